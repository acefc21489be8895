// `servetune import FILE... --into RUN_DIR [--candidate NAME] [--workload NAME]... [--set KEY=VALUE]... [--dry-run]`:
// results of other tools become records of a run folder that `servetune report` and `check` read (see importer.h).
#include <cstdio>

#include "commands.h"
#include "importers/importer.h"
#include "report/report.h"

namespace servetune::cli {
namespace {

void import_command(const importers::ImportOptions& o) {
  const importers::ImportOutcome out = importers::run_import(o);
  for (const auto& r : out.records) {
    const auto& p = r["provenance"];
    const auto& m = r["metrics"];
    const std::string tpot = m.contains("mean_tpot_ms") ? report::format_number(m["mean_tpot_ms"].get<double>()) + " ms" : "-";
    const std::string tps = m.contains("total_token_throughput") ? report::format_number(m["total_token_throughput"].get<double>()) : "-";
    const std::string from = p["file"].get<std::string>() + ":" + std::to_string(p["line"].get<int>());
    std::printf("%s %s / %s (repeat %d): %s tok/s total, mean TPOT %s  <- %s (%s)\n", o.dry_run ? "would import" : "imported",
                r["candidate"]["id"].get<std::string>().c_str(), r["workload"]["name"].get<std::string>().c_str(),
                r["repeat"].get<int>(), tps.c_str(), tpot.c_str(), from.c_str(), p["format"].get<std::string>().c_str());
  }
  if (!o.dry_run) {
    std::printf("%zu record(s) in %s; regenerate the report with: servetune report %s\n", out.records.size(), o.into.c_str(),
                o.into.c_str());
  }
}

void add_import_command(CLI::App& app) {
  auto o = std::make_shared<importers::ImportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Import results of other tools (vllm bench serve / SGLang bench_serving output and JSON, GuideLLM, AIPerf) into a run folder");
  cmd->add_option("files", o->files, "Result files: stdout blocks, --save-result JSON, JSONL, GuideLLM / AIPerf JSON")->required();
  cmd->add_option("--into", o->into, "Run folder to add the records to (created when missing)")->required();
  cmd->add_option("--candidate", o->candidate, "Candidate id (default: from --set, the result's label, or the file name)");
  cmd->add_option("--workload", o->workloads,
                  "Workload name: once for all results, or once per result in file order (default: the dataset name, or "
                  "'imported'; results at several concurrencies become NAME@c<N>)")
      ->allow_extra_args(false);  // one value per --workload, so positional files may follow
  cmd->add_option("--set", o->sets, "KEY=VALUE setting of the candidate, e.g. --set engine=vllm --set version=0.11.0 --set tp_size=8")
      ->allow_extra_args(false);
  cmd->add_flag("--dry-run", o->dry_run, "Parse and validate; print what would be imported, write nothing");
  cmd->callback([o] { import_command(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(65, add_import_command);

}  // namespace servetune::cli

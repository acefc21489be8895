// `servetune report RUN_DIR [--baseline CANDIDATE] [--format md|html|csv] [--output FILE]`: regenerates a report
// from stored results (see report/report.h).
#include <cstdio>

#include "commands.h"
#include "report/report.h"
#include "servetune/error.h"
#include "tuner/results_store.h"

namespace servetune::cli {
namespace {

struct ReportOptions {
  std::string run_dir;
  std::string baseline;
  std::string format = "md";
  std::string output;
};

void run_report(const ReportOptions& o) {
  if (o.format != "md" && o.format != "html" && o.format != "csv") throw_usage("--format must be md, html or csv, got '" + o.format + "'");
  const report::ReportData data = report::load_report(o.run_dir, o.baseline);
  const std::string text = o.format == "md" ? report::render_markdown(data)
                           : o.format == "html" ? report::render_html(data)
                                                : report::summary_csv(data);
  if (o.output.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  tuner::write_file_atomic(o.output, text);
  std::fprintf(stderr, "wrote %s\n", o.output.c_str());
}

void add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* cmd = app.add_subcommand("report", "Regenerate a tuning report (Markdown, HTML with charts, or CSV) from a results folder");
  cmd->add_option("run_dir", o->run_dir, "Run folder of a sweep, or a folder of result records")->required();
  cmd->add_option("--baseline", o->baseline, "Candidate id or label to compare against (default: the sweep's baseline)");
  cmd->add_option("--format", o->format, "md | html | csv")->capture_default_str();
  cmd->add_option("--output,-o", o->output, "Write to this file instead of stdout");
  cmd->callback([o] { run_report(*o); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(60, add_report_command);

}  // namespace servetune::cli

// The sweep driver: input checks, the run folder, and the strategy loop (see sweep_runner.h); trials run in
// trial_runner.cpp.
#include "tuner/sweep_runner.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "servetune/error.h"
#include "servetune/tokenizer.h"
#include "tuner/interrupt.h"
#include "tuner/executor.h"
#include "tuner/launch_records.h"
#include "tuner/launcher.h"
#include "tuner/plan.h"
#include "tuner/progress.h"
#include "tuner/results_store.h"
#include "tuner/results_table.h"
#include "tuner/space.h"
#include "tuner/strategy.h"
#include "tuner/trial_runner.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

// Files the sweep reads, checked before anything runs.
void check_inputs(const SweepSpec& spec) {
  const std::string& src = spec.source;
  if (spec.builtin() && !fs::exists(spec.target.model)) {
    throw_usage(src + ": target.model: " + spec.target.model + ": no such file or directory");
  }
  if (!spec.builtin()) {
    if (spec.target.tokenizer.empty()) throw_usage(src + ": target.tokenizer: an external target needs a tokenizer (.gguf or HF directory) for its datasets");
    if (!fs::exists(spec.target.tokenizer)) throw_usage(src + ": target.tokenizer: " + spec.target.tokenizer + ": no such file or directory");
    for (const auto& [name, server] : spec.target.servers) {
      if (spec.target.port == 0 && server.command.find("{port}") == std::string::npos) {
        throw_usage(src + ": target: the command of " + name + " has no {port}; put {port} in it or give target.port");
      }
    }
  }
  for (size_t i = 0; i < spec.workloads.size(); ++i) {
    const auto& d = spec.workloads[i].data;
    const std::string path = d.name == "sharegpt" && d.path.empty() ? datasets::default_sharegpt_path() : d.path;
    if ((d.name == "sharegpt" || d.name == "trace") && !fs::exists(path)) {
      throw_usage(src + ": workload " + spec.workloads[i].group + ": dataset file " + path +
                  " does not exist" + (d.path.empty() ? " (scripts/setup.sh fetches it)" : ""));
    }
  }
}

// A trial the sweep's interruption cut short counts as not run: --resume runs it again.
bool interrupted_marker(const nlohmann::ordered_json& marker) {
  return marker.value("failure", std::string()) == trial_failure_name(TrialFailure::kInterrupted);
}

// The strategy loop: asks the strategy for the next batch of trials, skips those already complete (--resume) or
// excluded by the constraints, and hands the rest to the executor; the strategy sees every result so far before its
// next batch.
class Driver {
 public:
  Driver(const SweepSpec& spec, ResultsStore& store, const SweepOptions& o)
      : spec_(spec), store_(store), space_(spec), strategy_(Strategy::make(spec, space_)),
        launcher_(Launcher::make(spec, space_)), progress_(o.progress, strategy_->planned_runs()),
        tokenizer_(Tokenizer::from_path(spec.builtin() ? spec.target.model : spec.target.tokenizer)),
        trials_(spec, space_, store, *launcher_, progress_, *tokenizer_) {
    if (o.trial.empty()) executor_ = Executor::make(o.executor, {spec_, space_, store_, trials_, progress_});
  }

  SweepOutcome run() {
    SweepOutcome outcome;
    outcome.run_dir = store_.dir();
    ResultsTable table = ResultsTable::build(store_.records(), store_.trials());
    while (auto batch = strategy_->next(table)) {
      progress_.note("== " + batch->stage + ": " + std::to_string(batch->trials.size()) + " candidates");
      std::vector<Trial> pending;
      for (const Trial& t : batch->trials) {
        const size_t runs = max_runs(t.workloads, spec_.repeat);
        if (const auto marker = store_.trial(t.candidate.id, t.tag); marker && !interrupted_marker(*marker)) {
          ++outcome.trials_reused;
          progress_.skip_runs(runs);
          continue;
        }
        if (!t.candidate.skip_reason.empty()) {
          trials_.skip(t);
          progress_.note(t.candidate.id + " (" + t.candidate.label + "): skipped: " + t.candidate.skip_reason);
          progress_.skip_runs(runs);
          ++outcome.skipped;
          continue;
        }
        pending.push_back(t);
      }
      if (interrupted_by() == 0 && !pending.empty()) {
        outcome.failed += executor_->run(pending);
        for (const Trial& t : pending) {
          const auto marker = store_.trial(t.candidate.id, t.tag);
          outcome.trials_run += marker ? 1 : 0;
        }
      }
      table = ResultsTable::build(store_.records(), store_.trials());
      if (interrupted_by() != 0) break;
    }
    outcome.interrupted_by = interrupted_by();
    for (const auto& c : table.candidates()) outcome.succeeded += c.status == "ok" ? 1 : 0;
    return outcome;
  }

  // --trial: replays the strategy over the stored results up to the batch holding the trial (the batches before it
  // are complete: the driver that submitted it waited for them) and runs that one trial here.
  SweepOutcome run_one(const std::string& key) {
    SweepOutcome outcome;
    outcome.run_dir = store_.dir();
    const std::string wanted = key.find(':') == std::string::npos ? key + ":main" : key;
    ResultsTable table = ResultsTable::build(store_.records(), store_.trials());
    while (auto batch = strategy_->next(table)) {
      for (const Trial& t : batch->trials) {
        if (trial_key(t) != wanted) continue;
        const auto marker = store_.trial(t.candidate.id, t.tag);
        if (!marker || interrupted_marker(*marker)) {
          if (!t.candidate.skip_reason.empty()) throw_usage("trial " + wanted + " is skipped: " + t.candidate.skip_reason);
          trials_.run(t);
          ++outcome.trials_run;
        } else {
          ++outcome.trials_reused;  // a requeued job whose trial already ran: nothing to do twice
        }
        const auto done = store_.trial(t.candidate.id, t.tag);
        outcome.trial_failed = !done || done->value("status", std::string()) != "ok";
        outcome.interrupted_by = interrupted_by();
        return outcome;
      }
      table = ResultsTable::build(store_.records(), store_.trials());
    }
    throw_usage(store_.dir() + ": no trial " + wanted + " in the sweep's plan so far (--trial names CANDIDATE:TAG, e.g. c03:main)");
  }

 private:
  const SweepSpec& spec_;
  ResultsStore& store_;
  SearchSpace space_;
  std::unique_ptr<Strategy> strategy_;
  std::unique_ptr<Launcher> launcher_;
  Progress progress_;
  std::unique_ptr<Tokenizer> tokenizer_;
  TrialRunner trials_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace

std::string plan_text(const SweepSpec& spec) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) return "";
  print_plan(mem, spec);
  std::fclose(mem);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

SweepOutcome run_sweep(const SweepOptions& o) {
  if (o.file.empty() && o.resume_dir.empty()) throw_usage("servetune sweep needs a sweep file (or --resume RUN_DIR)");
  if (!o.resume_dir.empty() && !o.output_dir.empty()) throw_usage("--output and --resume are exclusive (--resume names the run folder)");
  SpecFile file;
  std::string text;
  std::unique_ptr<ResultsStore> store;
  if (!o.resume_dir.empty()) {
    store = std::make_unique<ResultsStore>(o.resume_dir);
    const nlohmann::ordered_json stored = store->sweep();
    file.path = stored.value("source", o.resume_dir + "/sweep.json");
    file.root = stored.at("document");
    if (!o.file.empty()) {
      const SpecFile given = load_spec_file(o.file);
      if (given.root != file.root) {
        throw_usage(o.file + ": differs from the sweep being resumed in " + o.resume_dir +
                    " (resume without the file, or start a new run)");
      }
    }
  } else {
    file = load_spec_file(o.file);
    text = read_text_file(o.file);
  }
  const SweepSpec spec = parse_sweep(file);
  if (o.dry_run) {
    print_plan(o.out, spec);
    return {};
  }
  check_inputs(spec);
  validate_plan(spec, SearchSpace(spec));
  if (o.trial.empty()) Executor::check(o.executor, spec);  // before the run folder exists
  if (!store) {
    const std::string dir = o.output_dir.empty() ? (fs::path("results") / spec.name / now_stamp()).string() : o.output_dir;
    store = std::make_unique<ResultsStore>(dir);
    store->create(spec.document, o.file, text);
    write_file_atomic((fs::path(dir) / "plan.txt").string(), plan_text(spec));
  }
  if (!o.trial.empty()) {
    if (o.resume_dir.empty()) throw_usage("--trial needs --resume RUN_DIR (it runs one trial of that run folder)");
    const InterruptHandlers handlers;
    return Driver(spec, *store, o).run_one(o.trial);
  }
  std::fprintf(o.out, "servetune sweep %s: results in %s\n", spec.name.c_str(), store->dir().c_str());
  // Servers a killed sweep left behind. Not with --trial (its siblings' servers run on purpose) nor under Slurm (the
  // servers ran on the nodes, inside jobs that scancel stops, and pids here mean nothing there).
  if (o.executor.kind != "slurm") {
    for (const auto& line : reap_leftover_servers(store->dir())) {
      std::fprintf(o.progress, "servetune: left running by the interrupted sweep: %s\n", line.c_str());
    }
  }
  std::fflush(o.out);
  const InterruptHandlers handlers;
  SweepOutcome outcome = Driver(spec, *store, o).run();
  outcome.run_dir = store->dir();
  return outcome;
}

}  // namespace servetune::tuner

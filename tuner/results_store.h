// A sweep's run folder: the sweep file (as given and as JSON), one record per (candidate, workload, repeat) in
// records/, one completion marker per trial (a candidate's launch with its workloads) in trials/, server logs and
// per-request arrays in raw/, summary.csv and the reports. Every file is written atomically (temp file + rename),
// so a killed sweep leaves complete files only; a trial without its marker is re-run on --resume.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace servetune::tuner {

inline constexpr const char* kRecordSchema = "servetune.record.v1";

// Writes `content` to `path` through a temp file in the same folder, fsync and rename. Throws Error(kIo).
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_text_file(const std::string& path);  // Throws Error(kIo).

class ResultsStore {
 public:
  explicit ResultsStore(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // A new run folder: fails (Error(kUsage)) when `dir` already holds a sweep.
  void create(const nlohmann::ordered_json& sweep_document, const std::string& source_path, const std::string& source_text);
  bool exists() const;
  // sweep.json's {"source", "document", ...}; Error(kUsage) when the folder is not a run folder.
  nlohmann::ordered_json sweep() const;

  std::string record_path(const std::string& candidate, const std::string& workload, int repeat) const;
  std::string trial_path(const std::string& candidate, const std::string& tag) const;
  std::string raw_dir(const std::string& candidate) const;

  std::optional<nlohmann::ordered_json> trial(const std::string& candidate, const std::string& tag) const;
  void write_trial(const nlohmann::ordered_json& marker) const;
  void write_record(const nlohmann::ordered_json& record) const;
  // Removes the records a killed launch of this trial may have left (before it runs again).
  void discard_partial(const std::string& candidate, const std::vector<std::string>& workloads) const;

  std::vector<nlohmann::ordered_json> records() const;
  std::vector<nlohmann::ordered_json> trials() const;

 private:
  std::string dir_;
};

// Records from a run folder, a folder of record files, or one file (a servetune record, or a `servetune bench` /
// `vllm bench serve --save-result` JSON, wrapped as a record). Throws Error(kUsage/kIo/kFormat) naming the path.
std::vector<nlohmann::ordered_json> load_records(const std::string& path);
// Wraps a flat vLLM-style result JSON into a record (candidate from `label` / engine_config, workload from the
// dataset fields).
nlohmann::ordered_json record_from_bench_json(const nlohmann::ordered_json& j, const std::string& path);

// A unique id for one launch (hex).
std::string new_launch_id();
// Local time now, as "2026-12-06T07:34:08+0000" (records) and as "20261206-073408" (run folder and file names).
std::string now_iso8601();
std::string now_stamp();

}  // namespace servetune::tuner

// Run-folder storage (see results_store.h).
#include "tuner/results_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "servetune/error.h"

namespace servetune::tuner {
namespace fs = std::filesystem;
namespace {

std::string local_time_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

std::vector<fs::path> json_files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::ordered_json read_json(const fs::path& p) {
  try {
    return nlohmann::ordered_json::parse(read_text_file(p.string()));
  } catch (const nlohmann::json::parse_error& e) {
    throw_format(p.string(), std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& content) {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) throw_io(target.parent_path().string(), "cannot create the folder: " + ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(tmp, std::string("cannot write: ") + std::strerror(errno));
  size_t off = 0;
  while (off < content.size()) {
    const ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_io(tmp, std::string("cannot write: ") + std::strerror(err));
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw_io(tmp, std::string("cannot write: ") + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw_io(path, std::string("cannot rename the temp file into place: ") + std::strerror(err));
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io(path, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string new_launch_id() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                    static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(g()));
  return buf;
}

std::string now_iso8601() { return local_time_now("%Y-%m-%dT%H:%M:%S%z"); }
std::string now_stamp() { return local_time_now("%Y%m%d-%H%M%S"); }

bool ResultsStore::exists() const { return fs::exists(fs::path(dir_) / "sweep.json"); }

void ResultsStore::create(const nlohmann::ordered_json& document, const std::string& source_path, const std::string& source_text) {
  if (exists()) throw_usage(dir_ + ": already holds a sweep (use --resume " + dir_ + " to continue it)");
  nlohmann::ordered_json j;
  j["source"] = source_path;
  j["created"] = now_iso8601();
  j["document"] = document;
  const std::string ext = fs::path(source_path).extension() == ".json" ? ".json" : ".yaml";
  write_file_atomic((fs::path(dir_) / ("sweep-file" + ext)).string(), source_text);
  write_file_atomic((fs::path(dir_) / "sweep.json").string(), j.dump(2) + "\n");
}

nlohmann::ordered_json ResultsStore::sweep() const {
  const fs::path p = fs::path(dir_) / "sweep.json";
  if (!fs::exists(p)) throw_usage(dir_ + ": not a sweep run folder (no sweep.json)");
  return read_json(p);
}

std::string ResultsStore::record_path(const std::string& candidate, const std::string& workload, int repeat) const {
  return (fs::path(dir_) / "records" / candidate / (workload + ".r" + std::to_string(repeat) + ".json")).string();
}

std::string ResultsStore::trial_path(const std::string& candidate, const std::string& tag) const {
  return (fs::path(dir_) / "trials" / (candidate + "." + tag + ".json")).string();
}

std::string ResultsStore::raw_dir(const std::string& candidate) const { return (fs::path(dir_) / "raw" / candidate).string(); }

std::optional<nlohmann::ordered_json> ResultsStore::trial(const std::string& candidate, const std::string& tag) const {
  const fs::path p = trial_path(candidate, tag);
  if (!fs::exists(p)) return std::nullopt;
  return read_json(p);
}

void ResultsStore::write_trial(const nlohmann::ordered_json& marker) const {
  write_file_atomic(trial_path(marker.at("candidate").get<std::string>(), marker.at("tag").get<std::string>()), marker.dump(2) + "\n");
}

void ResultsStore::write_record(const nlohmann::ordered_json& record) const {
  write_file_atomic(record_path(record.at("candidate").at("id").get<std::string>(), record.at("workload").at("name").get<std::string>(),
                                record.at("repeat").get<int>()),
                    record.dump(2) + "\n");
}

void ResultsStore::discard_partial(const std::string& candidate, const std::vector<std::string>& workloads) const {
  const fs::path dir = fs::path(dir_) / "records" / candidate;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    for (const auto& w : workloads) {
      if (name.rfind(w + ".r", 0) == 0) fs::remove(e.path(), ec);
    }
  }
}

std::vector<nlohmann::ordered_json> ResultsStore::records() const {
  std::vector<nlohmann::ordered_json> out;
  for (const auto& p : json_files_under(fs::path(dir_) / "records")) out.push_back(read_json(p));
  return out;
}

std::vector<nlohmann::ordered_json> ResultsStore::trials() const {
  std::vector<nlohmann::ordered_json> out;
  for (const auto& p : json_files_under(fs::path(dir_) / "trials")) out.push_back(read_json(p));
  return out;
}

nlohmann::ordered_json record_from_bench_json(const nlohmann::ordered_json& j, const std::string& path) {
  if (!j.contains("total_token_throughput") && !j.contains("output_throughput")) {
    throw_format(path, "neither a servetune record nor a benchmark result (no output_throughput)");
  }
  nlohmann::ordered_json r;
  r["schema"] = kRecordSchema;
  const std::string label = j.contains("label") && j["label"].is_string() ? j["label"].get<std::string>()
                                                                          : j.value("backend", std::string("run"));
  r["candidate"] = {{"id", label}, {"label", label}, {"settings", j.value("engine_config", nlohmann::ordered_json::object())}};
  const std::string dataset = j.value("dataset_name", std::string("unknown"));
  nlohmann::ordered_json w = {{"name", dataset}, {"group", dataset}, {"dataset", dataset}};
  if (j.contains("max_concurrency")) w["max_concurrency"] = j["max_concurrency"];
  if (j.contains("request_rate")) w["request_rate"] = j["request_rate"];
  r["workload"] = w;
  r["repeat"] = 0;
  nlohmann::ordered_json m = nlohmann::ordered_json::object();
  for (const auto& [k, v] : j.items()) {
    if (v.is_number()) m[k] = v;
  }
  r["metrics"] = m;
  r["provenance"] = {{"source", "file"}, {"path", path}, {"date", j.value("date", std::string())}};
  if (j.contains("environment")) r["provenance"]["environment"] = j["environment"];
  return r;
}

std::vector<nlohmann::ordered_json> load_records(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw_usage(path + ": no such file or folder");
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    const fs::path records = fs::path(path) / "records";
    files = json_files_under(fs::is_directory(records, ec) ? records : fs::path(path));
    files.erase(std::remove_if(files.begin(), files.end(),
                               [](const fs::path& p) { return p.filename() == "sweep.json" || p.parent_path().filename() == "trials"; }),
                files.end());
    if (files.empty()) throw_usage(path + ": holds no result records");
  } else {
    files.push_back(path);
  }
  std::vector<nlohmann::ordered_json> out;
  for (const auto& f : files) {
    nlohmann::ordered_json j = read_json(f);
    if (!j.is_object()) throw_format(f.string(), "not a result record (a JSON object)");
    if (j.value("schema", std::string()) == kRecordSchema) {
      out.push_back(std::move(j));
    } else {
      out.push_back(record_from_bench_json(j, f.string()));
    }
  }
  return out;
}

}  // namespace servetune::tuner

// `servetune import` (see importer.h): format detection, candidate and workload naming, record building, and the
// all-or-nothing write into the run folder (records/<candidate>/<workload>.r<repeat>.json plus imports.json).
#include "importers/importer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include "importers/import_util.h"
#include "servetune/error.h"
#include "tuner/results_store.h"

namespace servetune::importers {

using namespace tuner;  // records, results tables, specs and command lines are the tuner's
namespace fs = std::filesystem;
using import_detail::number_json;
using import_detail::parse_number;

namespace {

constexpr const char* kImportsFile = "imports.json";

// File- and id-safe: letters, digits, '.', '_', '-', '@' kept; anything else becomes '-'.
std::string safe_id(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '@';
    out += ok ? c : '-';
  }
  while (!out.empty() && (out.front() == '.' || out.front() == '-')) out.erase(out.begin());
  return out;
}

nlohmann::ordered_json parse_sets(const std::vector<std::string>& sets) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& kv : sets) {
    const size_t eq = kv.find('=');
    const std::string key = eq == std::string::npos ? "" : kv.substr(0, eq);
    if (key.empty() || safe_id(key) != key) throw_usage("--set '" + kv + "': expected KEY=VALUE (e.g. --set engine=vllm, --set tp_size=8)");
    const std::string value = kv.substr(eq + 1);
    if (value == "true" || value == "false") {
      out[key] = value == "true";
    } else if (const auto n = parse_number(value); n && value.find_first_of("eE") == std::string::npos) {
      out[key] = number_json(*n);
    } else {
      out[key] = value;
    }
  }
  return out;
}

std::string value_text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "vllm-0.11.0-tp_size8" from --set engine=vllm --set version=0.11.0 --set tp_size=8.
std::string id_from_settings(const nlohmann::ordered_json& s) {
  std::string id;
  for (const char* k : {"engine", "version"}) {
    if (s.contains(k)) id += (id.empty() ? "" : "-") + value_text(s[k]);
  }
  for (const auto& [k, v] : s.items()) {
    if (k == "engine" || k == "version") continue;
    id += (id.empty() ? "" : "-") + k + value_text(v);
  }
  return safe_id(id);
}

std::string level_text(const nlohmann::ordered_json& v) {
  if (v.is_number()) {
    const nlohmann::ordered_json n = number_json(v.get<double>());
    return n.dump();
  }
  return v.is_string() ? v.get<std::string>() : "";
}

struct Item {
  std::string path;
  ImportedResult result;
  std::string candidate;
  std::string base;  // workload name before levels
  std::string workload;
  std::string group;
  int repeat = 0;
};

}  // namespace

std::vector<ImportedResult> parse_import_text(const std::string& path, const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw_format(path, "empty file: no benchmark result to import");
  std::vector<ImportedResult> out;
  if (text[first] == '{' || text[first] == '[') {
    out = import_detail::parse_json_document(path, text);
  } else {
    out = import_detail::parse_text_blocks(path, text);
    if (out.empty()) {
      throw_format(path, "no benchmark result found: expected a '===== Serving Benchmark Result =====' block (vLLM / "
                         "SGLang stdout), vLLM --save-result JSON, SGLang JSONL, or a GuideLLM / AIPerf JSON export");
    }
  }
  if (out.empty()) throw_format(path, "holds no benchmark result");
  return out;
}

std::vector<ImportedResult> parse_import_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw_usage(path + ": no such file");
  if (fs::is_directory(path, ec)) throw_usage(path + ": a folder; give the result files to import");
  return parse_import_text(path, read_text_file(path));
}

ImportManifest read_import_manifest(const std::string& run_dir) {
  ImportManifest out;
  const fs::path p = fs::path(run_dir) / kImportsFile;
  std::error_code ec;
  if (!fs::exists(p, ec)) return out;
  try {
    const auto j = nlohmann::ordered_json::parse(read_text_file(p.string()));
    out.baseline = j.value("baseline", std::string());
    for (const auto& w : j.value("workloads", nlohmann::ordered_json::array())) {
      if (w.is_string()) out.workloads.push_back(w.get<std::string>());
    }
  } catch (const nlohmann::json::exception&) {
    return {};
  }
  return out;
}

ImportOutcome run_import(const ImportOptions& o) {
  if (o.files.empty()) throw_usage("import: give at least one result file");
  if (o.into.empty()) throw_usage("import: --into RUN_DIR is required");
  std::error_code ec;
  if (fs::exists(o.into, ec) && !fs::is_directory(o.into, ec)) throw_usage("--into " + o.into + ": exists and is not a folder");
  if (!o.candidate.empty() && safe_id(o.candidate) != o.candidate) {
    throw_usage("--candidate '" + o.candidate + "': use letters, digits, '.', '_', '-' only");
  }
  for (const auto& w : o.workloads) {
    if (w.empty() || safe_id(w) != w) throw_usage("--workload '" + w + "': use letters, digits, '.', '_', '-', '@' only");
  }
  const nlohmann::ordered_json settings = parse_sets(o.sets);

  // 1. Parse everything first.
  std::vector<Item> items;
  for (const auto& f : o.files) {
    for (auto& r : parse_import_file(f)) items.push_back({f, std::move(r), "", "", "", "", 0});
  }
  if (o.workloads.size() > 1 && o.workloads.size() != items.size()) {
    throw_usage("--workload is given " + std::to_string(o.workloads.size()) + " times but the files hold " +
                std::to_string(items.size()) + " results (give one name for all, or one per result in file order)");
  }

  // 2. Names: candidate, workload base, then levels (max concurrency / request rate) when a base has several.
  for (size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    const auto& src = it.result.source;
    if (!o.candidate.empty()) {
      it.candidate = o.candidate;
    } else if (!settings.empty()) {
      it.candidate = id_from_settings(settings);
    } else if (src.contains("label") && src["label"].is_string() && !safe_id(src["label"].get<std::string>()).empty()) {
      it.candidate = safe_id(src["label"].get<std::string>());
    } else {
      it.candidate = safe_id(fs::path(it.path).stem().string());
    }
    if (it.candidate.empty()) it.candidate = "imported";
    if (!o.workloads.empty()) {
      it.base = o.workloads.size() == 1 ? o.workloads[0] : o.workloads[i];
    } else if (it.result.workload.contains("dataset") && it.result.workload["dataset"].is_string()) {
      it.base = safe_id(it.result.workload["dataset"].get<std::string>());
    }
    if (it.base.empty()) it.base = "imported";
  }
  std::map<std::pair<std::string, std::string>, std::vector<Item*>> by_base;
  for (auto& it : items) by_base[{it.candidate, it.base}].push_back(&it);
  for (auto& [key, group] : by_base) {
    auto levels = [&](const char* k) {
      std::set<std::string> s;
      for (const Item* it : group) s.insert(it->result.workload.contains(k) ? level_text(it->result.workload[k]) : "");
      return s;
    };
    const auto conc = levels("max_concurrency"), rate = levels("request_rate");
    const bool by_conc = conc.size() > 1 && !conc.count(""), by_rate = !by_conc && rate.size() > 1 && !rate.count("");
    std::map<std::string, int> repeats;
    for (Item* it : group) {
      it->workload = it->base;
      if (by_conc) it->workload += "@c" + level_text(it->result.workload["max_concurrency"]);
      if (by_rate) it->workload += "@r" + level_text(it->result.workload["request_rate"]);
      it->group = by_conc || by_rate ? it->base : it->workload;
      it->repeat = repeats[it->workload]++;
    }
  }

  // 3. Records, checked against what the folder already holds.
  ResultsStore store(o.into);
  ImportOutcome outcome;
  const std::string now = now_iso8601();
  std::set<std::string> seen_candidates;
  for (const Item& it : items) {
    const ImportedResult& r = it.result;
    nlohmann::ordered_json rec;
    rec["schema"] = kRecordSchema;
    nlohmann::ordered_json cand = {{"id", it.candidate}, {"label", it.candidate}, {"settings", settings}, {"full_settings", settings}};
    if (settings.contains("engine")) cand["engine"] = value_text(settings["engine"]);
    if (settings.contains("version")) cand["engine_version"] = value_text(settings["version"]);
    rec["candidate"] = cand;
    nlohmann::ordered_json w = {{"name", it.workload}, {"group", it.group}};
    w["dataset"] = r.workload.value("dataset", nlohmann::ordered_json("unknown"));  // stdout blocks do not say
    for (const auto& [k, v] : r.workload.items()) {
      if (k != "dataset") w[k] = v;
    }
    if (w.contains("input_len") != w.contains("output_len")) {  // the report shows "IN in / OUT out" for random data
      if (!w.contains("input_len")) w["input_len"] = nullptr;
      if (!w.contains("output_len")) w["output_len"] = nullptr;
    }
    rec["workload"] = w;
    rec["repeat"] = it.repeat;
    rec["metrics"] = r.metrics;
    nlohmann::ordered_json p;
    p["source"] = "imported";
    p["tool"] = "servetune import";
    p["format"] = r.format;
    p["path"] = fs::absolute(it.path, ec).string();
    p["file"] = fs::path(it.path).filename().string();
    p["line"] = r.line;
    p["locator"] = r.locator;
    p["imported"] = now;
    for (const auto& [k, v] : r.source.items()) p[k == "date" ? "source_date" : k] = v;
    rec["provenance"] = p;
    if (!r.extra.empty()) rec["source_extra"] = r.extra;
    const std::string dest = store.record_path(it.candidate, it.workload, it.repeat);
    if (std::find(outcome.paths.begin(), outcome.paths.end(), dest) != outcome.paths.end()) {
      throw Error(ErrorKind::kInternal, "import: two results map to " + dest);
    }
    if (fs::exists(dest, ec)) {
      nlohmann::ordered_json old;
      try {
        old = nlohmann::ordered_json::parse(read_text_file(dest));
      } catch (const nlohmann::json::exception&) {
      }
      const auto& op = old.is_object() ? old.value("provenance", nlohmann::ordered_json::object()) : nlohmann::ordered_json::object();
      const bool same = op.value("source", std::string()) == "imported" && op.value("path", std::string()) == p["path"].get<std::string>() &&
                        op.value("line", 0) == r.line && op.value("locator", std::string()) == r.locator;
      if (!same) {
        throw_usage(o.into + " already holds a record for candidate '" + it.candidate + "', workload '" + it.workload + "' (" +
                    dest + "); import under another --candidate or --workload name");
      }
    }
    seen_candidates.insert(it.candidate);
    outcome.records.push_back(std::move(rec));
    outcome.paths.push_back(dest);
  }
  if (o.dry_run) return outcome;

  // 4. Write: every record, then the manifest (its baseline is the first candidate ever imported).
  for (size_t i = 0; i < outcome.records.size(); ++i) write_file_atomic(outcome.paths[i], outcome.records[i].dump(2) + "\n");
  const fs::path manifest_path = fs::path(o.into) / kImportsFile;
  nlohmann::ordered_json manifest = {{"schema", "servetune.imports.v1"}, {"baseline", items.front().candidate},
                                     {"workloads", nlohmann::ordered_json::array()}, {"imports", nlohmann::ordered_json::array()}};
  if (fs::exists(manifest_path, ec)) {
    try {
      const auto old = nlohmann::ordered_json::parse(read_text_file(manifest_path.string()));
      if (old.is_object() && old.contains("imports") && old["imports"].is_array()) manifest = old;
    } catch (const nlohmann::json::exception&) {
    }
  }
  if (!manifest.contains("workloads") || !manifest["workloads"].is_array()) manifest["workloads"] = nlohmann::ordered_json::array();
  for (const Item& it : items) {
    auto& ws = manifest["workloads"];
    if (std::find(ws.begin(), ws.end(), nlohmann::ordered_json(it.workload)) == ws.end()) ws.push_back(it.workload);
  }
  nlohmann::ordered_json entry = {{"date", now}, {"files", o.files}, {"settings", settings}, {"records", nlohmann::ordered_json::array()}};
  for (const auto& path : outcome.paths) entry["records"].push_back(fs::relative(path, o.into, ec).string());
  manifest["imports"].push_back(entry);
  write_file_atomic(manifest_path.string(), manifest.dump(2) + "\n");
  return outcome;
}

}  // namespace servetune::importers

// External server launch commands (see server_command.h) and the parsing of a server's sweep-file entry.
#include "tuner/server_command.h"

#include <algorithm>
#include <regex>

#include "loadgen/backends.h"
#include "servetune/error.h"
#include "tuner/spec_section.h"

namespace servetune::tuner {
namespace {

std::string value_text(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

bool is_off(const nlohmann::ordered_json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty());
}

// Replaces {} with `self` and {name} with the named value; unknown names are a sweep-file error.
std::string fill(const SweepSpec& spec, const std::string& tmpl, const std::string& what, const std::string* self,
                 const std::map<std::string, std::string>& vars) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    if ((tmpl[i] == '{' || tmpl[i] == '}') && i + 1 < tmpl.size() && tmpl[i + 1] == tmpl[i]) {  // {{ and }}
      out += tmpl[i];
      i += 2;
      continue;
    }
    if (tmpl[i] != '{') {
      out += tmpl[i++];
      continue;
    }
    const size_t close = tmpl.find('}', i);
    if (close == std::string::npos) throw_usage(spec.source + ": " + what + ": unclosed '{' in '" + tmpl + "'");
    const std::string name = tmpl.substr(i + 1, close - i - 1);
    if (name.empty()) {
      if (self == nullptr) throw_usage(spec.source + ": " + what + ": '{}' only applies in a flag template");
      out += *self;
    } else {
      const auto it = vars.find(name);
      if (it == vars.end()) {
        std::string known;
        for (const auto& [k, v] : vars) known += (known.empty() ? "" : ", ") + k;
        throw_usage(spec.source + ": " + what + ": unknown placeholder {" + name + "} (known: " + known + ")");
      }
      out += it->second;
    }
    i = close + 1;
  }
  return out;
}

}  // namespace

std::string shell_quote(const std::string& s) {
  if (!s.empty() && std::regex_match(s, std::regex("[A-Za-z0-9._/:=+@,%-]+"))) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

ServerSpec parse_server(const SpecFile& f, Section& s, const std::string& path, const std::string& name) {
  ServerSpec server;
  server.name = name;
  server.version = s.str("version", "");
  server.command = s.str("command", "", true);
  server.health = s.str("health", "/health");
  if (server.health.empty() || server.health[0] != '/') s.fail("health", "must be a path starting with '/'");
  server.flush_cache = s.str("flush_cache", "");
  if (!server.flush_cache.empty() && server.flush_cache[0] != '/') {
    s.fail("flush_cache", "must be a path starting with '/' (SGLang: /flush_cache; vLLM: /reset_prefix_cache)");
  }
  server.backend = s.str("backend", "openai");
  if (!loadgen::is_http_backend(server.backend)) {
    std::string known;
    for (const auto& b : loadgen::http_backends()) known += (known.empty() ? "" : ", ") + b;
    s.fail("backend", "must be one of " + known + ", got '" + server.backend + "'");
  }
  server.endpoint = s.str("endpoint", "");
  if (!server.endpoint.empty()) {
    try {
      loadgen::validate_endpoint(server.backend, server.endpoint);
    } catch (const Error& e) {
      s.fail("endpoint", e.what());
    }
  }
  server.served_model_name = s.str("served_model_name", "");
  server.env = s.str_map("env");
  if (const auto* fl = s.get("flags")) {
    if (!fl->is_object()) s.fail("flags", "must map settings to a flag template, null, or {value: template}");
    for (const auto& [k, v] : fl->items()) {
      if (!(v.is_null() || v.is_string() || v.is_object())) f.fail(path + ".flags." + k, "must be a template, null, or {value: template}");
      if (v.is_object()) {
        for (const auto& [val, t] : v.items()) {
          if (!(t.is_null() || t.is_string())) f.fail(path + ".flags." + k + "." + val, "must be a template or null");
        }
      }
    }
    server.flags = *fl;
  }
  server.startup_timeout_s = s.dbl("startup_timeout_s", 900.0);
  server.stop_timeout_s = s.dbl("stop_timeout_s", 30.0);
  server.request_timeout_s = s.dbl("request_timeout_s", 3600.0);
  if (!(server.startup_timeout_s > 0 && server.stop_timeout_s > 0 && server.request_timeout_s > 0)) {
    s.fail("startup_timeout_s", "timeouts must be positive");
  }
  return server;
}

const ServerSpec& server_for(const SweepSpec& spec, const nlohmann::ordered_json& settings) {
  if (spec.target.servers.size() == 1) return spec.target.servers.begin()->second;
  return spec.target.servers.at(settings.at("server").get<std::string>());
}

std::optional<LaunchCommand> render_launch(const SweepSpec& spec, const nlohmann::ordered_json& settings, int port,
                                           std::string& why) {
  LaunchCommand out;
  out.server = &server_for(spec, settings);
  const ServerSpec& server = *out.server;
  std::map<std::string, std::string> vars = {{"model", shell_quote(spec.target.model)},
                                             {"port", std::to_string(port)},
                                             {"host", spec.target.host}};
  for (const auto& [k, v] : settings.items()) vars.emplace(k, shell_quote(value_text(v)));
  const std::string where = "target" + (spec.target.servers.size() > 1 ? ".servers." + server.name : std::string()) + ".flags.";
  std::string flags;
  auto append = [&](const std::string& text) {
    if (!text.empty()) flags += (flags.empty() ? "" : " ") + text;
  };
  for (const auto& [k, v] : settings.items()) {
    if (k == "server") continue;
    const auto rule = server.flags.find(k);
    if (rule == server.flags.end()) {
      if (is_off(v)) continue;
      std::string flag = "--" + k;
      std::replace(flag.begin(), flag.end(), '_', '-');
      append(v.is_boolean() ? flag : flag + " " + shell_quote(value_text(v)));
      continue;
    }
    const nlohmann::ordered_json* tmpl = &*rule;
    if (rule->is_object()) {
      const std::string key = value_text(v);
      if (!rule->contains(key)) {
        why = server.name + " has no flag for " + k + " = " + key + " (the sweep file's flags." + k + " lists no such value)";
        return std::nullopt;
      }
      tmpl = &rule->at(key);
      if (tmpl->is_null()) {
        why = server.name + " does not support " + k + " = " + key;
        return std::nullopt;
      }
    } else if (rule->is_null()) {
      if (is_off(v)) continue;
      why = server.name + " does not support " + k + " (value " + v.dump() + ")";
      return std::nullopt;
    } else if (v.is_boolean() || v.is_null()) {
      if (is_off(v)) continue;
    }
    const std::string self = shell_quote(value_text(v));
    append(fill(spec, tmpl->get<std::string>(), where + k, &self, vars));
  }
  out.flags = flags;
  vars["flags"] = flags;
  out.command = fill(spec, server.command, "target" + (spec.target.servers.size() > 1 ? ".servers." + server.name : std::string()) + ".command",
                     nullptr, vars);
  return out;
}

}  // namespace servetune::tuner

// OpenAI-style API errors: an HTTP status plus {"error": {"message", "type", "param", "code"}}, and the mapping from
// engine Errors to statuses (a request the engine rejects is the client's fault: 400, never 500).
#pragma once

#include <stdexcept>
#include <string>

#include "servetune/error.h"

namespace servetune::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }  // "" renders as null
  const std::string& code() const { return code_; }    // "" renders as null

  // The JSON body, e.g. {"error":{"message":"...","type":"invalid_request_error","param":"max_tokens","code":null}}.
  std::string body() const;

 private:
  int status_;
  std::string type_;
  std::string param_;
  std::string code_;
};

// 400 invalid_request_error naming `param`.
[[noreturn]] void throw_bad_request(const std::string& message, const std::string& param = {});

// kInvalidRequest / kUsage / kUnsupported / kFormat -> 400, anything else -> 500 server_error.
ApiError api_error_from(const Error& e, const std::string& param = {});

const char* status_reason(int status);  // "Bad Request", ...

}  // namespace servetune::server

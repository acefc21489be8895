// ApiError rendering and the engine-error mapping (see api_error.h).
#include "server/api_error.h"

#include "server/json_text.h"

namespace servetune::server {
namespace {

const char* type_for(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429 || status == 503) return "service_unavailable_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)), status_(status), type_(type_for(status)), param_(std::move(param)),
      code_(std::move(code)) {}

std::string ApiError::body() const {
  std::string out = "{\"error\":{\"message\":";
  append_json_string(out, what());
  out += ",\"type\":";
  append_json_string(out, type_);
  out += ",\"param\":";
  if (param_.empty()) {
    out += "null";
  } else {
    append_json_string(out, param_);
  }
  out += ",\"code\":";
  if (code_.empty()) {
    out += "null";
  } else {
    append_json_string(out, code_);
  }
  out += "}}";
  return out;
}

void throw_bad_request(const std::string& message, const std::string& param) { throw ApiError(400, message, param); }

ApiError api_error_from(const Error& e, const std::string& param) {
  switch (e.kind()) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kUsage:
    case ErrorKind::kUnsupported:
    case ErrorKind::kFormat:
      return ApiError(400, e.what(), param);
    case ErrorKind::kIo:
    case ErrorKind::kInternal:
      break;
  }
  return ApiError(500, std::string("internal error: ") + e.what());
}

const char* status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace servetune::server

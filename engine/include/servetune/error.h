// Error types for servetune (public API): every user-caused failure becomes one Error with a kind and a message naming
// the input. Usage errors map to exit code 2 at the CLI, everything else to 1.
#pragma once

#include <stdexcept>
#include <string>

namespace servetune {

enum class ErrorKind {
  kUsage,        // bad flag, bad argument, bad config value
  kFormat,       // a file that is not what it claims to be (corrupt GGUF, bad JSON, ...)
  kIo,           // cannot open / read / write
  kUnsupported,  // valid input that servetune does not implement
  kInvalidRequest,  // a request the engine cannot serve (prompt too long, max_tokens <= 0, ...)
  kInternal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void throw_usage(const std::string& message) { throw Error(ErrorKind::kUsage, message); }
[[noreturn]] inline void throw_unsupported(const std::string& message) { throw Error(ErrorKind::kUnsupported, message); }
[[noreturn]] inline void throw_io(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kIo, path + ": " + what);
}
[[noreturn]] inline void throw_format(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

}  // namespace servetune

// Hand-rolled JSON text helpers for the hot streaming path (one SSE chunk per token): string escaping that turns
// ill-formed UTF-8 into U+FFFD (so output is always valid JSON), and shortest round-trip number formatting.
#pragma once

#include <string>
#include <string_view>

namespace servetune::server {

// Appends `s` as a quoted JSON string. Control characters are escaped; ill-formed UTF-8 sequences become U+FFFD.
void append_json_string(std::string& out, std::string_view s);
// Appends a finite double in the shortest form that reads back to the same value ("-0.25", "1e-07");
// non-finite values (never produced by valid logits) are written as -9999.0, as vLLM clamps -inf logprobs.
void append_json_number(std::string& out, double v);
void append_json_number(std::string& out, float v);  // shortest form that reads back to the same float

}  // namespace servetune::server

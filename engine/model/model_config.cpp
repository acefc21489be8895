// ModelConfig validation and derived rope tables.
#include "model/model_config.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace servetune {

void validate_model_config(const ModelConfig& c, const std::string& source) {
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) throw_format(source, what);
  };
  auto in_range = [&](int64_t v, int64_t hi, const char* name) {
    check(v > 0 && v <= hi, std::string(name) + " = " + std::to_string(v) + " is out of range (1.." + std::to_string(hi) + ")");
  };
  in_range(c.n_layers, 100000, "block count");
  in_range(c.hidden, 1 << 20, "embedding length");
  in_range(c.n_heads, 1 << 16, "attention head count");
  in_range(c.n_kv_heads, 1 << 16, "attention KV head count");
  in_range(c.head_dim, 1 << 14, "head dimension");
  in_range(c.ffn, 1 << 22, "feed-forward length");
  in_range(c.vocab, 1 << 24, "vocabulary size");
  in_range(c.context_length, 1 << 26, "context length");
  check(c.n_heads % c.n_kv_heads == 0, "attention head count " + std::to_string(c.n_heads) +
                                           " is not a multiple of the KV head count " + std::to_string(c.n_kv_heads));
  check(c.rope_dim > 0 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0,
        "rope dimension " + std::to_string(c.rope_dim) + " must be even and at most the head dimension " + std::to_string(c.head_dim));
  check(std::isfinite(c.rms_eps) && c.rms_eps > 0 && c.rms_eps < 1, "rms norm epsilon must be in (0, 1)");
  check(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope frequency base must be positive");
  check(std::isfinite(c.rope_factor) && c.rope_factor > 0, "rope scaling factor must be positive");
}

std::vector<float> llama3_rope_freq_factors(const ModelConfig& c) {
  if (c.rope_scaling != RopeKind::kLlama3) return {};
  std::vector<float> factors(static_cast<size_t>(c.rope_dim / 2));
  const double low_wavelen = static_cast<double>(c.rope_original_context) / c.rope_low_freq_factor;
  const double high_wavelen = static_cast<double>(c.rope_original_context) / c.rope_high_freq_factor;
  for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * static_cast<double>(i) / static_cast<double>(c.rope_dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double factor = 1.0;
    if (wavelen > low_wavelen) {
      factor = c.rope_factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (static_cast<double>(c.rope_original_context) / wavelen - c.rope_low_freq_factor) /
                            (c.rope_high_freq_factor - c.rope_low_freq_factor);
      factor = 1.0 / ((1.0 - smooth) / c.rope_factor + smooth);
    }
    factors[static_cast<size_t>(i)] = static_cast<float>(factor);
  }
  return factors;
}

}  // namespace servetune

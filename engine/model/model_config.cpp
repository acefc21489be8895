// ModelConfig validation and derived rope tables.
#include "model/model_config.h"

#include <algorithm>
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
  if (c.is_moe()) {
    in_range(c.moe.expert_ffn, 1 << 22, "expert feed-forward length");
    validate_moe_routing(c.moe.routing, source);
    check(static_cast<int64_t>(c.moe.moe_layer.size()) == c.n_layers, "the MoE layer list must have one entry per layer");
  }
  if (c.is_mla()) {
    in_range(c.mla.qk_nope_dim, 1 << 14, "MLA key no-rope dimension");
    in_range(c.mla.v_head_dim, 1 << 14, "MLA value head dimension");
    check(c.head_dim == c.mla.qk_nope_dim + c.mla.qk_rope_dim && c.rope_dim == c.mla.qk_rope_dim,
          "MLA head dimension must be the no-rope plus the rope dimension");
  }
}

namespace {

// YaRN (transformers' _compute_yarn_parameters): frequencies below the beta_slow band are interpolated (divided by
// the factor), above beta_fast extrapolated (kept), with a linear ramp between; as divisors of the base frequencies.
std::vector<float> yarn_freq_factors(const ModelConfig& c) {
  const double dim = static_cast<double>(c.rope_dim), base = c.rope_theta;
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(c.rope_original_context) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(c.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.yarn_beta_slow)), dim - 1.0);
  if (low == high) high += 0.001;
  std::vector<float> factors(static_cast<size_t>(c.rope_dim / 2));
  for (size_t i = 0; i < factors.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolate = 1.0 - ramp;
    factors[i] = static_cast<float>(1.0 / ((1.0 - extrapolate) / c.rope_factor + extrapolate));
  }
  return factors;
}

}  // namespace

float yarn_softmax_scale(double factor, double log_multiplier) {
  if (factor <= 1.0) return 1.0f;
  const double m = 1.0 + log_multiplier * std::log(factor);
  return static_cast<float>(m * m);
}

std::vector<float> rope_freq_factors(const ModelConfig& c) {
  if (c.rope_scaling == RopeKind::kYarn) return yarn_freq_factors(c);
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

// Device sampling on the GPU backend against the host Sampler (the checks are in backend_sample_checks.h), and its
// refusal of non-finite logits. Skips, saying why, when no GPU is visible.
#include <cmath>
#include <limits>

#include "backend/cuda/gpu_backend.h"
#include "backend_sample_checks.h"

namespace servetune {
namespace {

std::unique_ptr<Backend> gpu(std::string& skip_reason) {
  if (gpu_device_count() > 0) return make_backend(gpu_backend_name(), 1);
  skip_reason = std::string("no GPU visible to the ") + gpu_backend_name() + " runtime";
  return nullptr;
}

INSTANTIATE_TEST_SUITE_P(Gpu, BackendSample, ::testing::Values(&gpu));

// A NaN or +inf logit (one row of three, greedy and sampled) is an error naming the row, not a token: an argmax over
// NaNs still returns a plausible id. -inf (a masked token) is an ordinary logit.
TEST(GpuSample, NonFiniteLogitsAreAnErrorNamingTheRow) {
  std::string skip_reason;
  auto backend = gpu(skip_reason);
  if (!backend) GTEST_SKIP() << skip_reason;
  const int64_t vocab = 1000;
  for (float poison : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    for (float temperature : {0.0f, 0.8f}) {
      std::vector<float> logits = random_logits(3 * vocab, 5, 2.0f);
      logits[vocab + 777] = poison;
      logits[2 * vocab + 3] = -std::numeric_limits<float>::infinity();
      auto buffer = backend->allocate(logits.size() * sizeof(float));
      backend->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
      SampleRow rows[3];
      for (SampleRow& r : rows) r.temperature = temperature, r.uniform = 0.5;
      int32_t tokens[3] = {};
      try {
        backend->sample(static_cast<const float*>(buffer->data()), 3, vocab, rows, tokens);
        ADD_FAILURE() << "no error for logit " << poison << ", temperature " << temperature;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("row 1 holds NaN or +inf"), std::string::npos) << e.what();
      }
      logits[vocab + 777] = 0.0f;  // the same rows without the poison sample normally
      backend->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
      backend->sample(static_cast<const float*>(buffer->data()), 3, vocab, rows, tokens);
      for (int32_t t : tokens) EXPECT_TRUE(t >= 0 && t < vocab);
    }
  }
}

}  // namespace
}  // namespace servetune

// The two collectives a tensor-parallel model shard runs, shared by the model families: the sum of row-parallel
// layers' partial outputs, and the gather of the vocab-parallel head's logits columns into whole rows.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/parallel.h"

namespace servetune {

// Sums every rank's `count` partial values in place (all-reduce); nothing without tensor parallelism.
void sum_partials(Backend& backend, const ParallelContext& parallel, float* partial, int64_t count);

// Rank r holds `local` = [n_out, its balanced_slice(vocab) columns]; fills `logits` with the full [n_out, vocab]
// rows (`gathered` is scratch the caller keeps between steps).
void gather_vocab_logits(Backend& backend, const ParallelContext& parallel, int64_t vocab, const float* local, int64_t n_out,
                         std::vector<float>& gathered, std::vector<float>& logits);

}  // namespace servetune

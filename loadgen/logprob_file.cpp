// Reading and writing the log-probability file (see logprob_file.h). Native byte order: the file is a baseline for
// runs on the same kind of machine, not an exchange format.
#include "loadgen/logprob_file.h"

#include <cstring>

#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

constexpr char kDenseMagic[8] = {'S', 'T', 'L', 'O', 'G', 'P', '0', '1'};
constexpr char kSparseMagic[8] = {'S', 'T', 'L', 'O', 'G', 'P', '0', '2'};

struct Header {
  int32_t ctx = 0, vocab = 0, chunks = 0;
};

template <class T>
void put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <class T>
bool get(std::ifstream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof(v)));
}

}  // namespace

LogprobWriter::LogprobWriter(std::string path, const LogprobShape& shape, bool dense) : path_(std::move(path)), dense_(dense) {
  out_.open(path_, std::ios::binary);
  if (!out_) throw_io(path_, "cannot write the log-probabilities");
  out_.write(dense ? kDenseMagic : kSparseMagic, sizeof(kDenseMagic));
  put(out_, Header{shape.ctx, shape.vocab, static_cast<int32_t>(shape.chunks.size())});
  for (const auto& c : shape.chunks) out_.write(reinterpret_cast<const char*>(c.data()), static_cast<std::streamsize>(c.size() * sizeof(int32_t)));
}

void LogprobWriter::write(const PositionLogprobs& p) {
  if (dense_) {
    out_.write(reinterpret_cast<const char*>(p.dense.data()), static_cast<std::streamsize>(p.dense.size() * sizeof(float)));
    return;
  }
  put(out_, p.target_logprob);
  put(out_, static_cast<int32_t>(p.sparse.size()));
  for (const TokenLogprob& t : p.sparse) {
    put(out_, t.token);
    put(out_, t.logprob);
  }
}

void LogprobWriter::finish() {
  if (!out_.flush()) throw_io(path_, "cannot write the log-probabilities");
}

LogprobReader::LogprobReader(std::string path, const LogprobShape& shape, bool run_dense) : path_(std::move(path)) {
  in_.open(path_, std::ios::binary);
  if (!in_) throw_io(path_, "cannot open the base log-probabilities");
  char magic[8] = {};
  Header h;
  in_.read(magic, sizeof(magic));
  get(in_, h);
  const bool dense = std::memcmp(magic, kDenseMagic, sizeof(magic)) == 0;
  if (!in_ || (!dense && std::memcmp(magic, kSparseMagic, sizeof(magic)) != 0)) {
    throw_usage(path_ + ": not a file servetune perplexity --save-logprobs wrote");
  }
  dense_ = dense;
  vocab_ = h.vocab;
  const auto chunks = static_cast<int32_t>(shape.chunks.size());
  // The vocabulary matters only between whole rows: top-K entries are matched by token id.
  const bool vocab_differs = dense && run_dense && h.vocab != shape.vocab;
  if (h.ctx != shape.ctx || h.chunks != chunks || vocab_differs) {
    throw_usage(path_ + ": the base ran ctx " + std::to_string(h.ctx) + ", vocabulary " + std::to_string(h.vocab) + ", " +
                std::to_string(h.chunks) + " chunks; this run has " + std::to_string(shape.ctx) + ", " + std::to_string(shape.vocab) +
                ", " + std::to_string(chunks) + " (same --ctx, --chunks, text and tokenizer needed)");
  }
  std::vector<int32_t> tokens(static_cast<size_t>(h.ctx));
  for (const auto& c : shape.chunks) {
    in_.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
    if (!in_ || tokens != c) throw_usage(path_ + ": the base scored other tokens (same text and tokenizer needed)");
  }
}

PositionLogprobs LogprobReader::next(int32_t target) {
  PositionLogprobs p;
  p.target = target;
  bool ok = true;
  if (dense_) {
    p.dense.resize(static_cast<size_t>(vocab_));
    ok = static_cast<bool>(in_.read(reinterpret_cast<char*>(p.dense.data()), static_cast<std::streamsize>(p.dense.size() * sizeof(float))));
    if (ok && target >= 0 && target < vocab_) p.target_logprob = p.dense[static_cast<size_t>(target)];
  } else {
    int32_t n = 0;
    ok = get(in_, p.target_logprob) && get(in_, n) && n >= 0 && n <= (1 << 24);
    if (ok) p.sparse.resize(static_cast<size_t>(n));
    for (TokenLogprob& t : p.sparse) ok = ok && get(in_, t.token) && get(in_, t.logprob);
  }
  if (!ok) throw_usage(path_ + ": ends early (a partial or other file)");
  return p;
}

}  // namespace servetune::loadgen

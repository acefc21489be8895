// Reference (de)quantization against goldens from the gguf Python package (tests/data/quant, made by
// scripts/gen_quant_goldens.py): every tensor of the real GGUF files, synthetic blocks of every type, quantizers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/quant.h"
#include "formats/gguf.h"
#include "test_paths.h"

namespace servetune {
namespace {

constexpr uint64_t kPolyInit = 0xCBF29CE484222325ull;
constexpr uint64_t kPolyMul = 0x100000001B3ull;
constexpr int64_t kChunk = int64_t{1} << 20;

// poly64 of the float32 bit patterns (see scripts/gen_quant_goldens.py).
uint64_t poly64(const float* x, int64_t n) {
  uint64_t h = kPolyInit;
  for (int64_t i = 0; i < n; ++i) h = h * kPolyMul + f32_to_bits(x[i]);
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Distance in units in the last place between two floats (0 when bitwise equal).
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    const int64_t u = f32_to_bits(f);
    return (u & 0x80000000) != 0 ? 0x80000000LL - u : u;
  };
  return std::llabs(ordered(a) - ordered(b));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> as_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// First index where the outputs differ bitwise, with both values and the ulp distance; empty when equal.
std::string first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (f32_to_bits(got[i]) != f32_to_bits(want[i])) {
      std::ostringstream os;
      os << "first difference at element " << i << ": got " << got[i] << " want " << want[i] << " ("
         << ulp_distance(got[i], want[i]) << " ulp)";
      return os.str();
    }
  }
  return "";
}

DType dtype_named(const std::string& name) {
  const auto t = dtype_from_name(name);
  if (!t) throw std::runtime_error("golden names unknown type " + name);
  return *t;
}

struct TensorGolden {
  std::string name, type;
  int64_t n = 0;
  std::vector<std::string> chunk_hashes;
  std::vector<std::pair<int64_t, uint32_t>> samples;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

std::vector<TensorGolden> read_real_golden(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<TensorGolden> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    TensorGolden g;
    std::string hashes, samples;
    ls >> g.name >> g.type >> g.n >> hashes >> samples;
    g.chunk_hashes = split(hashes, ',');
    for (const std::string& s : split(samples, ',')) {
      const size_t eq = s.find('=');
      g.samples.emplace_back(std::stoll(s.substr(0, eq)),
                             static_cast<uint32_t>(std::stoul(s.substr(eq + 1), nullptr, 16)));
    }
    out.push_back(std::move(g));
  }
  return out;
}

// On a mismatch the golden only knows hashes and samples; the full expected output comes from
// `scripts/gen_quant_goldens.py --dump FILE DIR`, compared element by element when SERVETUNE_QUANT_EXPECTED_DIR=DIR.
std::string compare_with_dump(const std::string& tensor, const std::vector<float>& got) {
  const char* dir = std::getenv("SERVETUNE_QUANT_EXPECTED_DIR");
  if (dir == nullptr) {
    return "for the first differing element run scripts/gen_quant_goldens.py --dump FILE DIR and rerun with "
           "SERVETUNE_QUANT_EXPECTED_DIR=DIR";
  }
  const std::string path = std::string(dir) + "/" + tensor + ".f32";
  if (!std::filesystem::exists(path)) return "no " + path;
  return first_difference(got, as_floats(read_bytes(path)));
}

// Dequantizes every tensor of `gguf_path` row by row and compares it with the golden; prints the bit-exact count.
void check_real_file(const std::string& gguf_path, const std::string& golden_name) {
  GgufFile file(gguf_path);
  const std::vector<TensorGolden> goldens = read_real_golden(testing::data_path("quant/" + golden_name));
  ASSERT_EQ(goldens.size(), file.tensors().size()) << golden_name << " does not cover every tensor";
  int exact = 0;
  std::map<std::string, int> per_type;
  std::vector<float> out;
  for (const TensorGolden& g : goldens) {
    const GgufTensorInfo* t = file.tensor(g.name);
    ASSERT_NE(t, nullptr) << g.name;
    ASSERT_EQ(dtype_name(t->dtype), g.type) << g.name;
    ASSERT_EQ(t->n_elements(), g.n) << g.name;
    const int64_t row = t->dims.empty() ? 1 : t->dims[0];
    const int64_t row_bytes = *dtype_row_bytes(t->dtype, row);
    out.resize(static_cast<size_t>(g.n));
    for (int64_t r = 0; r < g.n / row; ++r)
      dequantize_row(t->dtype, t->data + r * row_bytes, out.data() + r * row, row);

    std::string problem;
    for (size_t c = 0; c < g.chunk_hashes.size() && problem.empty(); ++c) {
      const int64_t begin = static_cast<int64_t>(c) * kChunk;
      const uint64_t h = poly64(out.data() + begin, std::min(kChunk, g.n - begin));
      if (hex64(h) != g.chunk_hashes[c]) {
        problem = "hash of elements [" + std::to_string(begin) + ", " + std::to_string(std::min(g.n, begin + kChunk)) +
                  ") differs";
      }
    }
    for (const auto& [index, bits] : g.samples) {
      const float want = bits_to_f32(bits);
      if (f32_to_bits(out[static_cast<size_t>(index)]) != bits) {
        std::ostringstream os;
        os << "; element " << index << ": got " << out[static_cast<size_t>(index)] << " want " << want << " ("
           << ulp_distance(out[static_cast<size_t>(index)], want) << " ulp)";
        problem += os.str();
      }
    }
    if (!problem.empty()) problem += "; " + compare_with_dump(g.name, out);
    EXPECT_TRUE(problem.empty()) << gguf_path << ": tensor " << g.name << " (" << g.type << "): " << problem;
    if (problem.empty()) {
      ++exact;
      ++per_type[g.type];
    }
  }
  std::ostringstream summary;
  for (const auto& [type, count] : per_type) summary << " " << type << ":" << count;
  std::printf("%s: %d/%zu tensors bit-exact (%s )\n", gguf_path.c_str(), exact, goldens.size(), summary.str().c_str());
}

TEST(QuantGolden, Stories260KEveryTensor) { check_real_file(testing::stories_path(), "real_stories260K.txt"); }

TEST(QuantGolden, SmolLM2Q4_1EveryTensor) {
  SERVETUNE_REQUIRE_FILE(testing::smollm2_path());
  check_real_file(testing::smollm2_path(), "real_smollm2_q4_1.txt");
}

struct SyntheticCase {
  std::string kind, type;
  std::vector<std::string> args;
};

std::vector<SyntheticCase> read_manifest() {
  std::ifstream in(testing::data_path("quant/synthetic.txt"));
  if (!in) throw std::runtime_error("cannot open tests/data/quant/synthetic.txt");
  std::vector<SyntheticCase> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    SyntheticCase c;
    ls >> c.kind >> c.type;
    for (std::string a; ls >> a;) c.args.push_back(a);
    out.push_back(std::move(c));
  }
  return out;
}

TEST(QuantGolden, SyntheticBlocksOfEveryType) {
  int dequant_cases = 0, quant_cases = 0, all16_cases = 0;
  for (const SyntheticCase& c : read_manifest()) {
    SCOPED_TRACE(c.kind + " " + c.type);
    const DType t = dtype_named(c.type);
    if (c.kind == "dequant_all16") {
      std::vector<uint16_t> in(65536);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
      std::vector<float> out(in.size());
      dequantize_row(t, in.data(), out.data(), static_cast<int64_t>(in.size()));
      EXPECT_EQ(hex64(poly64(out.data(), static_cast<int64_t>(out.size()))), c.args.at(0));
      ++all16_cases;
      continue;
    }
    const int64_t n = std::stoll(c.args.at(0));
    const std::vector<uint8_t> in = read_bytes(testing::data_path("quant/" + c.args.at(1)));
    const std::vector<uint8_t> want = read_bytes(testing::data_path("quant/" + c.args.at(2)));
    if (c.kind == "dequant") {
      ASSERT_EQ(static_cast<int64_t>(in.size()), *dtype_row_bytes(t, n));
      std::vector<float> out(static_cast<size_t>(n));
      dequantize_row(t, in.data(), out.data(), n);
      EXPECT_EQ(first_difference(out, as_floats(want)), "");
      ++dequant_cases;
    } else if (c.kind == "quant") {
      ASSERT_EQ(static_cast<int64_t>(in.size()), n * 4);
      const std::vector<float> x = as_floats(in);
      std::vector<uint8_t> out(static_cast<size_t>(*dtype_row_bytes(t, n)));
      quantize_row(t, x.data(), out.data(), n);
      ASSERT_EQ(out.size(), want.size());
      const int64_t block_bytes = dtype_info(t).type_size;
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != want[i]) {
          ADD_FAILURE() << "first differing byte " << i << " (block " << static_cast<int64_t>(i) / block_bytes
                        << "): got " << int{out[i]} << " want " << int{want[i]};
          break;
        }
      }
      ++quant_cases;
    } else {
      ADD_FAILURE() << "unknown case kind " << c.kind;
    }
  }
  EXPECT_EQ(dequant_cases, 10);
  EXPECT_EQ(all16_cases, 2);
  EXPECT_EQ(quant_cases, 7);
}

TEST(Quant, SupportedTypes) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8_E4M3, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                  DType::kQ8_K}) {
    EXPECT_TRUE(can_dequantize(t)) << dtype_name(t);
  }
  EXPECT_FALSE(can_dequantize(DType::kI32));
  EXPECT_FALSE(can_quantize(DType::kQ4_K));
  float out[32];
  const int32_t ints[32] = {};
  try {
    dequantize_row(DType::kI32, ints, out, 32);
    ADD_FAILURE() << "I32 dequantized";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  try {
    quantize_row(DType::kQ6_K, out, out, 256);
    ADD_FAILURE() << "Q6_K quantized";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
}

TEST(Quant, PartialBlockIsRejected) {
  BlockQ4_0 block{};
  float out[32];
  try {
    dequantize_row(DType::kQ4_0, &block, out, 31);
    ADD_FAILURE() << "31 elements of Q4_0 dequantized";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("32-element blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(DType::kQ8_0, out, &block, 16), Error);
}

// FP8 E4M3 (OCP "fn"): exhaustive against the definition (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8.
TEST(Quant, Fp8E4M3AllCodes) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  std::vector<float> out(256);
  dequantize_row(DType::kFP8_E4M3, codes.data(), out.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int e = (i >> 3) & 0x0F, m = i & 7;
    const double sign = (i & 0x80) ? -1.0 : 1.0;
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(m / 8.0, -6) : sign * std::ldexp(1.0 + m / 8.0, e - 7);
    EXPECT_EQ(out[i], static_cast<float>(want)) << "code " << i;
  }
  EXPECT_EQ(out[0x7E], 448.0f);
  EXPECT_EQ(out[0x38], 1.0f);
  EXPECT_EQ(out[0x01], 0x1p-9f);
  EXPECT_TRUE(std::signbit(out[0x80]));
}

// f32_to_fp8_e4m3 against a search over the definition: the nearest finite code (ties to the even code, whose
// mantissa's last bit is 0), ±448 from 448 up, NaN kept; on every midpoint between neighbouring codes and just
// either side of it, on random magnitudes across the whole range, and on specials. Round trips every code.
TEST(Quant, Fp8E4M3EncodeIsNearestEvenSaturating) {
  std::vector<double> value(127);  // positive finite codes 0x00..0x7E
  for (int c = 0; c < 127; ++c) value[c] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
  const auto oracle = [&](float x) -> uint8_t {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (std::isnan(x)) return sign | 0x7F;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= 448.0) return sign | 0x7E;
    int best = 0;
    for (int c = 1; c < 127; ++c) {
      const double d = std::fabs(value[c] - a), best_d = std::fabs(value[best] - a);
      if (d < best_d || (d == best_d && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>(sign | best);
  };
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 1e30f, 448.0f, 464.0f, 500.0f};
  for (int c = 0; c + 1 < 127; ++c) {
    const auto mid = static_cast<float>((value[c] + value[c + 1]) / 2);  // exact in float
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid, static_cast<float>(value[c])});
  }
  uint32_t state = 12345;
  for (int i = 0; i < 20000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float magnitude = std::ldexp(1.0f + static_cast<float>(state >> 8) / 16777216.0f, static_cast<int>(state % 24) - 14);
    xs.push_back(i % 2 == 0 ? magnitude : -magnitude);
  }
  for (float x : xs) ASSERT_EQ(f32_to_fp8_e4m3(x), oracle(x)) << "x " << x;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

// Q8_K has no gguf.quants reference; its layout is a float scale and int8 codes.
TEST(Quant, Q8KIsScaleTimesCode) {
  BlockQ8_K block{};
  block.d = 0.375f;
  for (int j = 0; j < kQK_K; ++j) block.qs[j] = static_cast<int8_t>(j - 128);
  std::vector<float> out(kQK_K);
  dequantize_row(DType::kQ8_K, &block, out.data(), kQK_K);
  for (int j = 0; j < kQK_K; ++j) EXPECT_EQ(out[j], 0.375f * static_cast<float>(j - 128)) << j;
}

// Block-scaled FP8 rows: each code's value times its 128-column block's scale, one rounding; FP8_E4M3_B128 itself has
// no row dequantizer (a row means nothing without its scales).
TEST(Quant, Fp8BlockRowIsCodeTimesItsBlockScale) {
  std::vector<uint8_t> codes(300);
  for (size_t i = 0; i < codes.size(); ++i) {
    codes[i] = static_cast<uint8_t>(i * 37 % 256);
    if ((codes[i] & 0x7F) == 0x7F) codes[i] ^= 1;  // no NaN: NaN != NaN
  }
  const float scales[] = {0.5f, 1.0f / 3.0f, 1e-30f};
  std::vector<float> out(300);
  dequantize_fp8_block_row(codes.data(), scales, out.data(), 300);
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(out[i], fp8_e4m3_to_f32(codes[i]) * scales[i / 128]) << i;
  EXPECT_FALSE(can_dequantize(DType::kFP8_E4M3_B128));
  EXPECT_FALSE(can_quantize(DType::kFP8_E4M3_B128));
  EXPECT_THROW(dequantize_row(DType::kFP8_E4M3_B128, codes.data(), out.data(), 300), Error);
}

}  // namespace
}  // namespace servetune

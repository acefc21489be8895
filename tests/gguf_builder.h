// Builds GGUF byte images in memory for tests and fuzz seeds: metadata of any type, tensors with raw data.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace servetune::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  void kv_u32(const std::string& key, uint32_t v) { kv_header(key, 4), put(v), ++n_kv_; }
  void kv_i32(const std::string& key, int32_t v) { kv_header(key, 5), put(v), ++n_kv_; }
  void kv_f32(const std::string& key, float v) { kv_header(key, 6), put(v), ++n_kv_; }
  void kv_bool(const std::string& key, bool v) { kv_header(key, 7), put(static_cast<uint8_t>(v)), ++n_kv_; }
  void kv_str(const std::string& key, const std::string& v) { kv_header(key, 8), put_str(v), ++n_kv_; }
  void kv_u64(const std::string& key, uint64_t v) { kv_header(key, 10), put(v), ++n_kv_; }
  void kv_f64(const std::string& key, double v) { kv_header(key, 12), put(v), ++n_kv_; }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    kv_header(key, 9);
    put(uint32_t{8});
    put(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) put_str(s);
    ++n_kv_;
  }
  void kv_f32_array(const std::string& key, const std::vector<float>& v) {
    kv_header(key, 9);
    put(uint32_t{6});
    put(static_cast<uint64_t>(v.size()));
    for (float f : v) put(f);
    ++n_kv_;
  }
  // A tensor whose bytes follow in the data section (offsets aligned to 32).
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t ggml_type, const std::vector<uint8_t>& data) {
    put_str_to(tensor_infos_, name);
    put_to(tensor_infos_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put_to(tensor_infos_, d);
    put_to(tensor_infos_, ggml_type);
    while (data_.size() % 32 != 0) data_.push_back(0);
    put_to(tensor_infos_, static_cast<uint64_t>(data_.size()));
    data_.insert(data_.end(), data.begin(), data.end());
    ++n_tensors_;
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> out;
    put_to(out, uint32_t{0x46554747});
    put_to(out, version_);
    put_to(out, n_tensors_);
    put_to(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), tensor_infos_.begin(), tensor_infos_.end());
    while (out.size() % 32 != 0) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  template <typename T>
  static void put_to(std::vector<uint8_t>& buf, T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    buf.insert(buf.end(), b, b + sizeof(T));
  }
  static void put_str_to(std::vector<uint8_t>& buf, const std::string& s) {
    put_to(buf, static_cast<uint64_t>(s.size()));
    buf.insert(buf.end(), s.begin(), s.end());
  }
  template <typename T>
  void put(T v) { put_to(kv_, v); }
  void put_str(const std::string& s) { put_str_to(kv_, s); }
  void kv_header(const std::string& key, uint32_t type) { put_str(key), put(type); }

  uint32_t version_;
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<uint8_t> tensor_infos_;
  std::vector<uint8_t> data_;
};

}  // namespace servetune::testing

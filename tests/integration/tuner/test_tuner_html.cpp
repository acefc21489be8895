// The HTML report in a real browser: headless Chromium renders a sweep's report.html to a PNG, which must show
// content (not a blank page) including the charts (pixels in the chart colors, such as the best candidate's green
// bar). Skipped when Chromium is not installed (required under SERVETUNE_REQUIRE_MODELS=1, as in CI).
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <vector>

#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
};

uint32_t be32(const uint8_t* p) { return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3]; }

// 8-bit RGB / RGBA, non-interlaced PNG (what Chromium writes).
Image decode_png(const std::string& bytes) {
  Image img;
  const auto* d = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() < 8 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return img;
  std::vector<uint8_t> idat;
  int channels = 0;
  for (size_t off = 8; off + 12 <= bytes.size();) {
    const uint32_t len = be32(d + off);
    const std::string type = bytes.substr(off + 4, 4);
    const uint8_t* body = d + off + 8;
    if (type == "IHDR") {
      img.width = be32(body);
      img.height = be32(body + 4);
      if (body[8] != 8 || body[12] != 0) return {};
      channels = body[9] == 6 ? 4 : (body[9] == 2 ? 3 : 0);
    } else if (type == "IDAT") {
      idat.insert(idat.end(), body, body + len);
    }
    off += 12 + len;
  }
  if (channels == 0) return {};
  const size_t stride = img.width * static_cast<size_t>(channels);
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK || raw_len != raw.size()) return {};
  std::vector<uint8_t> px(stride * img.height), prev(stride, 0);
  for (uint32_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &px[y * stride];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= static_cast<size_t>(channels) ? out[x - channels] : 0, b = prev[x];
      const int c = x >= static_cast<size_t>(channels) ? prev[x - channels] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : (pb <= pc ? b : c);
      }
      out[x] = static_cast<uint8_t>(in[x] + pred);
    }
    std::copy(out, out + stride, prev.begin());
  }
  img.rgb.reserve(img.width * img.height * 3);
  for (size_t i = 0; i < px.size(); i += static_cast<size_t>(channels)) img.rgb.insert(img.rgb.end(), &px[i], &px[i] + 3);
  return img;
}

std::string find_chromium() {
  for (const char* name : {"chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"}) {
    if (servetune_shell("command -v " + std::string(name) + " >/dev/null 2>&1")) return name;
  }
  return "";
}

TEST(TunerHtml, HeadlessChromiumRendersTheReport) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    if (require_fetched()) FAIL() << "headless Chromium is not installed (Debian package chromium-headless-shell)";
    GTEST_SKIP() << "headless Chromium is not installed (Debian package chromium-headless-shell)";
  }
  const fs::path dir = scratch("html");
  write_text(dir / "s.yaml", "name: html\ntarget: {engine: builtin, model: " + stories_path() +
                                 ", settings: {threads: 1}}\nspace: {max_running_requests: [1, 4, 16]}\n"
                                 "workloads:\n  - {name: w, dataset: random, input_len: 32, output_len: 16, num_prompts: 16}\n"
                                 "  - {name: load, dataset: random, input_len: 16, output_len: 8, num_prompts: 8, max_concurrency: [1, 2, 8]}\n");
  ASSERT_EQ(servetune("sweep " + (dir / "s.yaml").string() + " --output " + (dir / "run").string()).code, 0);
  const fs::path png = dir / "shot.png";
  const std::string cmd = chromium + " --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,2600 --screenshot=" +
                          png.string() + " file://" + (dir / "run" / "report.html").string() + " >/dev/null 2>&1";
  ASSERT_TRUE(servetune_shell(cmd)) << cmd;
  const Image img = decode_png(read_text(png));
  ASSERT_EQ(img.width, 1200u);
  ASSERT_EQ(img.height, 2600u);
  size_t ink = 0, green = 0;
  std::set<uint32_t> colors;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const uint8_t r = img.rgb[i], g = img.rgb[i + 1], b = img.rgb[i + 2];
    if (r < 240 || g < 240 || b < 240) ++ink;
    if (std::abs(r - 0x2c) < 8 && std::abs(g - 0xa0) < 8 && std::abs(b - 0x2c) < 8) ++green;
    colors.insert((uint32_t{r} << 16) | (uint32_t{g} << 8) | b);
  }
  const double ink_fraction = static_cast<double>(ink) / (static_cast<double>(img.rgb.size()) / 3.0);
  EXPECT_GT(ink_fraction, 0.03) << "the page looks blank";
  EXPECT_GT(colors.size(), 20u);
  EXPECT_GT(green, 500u) << "no best-candidate bar rendered";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace servetune::testing

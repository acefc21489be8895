// `servetune probe-device [--device D] [--threads N] [--json]`: measures the device's memory, copy bandwidth and bf16
// GEMM rate (servetune/device_probe.h); the device check reads --json to report utilisation and size its runs.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "servetune/device_probe.h"
#include "servetune/model_info.h"

namespace servetune::cli {
namespace {

struct ProbeOptions {
  std::string device = "cpu";
  int threads = 0;
  bool json = false;
};

void run_probe(const ProbeOptions& o) {
  const DeviceProbe p = probe_device(parse_device(o.device), o.threads);
  if (o.json) {
    const nlohmann::json j = {{"device", p.device},
                              {"name", p.name},
                              {"total_bytes", p.total_bytes},
                              {"free_bytes", p.free_bytes},
                              {"copy_buffer_bytes", p.copy_buffer_bytes},
                              {"copy_bytes_per_s", p.copy_bytes_per_s},
                              {"copy_what", p.copy_what},
                              {"gemm_flops", p.gemm_flops},
                              {"gemm_what", p.gemm_what},
                              {"fp8_gemm_flops", p.fp8_gemm_flops},
                              {"fp8_gemm_what", p.fp8_gemm_what}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("device:  %s (%s)\n", p.device.c_str(), p.name.c_str());
  std::printf("memory:  %s total, %s free\n", format_bytes(static_cast<double>(p.total_bytes)).c_str(),
              format_bytes(static_cast<double>(p.free_bytes)).c_str());
  std::printf("copy:    %.1f GB/s read + write (%s)\n", p.copy_bytes_per_s / 1e9, p.copy_what.c_str());
  std::printf("gemm:    %.3g TFLOP/s (%s)\n", p.gemm_flops / 1e12, p.gemm_what.c_str());
  if (p.fp8_gemm_flops > 0) std::printf("fp8:     %.3g TFLOP/s (%s)\n", p.fp8_gemm_flops / 1e12, p.fp8_gemm_what.c_str());
}

void add_probe_device_command(CLI::App& app) {
  auto opts = std::make_shared<ProbeOptions>();
  CLI::App* sub = app.add_subcommand("probe-device", "measure a device's memory, copy bandwidth and bf16 GEMM rate");
  sub->add_option("--device", opts->device, "cpu, cuda or hip (GPU builds)");
  sub->add_option("--threads", opts->threads, "CPU threads for the cpu's GEMM (0: all cores)");
  sub->add_flag("--json", opts->json, "one JSON object instead of text");
  sub->callback([opts] { run_probe(*opts); });
}

}  // namespace

SERVETUNE_REGISTER_COMMAND(95, add_probe_device_command);

}  // namespace servetune::cli

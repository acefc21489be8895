// Runtime x86 CPU feature detection (cpuid + xgetbv) and the ISA level the CPU kernels dispatch to.
// SERVETUNE_CPU_ISA=reference|avx2|avx512 forces a level (for testing); forcing one the CPU lacks is a usage error.
#pragma once

#include <optional>
#include <string_view>

namespace servetune {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
};

// What this CPU and OS support (the OS must save the YMM / ZMM state, checked with xgetbv). Computed once.
const CpuFeatures& cpu_features();

// Kernel levels, in increasing order. kAvx2 needs AVX2+FMA+F16C; kAvx512 needs those plus AVX-512 F/BW/VL/DQ/VNNI
// (AVX-512 BF16 is optional and checked separately by the kernels that use it).
enum class CpuIsa { kReference = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view cpu_isa_name(CpuIsa isa);
std::optional<CpuIsa> cpu_isa_from_name(std::string_view name);

// Best level this CPU supports.
CpuIsa cpu_best_isa();
// True when this CPU can run kernels of `isa`.
bool cpu_supports(CpuIsa isa);
// The level the kernels use: SERVETUNE_CPU_ISA if set (read once), else cpu_best_isa(). Throws Error(kUsage) for an
// unknown name or a level this CPU cannot run.
CpuIsa cpu_selected_isa();

}  // namespace servetune

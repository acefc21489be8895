// cpuid/xgetbv feature detection and SERVETUNE_CPU_ISA handling for the CPU kernel dispatch.
#include "core/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace servetune {
namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  const bool fma = (ecx >> 12) & 1;
  const bool f16c = (ecx >> 29) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state) return f;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned leaf7_ebx = ebx, leaf7_ecx = ecx;
  f.fma = fma;
  f.f16c = f16c;
  f.avx2 = (leaf7_ebx >> 5) & 1;
  if (zmm_state) {
    f.avx512f = (leaf7_ebx >> 16) & 1;
    f.avx512dq = (leaf7_ebx >> 17) & 1;
    f.avx512bw = (leaf7_ebx >> 30) & 1;
    f.avx512vl = (leaf7_ebx >> 31) & 1;
    f.avx512vnni = (leaf7_ecx >> 11) & 1;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx512bf16 = (eax >> 5) & 1;
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

CpuIsa select_isa() {
  const char* env = std::getenv("SERVETUNE_CPU_ISA");
  if (env == nullptr || *env == '\0') return cpu_best_isa();
  const std::optional<CpuIsa> isa = cpu_isa_from_name(env);
  if (!isa) throw_usage(std::string("SERVETUNE_CPU_ISA must be reference, avx2 or avx512, got '") + env + "'");
  if (!cpu_supports(*isa)) {
    throw_usage(std::string("SERVETUNE_CPU_ISA=") + env + " but this CPU supports at most " +
                std::string(cpu_isa_name(cpu_best_isa())));
  }
  return *isa;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kReference:
      return "reference";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::optional<CpuIsa> cpu_isa_from_name(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kReference, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  return std::nullopt;
}

bool cpu_supports(CpuIsa isa) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case CpuIsa::kReference:
      return true;
    case CpuIsa::kAvx2:
      return avx2;
    case CpuIsa::kAvx512:
      return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  }
  return false;
}

CpuIsa cpu_best_isa() {
  if (cpu_supports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_supports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kReference;
}

CpuIsa cpu_selected_isa() {
  static const CpuIsa isa = select_isa();
  return isa;
}

}  // namespace servetune

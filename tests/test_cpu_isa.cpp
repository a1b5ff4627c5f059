// FLASHATTN_CPU_ISA really selects the CPU kernels it names (the ISA reruns of the sweep rely on
// it), and without it the best set the machine supports is chosen.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cpu/kernels.h"

TEST(CpuIsa, FollowsTheEnvironmentOrTheMachine) {
  const std::string isa = flashattn::cpu::cpu_isa();
  const char* forced = std::getenv("FLASHATTN_CPU_ISA");
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
  __builtin_cpu_init();
  const bool v4 = __builtin_cpu_supports("x86-64-v4"), v3 = __builtin_cpu_supports("x86-64-v3");
  const std::string best = v4 ? "avx512" : (v3 ? "avx2" : "baseline");
  if (!forced) {
    EXPECT_EQ(isa, best);
  } else if (std::string(forced) == "baseline" || (std::string(forced) == "avx2" && v3)) {
    EXPECT_EQ(isa, forced);
  }
#else
  EXPECT_EQ(isa, "baseline") << (forced ? forced : "");
#endif
}

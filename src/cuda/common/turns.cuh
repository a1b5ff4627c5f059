// Turns in global memory: one int per dQ tile of a deterministic backward, holding 1 + the key
// block that added to the tile last (zeroed before the launch). One thread of a block waits for
// its predecessor's value with acquire loads, and hands the tile on with a release store after a
// barrier that follows every thread's adds, which the release then orders before the next
// adder's at gpu scope. The waits are deadlock-free only if the block waited for was launched
// before the waiting one (both backwards launch key blocks in descending order).
#pragma once

namespace flashattn::cuda {

__device__ __forceinline__ void wait_for_turn(const int* turn, int predecessor) {
  int now;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(turn) : "memory");
    if (now == predecessor + 1) return;
    __nanosleep(64);
  }
}

// Hands the tile on from key block `adder`.
__device__ __forceinline__ void release_turn(int* turn, int adder) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(turn), "r"(adder + 1) : "memory");
}

}  // namespace flashattn::cuda

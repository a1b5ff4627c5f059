// The sm80 backward's shared dropout draws (cuda/sm80/dropout_draws.h): a warp simulated call by
// call and rotation by rotation, as the kernel runs it, ends with every lane holding the keep
// decision of each of its S^T elements exactly as semantics::Dropout::keep draws it.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/semantics.h"
#include "cuda/sm80/dropout_draws.h"

namespace {

using flashattn::cuda::dropout_element;
using flashattn::cuda::dropout_keep_byte;
using flashattn::cuda::dropout_received_bits;
using flashattn::cuda::dropout_source;
using flashattn::cuda::DropoutElement;
using flashattn::cuda::DropoutKeepBits;
using flashattn::semantics::Dropout;
using flashattn::semantics::Philox4;

// Keep bits of the 32 lanes after the kernel's rounds and rotations (dropout_keep_bits in the
// backward kernel).
template <int kKeyTiles, int kQueryTiles>
using Bits = DropoutKeepBits<kKeyTiles, kQueryTiles>;

template <int kKeyTiles, int kQueryTiles>
void simulate_warp(const Dropout& drop, int64_t batch_head, int64_t query0, int64_t key0,
                   Bits<kKeyTiles, kQueryTiles> (&keep)[32]) {
  constexpr int kElements = 4 * kKeyTiles * kQueryTiles;
  Bits<kKeyTiles, kQueryTiles> mine[32] = {};
  for (int round = 0; round < kElements / 8; ++round)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      const DropoutElement e = dropout_element<kQueryTiles>(round * 8 + g);
      const Philox4 r =
          drop.draws(batch_head, query0 + e.query_tile * 8 + 2 * t + e.c, (key0 >> 3) + e.key_tile * 2 + e.half);
      mine[lane] |= Bits<kKeyTiles, kQueryTiles>(dropout_keep_byte(r, drop.threshold)) << (8 * round);
    }
  for (auto& k : keep) k = 0;
  for (int rotation = 0; rotation < 8; ++rotation)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4, source = dropout_source(g, rotation);
      keep[lane] |= dropout_received_bits(mine[source * 4 + t], g, source);
    }
}

template <int kKeyTiles, int kQueryTiles>
void check_warp(const Dropout& drop, int64_t batch_head, int64_t query0, int64_t key0) {
  Bits<kKeyTiles, kQueryTiles> keep[32];
  simulate_warp<kKeyTiles, kQueryTiles>(drop, batch_head, query0, key0, keep);
  int dropped = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int kt = 0; kt < kKeyTiles; ++kt)
      for (int half = 0; half < 2; ++half)
        for (int qt = 0; qt < kQueryTiles; ++qt)
          for (int c = 0; c < 2; ++c) {
            const int element = ((kt * 2 + half) * kQueryTiles + qt) * 2 + c;
            const int64_t i = query0 + qt * 8 + 2 * t + c, j = key0 + kt * 16 + half * 8 + g;
            const bool expected = drop.keep(batch_head, i, j);
            dropped += !expected;
            EXPECT_EQ(((keep[lane] >> element) & 1u) != 0, expected)
                << "lane " << lane << ", element " << element << " (query " << i << ", key " << j << ")";
          }
  }
  EXPECT_GT(dropped, 0) << "the case should drop some elements";
}

TEST(BackwardDropoutDraws, EveryLaneGetsItsElementsDraws) {
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    const Dropout drop = Dropout::make(p, 0x1234'5678'9abcULL, 77);
    for (const int64_t batch_head : {0, 5})
      for (const int64_t query0 : {0, 32, 4064})
        for (const int64_t key0 : {0, 48, 4096}) {
          check_warp<2, 8>(drop, batch_head, query0, key0);  // 128 query rows a step: 64 elements a lane
          check_warp<2, 4>(drop, batch_head, query0, key0);  // 128 keys a block: 32 elements a lane
          check_warp<1, 4>(drop, batch_head, query0, key0);  // 64 keys a block: 16
        }
  }
}

}  // namespace

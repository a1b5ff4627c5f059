// How the sm80 backward shares Philox draws among the lanes of a warp: each call is made once
// and its keep decisions, as bits, go to the lanes that need them. Plain C++: the host tests
// simulate a warp with it, the kernel runs it with shuffles.
//
// The backward holds S^T: lane 4 g + t has keys g and g + 8 of each 16-key tile and queries
// 2 t, 2 t + 1 of each 8-query tile. One Philox call gives the draws of 8 consecutive keys (a key
// group) of one query, which the 8 lanes of a column t (g = 0..7) need one each. The elements of
// a lane, numbered
//   element = ((key_tile * 2 + half) * query_tiles + query_tile) * 2 + c
// (keys key_tile * 16 + half * 8 + g, query query_tile * 8 + 2 t + c), go in rounds of 8: in
// round `round` lane g of column t makes the call of element round * 8 + g of its column and
// compares its 8 draws with the threshold, keeping the bits in byte `round` of a word (bit k for
// key k of the group: lane k's; 64 bits for more than 4 rounds). After the rounds each lane of
// the column sends that word to the others (7 shuffles), and lane g takes bit g of each byte of
// sender s's word as its bit s: an 8 x 8 bit transpose per round. Drawing per element would make
// each call 8 times; sending 16-bit draws instead of bits would take 8 shuffles and a word
// selection per round.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/semantics.h"  // FA_HD, Dropout

namespace flashattn::cuda {

struct DropoutElement {
  int key_tile, half, query_tile, c;
};

// A lane's keep bits, bit `element` each: 32 bits, or 64 for more than 4 rounds.
template <int kKeyTiles, int kQueryTiles>
using DropoutKeepBits = std::conditional_t<(4 * kKeyTiles * kQueryTiles > 32), uint64_t, uint32_t>;

template <int kQueryTiles>
FA_HD constexpr DropoutElement dropout_element(int element) {
  return {element / (4 * kQueryTiles), element / (2 * kQueryTiles) % 2, element / 2 % kQueryTiles, element % 2};
}

// The keep bits of one call's 8 draws, bit k for key k of its group.
FA_HD uint32_t dropout_keep_byte(const semantics::Philox4& r, uint32_t threshold) {
  uint32_t bits = 0;
  for (int k = 0; k < 8; ++k) bits |= uint32_t(semantics::Dropout::draw_of(r, k) >= threshold) << k;
  return bits;
}

// Rotation r (0 to 7): the lane of its column whose word lane g takes, and what it takes of it:
// bit g of each round's byte, as its bits `source` of those bytes.
FA_HD constexpr int dropout_source(int g, int rotation) { return (g + rotation) & 7; }
template <typename Bits>
FA_HD constexpr Bits dropout_received_bits(Bits sent, int g, int source) {
  return ((sent >> g) & Bits(0x0101010101010101ull)) << source;
}

}  // namespace flashattn::cuda

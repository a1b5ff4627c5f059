// How the sm80 backward shares Philox draws among the lanes of a warp. Plain C++: the host
// tests simulate a warp with it, the kernel runs it with shuffles.
//
// The backward holds S^T: lane 4 g + t has keys g and g + 8 of each 16-key tile and queries
// 2 t, 2 t + 1 of each 8-query tile. One Philox call gives the draws of 8 consecutive keys (a key
// group) of one query, which the 8 lanes of a column t (g = 0..7) need one each. Drawing per
// element would make each call 8 times. Instead the elements of a lane, numbered
// element = ((key_tile * 2 + half) * query_tiles + query_tile) * 2 + c
// (keys key_tile * 16 + half * 8 + g, query query_tile * 8 + 2 t + c), go in rounds of 8: in
// round `round`, lane g of column t draws for element round * 8 + g of its column, then over 8
// rotations receives from lane (g + r) % 8 of the column the word holding its own key's draw
// (word g / 2, half g % 2) of element round * 8 + (g + r) % 8.
#pragma once

#include "core/semantics.h"  // FA_HD

namespace flashattn::cuda {

struct DropoutElement {
  int key_tile, half, query_tile, c;
};

template <int kQueryTiles>
FA_HD constexpr DropoutElement dropout_element(int element) {
  return {element / (4 * kQueryTiles), element / (2 * kQueryTiles) % 2, element / 2 % kQueryTiles, element % 2};
}

// Rotation r: the lane (of a column) that lane g receives from, and the word it sends: the one
// its receiver (g_receiver = (g - r) % 8) needs.
FA_HD constexpr int dropout_source(int g, int rotation) { return (g + rotation) & 7; }
FA_HD constexpr int dropout_sent_word(int g, int rotation) { return ((g - rotation) & 7) >> 1; }

}  // namespace flashattn::cuda

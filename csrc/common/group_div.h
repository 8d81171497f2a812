// i / G for the row index i of a KV-major item and the query-head group G = Hq / Hkv, by a
// multiply instead of a division (sparse_attn/kv_major_sm90.cuh builds a tile's row tables with
// it). Host and device, so that the host tests check it over its whole range.
//
// With magic = ceil(2^32 / G) (2 <= G), floor(i magic / 2^32) = floor(i / G) while i G < 2^32:
// i magic / 2^32 = i / G + i (magic - 2^32 / G) / 2^32, and the excess is below i / 2^32 < 1 / G,
// which is not enough to carry i / G past the next integer (its fraction is at most 1 - 1 / G).
// A KV-major item has at most kKvm90MaxTokensPerItem = 1024 tokens, so i < 1024 G, and i G < 2^32
// holds for G < 2048; above that (and for a magic of 0) the division is taken.
#pragma once

#include <cstdint>

#include "flashmsa/types.h"

namespace flashmsa {

inline constexpr int kGroupDivMaxG = 2048;       // exclusive bound of the multiply form
inline constexpr int kGroupDivMaxRowsPerG = 1024;  // i < 1024 G: the rows of one KV-major item

// The multiplier of group_div: ceil(2^32 / G) for 2 <= G < kGroupDivMaxG, else 0 (divide).
MSA_HOST_DEVICE uint32_t group_div_magic(int G) {
  return G >= 2 && G < kGroupDivMaxG ? uint32_t(0xFFFFFFFFull / uint32_t(G)) + 1u : 0u;
}

// i / G for 0 <= i < kGroupDivMaxRowsPerG * G, magic = group_div_magic(G).
MSA_HOST_DEVICE int group_div(int i, int G, uint32_t magic) {
  if (G == 1) return i;
  if (magic == 0) return i / G;
#if defined(__CUDA_ARCH__)
  return int(__umulhi(uint32_t(i), magic));
#else
  return int((uint64_t(uint32_t(i)) * magic) >> 32);
#endif
}

}  // namespace flashmsa

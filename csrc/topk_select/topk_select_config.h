// Tile sizes, shared memory plan and kernel parameters of msa_topk_select on SM80+.
// docs/design/topk_select.md explains the schedule and the numbers chosen here.
#pragma once

#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/types.h"

namespace flashmsa::cuda::topk {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
// Tokens per CTA: a row of the score tile is 32 consecutive tokens = 128 contiguous bytes, so the
// loads of the (P, S) column-major-per-token layout are fully coalesced.
inline constexpr int kTokens = 32;
// Blocks per chunk: one warp holds a chunk of one row in registers, 8 keys per lane. P <= 256 (32K
// context) is one chunk; longer rows stream chunk by chunk, carrying the best `target` so far.
inline constexpr int kChunk = 256;
inline constexpr int kKeysPerLane = kChunk / 32;
// +1 word per tile row: a warp reading one token's column (rows lane + 32 i) hits 32 banks.
inline constexpr int kTileStride = kTokens + 1;
inline constexpr int kTileWords = kChunk * kTileStride;
inline constexpr int kMaxCarry = kMaxTopk;

// Per-row selection state, one per token of the CTA.
struct RowInfo {
  int nvp;        // clamped num_valid_pages
  int fb;         // forced begin blocks [0, fb)
  int fe;         // forced end blocks [nvp - fe, nvp)
  int mid_begin;  // candidates [mid_begin, mid_end)
  int mid_end;
  int target;   // candidates to choose (0: the row has only forced blocks)
  int n_carry;  // candidates chosen so far (multi-chunk rows), ascending in carry_idx
};

// Shared memory: the fixed part (row states, union range, the carry of multi-chunk rows) at
// compile-time offsets, then `num_buffers` score tiles (sized on the host: 1 when P <= kChunk).
// The 16 KB carry is allocated even for single-chunk launches: at <= 64 registers x 256 threads
// four CTAs fit an SM either way (4 x 51 KB < 228 KB), and fixed offsets keep registers free.
struct SharedStorage {
  RowInfo rows[kTokens];
  int block_begin;  // union of the rows' candidate ranges: blocks [block_begin, block_end)
  int block_end;    // (block_begin >= block_end: no row has a candidate)
  alignas(16) uint32_t carry_key[kTokens][kMaxCarry];  // chosen so far, ascending block order
  int carry_idx[kTokens][kMaxCarry];
  alignas(16) uint32_t tiles[1][kTileWords];  // [num_buffers][kChunk][kTileStride]
};

struct KernelParams {
  TopkSelectParams p;
  int token_groups;  // ceil(S / kTokens)
  int items;         // H * token_groups (< 2^31, checked on the host)
  int num_buffers;   // 1 (P <= kChunk) or 2 (chunks double-buffered)
};

// Bytes of dynamic shared memory of a launch.
constexpr size_t smem_bytes(int num_buffers) {
  return sizeof(SharedStorage) + size_t(num_buffers - 1) * kTileWords * 4;
}

}  // namespace flashmsa::cuda::topk

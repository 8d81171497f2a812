// Tile sizes, shared memory plan and kernel parameters of msa_topk_select on SM80+.
// docs/design/topk_select.md explains the schedule and the numbers chosen here.
#pragma once

#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/types.h"

namespace flashmsa::cuda::topk {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
// Tokens per CTA of the warp-per-row kernel: a row of the score tile is 32 consecutive tokens = 128
// contiguous bytes, so the loads of the (P, S) column-major-per-token layout are fully coalesced.
// Decode-sized calls (a few hundred rows) use 8 tokens per CTA instead: 4x the CTAs, one row per
// warp, for latency (rows of 32 contiguous bytes: one memory sector each).
inline constexpr int kTokens = 32;
inline constexpr int kTokensSmall = 8;
// Blocks per chunk: one warp holds a chunk of one row in registers, 8 keys per lane. P <= 256 (32K
// context) is one chunk; longer rows stream chunk by chunk, carrying the best `target` so far.
inline constexpr int kChunk = 256;
inline constexpr int kKeysPerLane = kChunk / 32;
// +1 word per tile row: a warp reading one token's column (rows lane + 32 i) hits 32 banks (the
// stride is odd for both token counts).
template <int kTok>
inline constexpr int kTileStride = kTok + 1;
template <int kTok>
inline constexpr int kTileWords = kChunk * kTileStride<kTok>;
inline constexpr int kMaxCarry = kMaxTopk;
// Split rows (warp_split, topk_split_kernel.cuh): a CTA per row, its chunks split over at most this
// many warps (one chunk each up to 8 chunks = P 2048; longer rows give each warp a run of chunks).
inline constexpr int kSplitWarps = kWarps;

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
template <int kTok>
struct SharedStorage {
  RowInfo rows[kTok];
  int block_begin;  // union of the rows' candidate ranges: blocks [block_begin, block_end)
  int block_end;    // (block_begin >= block_end: no row has a candidate)
  alignas(16) uint32_t carry_key[kTok][kMaxCarry];  // chosen so far, ascending block order
  int carry_idx[kTok][kMaxCarry];
  alignas(16) uint32_t tiles[1][kTileWords<kTok>];  // [num_buffers][kChunk][kTileStride]
};

struct KernelParams {
  TopkSelectParams p;
  int token_groups;  // ceil(S / tokens per CTA)
  int items;         // H * token_groups (< 2^31, checked on the host)
  int num_buffers;   // 1 (P <= kChunk) or 2 (chunks double-buffered)
};

// Bytes of dynamic shared memory of a launch.
template <int kTok>
constexpr size_t smem_bytes(int num_buffers) {
  return sizeof(SharedStorage<kTok>) + size_t(num_buffers - 1) * kTileWords<kTok> * 4;
}

// ---- the thread-per-row radix kernel (topk_radix_kernel.cuh) ---------------------------------

namespace radix {

// Radix digit: 4 bits, 16 bins per row (one 32-bit counter per bin and lane).
inline constexpr int kBins = 16;
// A chunk whose survivors (entries below the full carry's largest key) number w is merged into
// the carry one survivor at a time when w * (target + 4) <= kInsertBudget (each insertion scans
// and shifts the carry), else by a radix select: 8 survivors at topk 16, 2 at topk 64.
inline constexpr int kInsertBudget = 160;

// One variant of the kernel (docs/design/topk_select.md, "Thread per row" and "Lean variants";
// three are built: Classic, Lean1Buf and Uniform1Buf):
//   kBuffers: chunk buffers per warp (2: chunk c + 1 loads while chunk c is chosen from; 1: the
//     warps of the SM hide each other's loads instead, at less shared memory per warp);
//   kChunk: blocks per chunk (kChunk x 32 tokens x 4 bytes per buffer; an offset fits a byte);
//   kWarps: warps per CTA. The warps share nothing, so this only sets how finely shared memory is
//     handed out (every CTA also costs the SM 1 KB of reserved shared memory);
//   kLean: the lean trims: a row's first chunk converted in place (no compaction
//     bookkeeping), the insertion-or-radix choice made warp-uniform, and the radix select started
//     at the keys' range [min, max] (bins at most one float exponent wide from the smallest key,
//     the last one taking every key above) instead of the top 4 bits;
//   kUniform (lean only): the passes without per-lane branches and with warp-uniform trip counts
//     (docs/design/topk_select.md, "Uniform passes"): the filter compacts branch-free, the select's
//     survivor passes run to the warp's largest survivor count (rows past a lane's own count
//     masked), and the ordered output is branch-free per key, its `last` choice hoisted out of the
//     loop and the carry's block ids loaded with its keys.
template <int kBuffers_, int kChunk_, int kWarps_, bool kLean_, bool kUniform_ = false>
struct Variant {
  static constexpr int kBuffers = kBuffers_;
  static constexpr int kChunk = kChunk_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = 32 * kWarps_;
  static constexpr bool kLean = kLean_;
  static constexpr bool kUniform = kUniform_;
  static_assert(kBuffers == 1 || kBuffers == 2, "one or two chunk buffers");
  static_assert(kLean || !kUniform, "the uniform passes are built on the lean select");
  static_assert(kChunk % 8 == 0 && kChunk <= 256, "a block offset in the chunk fits a byte");

  // 32-bit words of shared memory per warp, every array [rows][32 lanes]: carried keys and block
  // ids [carry] each, chunk tiles [kBuffers][kChunk], byte offsets [kChunk / 4] (four bytes of
  // one lane a word), histogram [kBins + 1] (the last bin counts the keys outside the prefix and
  // is never read). Every part starts 16-byte aligned.
  static constexpr int warp_words(int carry) {
    return 2 * carry * 32 + kBuffers * kChunk * 32 + kChunk * 8 + (kBins + 1) * 32;
  }
  static constexpr size_t smem_bytes(int carry) { return size_t(warp_words(carry)) * 4 * kWarps; }
};

// radix: 2 warps of ~24 KB (topk 16) per CTA, 4 CTAs = 8 warps per SM.
using Classic = Variant<2, 64, 2, false>;
// radix_1buf: one buffer of 64 blocks, one warp (~16 KB at topk 16) per CTA: 13 warps per SM.
using Lean1Buf = Variant<1, 64, 1, true>;
// radix_uniform: radix_1buf (same buffers, warps and shared memory) with the uniform passes.
using Uniform1Buf = Variant<1, 64, 1, true, true>;

struct Params {
  TopkSelectParams p;
  int token_groups;  // ceil(S / 32)
  int groups;        // H * token_groups (< 2^31, checked on the host)
  int carry;         // topk - force_begin - force_end: the most candidates a row chooses
  int vec;           // 1: 16-byte loads (S % 4 == 0 and score 16-byte aligned), else 4-byte
};

}  // namespace radix

}  // namespace flashmsa::cuda::topk

// msa_topk_select, sorting networks (plan kernel `net`): L lanes per (token, head) row, each
// keeping the K smallest candidate words of its share of the row in registers (topk_net.h: the
// words, the networks, the exact boundary rule), the L shares merged by shuffles, the choice
// written in block order. No shared memory, no branch on data except the rare second pass.
//
// A warp holds 32 / L rows: 32 / L consecutive tokens of one head (L = 1: 32 rows, lane l the row
// of token s0 + l; a candidate block's 32 scores are one 128-byte line, so every load of the warp
// is coalesced). Lane `part` of a row takes the row's blocks lo + part, lo + part + L, ... ([lo,
// hi): the union of the warp's candidate ranges; a block outside the lane's own range is kSent),
// 16 at a time: loads, words, a 16-input network, the merge into its K smallest. Warps run the
// longest rows first (token groups in descending order, heads interleaved), as the radix kernel.
// docs/design/topk_select.md, "Sorting networks".
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "topk_select/topk_net.h"

namespace flashmsa::cuda::topk::net {

inline constexpr int kWarpsPerCta = 4;

struct Params {
  TopkSelectParams p;
  int token_groups;  // ceil(S / (32 / L))
  int groups;        // H * token_groups (< 2^31, checked on the host)
};

// One pass over this lane's share of the row: best := the K smallest words of best (all kSent on
// entry) and the words `word(score, block - lo)` of blocks lo + part + L j in [lo, hi) (those
// outside [r_lo, r_hi) when kRange: kSent, not loaded). col: the row's score column (block b at
// col[b * stride]). Warp-uniform trip counts; no shuffles. The loads of batch j0 + 16 are issued
// before the network of batch j0, so that they are in flight while it runs. first,
// with have_first, the first batch's scores, already loaded (every block of it below num_blocks).
template <int K, int L, bool kRange, class Word>
__device__ __forceinline__ void scan_share(uint32_t (&best)[K], const float* col, int64_t stride,
                                           int lo, int hi, int part, int r_lo, int r_hi, Word word,
                                           const float (&first)[kBatch], bool have_first) {
  const int span = hi - lo;
  const int n_full = span / L;            // every part has its elements j < n_full
  const int n_any = (span + L - 1) / L;   // part 0 has the most
  const int64_t step = int64_t(L) * stride;
  const auto in_share = [&](int j) {
    const int blk = lo + part + L * j;
    return blk < hi && (!kRange || (blk >= r_lo && blk < r_hi));
  };
  // Whether every element of the batch at j0 exists in every lane (warp-uniform).
  const auto full = [&](int j0) { return !kRange && j0 + kBatch <= n_full; };
  const auto load = [&](int j0, const float* ptr, float (&v)[kBatch]) {
    if (full(j0)) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = __ldg(ptr + i * step);
    } else {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = in_share(j0 + i) ? __ldg(ptr + i * step) : 0.0f;
    }
  };
  const float* ptr = col + int64_t(lo + part) * stride;
  float v[kBatch];
  if (have_first) {  // warp-uniform
#pragma unroll
    for (int i = 0; i < kBatch; ++i) v[i] = first[i];
  } else {
    load(0, ptr, v);
  }
  for (int j0 = 0; j0 < n_any; j0 += kBatch) {
    uint32_t w[kBatch];
    if (full(j0)) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) w[i] = word(v[i], part + L * (j0 + i));
    } else {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) w[i] = in_share(j0 + i) ? word(v[i], part + L * (j0 + i)) : kSent;
    }
    ptr += kBatch * step;
    if (j0 + kBatch < n_any) load(j0 + kBatch, ptr, v);
    sort_words(w);
    if (j0 == 0) {  // best is all kSent: the K smallest are the batch's words
#pragma unroll
      for (int i = 0; i < kBatch; ++i) best[i] = w[i];
    } else {
      merge_into(best, w);
    }
  }
}

// The L lanes of a row (lanes L t .. L t + L - 1) end with the K smallest words of all their
// shares, each lane the same (a butterfly: partners merge each other's sorted words).
template <int K, int L>
__device__ __forceinline__ void team_merge(uint32_t (&best)[K]) {
#pragma unroll
  for (int m = 1; m < L; m <<= 1) {
    uint32_t other[K];
#pragma unroll
    for (int i = 0; i < K; ++i) other[i] = __shfl_xor_sync(0xFFFFFFFFu, best[i], m);
    merge_into(best, other);
  }
}

// CTAs per SM the registers must allow: K = 16 at <= 102 registers (20 warps per SM), K = 32 at
// <= 128 (16 warps).
template <int K>
inline constexpr int kMinCtasPerSm = K == 16 ? 5 : 4;

template <int K, int L>
__global__ void __launch_bounds__(kWarpsPerCta * 32, kMinCtasPerSm<K>)
    topk_net_kernel(const __grid_constant__ Params np) {
  static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0, "lanes per row: a power of two <= 32");
  const TopkSelectParams& p = np.p;
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * kWarpsPerCta + (threadIdx.x >> 5);
  if (g >= np.groups) return;  // warp-uniform
  constexpr int kRows = 32 / L;
  const int part = lane % L;
  const int h = g % p.num_heads;
  const int s = (np.token_groups - 1 - g / p.num_heads) * kRows + lane / L;
  const bool has_row = s < p.num_tokens;
  const float* col = p.score + int64_t(h) * p.num_blocks * p.num_tokens + (has_row ? s : 0);
  const int64_t stride = p.num_tokens;
  // num_valid_pages first (its load must not queue behind the 16 below), then the first batch of
  // the lane's share, loaded before num_valid_pages arrives: candidates start at force_begin
  // whenever a row has any, so unless the warp's range starts elsewhere these are the first
  // batch's scores, and the loads after the ranges do not wait a second DRAM round trip
  // (decode-sized calls are latency).
  int64_t nvp_in = 0;
  if (has_row) {
    nvp_in = p.num_valid_pages != nullptr ? int64_t(__ldg(p.num_valid_pages + s))
                                          : int64_t(p.num_valid_pages_value);
  }
  float first[kBatch];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int blk = p.force_begin + part + L * i;
    first[i] = has_row && blk < p.num_blocks ? __ldg(col + int64_t(blk) * stride) : 0.0f;
  }

  TopkRanges r{};
  int* out_row = nullptr;
  if (has_row) {
    r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
    out_row = p.out + (int64_t(s) * p.num_heads + h) * p.topk;
  }
  const bool active = has_row && r.target > 0;
  const int n_sel = active ? r.target : 0;
  // Forced blocks and the -1 tail ([0, fb) | n_sel chosen | [nvp - fe, nvp) | -1 ...), the
  // row's positions j = part (mod L).
  if (has_row) {
    for (int j = part; j < p.topk; j += L) {
      if (j < r.fb) {
        out_row[j] = j;
      } else if (j >= r.fb + n_sel) {
        const int e = j - r.fb - n_sel;
        out_row[j] = e < r.fe ? r.nvp - r.fe + e : -1;
      }
    }
  }

  // The union of the warp's candidate ranges: only those blocks are read.
  const int lo = __reduce_min_sync(0xFFFFFFFFu, active ? r.mid_begin : INT_MAX);
  const int hi = __reduce_max_sync(0xFFFFFFFFu, active ? r.mid_end : 0);
  if (lo >= hi) return;  // warp-uniform
  const bool uniform = __all_sync(0xFFFFFFFFu, active && r.mid_begin == lo && r.mid_end == hi);
  const int b = offset_bits(hi - lo);  // hi - lo <= kMaxSpan (the plan's bound)
  const uint32_t high_mask = ~((1u << b) - 1u);
  const int r_lo = active ? r.mid_begin : 0;
  const int r_hi = active ? r.mid_end : 0;

  uint32_t best[K];
#pragma unroll
  for (int i = 0; i < K; ++i) best[i] = kSent;
  const auto w1 = [high_mask](float v, int off) { return word1(v, off, high_mask); };
  const bool have_first = lo == p.force_begin;  // warp-uniform
  if (uniform) {
    scan_share<K, L, false>(best, col, stride, lo, hi, part, r_lo, r_hi, w1, first, have_first);
  } else {
    scan_share<K, L, true>(best, col, stride, lo, hi, part, r_lo, r_hi, w1, first, have_first);
  }
  team_merge<K, L>(best);

  // The cut: the target-th word; a straddle when the next word has the same truncated key.
  const uint32_t t_word = active ? word_at(best, r.target - 1) : 0u;
  const uint32_t n_word = active ? word_at(best, r.target) : 0u;  // target < K (the plan's bound)
  const bool straddle = active && ((t_word ^ n_word) & high_mask) == 0u;
  uint32_t best2[K];
#pragma unroll
  for (int i = 0; i < K; ++i) best2[i] = kSent;
  if (__any_sync(0xFFFFFFFFu, straddle)) {
    const uint32_t cut = t_word & high_mask;
    const auto w2 = [b, high_mask, cut](float v, int off) { return word2(v, off, b, high_mask, cut); };
    scan_share<K, L, true>(best2, col, stride, lo, hi, part, straddle ? r_lo : 0, straddle ? r_hi : 0,
                           w2, first, false);
    team_merge<K, L>(best2);
  }
  if (!active) return;

  uint32_t sel[K];
  chosen_offsets(best, best2, r.target, straddle, high_mask, sel);
#pragma unroll
  for (int i = 0; i < K; ++i) {
    if (i < n_sel && (r.fb + i) % L == part) out_row[r.fb + i] = lo + int(sel[i]);
  }
}

}  // namespace flashmsa::cuda::topk::net

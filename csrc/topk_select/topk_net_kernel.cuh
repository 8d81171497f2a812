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
//
// With a pivot (N > 0, plan option net_pivot: a warp per row, L = 32, rows of at most 32 N
// candidates) the warp first tries a short path: each lane's N scores as order keys, the
// target-th smallest of the 32 lanes' minima as a pivot (at least `target` keys are <= it, so the
// row's best `target` are among the keys <= it), those survivors compacted into shared memory and,
// when there are at most 32, sorted by (key, block) across the warp; the first `target` are the
// choice. More survivors (ties, adversarial rows) run the network path in the same warp. The
// result is the same either way: the choice is the exact top `target` of a total order.
// docs/design/topk_select.md, "Pivot before the networks".
//
// The pivot path's two forms (plan option net_pivot_mode): `sort`, a warp per row (pivot_row,
// in topk_net_kernel): three bitonic sorts across the warp (the lanes' minima, the survivors by
// (key, block), the chosen blocks), each 15 dependent shuffle stages; `rank_cta`
// (topk_pivot_cta_kernel; auto's for rows of more than 256 blocks since the H200 runs at 0e3ed29 /
// 9903d0a): a CTA of 4 warps a row, each a
// quarter of the row's scores, the lanes' minima meeting in shared memory; it counts instead of
// sorting: the pivot and the cut are k-th smallest keys (warp_kth_smallest: 31 shuffles, none
// waiting on another), the survivors are compacted in block order by ballots, so the chosen are the
// keys below the cut and the first ties at it in block order, placed by a ballot.
// docs/design/topk_select.md, "Counting instead of sorting".
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

// Sorts one value per lane ascending across the warp (lane i gets the i-th smallest): a bitonic
// network of shuffles, 15 stages.
template <class T>
__device__ __forceinline__ T warp_sort(T v, int lane) {
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const T x = __shfl_xor_sync(0xFFFFFFFFu, v, j);
      const bool keep_min = ((lane & j) == 0) == ((lane & k) == 0);
      v = keep_min ? (x < v ? x : v) : (x < v ? v : x);
    }
  }
  return v;
}

// The pivot path of one row (a whole warp; N scores a lane, slot i of lane l = block lo + l + 32 i,
// those at or past hi not candidates): writes the target chosen blocks ascending at chosen[0..)
// and returns true, or returns false (warp-uniform) when the networks must run instead: more than
// 32 keys survive the pivot, or the pivot is 0xFFFFFFFF (the key of an empty slot; a real key
// only for a negative NaN with a full payload). v: the lane's N scores; stage: this warp's 32
// entries of shared memory.
template <int N>
__device__ __forceinline__ bool pivot_row(const float (&v)[N], int lo, int hi, int lane, int target,
                                          int* chosen, uint2* stage) {
  const int slots = (hi - lo - lane + 31) >> 5;  // the lane's candidates: slots i < slots
  uint32_t key[N];
  uint32_t lane_min = 0xFFFFFFFFu;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    key[i] = i < slots ? topk_order_key(v[i]) : 0xFFFFFFFFu;
    lane_min = umin(lane_min, key[i]);
  }
  // At least `target` candidates have keys <= pivot: the minima of the `target` lanes sorted
  // first (target <= min(32, the row's candidates), so each of those lanes has a candidate).
  // Any candidate with a larger key ranks below all of them, so the best `target` all survive.
  const uint32_t pivot = __shfl_sync(0xFFFFFFFFu, warp_sort(lane_min, lane), target - 1);
  if (pivot == 0xFFFFFFFFu) return false;  // warp-uniform; empty slots would pass the test below
  int count = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) count += key[i] <= pivot ? 1 : 0;
  // The lane's first position: an exclusive scan of the counts.
  int pos = count;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xFFFFFFFFu, pos, d);
    if (lane >= d) pos += up;
  }
  const int total = __shfl_sync(0xFFFFFFFFu, pos, 31);
  if (total > 32) return false;  // warp-uniform
  uint2* out = stage + (pos - count);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (key[i] <= pivot) *out++ = make_uint2(key[i], uint32_t(lane + 32 * i));
  }
  __syncwarp();
  const uint2 e = lane < total ? stage[lane] : make_uint2(0xFFFFFFFFu, 0xFFFFFFFFu);
  // (key, offset) ascending: the row's order, ties to the lower block.
  const uint64_t ranked = warp_sort((uint64_t(e.x) << 32) | e.y, lane);
  // The chosen offsets in block order.
  const uint32_t off = warp_sort(lane < target ? uint32_t(ranked) : 0xFFFFFFFFu, lane);
  if (lane < target) chosen[lane] = lo + int(off);
  return true;
}

// The k-th smallest (1 <= k <= 32) of the warp's 32 keys, counted with multiplicity, in every
// lane: each lane counts the keys below its own (31 shuffles, none waiting on another); a key x has
// fewer than k keys below it exactly when x <= the k-th smallest, so that is the largest such key.
__device__ __forceinline__ uint32_t warp_kth_smallest(uint32_t key, int k) {
  int below = 0;
#pragma unroll
  for (int d = 1; d < 32; ++d) below += __shfl_xor_sync(0xFFFFFFFFu, key, d) < key ? 1 : 0;
  return __reduce_max_sync(0xFFFFFFFFu, below < k ? key : 0u);
}

// The smallest of a lane's keys (four chains side by side, then their minimum).
template <int N>
__device__ __forceinline__ uint32_t keys_min(const uint32_t (&key)[N]) {
  constexpr int A = N < 4 ? N : 4;
  uint32_t m[A];
#pragma unroll
  for (int i = 0; i < A; ++i) m[i] = key[i];
#pragma unroll
  for (int i = A; i < N; ++i) m[i % A] = umin(m[i % A], key[i]);
#pragma unroll
  for (int i = 1; i < A; ++i) m[0] = umin(m[0], m[i]);
  return m[0];
}

// The survivors (keys <= pivot) of the warp's slots: their count, by a ballot a slot.
template <int N>
__device__ __forceinline__ int count_survivors(const uint32_t (&key)[N], uint32_t pivot) {
  int total = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) total += __popc(__ballot_sync(0xFFFFFFFFu, key[i] <= pivot));
  return total;
}

// The survivors into stage[base ..) in block order (slot i of lane l is offset first + l + 32 i:
// slot-major, then lane), as (key, offset), by the same ballots again (no mask kept per slot: at
// 32 slots a lane they would not fit beside the keys); positions past 32 are not written.
template <int N>
__device__ __forceinline__ void stage_survivors(const uint32_t (&key)[N], uint32_t pivot, int base,
                                                int lane, int first, uint2* stage) {
  const uint32_t below = (1u << lane) - 1u;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const bool keep = key[i] <= pivot;
    const uint32_t kept = __ballot_sync(0xFFFFFFFFu, keep);
    const int pos = base + __popc(kept & below);
    if (keep && pos < 32) stage[pos] = make_uint2(key[i], uint32_t(first + lane + 32 * i));
    base += __popc(kept);
  }
}

// The choice from `total` (target <= total <= 32) survivors staged in block order: the target
// best by (key, block) are the keys below the cut (the target-th smallest key) and the first ties
// at it in block order; chosen[0 .. target) gets their blocks (lo + offset), ascending.
__device__ __forceinline__ void choose_staged(const uint2* stage, int total, int lane, int target,
                                              int lo, int* chosen) {
  const uint2 e = lane < total ? stage[lane] : make_uint2(0xFFFFFFFFu, 0u);
  // The survivors' keys are <= the pivot < 0xFFFFFFFF, so the empty lanes sort last.
  const uint32_t cut = warp_kth_smallest(e.x, target);
  const uint32_t below = (1u << lane) - 1u;
  const int n_lt = __popc(__ballot_sync(0xFFFFFFFFu, e.x < cut));
  const uint32_t ties = __ballot_sync(0xFFFFFFFFu, e.x == cut);
  const bool take = e.x < cut || (e.x == cut && __popc(ties & below) < target - n_lt);
  const uint32_t took = __ballot_sync(0xFFFFFFFFu, take);
  if (take) chosen[__popc(took & below)] = lo + int(e.y);
}

// The network path of the warp's rows (lo, hi: the union of its candidate ranges; first, with
// have_first, the first batch's scores already loaded): pass 1, the rare exact second pass, the
// choice written at out_row[r.fb ..) of each active row.
template <int K, int L>
__device__ __forceinline__ void network_rows(const float* col, int64_t stride, bool active,
                                             const TopkRanges& r, int lo, int hi, int part,
                                             int* out_row, const float (&first)[kBatch],
                                             bool have_first) {
  const int n_sel = active ? r.target : 0;
  const bool uniform = __all_sync(0xFFFFFFFFu, active && r.mid_begin == lo && r.mid_end == hi);
  const int b = offset_bits(hi - lo);  // hi - lo <= kMaxSpan (the plan's bound)
  const uint32_t high_mask = ~((1u << b) - 1u);
  const int r_lo = active ? r.mid_begin : 0;
  const int r_hi = active ? r.mid_end : 0;

  uint32_t best[K];
#pragma unroll
  for (int i = 0; i < K; ++i) best[i] = kSent;
  const auto w1 = [high_mask](float v, int off) { return word1(v, off, high_mask); };
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

// CTAs per SM the registers must allow: K = 16 at <= 102 registers (20 warps per SM), K = 32 at
// <= 128 (16 warps).
template <int K>
inline constexpr int kMinCtasPerSm = K == 16 ? 5 : 4;

// N: the pivot path's scores a lane (0: none; else L = 32 and rows of at most 32 N candidates;
// decode-sized calls, so up to 128 registers: 32 scores and keys stay live through the pivot).
template <int K, int L, int N = 0>
__global__ void __launch_bounds__(kWarpsPerCta * 32, N > 0 ? 4 : kMinCtasPerSm<K>)
    topk_net_kernel(const __grid_constant__ Params np) {
  static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0, "lanes per row: a power of two <= 32");
  static_assert(N == 0 || (L == 32 && (N == 8 || N == 16 || N == 32)), "the pivot: a warp per row");
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
  // The pivot's slots past the first batch, loaded the same way.
  constexpr int kMore = N > kBatch ? N - kBatch : 1;
  float more[kMore];
  if constexpr (N == 0) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int blk = p.force_begin + part + L * i;
      first[i] = has_row && blk < p.num_blocks ? __ldg(col + int64_t(blk) * stride) : 0.0f;
    }
  } else {
    // A warp per row (L = 32): slot i is block force_begin + lane + 32 i, one pointer step of
    // 32 rows apart, present while i < the lane's count (fewer address instructions per load
    // than the general form above: this kernel is decode-sized, its prologue on the chain).
    const int count = has_row ? (p.num_blocks - p.force_begin - part + 31) >> 5 : 0;
    const float* ptr = col + int64_t(p.force_begin + part) * stride;
    const int64_t step = 32 * stride;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) first[i] = i < count ? __ldg(ptr + i * step) : 0.0f;
#pragma unroll
    for (int i = 0; i < kMore; ++i)
      more[i] = N > kBatch && kBatch + i < count ? __ldg(ptr + (kBatch + i) * step) : 0.0f;
  }

  TopkRanges r{};
  int* out_row = nullptr;
  if (has_row) {
    r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
    out_row = topk_out_row(p, s, h);
  }
  const bool active = has_row && r.target > 0;
  const int n_sel = active ? r.target : 0;
  // Forced blocks and the -1 tail ([0, fb) | n_sel chosen | [nvp - fe, nvp) | -1 ...), the
  // row's positions j = part (mod L).
  if (has_row) write_topk_frame(out_row, p.topk, r, n_sel, part, L);

  // The union of the warp's candidate ranges: only those blocks are read.
  const int lo = __reduce_min_sync(0xFFFFFFFFu, active ? r.mid_begin : INT_MAX);
  const int hi = __reduce_max_sync(0xFFFFFFFFu, active ? r.mid_end : 0);
  if (lo >= hi) return;  // warp-uniform
  if constexpr (N > 0) {
    // One row a warp (L = 32): active, lo and hi are the row's.
    __shared__ uint2 stage[kWarpsPerCta][32];
    if (hi - lo <= 32 * N) {  // warp-uniform
      const bool have = lo == p.force_begin;
      float v[N];
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int blk = lo + lane + 32 * i;
        const float spec = i < kBatch ? first[i < kBatch ? i : 0] : more[i < kBatch ? 0 : i - kBatch];
        v[i] = have ? spec : blk < hi ? __ldg(col + int64_t(blk) * stride) : 0.0f;
      }
      if (pivot_row<N>(v, lo, hi, lane, r.target, out_row + r.fb, stage[threadIdx.x >> 5])) return;
    }
  }
  network_rows<K, L>(col, stride, active, r, lo, hi, part, out_row, first, lo == p.force_begin);
}

// net_pivot_mode=rank_cta (auto's above 256 blocks): a CTA of kWarpsPerCta warps a row (np.groups rows, L = 32); warp w
// holds slots [N / 4 w, N / 4 (w + 1)) of the row's N a lane (slot j of lane l: block lo + l +
// 32 j, as pivot_row's), so lane l's minimum over the row is the minimum of the 4 warps' lane-l
// minima (shared memory), and the pivot is pivot_row's. Every warp computes it (no barrier for a
// broadcast); the survivors are compacted in block order across the warps (their counts through
// shared memory) and warp 0 chooses from them. More than 32 survivors, or a pivot of 0xFFFFFFFF:
// warp 0 runs the networks over the row (the CTA decides together: every warp sees the same
// pivot and counts).
template <int N>
__global__ void __launch_bounds__(kWarpsPerCta * 32) topk_pivot_cta_kernel(const __grid_constant__ Params np) {
  static_assert(N == 8 || N == 16 || N == 32, "8, 16 or 32 scores a lane over the row");
  constexpr int W = kWarpsPerCta;
  constexpr int Q = N / W;  // this warp's slots a lane
  const TopkSelectParams& p = np.p;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = blockIdx.x;  // < np.groups: the grid is the rows
  const int h = g % p.num_heads;
  const int s = np.token_groups - 1 - g / p.num_heads;  // L = 32: a token group is a token
  const float* col = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s;
  const int64_t stride = p.num_tokens;
  // num_valid_pages, then this warp's scores as if the candidates start at force_begin (they do
  // whenever the row has any), before the ranges: one DRAM round trip for both (see
  // topk_net_kernel).
  const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(__ldg(p.num_valid_pages + s))
                                                      : int64_t(p.num_valid_pages_value);
  const int first = Q * warp * 32;  // this warp's first offset in the row's candidate range
  float v[Q];
  {
    const int blk0 = p.force_begin + first + lane;
    const float* ptr = col + int64_t(blk0) * stride;
    const int64_t step = 32 * stride;
#pragma unroll
    for (int i = 0; i < Q; ++i) v[i] = blk0 + 32 * i < p.num_blocks ? __ldg(ptr + i * step) : 0.0f;
  }
  const TopkRanges r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
  int* const out_row = topk_out_row(p, s, h);
  const int n_sel = r.target > 0 ? r.target : 0;
  write_topk_frame(out_row, p.topk, r, n_sel, int(threadIdx.x), W * 32);
  const int lo = r.mid_begin;
  const int hi = r.mid_end;
  if (r.target <= 0 || lo >= hi) return;  // CTA-uniform

  __shared__ uint32_t lane_mins[W][32];
  __shared__ int counts[W];
  __shared__ uint2 stage[32];
  const bool have = lo == p.force_begin;  // the loads above are this range's
  uint32_t key[Q];
#pragma unroll
  for (int i = 0; i < Q; ++i) {
    const int blk = lo + first + lane + 32 * i;
    const float x = have ? v[i] : blk < hi ? __ldg(col + int64_t(blk) * stride) : 0.0f;
    key[i] = blk < hi ? topk_order_key(x) : 0xFFFFFFFFu;
  }
  lane_mins[warp][lane] = keys_min(key);
  __syncthreads();
  uint32_t lane_min = lane_mins[0][lane];
#pragma unroll
  for (int w = 1; w < W; ++w) lane_min = umin(lane_min, lane_mins[w][lane]);
  const uint32_t pivot = warp_kth_smallest(lane_min, r.target);  // the same in every warp
  const int mine = pivot != 0xFFFFFFFFu ? count_survivors(key, pivot) : 0;
  if (lane == 0) counts[warp] = mine;
  __syncthreads();
  int base = 0;
  int total = 0;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    const int c = counts[w];
    base += w < warp ? c : 0;
    total += c;
  }
  const bool staged = pivot != 0xFFFFFFFFu && total <= 32;  // CTA-uniform
  if (staged) stage_survivors(key, pivot, base, lane, first, stage);
  __syncthreads();
  if (warp != 0) return;
  if (staged) {
    choose_staged(stage, total, lane, r.target, lo, out_row + r.fb);
    return;
  }
  float none[kBatch];
#pragma unroll
  for (int i = 0; i < kBatch; ++i) none[i] = 0.0f;
  network_rows<16, 32>(col, stride, true, r, lo, hi, lane, out_row, none, false);
}

}  // namespace flashmsa::cuda::topk::net

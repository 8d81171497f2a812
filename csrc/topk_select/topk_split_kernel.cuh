// msa_topk_select, split rows (plan kernel warp_split): one CTA per (token, head) row, the row's
// candidates split over up to kSplitWarps warps. Each warp selects the exact top `target` of its
// slice (consecutive 256-block chunks, the bitwise threshold search of topk_select_kernel.cuh,
// carrying its choice from chunk to chunk); warp 0 then merges the slices' choices (in block
// order: slice w's at [w * target, (w + 1) * target)) with the same search into the exact top
// `target` of the row: the top `target` of a union of per-slice top-`target` sets under a total
// order ((key, block)) is the global top `target`. Rows of one chunk take no merge: the one warp
// writes the row, as warp_per_row_8 does. docs/design/topk_select.md, "Split rows".
//
// warp_digits (topk_digits_kernel): where every row is one chunk (num_blocks <= 256), a one-warp
// CTA per row that finds the exact threshold by 8-bit radix digits of the order keys (at most 4
// passes of a 256-bin shared histogram and a warp scan, digit_threshold below) instead of the
// bitwise search; the rest (ties, output order) as warp_split's one-chunk rows. Longer rows run
// topk_split_kernel. docs/design/topk_select.md, "Digit rows".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "topk_select/topk_select_config.h"
#include "topk_select/topk_select_kernel.cuh"

namespace flashmsa::cuda::topk::split {

// Exact threshold of the `target` best of one warp's <= 256 keys (valid slots only; target < their
// number) by 8-bit digits, most significant first: per pass every key whose higher digits equal
// the prefix chosen so far adds one to its digit's bin of `hist` (256 words of shared memory,
// this warp's only), a warp scan over the bins finds the digit holding rank target - 1, and keys
// of lower digits are counted as below. Result as the bitwise search's: keys < thr are chosen,
// plus the first `need` (block order) equal to thr. A pass stops the search early when its digit's
// keys are all chosen (rank target - 1 is the bin's last): thr is then the bin's end, need 0.
__device__ __forceinline__ void digit_threshold(const uint32_t (&key)[kKeysPerLane], uint32_t valid,
                                                int target, uint32_t* hist, uint32_t& thr,
                                                int& need) {
  const int lane = threadIdx.x & 31;
  uint4* bins = reinterpret_cast<uint4*>(hist) + 2 * lane;  // this lane's bins [8 lane, 8 lane + 8)
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  bins[0] = zero;
  bins[1] = zero;
  __syncwarp();
  const int rank = target - 1;
  uint32_t prefix = 0;  // the digits chosen so far (bits at and above the pass's `shift + 8`)
  int below = 0;        // valid keys below the prefix's range
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
#pragma unroll
    for (int i = 0; i < kKeysPerLane; ++i) {
      const bool in = ((valid >> i) & 1u) && (pass == 0 || ((key[i] ^ prefix) >> (shift + 8)) == 0u);
      if (in) atomicAdd(hist + ((key[i] >> shift) & 0xFFu), 1u);
    }
    __syncwarp();  // every key counted
    const uint4 a = bins[0];
    const uint4 b = bins[1];
    bins[0] = zero;  // cleared for the next pass (these bins are read by this lane only)
    bins[1] = zero;
    const int c[8] = {int(a.x), int(a.y), int(a.z), int(a.w), int(b.x), int(b.y), int(b.z), int(b.w)};
    int incl[8];  // inclusive prefix sums of this lane's bins
    incl[0] = c[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) incl[j] = incl[j - 1] + c[j];
    int lane_end = incl[7];  // inclusive scan of the lanes' totals
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int t = __shfl_up_sync(0xFFFFFFFFu, lane_end, d);
      if (lane >= d) lane_end += t;
    }
    const int lane_begin = lane_end - incl[7];
    const int r = rank - below;  // rank in the prefix's range: 0 <= r < keys in the range
    // The one lane whose bins hold rank r; in it the digit j: lane_begin + incl[j - 1] <= r <
    // lane_begin + incl[j].
    const int src = __ffs(__ballot_sync(0xFFFFFFFFu, lane_begin <= r && r < lane_end)) - 1;
    int j_r = 0, lower = lane_begin, cnt = c[0];
#pragma unroll
    for (int j = 1; j < 8; ++j) {
      if (lane_begin + incl[j - 1] <= r) {
        j_r = j;
        lower = lane_begin + incl[j - 1];
        cnt = c[j];
      }
    }
    const int digit = 8 * src + __shfl_sync(0xFFFFFFFFu, j_r, src);
    below += __shfl_sync(0xFFFFFFFFu, lower, src);
    cnt = __shfl_sync(0xFFFFFFFFu, cnt, src);
    prefix |= uint32_t(digit) << shift;
    __syncwarp();  // every lane cleared its bins before the next pass counts
    const uint32_t bin_last = prefix | ((1u << shift) - 1u);
    if (rank - below == cnt - 1 && bin_last != 0xFFFFFFFFu) {  // the bin's keys are all chosen
      thr = bin_last + 1u;
      need = 0;
      return;
    }
  }
  thr = prefix;  // the key of rank target - 1 itself
  need = target - below;
}

// One warp, up to 256 candidates in registers (slot i of lane l = entry l + 32 i: slot order is
// block order) after the carried choice (n_carry entries, ascending, all before the slots): write
// the `target` best, ascending, to out_row[pos] (to_out) or to (dst_key, dst_idx)[pos] (may be
// the carry itself: it is read before any lane writes). Returns the number chosen. kDigits: the
// threshold by digit_threshold (no carry; `hist` its 256 shared words) instead of the bitwise search.
template <bool kCarry, class IdxOf, bool kDigits = false>
__device__ __forceinline__ int select_slots(const uint32_t (&key)[kKeysPerLane], uint32_t valid,
                                            IdxOf idx_of, const uint32_t* carry_key,
                                            const int* carry_idx, int n_carry, int target,
                                            bool to_out, int* out_row, uint32_t* dst_key,
                                            int* dst_idx, uint32_t* hist = nullptr) {
  static_assert(!(kDigits && kCarry), "the digit threshold is for a row of one chunk");
  const int lane = threadIdx.x & 31;
  const uint32_t lt_mask = (1u << lane) - 1u;
  constexpr uint32_t kNone = 0xFFFFFFFFu;  // key of an empty slot: never counted as "below"

  uint32_t ckey[2] = {kNone, kNone};
  int cidx[2] = {0, 0};
  bool cvalid[2] = {false, false};
  if constexpr (kCarry) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = lane + 32 * j;
      cvalid[j] = c < n_carry;
      if (cvalid[j]) {
        ckey[j] = carry_key[c];
        cidx[j] = carry_idx[c];
      }
    }
  }
  __syncwarp();  // every lane has read the old carry before any lane writes the new one

  const int n_lane = __popc(valid) + int(cvalid[0]) + int(cvalid[1]);
  const int total = __reduce_add_sync(0xFFFFFFFFu, n_lane);

  // All candidates (total <= target), or key < thr, or key < thr plus the first `need` (in block
  // order) with key == thr. Invariant of the search: count(key < lo) = c_lo < target.
  const bool take_all = total <= target;
  uint32_t thr = 0;
  int need = 0;
  if (kDigits && !take_all) {
    digit_threshold(key, valid, target, hist, thr, need);
  } else if (!take_all) {
    bit_threshold<kCarry>(key, valid, ckey, cvalid, target, thr, need);
  }

  ThresholdPick pick{take_all, thr, need, lt_mask};
  auto visit = [&](uint32_t k, bool v, int blk) {
    int pos;
    if (pick(k, v, pos)) {
      if (to_out) {
        out_row[pos] = blk;
      } else {
        dst_key[pos] = k;
        dst_idx[pos] = blk;
      }
    }
  };
  if constexpr (kCarry) {
    visit(ckey[0], cvalid[0], cidx[0]);
    visit(ckey[1], cvalid[1], cidx[1]);
  }
#pragma unroll
  for (int i = 0; i < kKeysPerLane; ++i) visit(key[i], (valid >> i) & 1u, idx_of(i));
  __syncwarp();  // the new carry is visible to every lane of the warp
  return pick.n_sel;
}

// select_slots with the carry chosen at run time: a warp's first chunk has none.
template <class IdxOf>
__device__ __forceinline__ int select_slots_any(bool carry, const uint32_t (&key)[kKeysPerLane],
                                                uint32_t valid, IdxOf idx_of,
                                                const uint32_t* carry_key, const int* carry_idx,
                                                int n_carry, int target, bool to_out, int* out_row,
                                                uint32_t* dst_key, int* dst_idx) {
  return carry ? select_slots<true>(key, valid, idx_of, carry_key, carry_idx, n_carry, target,
                                    to_out, out_row, dst_key, dst_idx)
               : select_slots<false>(key, valid, idx_of, carry_key, carry_idx, 0, target, to_out,
                                     out_row, dst_key, dst_idx);
}

// The row of CTA blockIdx.x: token s, head h (the output row is out[s, h, :]), its ranges and
// output frame (no carry).
struct RowOfCta {
  int s;
  int h;
  TopkRanges r;
  RowInfo ri;
};
__device__ __forceinline__ RowOfCta row_of_cta(const TopkSelectParams& p) {
  RowOfCta row;
  row.s = int(blockIdx.x / unsigned(p.num_heads));
  row.h = int(blockIdx.x % unsigned(p.num_heads));
  const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[row.s])
                                                      : int64_t(p.num_valid_pages_value);
  const TopkRanges r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
  row.r = r;
  row.ri.nvp = r.nvp;
  row.ri.fb = r.fb;
  row.ri.fe = r.fe;
  row.ri.mid_begin = r.mid_begin;
  row.ri.mid_end = r.mid_end;
  row.ri.target = r.target;
  row.ri.n_carry = 0;
  return row;
}

// Shared memory of a CTA (static, 4.5 KB): the slices' choices, flat (slice w at w * target),
// each warp's carry while it walks its slice; warp 0's carry of the merge.
struct Shared {
  uint32_t slice_key[kSplitWarps * kMaxTopk];
  int slice_idx[kSplitWarps * kMaxTopk];
  uint32_t merge_key[kMaxTopk];
  int merge_idx[kMaxTopk];
};

__global__ void __launch_bounds__(kThreads, 4)
    topk_split_kernel(const __grid_constant__ TopkSelectParams p) {
  __shared__ Shared sm;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  constexpr uint32_t kNone = 0xFFFFFFFFu;

  // CTA b: row (token b / H, head b % H); the output row is out[s, h, :].
  const RowOfCta row = row_of_cta(p);
  const int s = row.s;
  const int h = row.h;
  // The output row, computed where it is written (held in a register across the kernel it
  // spilled at 64 registers).
  const auto out_row = [&p, s, h] { return topk_out_row(p, s, h); };
  const TopkRanges& r = row.r;
  const RowInfo& ri = row.ri;
  if (r.target <= 0) {  // nothing to choose: forced blocks and -1 only
    if (warp == 0) write_row_frame(out_row(), p.topk, ri, 0);
    return;
  }

  // Slices: consecutive runs of `per_warp` chunks of 256 candidates, one per active warp.
  const int target = r.target;
  const int n = r.mid_end - r.mid_begin;
  const int chunks = (n + kChunk - 1) / kChunk;
  const int per_warp = (chunks + kSplitWarps - 1) / kSplitWarps;
  const int slices = (chunks + per_warp - 1) / per_warp;
  const bool direct = slices == 1;  // one slice: its warp writes the output row

  if (warp < slices) {
    const float* col = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s;
    const int c_begin = warp * per_warp;
    const int c_end = min(c_begin + per_warp, chunks);
    uint32_t* my_key = sm.slice_key + warp * target;
    int* my_idx = sm.slice_idx + warp * target;
    // Scores of chunk c into registers (the next chunk's load is issued before this one's search).
    float raw[kKeysPerLane];
    auto load = [&](int c) {
      const int p0 = r.mid_begin + c * kChunk;
#pragma unroll
      for (int i = 0; i < kKeysPerLane; ++i) {
        const int blk = p0 + lane + 32 * i;
        raw[i] = blk < r.mid_end ? __ldg(col + int64_t(blk) * p.num_tokens) : 0.0f;
      }
    };
    load(c_begin);
    int n_carry = 0;
    for (int c = c_begin; c < c_end; ++c) {
      const int p0 = r.mid_begin + c * kChunk;
      uint32_t key[kKeysPerLane];
      uint32_t valid = 0;
#pragma unroll
      for (int i = 0; i < kKeysPerLane; ++i) {
        const bool v = p0 + lane + 32 * i < r.mid_end;
        key[i] = v ? topk_order_key(raw[i]) : kNone;
        valid |= uint32_t(v) << i;
      }
      if (c + 1 < c_end) load(c + 1);
      const bool out = direct && c + 1 == c_end;
      n_carry = select_slots_any(n_carry > 0, key, valid,
                                       [&](int i) { return p0 + lane + 32 * i; }, my_key, my_idx,
                                       n_carry, target, out, out_row() + ri.fb, my_key, my_idx);
    }
    if (direct) write_row_frame(out_row(), p.topk, ri, n_carry);
  }
  if (direct) return;
  __syncthreads();  // every slice's choice is in shared memory

  if (warp == 0) {
    // Slices before the last hold `target` entries each (>= 256 candidates); the last one
    // min(target, its candidates). In slice order they are in block order.
    const int last_n = min(target, n - (slices - 1) * per_warp * kChunk);
    const int m = (slices - 1) * target + last_n;
    int n_carry = 0;
    for (int e0 = 0; e0 < m; e0 += kChunk) {
      uint32_t key[kKeysPerLane];
      int idx[kKeysPerLane];
      uint32_t valid = 0;
#pragma unroll
      for (int i = 0; i < kKeysPerLane; ++i) {
        const int e = e0 + lane + 32 * i;
        const bool v = e < m;
        key[i] = v ? sm.slice_key[e] : kNone;
        idx[i] = v ? sm.slice_idx[e] : 0;
        valid |= uint32_t(v) << i;
      }
      const bool out = e0 + kChunk >= m;
      n_carry = select_slots_any(n_carry > 0, key, valid, [&](int i) { return idx[i]; },
                                       sm.merge_key, sm.merge_idx, n_carry, target, out,
                                       out_row() + ri.fb, sm.merge_key, sm.merge_idx);
    }
    write_row_frame(out_row(), p.topk, ri, n_carry);
  }
}

// warp_digits where every row is one chunk (num_blocks <= kChunk; the launcher runs
// topk_split_kernel for longer rows): a one-warp CTA per (token, head) row, as
// topk_split_kernel's one-chunk rows but with the threshold by digit_threshold.
__global__ void __launch_bounds__(32)
    topk_digits_kernel(const __grid_constant__ TopkSelectParams p) {
  __shared__ alignas(16) uint32_t hist[256];
  const int lane = threadIdx.x;
  constexpr uint32_t kNone = 0xFFFFFFFFu;
  const RowOfCta row = row_of_cta(p);
  const TopkRanges& r = row.r;
  int n_sel = 0;
  if (r.target > 0) {  // else forced blocks and -1 only
    const float* col = p.score + int64_t(row.h) * p.num_blocks * p.num_tokens + row.s;
    uint32_t key[kKeysPerLane];
    uint32_t valid = 0;
#pragma unroll
    for (int i = 0; i < kKeysPerLane; ++i) {
      const int blk = r.mid_begin + lane + 32 * i;
      const bool v = blk < r.mid_end;
      key[i] = v ? topk_order_key(__ldg(col + int64_t(blk) * p.num_tokens)) : kNone;
      valid |= uint32_t(v) << i;
    }
    auto block_of = [&](int i) { return r.mid_begin + lane + 32 * i; };
    n_sel = select_slots<false, decltype(block_of), true>(key, valid, block_of, nullptr, nullptr, 0,
                                                          r.target, true,
                                                          topk_out_row(p, row.s, row.h) + r.fb,
                                                          nullptr, nullptr, hist);
  }
  write_row_frame(topk_out_row(p, row.s, row.h), p.topk, row.ri, n_sel);
}

}  // namespace flashmsa::cuda::topk::split

// msa_topk_select, split rows (plan kernel warp_split): one CTA per (token, head) row, the row's
// candidates split over up to kSplitWarps warps. Each warp selects the exact top `target` of its
// slice (consecutive 256-block chunks, the bitwise threshold search of topk_select_kernel.cuh,
// carrying its choice from chunk to chunk); warp 0 then merges the slices' choices (in block
// order: slice w's at [w * target, (w + 1) * target)) with the same search into the exact top
// `target` of the row: the top `target` of a union of per-slice top-`target` sets under a total
// order ((key, block)) is the global top `target`. Rows of one chunk take no merge: the one warp
// writes the row, as warp_per_row_8 does. docs/design/topk_select.md, "Split rows".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "topk_select/topk_select_config.h"
#include "topk_select/topk_select_kernel.cuh"

namespace flashmsa::cuda::topk::split {

// One warp, up to 256 candidates in registers (slot i of lane l = entry l + 32 i: slot order is
// block order) after the carried choice (n_carry entries, ascending, all before the slots): write
// the `target` best, ascending, to out_row[pos] (to_out) or to (dst_key, dst_idx)[pos] (may be
// the carry itself: it is read before any lane writes). Returns the number chosen.
template <bool kCarry, class IdxOf>
__device__ __forceinline__ int select_slots(const uint32_t (&key)[kKeysPerLane], uint32_t valid,
                                            IdxOf idx_of, const uint32_t* carry_key,
                                            const int* carry_idx, int n_carry, int target,
                                            bool to_out, int* out_row, uint32_t* dst_key,
                                            int* dst_idx) {
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
  if (!take_all) {
    uint32_t lmin = kNone, lmax = 0;
#pragma unroll
    for (int i = 0; i < kKeysPerLane; ++i) {
      lmin = min(lmin, key[i]);
      if ((valid >> i) & 1u) lmax = max(lmax, key[i]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      lmin = min(lmin, ckey[j]);
      if (cvalid[j]) lmax = max(lmax, ckey[j]);
    }
    const uint32_t kmin = __reduce_min_sync(0xFFFFFFFFu, lmin);
    const uint32_t kmax = __reduce_max_sync(0xFFFFFFFFu, lmax);
    uint32_t lo = kmin;
    int c_lo = 0;
    if (kmin != kmax) {
      const int hb = 31 - __clz(kmin ^ kmax);
      lo = hb == 31 ? 0u : (kmin & ~((2u << hb) - 1u));
      for (int b = hb; b >= 0; --b) {
        const uint32_t mid = lo + (1u << b);
        int c = 0;
#pragma unroll
        for (int i = 0; i < kKeysPerLane; ++i) c += int(key[i] < mid);
        if constexpr (kCarry) c += int(ckey[0] < mid) + int(ckey[1] < mid);
        c = __reduce_add_sync(0xFFFFFFFFu, c);
        if (c == target) {  // exactly `target` keys below mid: no tie to break
          lo = mid;
          c_lo = c;
          break;
        }
        if (c < target) {
          lo = mid;
          c_lo = c;
        }
      }
    }
    thr = lo;
    need = target - c_lo;
  }

  int n_sel = 0;
  int n_eq = 0;
  auto visit = [&](uint32_t k, bool v, int blk) {
    bool sel;
    if (take_all) {
      sel = v;
    } else {
      const bool eq = v && k == thr && need > 0;
      const uint32_t eq_ballot = __ballot_sync(0xFFFFFFFFu, eq);
      const int eq_rank = n_eq + __popc(eq_ballot & lt_mask);
      n_eq += __popc(eq_ballot);
      sel = k < thr || (eq && eq_rank < need);
    }
    const uint32_t sel_ballot = __ballot_sync(0xFFFFFFFFu, sel);
    const int pos = n_sel + __popc(sel_ballot & lt_mask);
    n_sel += __popc(sel_ballot);
    if (sel) {
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
  return n_sel;
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
  const int s = int(blockIdx.x / unsigned(p.num_heads));
  const int h = int(blockIdx.x % unsigned(p.num_heads));
  int* out_row = p.out + int64_t(blockIdx.x) * p.topk;
  const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[s])
                                                      : int64_t(p.num_valid_pages_value);
  const TopkRanges r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
  RowInfo ri;
  ri.nvp = r.nvp;
  ri.fb = r.fb;
  ri.fe = r.fe;
  ri.mid_begin = r.mid_begin;
  ri.mid_end = r.mid_end;
  ri.target = r.target;
  ri.n_carry = 0;
  if (r.target <= 0) {  // nothing to choose: forced blocks and -1 only
    if (warp == 0) write_row_frame(out_row, p.topk, ri, 0);
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
                                       n_carry, target, out, out_row + ri.fb, my_key, my_idx);
    }
    if (direct) write_row_frame(out_row, p.topk, ri, n_carry);
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
                                       out_row + ri.fb, sm.merge_key, sm.merge_idx);
    }
    write_row_frame(out_row, p.topk, ri, n_carry);
  }
}

}  // namespace flashmsa::cuda::topk::split

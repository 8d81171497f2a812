// msa_topk_select on SM80+ (docs/semantics.md#topk-select, #d3): per (token s, head h), the
// `target` best candidate blocks of score[h, :, s] under (topk_order_key asc, block asc), plus the
// forced blocks, ascending, -1 tail padded. Bit-identical to the reference for every P, topk, nvp.
//
// A CTA takes 32 consecutive tokens of one head. It streams the (P x 32) score columns through
// shared memory in chunks of 256 blocks (128-byte coalesced rows, cp.async, double-buffered when
// P > 256); a warp then owns one token row of the chunk, 8 keys per lane in registers, and finds
// the exact threshold key with a bitwise search over warp-wide counts (redux.sync): the largest
// key value that leaves fewer than `target` keys below it. Keys below the threshold are chosen,
// plus the lowest-index keys equal to it (ballot ranks), which is exactly the reference's
// (key, index) order. Rows longer than one chunk carry their current choice (<= 64 entries,
// ascending) into the next chunk. docs/design/topk_select.md has the reasoning.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/ptx.cuh"
#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "topk_select/topk_select_config.h"

namespace flashmsa::cuda::topk {

extern __shared__ __align__(16) uint8_t topk_smem_raw[];
template <int kTok>
__device__ __forceinline__ SharedStorage<kTok>& shared_storage() {
  return *reinterpret_cast<SharedStorage<kTok>*>(topk_smem_raw);
}

// Forced blocks and the -1 tail of one output row, given the number of chosen candidates:
//   [0, fb) | n_sel chosen (written by select_chunk) | [nvp - fe, nvp) | -1 ...
__device__ __forceinline__ void write_row_frame(int* out_row, int topk, const RowInfo& ri,
                                                int n_sel) {
  for (int j = threadIdx.x & 31; j < topk; j += 32) {
    if (j < ri.fb) {
      out_row[j] = j;
    } else if (j >= ri.fb + n_sel) {
      const int e = j - ri.fb - n_sel;
      out_row[j] = e < ri.fe ? ri.nvp - ri.fe + e : -1;
    }
  }
}

// The exact threshold of the `target` best of one warp's candidates (kKeysPerLane slots a lane,
// `valid` marking the filled ones, plus with kCarry the two carried slots; target < their number)
// by a bitwise search over warp-wide counts (redux.sync): the largest key that leaves fewer than
// `target` keys below it. The rule: keys < thr are chosen, plus the first `need` (block order)
// equal to thr.
template <bool kCarry>
__device__ __forceinline__ void bit_threshold(const uint32_t (&key)[kKeysPerLane], uint32_t valid,
                                              const uint32_t (&ckey)[2], const bool (&cvalid)[2],
                                              int target, uint32_t& thr, int& need) {
  constexpr uint32_t kNone = 0xFFFFFFFFu;  // key of an empty slot
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
  // Invariant: count(key < lo) = c_lo < target <= count(key < lo + 2^(b+1)). The bits above the
  // highest bit where kmin and kmax differ are common to every candidate: start below them.
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
  need = target - c_lo;  // 0 after an exact hit
}

// The choice by that rule, one slot a lane at a time in block order: `take_all`, or key < thr, or
// key == thr among the first `need` such (ballot ranks). Returns whether the lane's candidate is
// chosen, and in `pos` its position among the chosen (the count so far plus the lower lanes').
struct ThresholdPick {
  bool take_all;
  uint32_t thr;
  int need;
  uint32_t lt_mask;  // the lanes below this one
  int n_sel = 0;     // chosen so far
  int n_eq = 0;      // candidates equal to thr seen so far
  __device__ __forceinline__ bool operator()(uint32_t k, bool v, int& pos) {
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
    pos = n_sel + __popc(sel_ballot & lt_mask);
    n_sel += __popc(sel_ballot);
    return sel;
  }
};

// One warp, one row, one chunk [p0, p0 + kChunk): choose among (the carried choice) + (this
// chunk's candidates). On the row's last chunk the result goes to the output row, else to the
// carry. Candidate order for ties is the block order: carry (ascending, all below p0), then chunk
// slot i, lane l = block p0 + l + 32 i.
template <int kTok, bool kCarry>
__device__ __forceinline__ void select_chunk(int tok, const RowInfo& ri, const uint32_t* tile,
                                             int p0, bool last, int* out_row, int topk) {
  SharedStorage<kTok>& sm = shared_storage<kTok>();
  const int lane = threadIdx.x & 31;
  const uint32_t lt_mask = (1u << lane) - 1u;
  constexpr uint32_t kNone = 0xFFFFFFFFu;  // key of an empty slot: never counted as "below"

  uint32_t key[kKeysPerLane];
  uint32_t valid = 0;  // bit i: slot i holds a candidate
#pragma unroll
  for (int i = 0; i < kKeysPerLane; ++i) {
    const int blk = p0 + lane + 32 * i;
    const bool v = blk >= ri.mid_begin && blk < ri.mid_end;
    key[i] = v ? topk_order_key(__uint_as_float(tile[(lane + 32 * i) * kTileStride<kTok> + tok])) : kNone;
    valid |= uint32_t(v) << i;
  }
  uint32_t ckey[2] = {kNone, kNone};
  int cidx[2] = {0, 0};
  bool cvalid[2] = {false, false};
  if constexpr (kCarry) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = lane + 32 * j;
      cvalid[j] = c < ri.n_carry;
      if (cvalid[j]) {
        ckey[j] = sm.carry_key[tok][c];
        cidx[j] = sm.carry_idx[tok][c];
      }
    }
  }
  __syncwarp();  // every lane has read the old carry before any lane writes the new one

  const int n_lane = __popc(valid) + int(cvalid[0]) + int(cvalid[1]);
  const int total = __reduce_add_sync(0xFFFFFFFFu, n_lane);
  const int target = ri.target;

  // Selection rule: all candidates (total <= target), or key < thr, or key < thr plus the first
  // `need` candidates (in block order) with key == thr.
  bool take_all = total <= target;
  uint32_t thr = 0;
  int need = 0;
  if (!take_all) bit_threshold<kCarry>(key, valid, ckey, cvalid, target, thr, need);

  // Walk the slots in block order; ballots give each chosen candidate its output position.
  ThresholdPick pick{take_all, thr, need, lt_mask};
  auto visit = [&](uint32_t k, bool v, int blk) {
    int pos;
    if (pick(k, v, pos)) {
      if (last) {
        out_row[ri.fb + pos] = blk;
      } else {
        sm.carry_key[tok][pos] = k;
        sm.carry_idx[tok][pos] = blk;
      }
    }
  };
  if constexpr (kCarry) {
    visit(ckey[0], cvalid[0], cidx[0]);
    visit(ckey[1], cvalid[1], cidx[1]);
  }
#pragma unroll
  for (int i = 0; i < kKeysPerLane; ++i) visit(key[i], (valid >> i) & 1u, p0 + lane + 32 * i);

  if (last) {
    write_row_frame(out_row, topk, ri, pick.n_sel);
  } else {
    __syncwarp();
    if (lane == 0) sm.rows[tok].n_carry = pick.n_sel;
  }
}

// Blocks [p_begin, p_end) (inside chunk c) of the CTA's tokens -> tile buffer, 4-byte cp.async:
// warp-wide, one instruction covers 32 / kTok block rows of kTok consecutive tokens (128 bytes).
template <int kTok>
__device__ __forceinline__ void load_chunk(const TopkSelectParams& p, uint32_t* tile, int h, int s0,
                                           int ntok, int p_begin, int p_end, int p0) {
  const float* src = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s0;
  const unsigned n = unsigned(p_end - p_begin) * kTok;
  for (unsigned idx = threadIdx.x; idx < n; idx += kThreads) {
    const int blk = p_begin + int(idx / kTok);
    const int tk = int(idx % kTok);
    if (tk < ntok)
      cp_async_4(smem_addr(tile + (blk - p0) * kTileStride<kTok> + tk),
                 src + int64_t(blk) * p.num_tokens + tk);
  }
  cp_async_commit();
}

// kTok = kTokens (32 tokens per CTA) or kTokensSmall (8: decode-sized calls, 4x the CTAs).
template <int kTok>
__global__ void __launch_bounds__(kThreads, 4)
    topk_select_kernel(const __grid_constant__ KernelParams kp) {
  const TopkSelectParams& p = kp.p;
  SharedStorage<kTok>& sm = shared_storage<kTok>();
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;

  for (int item = blockIdx.x; item < kp.items; item += gridDim.x) {
    const int h = item / kp.token_groups;
    const int s0 = (item % kp.token_groups) * kTok;
    const int ntok = min(kTok, p.num_tokens - s0);

    // Row ranges of the kTok tokens (warp 0, lane = token) and the union of their candidates.
    if (warp == 0) {
      int lo = INT_MAX, hi = 0;
      if (lane < ntok) {
        const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[s0 + lane])
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
        sm.rows[lane] = ri;
        if (r.target > 0) {
          lo = r.mid_begin;
          hi = r.mid_end;
        }
      }
      lo = __reduce_min_sync(0xFFFFFFFFu, lo);
      hi = __reduce_max_sync(0xFFFFFFFFu, hi);
      if (lane == 0) {
        sm.block_begin = lo;
        sm.block_end = hi;
      }
    }
    __syncthreads();

    // Rows with nothing to choose: forced blocks and -1 only.
    for (int tok = warp; tok < ntok; tok += kWarps) {
      const RowInfo ri = sm.rows[tok];
      if (ri.target <= 0)
        write_row_frame(topk_out_row(p, s0 + tok, h), p.topk, ri, 0);
    }

    // Only the blocks some row can choose are read: with per-token nvp (causal prefill) that is
    // about half of the (P x S) scores.
    const int blk_begin = sm.block_begin;
    const int blk_end = sm.block_end;
    if (blk_begin < blk_end) {
      const int c_begin = blk_begin / kChunk;
      const int c_end = (blk_end + kChunk - 1) / kChunk;
      auto issue = [&](int c) {
        const int p0 = c * kChunk;
        uint32_t* tile = sm.tiles[0] + ((c - c_begin) % kp.num_buffers) * kTileWords<kTok>;
        load_chunk<kTok>(p, tile, h, s0, ntok, max(p0, blk_begin), min(p0 + kChunk, blk_end), p0);
      };
      issue(c_begin);
      for (int c = c_begin; c < c_end; ++c) {
        if (c + 1 < c_end) {
          issue(c + 1);  // into the other buffer, free since the barrier that ended chunk c - 1
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();
        const uint32_t* tile = sm.tiles[0] + ((c - c_begin) % kp.num_buffers) * kTileWords<kTok>;
        const int p0 = c * kChunk;
        for (int tok = warp; tok < ntok; tok += kWarps) {
          const RowInfo ri = sm.rows[tok];
          if (ri.target <= 0 || ri.mid_end <= p0 || ri.mid_begin >= p0 + kChunk) continue;
          const bool last = ri.mid_end <= p0 + kChunk;
          int* out_row = topk_out_row(p, s0 + tok, h);
          if (ri.n_carry > 0) {
            select_chunk<kTok, true>(tok, ri, tile, p0, last, out_row, p.topk);
          } else {
            select_chunk<kTok, false>(tok, ri, tile, p0, last, out_row, p.topk);
          }
        }
        __syncthreads();  // the tile buffer and the row state are reused by the next chunk / item
      }
    } else {
      __syncthreads();  // the header is rewritten by the next item
    }
  }
}

}  // namespace flashmsa::cuda::topk

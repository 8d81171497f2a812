// msa_topk_select on SM80+, the thread-per-row kernel for large score tensors (many rows): the
// same result as topk_select_kernel.cuh (SPEC 2.2, D3), bit for bit, at a fraction of its
// instructions per row.
//
// A warp owns 32 consecutive tokens of one head; lane l owns row (s0 + l, h), whole. Nothing is
// shared between the warps of a CTA: each warp has its own slice of shared memory and
// synchronizes with __syncwarp only. Per warp, the blocks some row can choose are streamed in
// chunks of kChunk blocks (16-byte cp.async of 4 tokens where S % 4 == 0, double-buffered: chunk
// c + 1 loads while chunk c is chosen from), into a [row][lane] tile whose row is the 32 tokens
// of one block (128 contiguous bytes in memory and in shared memory; lane l's column is
// conflict-free).
//
// Each lane then selects its row's `target` best keys of (its carried choice) + (the chunk) with
// an exact radix select on the order key, 4 bits at a time, most significant first: a private
// 16-bin histogram (bins [digit][lane]: lane l only ever touches bank l) of the keys that share
// the digits fixed so far picks the bin holding the remaining rank; it stops as soon as that bin
// holds exactly the keys still needed (random data: after ~4 digits), else after the last digit
// with the exact key value K* and the count `need` of keys equal to it to take, lowest block
// first. One pass in block order then takes key < K*, plus the first `need` keys == K*: exactly
// the reference's (key asc, block asc) order. The choice (<= topk entries, ascending) is either
// the output row or the carry into the next chunk, where it precedes the chunk in block order.
// docs/design/topk_select.md has the reasoning and the numbers.
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

namespace radix {

// Forced blocks and the -1 tail of one output row, written by the row's own thread:
//   [0, fb) | n_sel chosen (written by the selection pass) | [nvp - fe, nvp) | -1 ...
__device__ __forceinline__ void write_frame(int* out_row, int topk, const TopkRanges& r, int n_sel) {
  for (int j = 0; j < topk; ++j) {
    if (j < r.fb) {
      out_row[j] = j;
    } else if (j >= r.fb + n_sel) {
      const int e = j - r.fb - n_sel;
      out_row[j] = e < r.fe ? r.nvp - r.fe + e : -1;
    }
  }
}

// One warp's shared memory (see warp_words): two buffers of [carry + kChunk][32] keys, two of
// [carry][32] carried block ids, and the [kBins + 1][32] histogram (bin kBins: a spare).
struct WarpSmem {
  uint32_t* keys;  // buffer b: keys + b * (carry + kChunk) * 32
  int* idx;        // buffer b: idx + b * carry * 32
  uint32_t* hist;
};

// The loads of chunk c (blocks [b_begin, b_end), all inside [p0, p0 + kChunk)) into buffer rows
// carry + (block - p0). Vectorized: 8 lanes cover the 32 tokens of one block (16 bytes each), a
// warp instruction 4 blocks; needs S % 4 == 0 and a 16-byte aligned score (the host checks).
__device__ __forceinline__ void load_chunk(const Params& rp, uint32_t* buf, const float* src,
                                           int ntok, int b_begin, int b_end, int p0) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = rp.p.num_tokens;
  uint32_t* rows = buf + (rp.carry + b_begin - p0) * 32;  // the row of block b_begin
  const int nb = b_end - b_begin;
  src += b_begin * stride;
  if (rp.vec) {
    const int seg = (lane & 7) * 4;
    if (seg < ntok) {  // ntok is a multiple of 4 here (S % 4 == 0)
#pragma unroll 4
      for (int i = lane >> 3; i < nb; i += 4)
        cp_async_16(smem_addr(rows + i * 32 + seg), src + i * stride + seg);
    }
  } else if (lane < ntok) {
#pragma unroll 4
    for (int i = 0; i < nb; ++i) cp_async_4(smem_addr(rows + i * 32 + lane), src + i * stride + lane);
  }
  cp_async_commit();
}

// The bin holding rank `rem` (1-based) of the histogram: `below` keys lie in lower bins, `m` in
// it. The bins hold at least `rem` keys in all (the caller's invariant).
__device__ __forceinline__ void find_bin(const uint32_t* hist, int rem, int& bin, int& below,
                                         int& m) {
  const int lane = threadIdx.x & 31;
  int cum = 0;
  bool found = false;
  bin = kBins - 1;
  below = 0;
  m = 0;
#pragma unroll
  for (int d = 0; d < kBins; ++d) {
    const int c = int(hist[d * 32 + lane]);
    if (!found && cum + c >= rem) {
      found = true;
      bin = d;
      below = cum;
      m = c;
    }
    cum += c;
  }
}

// f(key, row) for the rows [r_lo, r_hi) of a lane's column `col` (col[row * 32]), in order. The
// keys are read kBatch at a time before any is used: the compiler keeps shared loads behind earlier
// shared atomics / stores (it cannot tell the addresses apart), so one load per step would expose
// the full load latency on every key.
template <int kBatch = 8, typename F>
__device__ __forceinline__ void for_each_key(const uint32_t* col, int r_lo, int r_hi, F&& f) {
  int row = r_lo;
  for (; row + kBatch <= r_hi; row += kBatch) {
    uint32_t k[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) k[i] = col[(row + i) * 32];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) f(k[i], row + i);
  }
  for (; row < r_hi; ++row) f(col[row * 32], row);
}

__device__ __forceinline__ void clear_hist(uint32_t* hist) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 0; d < kBins; ++d) hist[d * 32 + lane] = 0;
}

// One lane, one row, one chunk: the row's entries are buffer rows [r_lo, r_hi) of `cur` (its
// carried choice, then the chunk's candidates, in block order). Chooses the row's `target` best
// of them; `last`: into the output row, else into the carry rows of the other buffer (`nxt`,
// ending at row `carry`). Returns the number chosen.
__device__ __forceinline__ int select_rows(const Params& rp, const WarpSmem& ws, int b,
                                           const TopkRanges& r, int r_lo, int r_hi, int j_lo,
                                           int p0, bool last, int* out_row) {
  const int lane = threadIdx.x & 31;
  const int kc = rp.carry;
  uint32_t* cur = ws.keys + b * (kc + kChunk) * 32 + lane;
  uint32_t* nxt = ws.keys + (b ^ 1) * (kc + kChunk) * 32 + lane;
  const int* cidx = ws.idx + b * kc * 32 + lane;
  int* nidx = ws.idx + (b ^ 1) * kc * 32 + lane;
  uint32_t* hist = ws.hist + lane;
  const int n = r_hi - r_lo;
  const int target = r.target;
  const bool search = n > target;

  // Selection rule: key < thr, or key == thr and among the first `need` such keys in block order.
  uint32_t thr = 0xFFFFFFFFu;  // take everything (n <= target)
  int need = INT_MAX;
  if (!search) {
    // Scores -> order keys in place (the chunk's entries; the carry holds keys already).
    for_each_key(cur, kc + j_lo, r_hi, [&](uint32_t bits, int row) {
      cur[row * 32] = topk_order_key(__uint_as_float(bits));
    });
  } else {
    // The same, plus the histogram of the top digit over the carry and the chunk.
    clear_hist(ws.hist);
    for_each_key(cur, kc + j_lo, r_hi, [&](uint32_t bits, int row) {
      const uint32_t k = topk_order_key(__uint_as_float(bits));
      cur[row * 32] = k;
      atomicAdd(hist + (k >> 28) * 32, 1u);
    });
    for_each_key(cur, r_lo, kc, [&](uint32_t k, int) { atomicAdd(hist + (k >> 28) * 32, 1u); });
    uint32_t prefix = 0;  // the digits fixed so far
    int rem = target;     // ranks still to fill among the keys that share them
    for (int shift = 28;; shift -= 4) {
      int bin, below, m;
      find_bin(ws.hist, rem, bin, below, m);
      rem -= below;
      prefix |= uint32_t(bin) << shift;
      if (m == rem) {  // the whole bin is taken: every key <= prefix with all lower bits set
        thr = prefix | ((1u << shift) - 1u);
        break;
      }
      if (shift == 0) {  // the exact rank-`target` key; `rem` of the keys equal to it are taken
        thr = prefix;
        need = rem;
        break;
      }
      clear_hist(ws.hist);
      const int next = shift - 4;
      // A key with the prefix has k - prefix < 2^shift, so (k - prefix) >> next is its next
      // digit; any other key (below: wraps around; above) gives >= kBins and counts into the
      // spare bin kBins, never read. Branch-free: 3 integer instructions and the atomic per key.
      for_each_key(cur, r_lo, r_hi, [&](uint32_t k, int) {
        const uint32_t d = min((k - prefix) >> next, uint32_t(kBins));
        atomicAdd(hist + d * 32, 1u);
      });
    }
  }

  // Chosen entries in block order: to the output row, or to the carry rows [kc - n_sel, kc) of
  // the other buffer (its chunk rows may be loading; the carry rows are this lane's alone).
  const int n_sel = min(n, target);
  const int base = kc - n_sel;
  int pos = 0;
  int n_eq = 0;
  for_each_key(cur, r_lo, r_hi, [&](uint32_t k, int row) {
    bool sel = k < thr;
    if (k == thr) sel = n_eq++ < need;
    if (sel) {
      const int blk = row < kc ? cidx[row * 32] : p0 + row - kc;
      if (last) {
        out_row[r.fb + pos] = blk;
      } else {
        nxt[(base + pos) * 32] = k;
        nidx[(base + pos) * 32] = blk;
      }
      ++pos;
    }
  });
  return n_sel;
}

__global__ void __launch_bounds__(kThreads) topk_radix_kernel(const __grid_constant__ Params rp) {
  const TopkSelectParams& p = rp.p;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int kc = rp.carry;

  uint32_t* wbase = reinterpret_cast<uint32_t*>(topk_smem_raw) + warp * warp_words(kc);
  WarpSmem ws;
  ws.keys = wbase;
  ws.idx = reinterpret_cast<int*>(wbase + 2 * (kc + kChunk) * 32);
  ws.hist = wbase + 2 * (kc + kChunk) * 32 + 2 * kc * 32;

  const int warps = gridDim.x * kWarps;
  for (int g = blockIdx.x * kWarps + warp; g < rp.groups; g += warps) {
    const int h = g / rp.token_groups;
    const int s0 = (g % rp.token_groups) * 32;
    const int ntok = min(32, p.num_tokens - s0);
    const bool has_row = lane < ntok;

    TopkRanges r{};
    int* out_row = nullptr;
    if (has_row) {
      const int64_t nvp_in = p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[s0 + lane])
                                                          : int64_t(p.num_valid_pages_value);
      r = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);
      out_row = p.out + (int64_t(s0 + lane) * p.num_heads + h) * p.topk;
      if (r.target <= 0) write_frame(out_row, p.topk, r, 0);  // forced blocks and -1 only
    }
    const bool active = has_row && r.target > 0;

    // The union of the rows' candidate ranges: only those blocks are read.
    const int lo = __reduce_min_sync(0xFFFFFFFFu, active ? r.mid_begin : INT_MAX);
    const int hi = __reduce_max_sync(0xFFFFFFFFu, active ? r.mid_end : 0);
    if (lo >= hi) continue;  // warp-uniform

    const float* src = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s0;
    const int c_begin = lo / kChunk;
    const int c_end = (hi + kChunk - 1) / kChunk;
    auto issue = [&](int c, int b) {
      const int p0 = c * kChunk;
      load_chunk(rp, ws.keys + b * (kc + kChunk) * 32, src, ntok, max(p0, lo),
                 min(p0 + kChunk, hi), p0);
    };
    issue(c_begin, 0);
    int n_carry = 0;  // this lane's carried choice: rows [kc - n_carry, kc) of the current buffer
    for (int c = c_begin; c < c_end; ++c) {
      const int b = (c - c_begin) & 1;
      if (c + 1 < c_end) {
        issue(c + 1, b ^ 1);  // its chunk rows were last read before the __syncwarp ending c - 1
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncwarp();  // every lane's copies of chunk c are visible to the warp
      const int p0 = c * kChunk;
      const int j_lo = max(r.mid_begin - p0, 0);
      const int j_hi = min(r.mid_end - p0, kChunk);
      if (active && j_lo < j_hi) {
        // A row with a carry started in an earlier chunk, so j_lo == 0 and its entries are one
        // range of buffer rows: the carry, then the chunk.
        const int r_lo = n_carry > 0 ? kc - n_carry : kc + j_lo;
        const bool last = r.mid_end <= p0 + kChunk;
        const int n_sel = select_rows(rp, ws, b, r, r_lo, kc + j_hi, j_lo, p0, last, out_row);
        if (last) {
          write_frame(out_row, p.topk, r, n_sel);
          n_carry = 0;
        } else {
          n_carry = n_sel;
        }
      }
      __syncwarp();  // buffer b's chunk rows are free for chunk c + 2
    }
  }
}

}  // namespace radix

}  // namespace flashmsa::cuda::topk

// msa_proxy_score on SM80+: out[h, t, r] = max over the visible keys j of block t of
// dot(q[r, h], k[j, h / G]), unscaled, fp32 accumulate (docs/semantics.md#proxy-score-math). One
// kernel per MMA element type (bf16 / fp16); fp8 operands are converted exactly on their way to
// shared memory.
//
// Work item = (q-tile, sequence, key-block split). A CTA loads the tile's Q rows (the hc heads of
// one KV group x consecutive tokens) once into registers, then streams the tile's key blocks
// through a cp.async pipeline: S = Q K^T per 128-key block with mma.sync m16n8k16, per-key mask,
// row max, one coalesced store per (head, block) row segment. Blocks above the tile's causal limit
// are never loaded: their columns are written -inf directly. docs/design/proxy_score.md has the
// reasoning behind each number.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "proxy_score/proxy_score_config.h"

namespace flashmsa::cuda::proxy {

// max with NaN propagation (canonical NaN 0x7FFFFFFF), the rule of the reference (torch.amax).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xFF800000); }

// Q rows of a tile -> shared memory (16-bit, swizzled). Row r of the tile is head (r / T) of the
// group, token (r % T); rows outside (head >= nh, token >= ntok) are zero.
template <typename Element, typename Shape>
__device__ __forceinline__ void load_q_tile(const KernelParams& kp, uint8_t* sQ,
                                            const TileState& st) {
  const ProxyScoreParams& p = kp.p;
  const int T = st.T;
  // Thread -> fixed chunk c (elements [8c, 8c + 8)) of rows r0, r0 + 8, ...: one swizzle phase
  // per thread and immediate smem offsets.
  const int c = threadIdx.x & 15;
  for (int r = threadIdx.x >> 4; r < Shape::kRows; r += kThreads / 16) {
    const int hl = r / T;
    const int tok = r - hl * T;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (hl < st.nh && tok < st.ntok) {
      const int64_t off = (st.row_begin + tok) * p.q_stride_token +
                          int64_t(st.head0 + hl) * p.q_stride_head + int64_t(c) * 8;
      if (kp.q_fp4) {
        // 8 values = 4 bytes of e2m1 pairs; their block scale is column c / 2 of the row's 8.
        const int64_t row = (st.row_begin + tok) * p.num_heads + st.head0 + hl;
        const uint8_t* src = static_cast<const uint8_t*>(p.q) + (st.row_begin + tok) * p.q_stride_token +
                             int64_t(st.head0 + hl) * p.q_stride_head + c * 4;
        const uint32_t raw = __ldg(reinterpret_cast<const uint32_t*>(src));
        const float scale = e4m3_to_float(p.q_scale[nvfp4_scale_offset(row, c >> 1)]) * 16384.0f;
        v.x = e2m1x2_to<Element>(raw & 0xFFu, scale);
        v.y = e2m1x2_to<Element>((raw >> 8) & 0xFFu, scale);
        v.z = e2m1x2_to<Element>((raw >> 16) & 0xFFu, scale);
        v.w = e2m1x2_to<Element>(raw >> 24, scale);
      } else if (kp.q_fp8) {
        const uint2 raw =
            __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.q) + off));
        v.x = e4m3x2_to_mma_bits<Element>(uint16_t(raw.x & 0xFFFFu));
        v.y = e4m3x2_to_mma_bits<Element>(uint16_t(raw.x >> 16));
        v.z = e4m3x2_to_mma_bits<Element>(uint16_t(raw.y & 0xFFFFu));
        v.w = e4m3x2_to_mma_bits<Element>(uint16_t(raw.y >> 16));
      } else {
        v = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) + off));
      }
    }
    *reinterpret_cast<uint4*>(sQ + swizzle_128x16b(r, c) * 16) = v;
  }
}

// Keys [0, n_keys) of block t -> pipeline stage `stage`. An invalid page loads nothing (its column
// is written -inf at finalisation). Keys past n_keys keep stale data: every use of them is masked.
__device__ __forceinline__ void load_k_block(const KernelParams& kp, uint8_t* tiles,
                                             const TileState& st, int t, int stage) {
  const ProxyScoreParams& p = kp.p;
  const int64_t base = kv_offset(p.k, p.kv, st.b, st.kh, t * kBlockSize);
  if (base < 0) return;
  const int n_keys = min(kBlockSize, st.seqlen_k - t * kBlockSize);
  if (!kp.k_fp8 && !kp.k_fp4) {
    const uint16_t* src = static_cast<const uint16_t*>(p.k.data) + base;
    uint8_t* dst = tiles + stage * kKTileBytes;
    // Thread -> fixed 16-byte chunk c of keys r0, r0 + 8, ... (cheap addresses: the loop must not
    // hoist per-iteration address registers next to the Q fragments).
    const int c = threadIdx.x & 15;
    for (int r = threadIdx.x >> 4; r < n_keys; r += kThreads / 16) {
      cp_async_16(smem_addr(dst + swizzle_128x16b(r, c) * 16),
                  src + int64_t(r) * p.k.stride_token + c * 8);
    }
  } else if (kp.k_fp4) {
    // Raw stage: [128][64] bytes of e2m1 pairs, then [128][8] scale bytes (columns 0..3 and 4..7
    // of a row's scales are two 4-byte runs 512 bytes apart in the 128x4 layout).
    const uint8_t* src = static_cast<const uint8_t*>(p.k.data) + base;
    uint8_t* dst = tiles + stage * kRawTileBytes;
    const int c = threadIdx.x & 3;  // 16-byte chunk of the 64-byte row: elements [32c, 32c + 32)
    for (int r = threadIdx.x >> 2; r < n_keys; r += kThreads / 4) {
      cp_async_16(smem_addr(dst + r * (kHeadDim / 2) + c * 16), src + int64_t(r) * p.k.stride_token + c * 16);
    }
    const int64_t srow0 = kv_scale_row(p.kv, p.num_kv_heads, st.b, st.kh, t * kBlockSize);
    const int step = !p.kv.paged ? p.num_kv_heads : 1;
    for (int e = threadIdx.x; e < n_keys * 2; e += kThreads) {
      const int r = e >> 1, half = e & 1;
      cp_async_4(smem_addr(dst + kFp4RawDataBytes + r * 8 + half * 4),
                 p.k.scale + nvfp4_scale_offset(srow0 + int64_t(r) * step, 4 * half));
    }
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(p.k.data) + base;
    uint8_t* dst = tiles + stage * kRawTileBytes;
    const int c = threadIdx.x & 7;  // 16-byte chunk of the fp8 row: elements [16c, 16c + 16)
    for (int r = threadIdx.x >> 3; r < n_keys; r += kThreads / 8) {
      cp_async_16(smem_addr(dst + r * kHeadDim + c * 16),
                  src + int64_t(r) * p.k.stride_token + c * 16);
    }
  }
}

// fp8 stage -> the 16-bit swizzled block the MMAs read (exact conversion).
template <typename Element>
__device__ __forceinline__ void convert_k_block(const uint8_t* raw, uint8_t* conv, int n_keys) {
  const int c = threadIdx.x & 7;
  for (int r = threadIdx.x >> 3; r < n_keys; r += kThreads / 8) {
    const uint4 in = *reinterpret_cast<const uint4*>(raw + r * kHeadDim + c * 16);
    uint4 lo, hi;
    e4m3x16_to_mma<Element>(in, lo, hi);
    *reinterpret_cast<uint4*>(conv + swizzle_128x16b(r, 2 * c) * 16) = lo;
    *reinterpret_cast<uint4*>(conv + swizzle_128x16b(r, 2 * c + 1) * 16) = hi;
  }
}

// NVFP4 stage -> the 16-bit swizzled block (exact: every e2m1 x e4m3 value is a bf16 / fp16 value).
template <typename Element>
__device__ __forceinline__ void convert_k_block_fp4(const uint8_t* raw, uint8_t* conv, int n_keys) {
  const int c = threadIdx.x & 3;  // raw chunk: 32 values, scale columns 2c and 2c + 1
  for (int r = threadIdx.x >> 2; r < n_keys; r += kThreads / 4) {
    const uint4 in = *reinterpret_cast<const uint4*>(raw + r * (kHeadDim / 2) + c * 16);
    const uint32_t w[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // output chunk 4c + q: values 32c + 8q .., the 4 bytes of w[q]
      const float scale = e4m3_to_float(raw[kFp4RawDataBytes + r * 8 + 2 * c + (q >> 1)]) * 16384.0f;
      uint4 out;
      out.x = e2m1x2_to<Element>(w[q] & 0xFFu, scale);
      out.y = e2m1x2_to<Element>((w[q] >> 8) & 0xFFu, scale);
      out.z = e2m1x2_to<Element>((w[q] >> 16) & 0xFFu, scale);
      out.w = e2m1x2_to<Element>(w[q] >> 24, scale);
      *reinterpret_cast<uint4*>(conv + swizzle_128x16b(r, 4 * c + q) * 16) = out;
    }
  }
}

// S = Q K^T for this warp's rows and keys of one block, masked per key when kMasked, reduced to
// per-row maxima and stored in part[warp_n][row].
//   qa:  (kMTiles, 8 k-steps, 4) A fragments      sK: (128 keys, 128 dims) swizzled 16-bit
// kScaled (msa_proxy_score_fp4): every logit times `lscale` before the mask and the max, as the
// reference does.
template <typename Element, typename Shape, bool kMasked, bool kScaled = false>
__device__ __forceinline__ void multiply_block(const uint32_t (&qa)[Shape::kMTiles][8][4],
                                               const uint8_t* sK, const int (*lim_rel)[2],
                                               float* part, float lscale = 1.0f) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_m = warp % Shape::kWarpsM;
  const int warp_n = warp / Shape::kWarpsM;
  float rmax[Shape::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < Shape::kMTiles; ++mt) rmax[mt][0] = rmax[mt][1] = neg_inf();

  // ldmatrix.x4 of K for 8 keys x 32 dims: matrices (keys +0..7, dims +0..7, +8..15, +16..23,
  // +24..31) = b0/b1 of k-step 2j and b0/b1 of k-step 2j + 1. Lane l addresses key l % 8 of matrix
  // l / 8; with keys starting at a multiple of 8, (key % 8) == (l % 8) fixes the swizzle phase.
  // One n8 step at a time keeps 16 accumulators live next to the 32 x kMTiles Q registers.
  const int key_lane = lane & 7;
  const int chunk_lane = lane >> 3;
  const uint32_t sK_u32 = smem_addr(sK);

  // Not unrolled: the 8-key steps are independent, and unrolling them only lets the scheduler hoist
  // K fragments of later steps, which costs registers the Q fragments need.
#pragma unroll 1
  for (int nc = 0; nc < Shape::kKeysPerWarp / 8; ++nc) {
    const int key0 = warp_n * Shape::kKeysPerWarp + nc * 8;
    const int key = key0 + key_lane;
    float acc[Shape::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Shape::kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t b[4];
      ldmatrix_x4(b, sK_u32 + swizzle_128x16b(key, 4 * j + chunk_lane) * 16);
#pragma unroll
      for (int mt = 0; mt < Shape::kMTiles; ++mt) {
        mma_m16n8k16<Element>(acc[mt], qa[mt][2 * j], b[0], b[1]);
        mma_m16n8k16<Element>(acc[mt], qa[mt][2 * j + 1], b[2], b[3]);
      }
    }
    // Accumulator (mt, e): row 16 mt + 8 (e / 2) + lane / 4, key key0 + 2 (lane % 4) + e % 2.
#pragma unroll
    for (int mt = 0; mt < Shape::kMTiles; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = acc[mt][e];
        if constexpr (kScaled) v *= lscale;
        if constexpr (kMasked) {
          const int kk = key0 + (lane & 3) * 2 + (e & 1);
          v = kk < lim_rel[mt][e >> 1] ? v : neg_inf();
        }
        rmax[mt][e >> 1] = max_nan(rmax[mt][e >> 1], v);
      }
  }
  // The 4 lanes of a quad hold the same rows: combine them.
#pragma unroll
  for (int mt = 0; mt < Shape::kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = rmax[mt][h];
      v = max_nan(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
      v = max_nan(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
      const int row = warp_m * Shape::kMTiles * 16 + mt * 16 + h * 8 + (lane >> 2);
      if ((lane & 3) == 0) part[warp_n * Shape::kRows + row] = v;
    }
}

__device__ __forceinline__ bool block_has_page(const ProxyScoreParams& p, int b, int t) {
  return !p.kv.paged || kv_page(p.kv, b, t) >= 0;
}

// Row maxima of block t (in part) -> out. Per-head: one row segment of consecutive tokens per
// head. reduce_heads: max over the group's heads, combined with earlier groups (same thread, so
// program order makes the read-modify-write safe; max is exact, so the result is deterministic).
template <typename Shape>
__device__ __forceinline__ void finalize_block(const KernelParams& kp, const float* part,
                                               const TileState& st, int t) {
  const ProxyScoreParams& p = kp.p;
  const bool has_page = block_has_page(p, st.b, t);
  const int T = st.T;
  const int64_t total_q = p.total_q;
  if (!p.reduce_heads) {
    for (int r = threadIdx.x; r < Shape::kRows; r += kThreads) {
      const int hl = r / T;
      const int tok = r - hl * T;
      if (hl >= st.nh || tok >= st.ntok) continue;
      float v = part[r];
#pragma unroll
      for (int wn = 1; wn < Shape::kWarpsN; ++wn) v = max_nan(v, part[wn * Shape::kRows + r]);
      if (!has_page) v = neg_inf();
      p.out[(int64_t(st.head0 + hl) * p.max_k_tiles + t) * total_q + st.row_begin + tok] = v;
    }
  } else {
    for (int tok = threadIdx.x; tok < st.ntok; tok += kThreads) {
      float v = neg_inf();
      for (int hl = 0; hl < st.nh; ++hl)
#pragma unroll
        for (int wn = 0; wn < Shape::kWarpsN; ++wn)
          v = max_nan(v, part[wn * Shape::kRows + hl * T + tok]);
      if (!has_page) v = neg_inf();
      float* o = p.out + int64_t(t) * total_q + st.row_begin + tok;
      *o = st.first_group ? v : max_nan(*o, v);
    }
  }
}

// -inf for columns [t_begin, t_end) of the tile's rows (no key of those blocks is visible). A
// thread keeps one row (token) and walks the columns, so the row -> token division runs once;
// for each column, consecutive threads store consecutive tokens.
template <typename Shape>
__device__ __forceinline__ void write_neg_inf(const KernelParams& kp, const TileState& st,
                                              int t_begin, int t_end) {
  const ProxyScoreParams& p = kp.p;
  const int64_t total_q = p.total_q;
  if (t_begin >= t_end) return;
  if (p.reduce_heads) {
    for (int tok = threadIdx.x; tok < st.ntok; tok += kThreads)
      for (int t = t_begin; t < t_end; ++t)
        p.out[int64_t(t) * total_q + st.row_begin + tok] = neg_inf();
    return;
  }
  // Rows per pass and the column step that keeps all threads busy when rows < threads.
  constexpr int kRowsPerPass = Shape::kRows < kThreads ? Shape::kRows : kThreads;
  constexpr int kTStep = kThreads / kRowsPerPass;
  const int t0 = t_begin + int(threadIdx.x) / kRowsPerPass;
  for (int r = int(threadIdx.x) % kRowsPerPass; r < Shape::kRows; r += kRowsPerPass) {
    const int hl = r / st.T;
    const int tok = r - hl * st.T;
    if (hl >= st.nh || tok >= st.ntok) continue;
    float* o = p.out + int64_t(st.head0 + hl) * p.max_k_tiles * total_q + st.row_begin + tok;
    for (int t = t0; t < t_end; t += kTStep) o[int64_t(t) * total_q] = neg_inf();
  }
}

// Work of one q-tile: which sequence, tokens and key-block columns (computed by every thread).
struct TileWork {
  int b;
  int64_t row_begin;
  int tok0;
  int ntok;
  int split_begin;  // key-block columns [split_begin, split_end) of this work item
  int split_end;
};

// The kernel's dynamic shared memory, named at namespace scope so that run_tile (not inlined)
// still addresses it as shared memory rather than through generic pointers.
extern __shared__ __align__(128) uint8_t proxy_smem_raw[];

// One q-tile with one tile shape: every KV group the CTA covers (one, or all with reduce_heads).
// Not inlined: three shapes inlined into one kernel body made ptxas spill around the Large shape's
// 128 Q fragment registers; as separate functions each shape is allocated on its own (one call per
// tile, so the call costs nothing measurable).
template <typename Element, typename Shape>
__device__ __noinline__ void run_tile(const KernelParams& kp, TileWork work) {
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(proxy_smem_raw);
  const ProxyScoreParams& p = kp.p;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warp_m = warp % Shape::kWarpsM;
  const TileState& st = smem.state;

  const int g_begin = p.reduce_heads ? 0 : int(blockIdx.y);
  const int g_end = p.reduce_heads ? kp.num_groups : g_begin + 1;
  for (int g = g_begin; g < g_end; ++g) {
    if (threadIdx.x == 0) {
      TileState s;
      s.b = work.b;
      s.row_begin = work.row_begin;
      s.tok0 = work.tok0;
      s.ntok = work.ntok;
      s.seqlen_k = kv_seqlen(p.kv, work.b);
      const RowRange rows = q_rows(p.qi, p.total_q, work.b);
      s.q_off = q_offset_of(p.q_offset, work.b, rows.len, s.seqlen_k);
      s.T = Shape::kRows / kp.heads_per_cta;
      s.kh = g / kp.subgroups;
      const int sub = g - s.kh * kp.subgroups;
      s.head0 = s.kh * kp.group_size + sub * kp.heads_per_cta;
      s.nh = min(kp.heads_per_cta, kp.group_size - sub * kp.heads_per_cta);
      // Keys visible to the tile: [0, lim_last) for its last token, [0, lim_first) for its first
      // (col_limit is non-decreasing in the token index). Blocks >= n_compute hold no visible key.
      s.lim_first = col_limit(p.causal, s.q_off, s.tok0, s.seqlen_k);
      const int lim_last = col_limit(p.causal, s.q_off, s.tok0 + s.ntok - 1, s.seqlen_k);
      const int n_compute = int(min(int64_t(p.max_k_tiles), ceil_div(lim_last, kBlockSize)));
      s.t_begin = work.split_begin;
      s.n_blocks = min(work.split_end, n_compute) - work.split_begin;
      s.first_group = g == g_begin;
      smem.state = s;
    }
    __syncthreads();
    if (g == g_begin) {
      write_neg_inf<Shape>(kp, st, st.t_begin + max(st.n_blocks, 0), work.split_end);
    }
    if (st.n_blocks <= 0) {
      __syncthreads();  // state is rewritten by the next group / tile
      continue;
    }

    // Q -> smem -> registers (A fragments), once per tile and group.
    load_q_tile<Element, Shape>(kp, smem.tiles, st);
    __syncthreads();
    uint32_t qa[Shape::kMTiles][8][4];
#pragma unroll
    for (int mt = 0; mt < Shape::kMTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        // Matrices (rows +0..7, k +0..7), (+8..15, +0..7), (+0..7, +8..15), (+8..15, +8..15).
        const int r =
            warp_m * Shape::kMTiles * 16 + mt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        ldmatrix_x4(qa[mt][ks],
                    smem_addr(smem.tiles) + swizzle_128x16b(r, 2 * ks + (lane >> 4)) * 16);
      }
    __syncthreads();  // every warp holds its Q fragments before the K pipeline overwrites them

    // Pipeline: blocks t_begin + i, i in [0, n_blocks); stage i % kStages.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < st.n_blocks) load_k_block(kp, smem.tiles, st, st.t_begin + s, s);
      cp_async_commit();
    }
    for (int i = 0; i < st.n_blocks; ++i) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // block i has landed; every warp is done with block i - 1's stage
      const int t = st.t_begin + i;
      if (i > 0) finalize_block<Shape>(kp, smem.part[(i - 1) & 1], st, t - 1);
      if (i + kStages - 1 < st.n_blocks)
        load_k_block(kp, smem.tiles, st, t + kStages - 1, (i + kStages - 1) % kStages);
      cp_async_commit();
      const uint8_t* sK = smem.tiles + (i % kStages) * kKTileBytes;
      if (kp.k_fp8 || kp.k_fp4) {
        uint8_t* conv = smem.tiles + kStages * kRawTileBytes;
        const int n_keys = min(kBlockSize, st.seqlen_k - t * kBlockSize);
        if (kp.k_fp4) {
          convert_k_block_fp4<Element>(smem.tiles + (i % kStages) * kRawTileBytes, conv, n_keys);
        } else {
          convert_k_block<Element>(smem.tiles + (i % kStages) * kRawTileBytes, conv, n_keys);
        }
        __syncthreads();
        sK = conv;
      }
      if (int64_t(t + 1) * kBlockSize <= st.lim_first) {  // 64-bit: t + 1 may be 2^24
        // Every key of the block is visible to every row of the tile.
        if (kp.q_fp4) {
          multiply_block<Element, Shape, false, true>(qa, sK, nullptr, smem.part[i & 1], p.logit_scale);
        } else {
          multiply_block<Element, Shape, false>(qa, sK, nullptr, smem.part[i & 1]);
        }
      } else {
        // Visible keys of each row this thread accumulates, relative to the block (<= 0 for
        // padding rows). Only the 1-2 diagonal / tail blocks of a tile get here, so the row ->
        // token division is recomputed rather than held in registers across the pipeline.
        int lim_rel[Shape::kMTiles][2];
#pragma unroll
        for (int mt = 0; mt < Shape::kMTiles; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = warp_m * Shape::kMTiles * 16 + mt * 16 + h * 8 + (lane >> 2);
            const int hl = r / st.T;
            const int tok = r - hl * st.T;
            lim_rel[mt][h] =
                (hl < st.nh && tok < st.ntok)
                    ? col_limit(p.causal, st.q_off, st.tok0 + tok, st.seqlen_k) - t * kBlockSize
                    : 0;
          }
        if (kp.q_fp4) {
          multiply_block<Element, Shape, true, true>(qa, sK, lim_rel, smem.part[i & 1], p.logit_scale);
        } else {
          multiply_block<Element, Shape, true>(qa, sK, lim_rel, smem.part[i & 1]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();
    finalize_block<Shape>(kp, smem.part[(st.n_blocks - 1) & 1], st, st.t_begin + st.n_blocks - 1);
    __syncthreads();  // part[], the tiles and the state are free for the next group / tile
  }
}

// -inf for rows no sequence covers: [0, cu_seqlens_q[0]) and [cu_seqlens_q[B], total_q).
// (cu_seqlens_q is expected non-decreasing; other values are read in bounds, results undefined.)
__device__ __forceinline__ void fill_uncovered_rows(const KernelParams& kp, int item) {
  const ProxyScoreParams& p = kp.p;
  const int64_t total_q = p.total_q;
  const UncoveredRows rows = uncovered_q_rows(p.qi, p.batch, total_q);
  if (rows.count == 0) return;
  const int64_t n = int64_t(p.reduce_heads ? 1 : p.num_heads) * p.max_k_tiles * rows.count;
  for (int64_t e = int64_t(item) * kThreads + threadIdx.x; e < n;
       e += int64_t(kp.n_fill) * kThreads) {
    const int64_t ht = e / rows.count;  // head * P + t
    p.out[ht * total_q + rows.row(e % rows.count)] = neg_inf();
  }
}

template <typename Element>
__global__ void __launch_bounds__(kThreads, 2)
    proxy_score_kernel(const __grid_constant__ KernelParams kp) {
  const ProxyScoreParams& p = kp.p;
  const int hc = kp.heads_per_cta;
  const int64_t n_items = kp.n_work + kp.n_fill;
  for (int64_t w = blockIdx.x; w < n_items; w += gridDim.x) {
    if (w >= kp.n_work) {
      if (blockIdx.y == 0) fill_uncovered_rows(kp, int(w - kp.n_work));
      continue;
    }
    // Longest causal tiles first: the q-tile index runs backwards along the grid.
    const int split = int(w % kp.n_split);
    const int64_t rest = w / kp.n_split;
    const int b = int(rest % p.batch);
    const int qt = kp.n_qt - 1 - int(rest / p.batch);
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    if (rows.len == 0) continue;
    TileWork work;
    work.b = b;
    work.split_begin = split * kp.blocks_per_split;
    work.split_end = min(p.max_k_tiles, work.split_begin + kp.blocks_per_split);
    if (rows.len <= MediumTile::kRows / hc) {
      // The whole sequence is one tile; only the first q-tile item of the sequence runs it.
      if (qt != 0) continue;
      work.tok0 = 0;
      work.ntok = rows.len;
      work.row_begin = rows.begin;
      if (rows.len <= SmallTile::kRows / hc) {
        run_tile<Element, SmallTile>(kp, work);
      } else {
        run_tile<Element, MediumTile>(kp, work);
      }
      continue;
    }
    const int T = LargeTile::kRows / hc;
    // Grid-stride over q-tiles: correct even when max_seqlen_q under-estimates a sequence.
    for (int64_t tile = qt; tile * T < rows.len; tile += kp.n_qt) {
      work.tok0 = int(tile * T);
      work.ntok = int(min(int64_t(T), rows.len - tile * T));
      work.row_begin = rows.begin + work.tok0;
      run_tile<Element, LargeTile>(kp, work);
    }
  }
}

}  // namespace flashmsa::cuda::proxy

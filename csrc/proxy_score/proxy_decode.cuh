// msa_proxy_score / msa_proxy_score_fp4 for decode (a few query tokens per request): a
// memory-streaming kernel. docs/design/proxy_score.md ("Decode kernel") explains the numbers.
//
// Work unit = (request b, KV head kh, key block t): the 128 keys of one block against every query
// row of the request that attends through kh (G heads x its tokens, at most 16 MMA rows per pass).
// The B x Hkv x P units (P = max_k_tiles) are split into equal contiguous ranges, one per CTA of a
// grid that is exactly resident (SMs x CTAs per SM), so that every CTA streams the same number of
// blocks and its cp.async pipeline runs across request boundaries without draining. Every index-K
// byte of a request is read once for all its heads and tokens.
//
// Per block: S = Q K^T on mma.sync m16n8k16 (rows = heads x tokens, 4 warps x 32 keys), K read
// from shared memory straight into B fragments (fp8 / NVFP4 converted in registers), per-key mask,
// row max, one store per (head, token). With fp8 K the plan may ask for fp16 MMAs whatever q's
// dtype (ProxyScorePlan::f16_mma, kernel=decode_f16): a K pair is then one cvt, and bf16 q rows
// are scaled into fp16 by a power of two (load_q_frags, kScaleQ). The dot product's 128 dims are assigned to (k-step, lane)
// slots by a fixed permutation, the same for every K dtype (so that fp8 / NVFP4 / paged twins of a
// call give bit-identical results): lane (g = lane / 4, c = lane % 4) owns the 8-dim chunks 4m + c,
// m = 0..3, of its rows and keys; k-step s = 2m + i takes dims (4m + c) * 8 + 4i + [0, 4).
// Except with NVFP4 K under the plan option nvfp4_cvt=word (load_k_frags): k-step 2m + i then takes
// the chunk's dims 2i + {0, 1, 4, 5}, so its sums may differ from the byte conversion's in the last bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/e2m1_word.cuh"
#include "common/ptx.cuh"
#include "flashmsa/error.h"
#include "flashmsa/params.h"
#include "flashmsa/plan.h"
#include "flashmsa/semantics.h"

namespace flashmsa::cuda::proxy::decode {

inline constexpr int kThreads = 128;  // 4 warps, 32 keys of each block per warp
inline constexpr int kRows = 16;      // MMA rows of one pass: heads x tokens
// Storage kinds of K (and of q: q is 16-bit, fp8 with fp8 K, or NVFP4 with NVFP4 K).
inline constexpr int kK16 = 0;
inline constexpr int kK8 = 1;
inline constexpr int kK4 = 2;

// Shared-memory stage of one 128-key block and the pipeline depth per K kind. For the default two
// CTAs per SM: ~96 KB of stages so that two CTAs fit an SM (2 x 97 KB of 228 KB) with (stages - 1)
// blocks in flight each while one is multiplied: 64 KB (16-bit), 80 KB (fp8), 81 KB (NVFP4) per
// CTA, 2-3x the ~50 KB per SM that HBM needs at full rate. NVFP4: 128 x 64 bytes of e2m1 pairs,
// then 128 x 8 scale bytes. kCtas = 3 or 4 (plan option decode_ctas, fp8 / NVFP4 K: more warps
// per SM to hide the conversion and MMA chains): as many stages as that many CTAs leave room for
// on an sm_90 SM (228 KB, 1 KB reserved per CTA): fp8 4 / 3, NVFP4 8 / 6.
template <int kK, int kCtas = 2>
struct Stage {
  static constexpr int kRowBytes = kK == kK16 ? 256 : (kK == kK8 ? 128 : 64);
  static constexpr int kDataBytes = kBlockSize * kRowBytes;
  static constexpr int kBytes = kDataBytes + (kK == kK4 ? kBlockSize * 8 : 0);
  static constexpr int kPartBytes = 2 * 4 * kRows * 4;  // part[2][warp][row]
  static constexpr int kStages = kCtas == 2 ? (kK == kK16 ? 3 : (kK == kK8 ? 6 : 10))
                                            : (228 * 1024 / kCtas - 1024 - kPartBytes) / kBytes;
  static constexpr int kSmemBytes = kStages * kBytes + kPartBytes;
  static_assert(kStages >= 2 && kStages <= 32, "the pipeline keeps one bit per stage in flight");
};

// Byte offset of the 16-byte chunk `chunk` of key row `row` in a stage (conflict-free swizzles for
// the fragment reads below: a read phase covers 2 (16-bit), 4 (fp8) or 8 (NVFP4) consecutive rows).
template <int kK>
__device__ __forceinline__ int chunk_offset(int row, int chunk) {
  if constexpr (kK == kK16) return row * 256 + ((chunk ^ ((row & 1) << 2)) << 4);
  else if constexpr (kK == kK8) return row * 128 + ((chunk ^ ((row & 3) << 1)) << 4);
  else return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
}

// Byte offset of the 16-byte chunk `chunk` of fp8 key row `row` in a stage that a TMA box of
// 128-byte rows wrote with the 128-byte swizzle (chunk ^ row % 8; decode_fp8=tma, proxy_decode_tma.cuh).
__device__ __forceinline__ int tma_sw128_offset(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

struct Params {
  ProxyScoreParams p;
  int group;     // G = Hq / Hkv (<= 16)
  int tokens;    // T = 16 / G: tokens per 16-row pass; row r = (head r / T, token r % T)
  int64_t units; // B * Hkv * P
  float scale;   // every logit times this (NVFP4: logit_scale * 2^7, see load_k_frags)
};

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xFF800000); }

// What every thread knows about the request of a unit (recomputed when b or kh changes).
struct Request {
  int b = -1;
  int kh = -1;
  int row_begin;
  int ntok;       // query rows of the request
  int seqlen_k;
  int64_t q_off;
  int n_compute;  // blocks [0, n_compute) hold a key visible to some row
};

__device__ __forceinline__ void load_request(const Params& dp, Request& r, int b, int kh) {
  const ProxyScoreParams& p = dp.p;
  r.b = b;
  r.kh = kh;
  const RowRange rows = q_rows(p.qi, p.total_q, b);
  r.row_begin = rows.begin;
  r.ntok = rows.len;
  r.seqlen_k = kv_seqlen(p.kv, b);
  r.q_off = q_offset_of(p.q_offset, b, rows.len, r.seqlen_k);
  const int lim_last = rows.len > 0 ? col_limit(p.causal, r.q_off, rows.len - 1, r.seqlen_k) : 0;
  r.n_compute = int(min(int64_t(p.max_k_tiles), ceil_div(lim_last, kBlockSize)));
}

// Unit u -> (b, kh, t).
__device__ __forceinline__ void unit_coords(const Params& dp, int64_t u, int& b, int& kh, int& t) {
  const int P = dp.p.max_k_tiles;
  const int64_t bk = u / P;
  t = int(u - bk * P);
  b = int(bk / dp.p.num_kv_heads);
  kh = int(bk - int64_t(b) * dp.p.num_kv_heads);
}

// Issues the cp.async copies of block t of request r into `stage`; false when nothing is loaded
// (no query row, no visible key, or an invalid page: the unit's columns are then -inf). page:
// paged caches, the block's page as kv_page_ahead read it (unused for flat ones).
template <int kK>
__device__ __forceinline__ bool load_block(const Params& dp, const Request& r, int t, int page, uint8_t* stage) {
  const ProxyScoreParams& p = dp.p;
  if (r.ntok == 0 || t >= r.n_compute) return false;
  // t < n_compute <= the sequence's blocks <= max_pages: the page read ahead is kv_page's.
  if (p.kv.paged && page < 0) return false;
  const int64_t base = p.kv.paged ? int64_t(page) * p.k.stride_page + int64_t(r.kh) * p.k.stride_head
                                  : kv_offset(p.k, p.kv, r.b, r.kh, t * kBlockSize);
  const int n_keys = min(kBlockSize, r.seqlen_k - t * kBlockSize);
  const uint32_t dst = smem_addr(stage);
  if constexpr (kK == kK16) {
    const uint16_t* src = static_cast<const uint16_t*>(p.k.data) + base;
    const int c = threadIdx.x & 15;
    for (int row = threadIdx.x >> 4; row < n_keys; row += kThreads / 16)
      cp_async_16(dst + chunk_offset<kK>(row, c), src + int64_t(row) * p.k.stride_token + c * 8);
  } else if constexpr (kK == kK8) {
    const uint8_t* src = static_cast<const uint8_t*>(p.k.data) + base;
    const int c = threadIdx.x & 7;
    for (int row = threadIdx.x >> 3; row < n_keys; row += kThreads / 8)
      cp_async_16(dst + chunk_offset<kK>(row, c), src + int64_t(row) * p.k.stride_token + c * 16);
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(p.k.data) + base;
    const int c = threadIdx.x & 3;
    for (int row = threadIdx.x >> 2; row < n_keys; row += kThreads / 4)
      cp_async_16(dst + chunk_offset<kK>(row, c), src + int64_t(row) * p.k.stride_token + c * 16);
    // Scale bytes of a key: columns 0..3 and 4..7 are two 4-byte runs of the 128x4 layout.
    const int64_t srow0 = p.kv.paged ? nvfp4_scale_row_paged(page, r.kh, 0, p.num_kv_heads)
                                     : kv_scale_row(p.kv, p.num_kv_heads, r.b, r.kh, t * kBlockSize);
    const int step = !p.kv.paged ? p.num_kv_heads : 1;
    for (int e = threadIdx.x; e < n_keys * 2; e += kThreads) {
      const int row = e >> 1, half = e & 1;
      cp_async_4(dst + Stage<kK>::kDataBytes + row * 8 + half * 4,
                 p.k.scale + nvfp4_scale_offset(srow0 + int64_t(row) * step, 4 * half));
    }
  }
  return true;
}

// Row (or query column) `row` of the pass from token tok0 of request r: head hl = row / T, token
// tok0 + row % T (T = dp.tokens); valid where both exist; its q row and head.
struct PassRow {
  bool valid;
  int64_t qrow;
  int head;
};
__device__ __forceinline__ PassRow pass_row(const Params& dp, const Request& r, int tok0, int row) {
  const int hl = row / dp.tokens;
  const int tok = tok0 + row - hl * dp.tokens;
  return {hl < dp.group && tok < r.ntok, int64_t(r.row_begin) + tok, r.kh * dp.group + hl};
}

// A fragments of the 16 rows of one pass (tokens [tok0, tok0 + T) of the request, all G heads):
// qa[s][0..3] = (row g, dims d..d+1), (row g + 8, d..d+1), (row g, d+2..d+3), (row g + 8, d+2..d+3)
// with d = (4 (s / 2) + c) * 8 + 4 (s % 2). Padding rows are zero.
// kScaleQ (bf16 q, fp16 MMAs): row h (g, g + 8) is multiplied by 2^(14 - E) into fp16 and
// qmul[h] = 2^(E - 14) turns its logits back (common/ptx.cuh f16_row_scale). Else qmul[h] = 1.
template <typename Mma, int kK, bool kScaleQ = false, bool kWord = false>
__device__ __forceinline__ void load_q_frags(const Params& dp, const Request& r, int tok0,
                                             uint32_t (&qa)[8][4], float (&qmul)[2]) {
  const ProxyScoreParams& p = dp.p;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const PassRow pr = pass_row(dp, r, tok0, g + 8 * half);
    const bool valid = pr.valid;
    const int64_t qrow = pr.qrow;
    const int head = pr.head;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int d = (4 * m + c) * 8;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (valid) {
        if constexpr (kK == kK4) {
          const uint8_t* src = static_cast<const uint8_t*>(p.q) + qrow * p.q_stride_token +
                               int64_t(head) * p.q_stride_head + d / 2;
          const uint32_t raw = __ldg(reinterpret_cast<const uint32_t*>(src));
          const float s = e4m3_to_float(p.q_scale[nvfp4_scale_offset(qrow * p.num_heads + head, d / 16)]);
          // e2m1 x e4m3 values are exact in fp16; 2^14 undoes e2m1x2_to's code placement.
#pragma unroll
          for (int i = 0; i < 4; ++i) w[i] = e2m1x2_to<Mma>((raw >> (8 * i)) & 0xFFu, s * 16384.0f);
        } else if (p.q_dtype == DType::kFP8E4M3) {
          const uint2 raw = __ldg(reinterpret_cast<const uint2*>(
              static_cast<const uint8_t*>(p.q) + qrow * p.q_stride_token + int64_t(head) * p.q_stride_head + d));
          w[0] = e4m3x2_to_mma_bits<Mma>(uint16_t(raw.x & 0xFFFFu));
          w[1] = e4m3x2_to_mma_bits<Mma>(uint16_t(raw.x >> 16));
          w[2] = e4m3x2_to_mma_bits<Mma>(uint16_t(raw.y & 0xFFFFu));
          w[3] = e4m3x2_to_mma_bits<Mma>(uint16_t(raw.y >> 16));
        } else {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(
              static_cast<const uint16_t*>(p.q) + qrow * p.q_stride_token + int64_t(head) * p.q_stride_head + d));
          w[0] = v.x;
          w[1] = v.y;
          w[2] = v.z;
          w[3] = v.w;
        }
      }
      qa[2 * m][half] = w[0];
      qa[2 * m][2 + half] = w[1];
      qa[2 * m + 1][half] = w[2];
      qa[2 * m + 1][2 + half] = w[3];
    }
  }
  if constexpr (kWord) q_frags_word_order(qa);  // the k-step dims of load_k_frags<.., true>
  qmul[0] = qmul[1] = 1.0f;
  if constexpr (kScaleQ) {
    static_assert(std::is_same_v<Mma, __half> && kK == kK8, "bf16 q into fp16 MMAs, fp8 K");
    // The words hold bf16 pairs here (q is bf16: launch_proxy_decode); the row's other dims are
    // in the lanes of its quad (c = lane % 4).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = 0.0f;
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int j = 0; j < 2; ++j) mx = fmaxf(mx, bf16x2_abs_max(qa[s][half + 2 * j]));
      const F16RowScale rs = f16_row_scale(quad_max(mx));  // common/ptx.cuh
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int j = 0; j < 2; ++j) qa[s][half + 2 * j] = bf16x2_scaled_to_f16x2(qa[s][half + 2 * j], rs.up);
      qmul[half] = rs.down;
    }
  }
}

// Two e2m1 codes (one byte) times a block scale x 2^7 (an fp16 pair): value x 2^-7, exact
// (common/ptx.cuh); the logit is rescaled by 2^7 in fp32.
__device__ __forceinline__ uint32_t e2m1x2_scaled(uint32_t byte, __half2 scale_x2p7) {
  return hmul2_bits(e2m1x2_code_bits(byte), *reinterpret_cast<const uint32_t*>(&scale_x2p7));
}

// B fragments of key `row` (this lane's key of an 8-key step) for the 8 k-steps: kb[s] = {b0, b1}.
// kWord (plan option nvfp4_cvt=word, NVFP4 only): the word of chunk m converted 8 codes at a time
// (common/e2m1_word.cuh); k-step 2m + o then takes dims d + 2o + {0, 4} (b0) and d + 2o + {1, 5}
// (b1), d = (4m + c) * 8, and load_q_frags<.., kWord> permutes the Q fragments to match.
// kSw128 (fp8 only): the stage has the TMA 128-byte swizzle (tma_sw128_offset), not chunk_offset's.
template <typename Mma, int kK, bool kWord = false, bool kSw128 = false>
__device__ __forceinline__ void load_k_frags(const uint8_t* stage, int row, int c, uint32_t (&kb)[8][2]) {
  static_assert(!kSw128 || kK == kK8, "the TMA-swizzled stage holds fp8 K");
  // NVFP4: the key's scale columns 2m + c / 2 (m = 0..3) x 2^7 as fp16 pairs {m = 0, 1}, {2, 3}:
  // one 8-byte load of the key's scales, two e4m3x2 conversions, two exact multiplies by 2^7.
  __half2 scale[2];
  if constexpr (kK == kK4) {
    static_assert(std::is_same_v<Mma, __half>, "NVFP4 K runs fp16 MMAs");
    const uint2 raw = *reinterpret_cast<const uint2*>(stage + Stage<kK>::kDataBytes + row * 8);
    const int shift = (c >> 1) * 8;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      // Bytes c / 2 and 2 + c / 2 of the word (columns 4w + c / 2 and 4w + 2 + c / 2).
      const uint32_t f16 = nvfp4_scale_pair_x128(__byte_perm((w == 0 ? raw.x : raw.y) >> shift, 0u, 0x4420));
      scale[w] = *reinterpret_cast<const __half2*>(&f16);
    }
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if constexpr (kK == kK16) {
      const uint4 v = *reinterpret_cast<const uint4*>(stage + chunk_offset<kK>(row, 4 * m + c));
      kb[2 * m][0] = v.x;
      kb[2 * m][1] = v.y;
      kb[2 * m + 1][0] = v.z;
      kb[2 * m + 1][1] = v.w;
    } else if constexpr (kK == kK8) {
      // Dims (4m + c) * 8: 16-byte chunk 2m + c / 2, its half c % 2.
      const int off = kSw128 ? tma_sw128_offset(row, 2 * m + (c >> 1)) : chunk_offset<kK>(row, 2 * m + (c >> 1));
      const uint2 v = *reinterpret_cast<const uint2*>(stage + off + (c & 1) * 8);
      kb[2 * m][0] = e4m3x2_to_mma_bits<Mma>(uint16_t(v.x & 0xFFFFu));
      kb[2 * m][1] = e4m3x2_to_mma_bits<Mma>(uint16_t(v.x >> 16));
      kb[2 * m + 1][0] = e4m3x2_to_mma_bits<Mma>(uint16_t(v.y & 0xFFFFu));
      kb[2 * m + 1][1] = e4m3x2_to_mma_bits<Mma>(uint16_t(v.y >> 16));
    } else {
      // Dims (4m + c) * 8: 4 bytes at 16-byte chunk m, word c; their scale is column 2m + c / 2.
      const uint32_t v = *reinterpret_cast<const uint32_t*>(stage + chunk_offset<kK>(row, m) + c * 4);
      if constexpr (kWord) {
        const uint32_t sc = *reinterpret_cast<const uint32_t*>(&scale[m >> 1]);  // half m % 2
        const uint32_t lo = e2m1_lo_codes(v), hi = e2m1_hi_codes(v);
        kb[2 * m][0] = hmul2_half_bits(codes_02(lo), sc, m & 1);      // dims d, d + 4
        kb[2 * m][1] = hmul2_half_bits(codes_02(hi), sc, m & 1);      // d + 1, d + 5
        kb[2 * m + 1][0] = hmul2_half_bits(codes_13(lo), sc, m & 1);  // d + 2, d + 6
        kb[2 * m + 1][1] = hmul2_half_bits(codes_13(hi), sc, m & 1);  // d + 3, d + 7
        continue;
      }
      const __half2 s2 = m == 0 ? __low2half2(scale[0])
                                : (m == 1 ? __high2half2(scale[0])
                                          : (m == 2 ? __low2half2(scale[1]) : __high2half2(scale[1])));
      kb[2 * m][0] = e2m1x2_scaled(v & 0xFFu, s2);
      kb[2 * m][1] = e2m1x2_scaled((v >> 8) & 0xFFu, s2);
      kb[2 * m + 1][0] = e2m1x2_scaled((v >> 16) & 0xFFu, s2);
      kb[2 * m + 1][1] = e2m1x2_scaled(v >> 24, s2);
    }
  }
}

// One key step of one block (keys key0 .. key0 + 7 against the 16 rows): B fragments, 8 MMAs,
// scale, mask, and this lane's keys key0 + 2c, key0 + 2c + 1 into the maxima of rows g, g + 8.
// kMasked: lim[h] = visible keys of row g + 8h relative to the block (<= 0: none).
template <typename Mma, int kK, bool kMasked, bool kScaleQ, bool kWord>
__device__ __forceinline__ void multiply_step(const Params& dp, const uint32_t (&qa)[8][4],
                                              const float (&qmul)[2], const uint8_t* stage,
                                              const int (&lim)[2], int key0, int g, int c,
                                              float (&rmax)[2]) {
  uint32_t kb[8][2];
  load_k_frags<Mma, kK, kWord>(stage, key0 + g, c, kb);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int s = 0; s < 8; ++s) mma_m16n8k16<Mma>(acc, qa[s], kb[s][0], kb[s][1]);
  // acc[e]: row g + 8 (e / 2), key key0 + 2c + e % 2.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[e];
    if constexpr (kK == kK4) v *= dp.scale;
    if constexpr (kScaleQ) v *= qmul[e >> 1];  // a power of two: exact, back to q's scale
    if constexpr (kMasked) {
      const int key = key0 + 2 * c + (e & 1);
      v = key < lim[e >> 1] ? v : neg_inf();
    }
    rmax[e >> 1] = max_nan(rmax[e >> 1], v);
  }
}

// Rows g, g + 8's maxima over the quad (the lanes of a row) into part[warp][row].
__device__ __forceinline__ void store_row_max(const float (&rmax)[2], float* part, int warp, int g,
                                              int c) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v = rmax[h];
    v = max_nan(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
    v = max_nan(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
    if (c == 0) part[warp * kRows + g + 8 * h] = v;
  }
}

// This warp's 32 keys of the block against the 16 rows: per-row maxima into part[warp][row].
// kMasked: per key, lim[h] = visible keys of row g + 8h relative to the block (<= 0: none); else
// every key of the block is visible to every row that is stored.
template <typename Mma, int kK, bool kMasked, bool kScaleQ, bool kWord>
__device__ __forceinline__ void multiply_block(const Params& dp, const uint32_t (&qa)[8][4],
                                               const float (&qmul)[2], const uint8_t* stage,
                                               const int (&lim)[2], float* part) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  float rmax[2] = {neg_inf(), neg_inf()};
#pragma unroll
  for (int ns = 0; ns < 4; ++ns)
    multiply_step<Mma, kK, kMasked, kScaleQ, kWord>(dp, qa, qmul, stage, lim, warp * 32 + ns * 8, g, c, rmax);
  store_row_max(rmax, part, warp, g, c);
}

// multiply_block over two independent blocks (plan option decode_ilp=2): block b's per-row maxima
// into part[b][warp][row]. The warp has 8 independent accumulator chains (2 blocks x 4 key steps)
// to schedule instead of 4 (ptxas keeps about 4 live and overlaps the blocks at the seam:
// docs/design/proxy_score.md), and the tail (quad shuffles, part[] stores, the caller's barrier
// and output stores) is paid once per pair. Every block's steps are multiply_block's, in its
// order: the results are bit-identical.
template <typename Mma, int kK, bool kMasked, bool kScaleQ, bool kWord>
__device__ __forceinline__ void multiply_pair(const Params& dp, const uint32_t (&qa)[8][4],
                                              const float (&qmul)[2], const uint8_t* const (&stage)[2],
                                              const int (&lim)[2][2], float* part) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  float rmax[2][2] = {{neg_inf(), neg_inf()}, {neg_inf(), neg_inf()}};
#pragma unroll
  for (int ns = 0; ns < 4; ++ns)
#pragma unroll
    for (int b = 0; b < 2; ++b)
      multiply_step<Mma, kK, kMasked, kScaleQ, kWord>(dp, qa, qmul, stage[b], lim[b], warp * 32 + ns * 8, g, c,
                                               rmax[b]);
#pragma unroll
  for (int b = 0; b < 2; ++b) store_row_max(rmax[b], part + b * (kThreads / 32) * kRows, warp, g, c);
}

// Per-key limits of the rows g, g + 8 of pass tok0 against block t (multiply_block's lim).
__device__ __forceinline__ void row_limits(const Params& dp, const Request& r, int t, int tok0, int g,
                                           int (&lim)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = g + 8 * h;
    const int hl = row / dp.tokens;
    const int tok = tok0 + row - hl * dp.tokens;
    lim[h] = (hl < dp.group && tok < r.ntok) ? col_limit(dp.p.causal, r.q_off, tok, r.seqlen_k) - t * kBlockSize
                                             : 0;
  }
}

// Rows of pass tok0 of block t -> out (after the part[] barrier). `loaded` false: -inf.
// Threads [kBase, kBase + 16) store (decode_ilp=2: warp b stores block b of a pair).
template <int kBase = 0>
__device__ __forceinline__ void store_pass(const Params& dp, const Request& r, int t, int tok0,
                                           const float* part, bool loaded) {
  const ProxyScoreParams& p = dp.p;
  const int64_t total_q = p.total_q;
  const int T = dp.tokens;
  const int ntok = min(T, r.ntok - tok0);
  if (!p.reduce_heads) {
    const int row = threadIdx.x - kBase;
    if (row >= kRows || (kBase > 0 && row < 0)) return;
    const int hl = row / T;
    const int tok = row - hl * T;
    if (hl >= dp.group || tok >= ntok) return;
    float v = neg_inf();
    if (loaded) {
      v = part[row];
#pragma unroll
      for (int w = 1; w < kThreads / 32; ++w) v = max_nan(v, part[w * kRows + row]);
    }
    const int head = r.kh * dp.group + hl;
    p.out[(int64_t(head) * p.max_k_tiles + t) * total_q + r.row_begin + tok0 + tok] = v;
  } else {
    // One KV head (checked by the launcher): the max over the G heads of the pass.
    const int tok = threadIdx.x - kBase;
    if (tok >= ntok || (kBase > 0 && tok < 0)) return;
    float v = neg_inf();
    if (loaded) {
      for (int hl = 0; hl < dp.group; ++hl)
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) v = max_nan(v, part[w * kRows + hl * T + tok]);
    }
    p.out[int64_t(t) * total_q + r.row_begin + tok0 + tok] = v;
  }
}

// -inf for the rows of out no request covers: [0, cu_seqlens_q[0]) and [cu_seqlens_q[B], total_q).
template <int kCtaThreads = kThreads>
__device__ __forceinline__ void fill_uncovered_rows(const Params& dp) {
  const ProxyScoreParams& p = dp.p;
  const int64_t total_q = p.total_q;
  const UncoveredRows rows = uncovered_q_rows(p.qi, p.batch, total_q);
  if (rows.count == 0) return;
  const int64_t n = int64_t(p.reduce_heads ? 1 : p.num_heads) * p.max_k_tiles * rows.count;
  for (int64_t e = int64_t(blockIdx.x) * kCtaThreads + threadIdx.x; e < n; e += int64_t(gridDim.x) * kCtaThreads) {
    const int64_t ht = e / rows.count;
    p.out[ht * total_q + rows.row(e % rows.count)] = neg_inf();
  }
}

// kIlp = 2 (plan option decode_ilp=2): an iteration waits for units i and i + 1 and, where both
// are loaded blocks of the same single-pass request, multiplies them together (multiply_pair)
// with one barrier and one store round for the pair, then moves on by two; otherwise it runs
// unit i alone as kIlp = 1 does (unit i + 1 already waited for).
template <typename Mma, int kK, bool kScaleQ, int kCtas, int kIlp, bool kWord>
__global__ void __launch_bounds__(kThreads, kCtas) proxy_decode_kernel(const __grid_constant__ Params dp) {
  using St = Stage<kK, kCtas>;
  constexpr int S = St::kStages;
  static_assert(kIlp == 1 || (kIlp == 2 && S >= 3), "decode_ilp=2 waits for two stages of S >= 3");
  extern __shared__ __align__(128) uint8_t smem[];
  float* part = reinterpret_cast<float*>(smem + S * St::kBytes);
  const ProxyScoreParams& p = dp.p;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;

  // This CTA's units [u0, u1): equal shares of B * Hkv * P.
  const int64_t u0 = dp.units * blockIdx.x / gridDim.x;
  const int64_t u1 = dp.units * (blockIdx.x + 1) / gridDim.x;
  const int64_t n = u1 - u0;

  // Producer cursor (the next unit to issue) and its request. `issued` holds one bit per unit in
  // flight: bit k = whether unit i + k (i: the unit consumed next) was loaded.
  Request pr, cr;
  int pb, pkh, pt;
  unit_coords(dp, u0, pb, pkh, pt);
  uint32_t issued = 0;
  auto issue = [&](int64_t j) -> bool {  // unit u0 + j (the cursor) into stage j % S
    // The page id is read beside a new request's lengths, not after them (kv_page_ahead).
    const int page = p.kv.paged ? int(kv_page_ahead(p.kv, pb, pt)) : -1;
    if (pb != pr.b || pkh != pr.kh) load_request(dp, pr, pb, pkh);
    const bool loaded = load_block<kK>(dp, pr, pt, page, smem + int(j % S) * St::kBytes);
    if (++pt == p.max_k_tiles) {
      pt = 0;
      if (++pkh == p.num_kv_heads) {
        pkh = 0;
        ++pb;
      }
    }
    return loaded;
  };
#pragma unroll 1
  for (int j = 0; j < S - 1; ++j) {
    if (j < n && issue(j)) issued |= 1u << j;
    cp_async_commit();
  }

  int cb, ckh, ct;
  unit_coords(dp, u0, cb, ckh, ct);
  uint32_t qa[8][4];
  float qmul[2];
  // The first request's Q fragments load while its first blocks are in flight (batch 1: most CTAs
  // take one block, and the Q latency would otherwise follow the block's).
  load_request(dp, cr, cb, ckh);
  bool q_ready = cr.ntok > 0 && cr.ntok <= dp.tokens;  // qa holds the single pass of request cr
  if (q_ready) load_q_frags<Mma, kK, kScaleQ, kWord>(dp, cr, 0, qa, qmul);
  int step = 1;  // units consumed by the last iteration (kIlp = 2: 1 or 2)
#pragma unroll 1
  for (int64_t i = 0; i < n; i += step) {
    // Refill stage (i - 1) % S with unit i + S - 1 (its bit lands at position S - 1) before
    // waiting for unit i, so that all S stages are in flight during the wait. The stage is free:
    // its last reader was a loaded unit <= i - 1, which every thread left through the barrier
    // after its multiply. For the same reason units that load nothing take no barrier at all
    // (-inf runs are just stores). kIlp = 2 after a pair: stage (i - 2) % S too, with unit
    // i + S - 2 (bit S - 2).
    if constexpr (kIlp == 2) {
      if (step == 2) {
        if (i + S - 2 < n && issue(i + S - 2)) issued |= 1u << (S - 2);
        cp_async_commit();
      }
    }
    if (i + S - 1 < n && issue(i + S - 1)) issued |= 1u << (S - 1);
    cp_async_commit();
    const bool loaded = issued & 1u;
    const bool loaded1 = kIlp == 2 && (issued & 2u);  // unit i + 1 (never set when i + 1 >= n)
    step = 1;
    if (loaded || loaded1) {
      // Unit i's group (kIlp = 2: and unit i + 1's): S - kIlp newer groups may stay in flight.
      cp_async_wait<S - kIlp>();
      __syncthreads();  // the blocks landed (every thread's copies); part[] is free again
    }

    if (cb != cr.b || ckh != cr.kh) {
      load_request(dp, cr, cb, ckh);
      q_ready = false;
    }
    const int t = ct;
    if constexpr (kIlp == 2) {
      if (loaded && loaded1 && t + 1 < p.max_k_tiles && cr.ntok <= dp.tokens) {
        // Blocks t and t + 1 of request cr (both loaded: cr has rows, and one pass).
        const uint8_t* const stages[2] = {smem + int(i % S) * St::kBytes, smem + int((i + 1) % S) * St::kBytes};
        float* part1 = part + (kThreads / 32) * kRows;
        if (!q_ready) load_q_frags<Mma, kK, kScaleQ, kWord>(dp, cr, 0, qa, qmul);
        q_ready = true;
        int lim[2][2] = {{0, 0}, {0, 0}};
        // Block t + 1 whole to the first token: both blocks are whole to every row. Else both
        // masked (a block a row sees whole gets a limit >= its 128 keys: kept as it is).
        if (int64_t(t + 2) * kBlockSize <= col_limit(p.causal, cr.q_off, 0, cr.seqlen_k)) {
          multiply_pair<Mma, kK, false, kScaleQ, kWord>(dp, qa, qmul, stages, lim, part);
        } else {
          row_limits(dp, cr, t, 0, g, lim[0]);
          row_limits(dp, cr, t + 1, 0, g, lim[1]);
          multiply_pair<Mma, kK, true, kScaleQ, kWord>(dp, qa, qmul, stages, lim, part);
        }
        __syncthreads();
        store_pass(dp, cr, t, 0, part, true);
        store_pass<32>(dp, cr, t + 1, 0, part1, true);  // warp 1
        ct += 2;  // t + 1 < max_k_tiles: at most the request's last block
        if (ct == p.max_k_tiles) {
          ct = 0;
          if (++ckh == p.num_kv_heads) {
            ckh = 0;
            ++cb;
          }
        }
        issued >>= 2;
        step = 2;
        continue;
      }
    }
    issued >>= 1;
    if (cr.ntok > 0) {
      const uint8_t* stage = smem + int(i % S) * St::kBytes;
      for (int tok0 = 0; tok0 < cr.ntok; tok0 += dp.tokens) {
        if (loaded) {
          if (!q_ready || cr.ntok > dp.tokens) load_q_frags<Mma, kK, kScaleQ, kWord>(dp, cr, tok0, qa, qmul);
          q_ready = true;
          int lim[2] = {0, 0};
          // The pass's first token sees the fewest keys (col_limit grows with the token): when it
          // sees the whole block, every row does and the per-key mask is skipped (64-bit: t + 1
          // may be 2^24).
          if (int64_t(t + 1) * kBlockSize <= col_limit(p.causal, cr.q_off, tok0, cr.seqlen_k)) {
            multiply_block<Mma, kK, false, kScaleQ, kWord>(dp, qa, qmul, stage, lim, part);
          } else {
            row_limits(dp, cr, t, tok0, g, lim);
            multiply_block<Mma, kK, true, kScaleQ, kWord>(dp, qa, qmul, stage, lim, part);
          }
          __syncthreads();
        }
        store_pass(dp, cr, t, tok0, part, loaded);
        if (loaded && tok0 + dp.tokens < cr.ntok) __syncthreads();  // part[] reused by the next pass
      }
    }
    if (++ct == p.max_k_tiles) {
      ct = 0;
      if (++ckh == p.num_kv_heads) {
        ckh = 0;
        ++cb;
      }
    }
  }
  cp_async_wait<0>();
  fill_uncovered_rows(dp);
}

template <typename Mma, int kK, bool kScaleQ = false, int kCtas = 2, int kIlp = 1, bool kWord = false>
void launch_kernel(const Params& dp, cudaStream_t stream) {
  static_assert(!kWord || kK == kK4, "nvfp4_cvt=word converts NVFP4 K");
  auto kernel = proxy_decode_kernel<Mma, kK, kScaleQ, kCtas, kIlp, kWord>;
  const size_t smem = Stage<kK, kCtas>::kSmemBytes;
  const int resident = prepare_launch(kernel, kThreads, smem);
  const DeviceLimits& limits = current_device_limits();
  // Exactly resident: one wave, every CTA streaming units / grid blocks.
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(int64_t(limits.num_sms) * resident,
                                                              std::max<int64_t>(dp.units, 1)));
  kernel<<<unsigned(ctas), kThreads, smem, stream>>>(dp);
  MSA_CHECK_LAUNCH();
}

// f(std::integral_constant<int, n>{}) for n = ctas, the plan's CTAs per SM for fp8 / NVFP4 K.
template <typename F>
void with_ctas(int ctas, F&& f) {
  switch (ctas) {
    case 2: f(std::integral_constant<int, 2>{}); return;
    case 3: f(std::integral_constant<int, 3>{}); return;
    case 4: f(std::integral_constant<int, 4>{}); return;
    default: MSA_FAIL("proxy_score: the plan's decode_ctas ", ctas, " is not 2, 3 or 4");
  }
}

// f(std::integral_constant<int, n>{}) for n = ilp, the plan's units per loop iteration (decode_ilp).
template <typename F>
void with_ilp(int ilp, F&& f) {
  switch (ilp) {
    case 1: f(std::integral_constant<int, 1>{}); return;
    case 2: f(std::integral_constant<int, 2>{}); return;
    default: MSA_FAIL("proxy_score: the plan's decode_ilp ", ilp, " is not 1 or 2");
  }
}

// The cp.async ring over fp8 K (launch.h): f16_mma (fp16 MMAs; bf16 q rows scaled, fp8 q as it
// is) or Element MMAs, at the plan's decode_ctas and decode_ilp.
template <typename Element>
void launch_ring_fp8(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  with_ilp(plan.decode_ilp, [&](auto u) {
    constexpr int kIlp = u.value;
    with_ctas(plan.decode_ctas, [&](auto c) {
      if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
        if (plan.f16_mma) {
          // Every e4m3 value is an fp16 value: fp8 q goes in as it is, bf16 q rows scaled.
          if (dp.p.q_dtype == DType::kBF16) {
            launch_kernel<__half, kK8, true, c.value, kIlp>(dp, stream);
          } else {
            launch_kernel<__half, kK8, false, c.value, kIlp>(dp, stream);
          }
          return;
        }
      }
      launch_kernel<Element, kK8, false, c.value, kIlp>(dp, stream);
    });
  });
}

// The cp.async ring over NVFP4 q and K (launch.h): fp16 MMAs (every e2m1 x e4m3 value is exact in
// fp16), the codes a word (nvfp4_cvt=word) or a byte at a time; instantiated for bf16 only.
template <typename Element>
void launch_ring_fp4(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  static_assert(std::is_same_v<Element, __nv_bfloat16>, "NVFP4 q and k: the bf16 unit");
  with_ilp(plan.decode_ilp, [&](auto u) {
    constexpr int kIlp = u.value;
    with_ctas(plan.decode_ctas, [&](auto c) {
      if (plan.nvfp4_word)  // nvfp4_cvt=word: the codes a word (8) at a time
        launch_kernel<__half, kK4, false, c.value, kIlp, true>(dp, stream);
      else
        launch_kernel<__half, kK4, false, c.value, kIlp>(dp, stream);
    });
  });
}

}  // namespace flashmsa::cuda::proxy::decode

#include "proxy_score/proxy_decode_tma.cuh"

namespace flashmsa::cuda::proxy {

// The decode kernel for Element (bf16 or fp16, the q-derived MMA type of proxy_score); false
// (nothing launched) when proxy_decode_runs (plan.h) says it does not run the call. From the plan:
// f16_mma (fp8 K with bf16 or fp8 q runs fp16 MMAs, bf16 q scaled per row), decode_ctas (the
// CTAs per SM that fp8 / NVFP4 K are built for; 16-bit K always 2), decode_ilp and nvfp4_word
// (NVFP4 K converted a word at a time).
template <typename Element>
bool launch_proxy_decode(const ProxyScoreParams& p, const ProxyScorePlan& plan, cudaStream_t stream) {
  if (!proxy_decode_runs(p)) return false;
  MSA_CHECK(p.q_dtype != DType::kNVFP4 || (p.q_scale != nullptr && p.k.scale != nullptr),
            "proxy_score: NVFP4 q / k need their block scales");
  if (p.total_q <= 0 || p.max_k_tiles <= 0) return true;  // an empty output: nothing to write

  decode::Params dp{};
  dp.p = p;
  dp.group = p.num_heads / p.num_kv_heads;
  dp.tokens = decode::kRows / dp.group;
  dp.units = proxy_decode_units(p);
  dp.scale = p.q_dtype == DType::kNVFP4 ? p.logit_scale * 128.0f : 1.0f;

  const bool k8 = p.k.dtype == DType::kFP8E4M3;
  const bool k4 = p.k.dtype == DType::kNVFP4;
  const int64_t q_elt = p.q_dtype == DType::kFP8E4M3 || p.q_dtype == DType::kNVFP4 ? 1 : 2;
  const int64_t k_elt = k8 || k4 ? 1 : 2;
  auto aligned = [](const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0; };
  MSA_CHECK(aligned(p.q, 16) && (p.q_stride_token * q_elt) % 16 == 0 && (p.q_stride_head * q_elt) % 16 == 0,
            "proxy_score: q must be 16-byte aligned with 16-byte multiple strides");
  MSA_CHECK(aligned(p.k.data, 16) && (p.k.stride_token * k_elt) % 16 == 0 &&
                (p.k.stride_head * k_elt) % 16 == 0 && (p.k.stride_page * k_elt) % 16 == 0,
            "proxy_score: k must be 16-byte aligned with 16-byte multiple strides");

  // NVFP4 q and k run fp16 MMAs: only the bf16 unit (the type proxy_score picks for NVFP4 q)
  // instantiates them.
  if (k4 && !std::is_same_v<Element, __nv_bfloat16>) return false;
  // decode_fp8=tma / decode_nvfp4=tma: the TMA-fed warp-per-block kernel of plan.tma_cols columns
  // a pass where it applies (sm_90a, no reduce_heads), else the cp.async ring. The fp8 and NVFP4
  // paths are instantiated in units of their own (launch.h).
  if (k8 && plan.tma && decode::tma::launch_fp8<Element>(dp, plan, stream)) return true;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {  // decode_nvfp4=tma, likewise
    if (k4 && plan.tma && decode::tma::launch_fp4<Element>(dp, plan, stream)) return true;
    if (k4) {
      decode::launch_ring_fp4<Element>(dp, plan, stream);
      return true;
    }
  }
  if (k8) {
    decode::launch_ring_fp8<Element>(dp, plan, stream);
  } else {
    decode::with_ilp(plan.decode_ilp, [&](auto u) {
      decode::launch_kernel<Element, decode::kK16, false, 2, u.value>(dp, stream);
    });
  }
  return true;
}

}  // namespace flashmsa::cuda::proxy

// msa_proxy_score decode with fp8 or NVFP4 K through TMA, a warp per key block (plan options
// decode_fp8=tma and decode_nvfp4=tma, sm_90a; docs/design/proxy_score.md, "fp8 K through TMA, a
// warp per block" and "NVFP4 K through TMA"). Included by proxy_decode.cuh after the cp.async
// kernel, whose pieces it reuses (units, requests, Q fragments, the fp8 B-fragment loads, the -inf
// fill).
//
// One CTA per SM: the last warp is the producer, the others (Shape<kK>::kConsumers: 6 for fp8, 11
// for NVFP4) consume; with decode_tma_issue=warps there is no producer warp and NVFP4 has 12
// consumers (Shape<kK>::kSelfConsumers). The CTA's units are proxy_decode's
// (an equal contiguous share of B x Hkv x P); unit j of the share goes to consumer warp
// w = j % kConsumers, as that warp's i-th unit (i = j / kConsumers), into the warp's own stage
// kStagesPerWarp * w + i % kStagesPerWarp. Each stage is so read by one warp, in order: a waiter is
// never a phase ahead of the stage (with one ring shared by all warps, a warp could reach a stage's
// next phase while an earlier, slower TMA into it was still in flight, and its parity wait would
// pass on the old phase: the first version did, and hung or faulted at B64 / 32K on the H200). The
// producer resolves 32 units at a time (one per lane: request, causal limit, page id), then its
// lane 0 waits for each stage's "empty" barrier and loads the 128 x 128 B block with one TMA (the
// paged / flat K map of common/tensor_map.h, 128-byte swizzle) completing on the stage's "full"
// barrier, or, for a unit that loads nothing, just arrives (stage flag 0). A consumer warp
// multiplies the whole block alone, so no barrier spans warps: it waits "full", reduces, stores,
// and releases the stage.
//
// Math per warp and block: keys on the MMA's M side. mma.sync m16n8k16 with A = 16 keys x 16 dims
// (fp8 -> MMA type in registers, load_k_frags' lane / dim assignment) and B = 8 query columns of
// the pass. A pass covers kCols = 8 or 16 columns (G heads x T = kCols / G tokens; the plan's
// ProxyScorePlan::tma_cols, a template parameter): Q's A fragments of load_q_frags are exactly
// the B fragments, rows g < 8 (qa[s][0], qa[s][2]) of columns 0-7 and rows g + 8 (qa[s][1],
// qa[s][3]) of columns 8-15, so with 16 columns each converted K A-fragment feeds two MMAs instead
// of being converted again in a second pass. A 16-key tile is 8 (16) MMAs and none of their rows
// is padding (the cp.async kernel puts the 4 query rows of M3 on M and wastes 12 of 16). The
// 8-column build is the kernel as first measured (054c9ce). The dims of k-step s are those of
// proxy_decode's k-step s, in the same order. MMA row g holds key 2 (g % 4) + g / 4 of its 8-key
// half: with the swizzle (chunk ^ key % 8), each 16-lane phase of the 8-byte K loads covers all 32
// banks once. The column maxima over keys are reduced in registers and over g by 3 xor-shuffles;
// bf16 q rows scaled into fp16 (kScaleQ) are scaled back after the max (a positive power of two:
// exact and monotone, so the same value as scaling each logit first).
//
// NVFP4 K (msa_proxy_score_fp4: q and K NVFP4): a stage is the block's 128 x 64 bytes of e2m1 codes
// (one TMA box, no swizzle: a lane reads its key's 16 bytes, and a read phase of 8 lanes covers 128
// contiguous bytes) followed by its 1 KB of e4m3 scales in the 128x4 layout of the scale tensor
// (paged: the page's aligned 1 KB tile by one bulk copy of the producer's lane 0 beside the TMA, on
// the same barrier; flat: gathered 4 bytes at a time by the producer lanes' cp.async, each lane's
// arrival (.noinc) counted on the stage's full barrier). Lane
// c of a key owns its dims [32c, 32c + 32) (scale groups 2c and 2c + 1): one 16-byte load, the
// word conversion of common/e2m1_word.cuh (value x 2^-7 in fp16, exact), and k-step 2w + o takes
// dims 32c + 8w + 2o + {0, 4} (k index 2c, 2c + 1) and + 1 (2c + 8, 2c + 9); the Q fragments
// (exact NVFP4 values in fp16, once per request) are built in that order. Each logit is
// acc x logit_scale x 2^7 (as the cp.async kernel's), masked, then maxed. The dims of a k-step
// differ from the cp.async kernel's, so sums may differ from its in the last bits.
#pragma once

#include <cfloat>

#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "proxy_score/nvfp4_scale_area.cuh"

namespace flashmsa::cuda::proxy::decode::tma {

// Per K kind: consumer warps, stages per consumer warp, stage layout.
template <int kK>
struct Shape;
template <>
struct Shape<kK8> {
  static constexpr int kConsumers = 6;                  // consumer warps (0..5), a whole block each
  static constexpr int kSelfConsumers = 6;              // without a producer warp (decode_tma_issue=warps)
  static constexpr int kStagesPerWarp = 2;              // each consumer warp's own stages
  static constexpr int kDataBytes = kBlockSize * 128;   // one 128-key fp8 block, 16 KB
  static constexpr int kStageBytes = kDataBytes;
};
template <>
struct Shape<kK4> {
  static constexpr int kConsumers = 11;  // + the producer: 12 warps, ptxas allows 168 registers
  static constexpr int kSelfConsumers = 12;  // the producer's place taken by a consumer (216 KB of stages)
  static constexpr int kStagesPerWarp = 2;
  static constexpr int kDataBytes = kBlockSize * 64;              // 128 keys x 64 bytes of e2m1 codes
  static constexpr int kStageBytes = kDataBytes + kNvfp4ScaleAreaBytes;  // + 1 KB of scales (nvfp4_scale_area.cuh)
};
// kSelf: the consumer warps issue their own loads (no producer warp).
template <int kK, bool kSelf>
struct Ring : Shape<kK> {
  using Shape<kK>::kStagesPerWarp;
  using Shape<kK>::kStageBytes;
  static constexpr int kConsumers = kSelf ? Shape<kK>::kSelfConsumers : Shape<kK>::kConsumers;
  // The CTA: the consumer warps, and the producer warp (the last) unless they issue their own loads.
  static constexpr int kCtaThreads = (kConsumers + (kSelf ? 0 : 1)) * 32;
  static constexpr int kStages = kConsumers * kStagesPerWarp;  // fp8 192 KB, NVFP4 198 KB (kSelf: 216 KB)
  // Consumer warp w's i-th unit (unit j = w + kConsumers i of the CTA's share): its stage and the
  // phase (of that stage's uses) it is.
  __host__ __device__ static constexpr int warp_stage(int w, int64_t i) {
    return w * kStagesPerWarp + int(uint64_t(i) % kStagesPerWarp);
  }
  __host__ __device__ static constexpr uint32_t warp_parity(int64_t i) {
    return uint32_t(uint64_t(i) / kStagesPerWarp) & 1u;
  }
  // The same for unit j of the CTA's share (the producer's count).
  __host__ __device__ static constexpr int unit_stage(int64_t j) { return warp_stage(int(j % kConsumers), j / kConsumers); }
  __host__ __device__ static constexpr uint32_t unit_parity(int64_t j) { return warp_parity(j / kConsumers); }
  // Stages (1024-byte aligned: the 128-byte swizzle's period), full[S] and empty[S] mbarriers, the
  // stages' loaded flags, and the alignment slack of the dynamic shared memory.
  static constexpr int kSmemBytes = kStages * kStageBytes + kStages * (2 * 8 + 4) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");
};

struct TmaParams {
  Params dp;         // dp.tokens = kCols / G (kCols: the launch's columns per pass, 8 or 16)
  CUtensorMap k_map; // encode_kv_block_map: 128 keys x 128 bytes, 128-byte swizzle (fp8) or 64 bytes, none (NVFP4)
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Arrivals that complete a stage's full barrier: the expect_tx of the TMA(s) of producer lane 0, and
// for flat NVFP4 each producer lane's cp.async arrival (.noinc).
template <int kK>
__host__ __device__ constexpr int full_arrivals(bool paged) {
  return kK == kK4 && !paged ? 1 + 32 : 1;
}

// What the loads of one unit need, resolved by one lane (32 units at a time, lane l: the l-th).
struct UnitLoad {
  int coord = -1;     // paged: the page, flat: the block's first row; -1: nothing to load
  int kh = 0;
  int64_t srow0 = 0;  // NVFP4: the block's first scale row (paged: a multiple of 128)
  int n_keys = 0;     // NVFP4, flat: keys of the block in the sequence
};

template <int kK>
__device__ __forceinline__ UnitLoad resolve_unit(const Params& dp, int64_t u) {
  const ProxyScoreParams& p = dp.p;
  UnitLoad ul;
  int b, t;
  unit_coords(dp, u, b, ul.kh, t);
  // The page id is read beside the request's lengths, not after them (one round trip less before
  // the CTA's first TMA); it is used only for a visible block.
  const int64_t page = p.kv.paged ? kv_page_ahead(p.kv, b, t) : -1;
  Request r;
  load_request(dp, r, b, ul.kh);
  if (r.ntok > 0 && t < r.n_compute) {
    ul.coord = p.kv.paged ? int(page) : int(kv_row_begin(p.kv, b) + int64_t(t) * kBlockSize);
    if constexpr (kK == kK4) {
      if (ul.coord >= 0) {
        ul.srow0 = p.kv.paged ? nvfp4_scale_row_paged(ul.coord, ul.kh, 0, p.num_kv_heads)
                              : nvfp4_scale_row_flat(int64_t(ul.coord), ul.kh, p.num_kv_heads);
        ul.n_keys = min(kBlockSize, r.seqlen_k - t * kBlockSize);
      }
    }
  }
  return ul;
}

// Lane k's UnitLoad on every lane.
__device__ __forceinline__ UnitLoad shfl_unit(const UnitLoad& ul, int k, bool nvfp4) {
  UnitLoad o;
  o.coord = __shfl_sync(0xFFFFFFFFu, ul.coord, k);
  o.kh = __shfl_sync(0xFFFFFFFFu, ul.kh, k);
  if (nvfp4) {
    o.srow0 = __shfl_sync(0xFFFFFFFFu, ul.srow0, k);
    o.n_keys = __shfl_sync(0xFFFFFFFFu, ul.n_keys, k);
  }
  return o;
}

// Loads unit `ul` into `stage` (its full barrier `full`, its flag `flag`) once the stage is free:
// the whole warp calls it. Flat NVFP4: every lane gathers scales and arrives (.noinc); otherwise
// lane 0 alone. Lane 0 writes the flag, then arms the barrier with the TMA (and, paged NVFP4, the
// scales' bulk copy), or just arrives for a unit that loads nothing.
template <int kK>
__device__ __forceinline__ void issue_unit(const TmaParams& tp, const UnitLoad& ul, uint32_t stage, uint32_t full,
                                           int* flag, int lane) {
  constexpr int kData = Shape<kK>::kDataBytes;
  const ProxyScoreParams& p = tp.dp.p;
  const bool gather = kK == kK4 && !p.kv.paged;
  if (gather) {
    if (ul.coord >= 0) gather_flat_scales(p, stage + kData, ul.srow0, ul.n_keys, lane);
    mbar_arrive_cp_async_noinc(full);
  }
  if (lane == 0) {
    *flag = ul.coord >= 0;
    if (ul.coord >= 0) {
      const bool bulk_scales = kK == kK4 && !gather;
      mbar_expect_tx(full, bulk_scales ? Shape<kK>::kStageBytes : kData);
      if (p.kv.paged)
        tma_load_4d(stage, &tp.k_map, full, 0, 0, ul.kh, ul.coord);
      else
        tma_load_3d(stage, &tp.k_map, full, 0, ul.kh, ul.coord);
      if (bulk_scales) bulk_load(stage + kData, p.k.scale + nvfp4_scale_offset(ul.srow0, 0), kBlockSize * 8, full);
    } else {
      mbar_arrive(full);
    }
  }
}

// The producer warp (decode_tma_issue=producer): resolves 32 units at a time and loads them in
// order, each once its stage's empty barrier says the consumer is done with the previous one.
template <int kK>
__device__ __forceinline__ void produce(const TmaParams& tp, uint32_t stage0, int* flags, uint32_t full0,
                                        uint32_t empty0, int64_t u0, int64_t n, int lane) {
  using R = Ring<kK, false>;
  if (lane == 0) tma_prefetch_map(&tp.k_map);
#pragma unroll 1
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    UnitLoad mine;
    if (j0 + lane < n) mine = resolve_unit<kK>(tp.dp, u0 + j0 + lane);
    const int m = n - j0 < 32 ? int(n - j0) : 32;
#pragma unroll 1
    for (int k = 0; k < m; ++k) {
      const UnitLoad ul = shfl_unit(mine, k, kK == kK4);
      const int64_t j = j0 + k;
      const int s = R::unit_stage(j);
      if (lane == 0) mbar_wait(empty0 + 8 * s, R::unit_parity(j) ^ 1u);
      __syncwarp();
      issue_unit<kK>(tp, ul, stage0 + s * R::kStageBytes, full0 + 8 * s, flags + s, lane);
    }
  }
}

// The lane's columns 8h + 2c + j (h < kCols / 8, j < 2) of a pass: head hl (of the request's G)
// and token tr (of the pass's dp.tokens), fixed for the launch, so computed once per warp.
template <int kCols>
struct ColMap {
  int hl[kCols / 8][2];
  int tr[kCols / 8][2];
};
template <int kCols>
__device__ __forceinline__ ColMap<kCols> col_map(const Params& dp, int c) {
  ColMap<kCols> m;
#pragma unroll
  for (int h = 0; h < kCols / 8; ++h) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = 8 * h + 2 * c + j;
      m.hl[h][j] = col / dp.tokens;
      m.tr[h][j] = col - m.hl[h][j] * dp.tokens;
    }
  }
  return m;
}

// Per-key limits of the lane's columns of pass tok0 against block t (0: none visible).
template <int kCols>
__device__ __forceinline__ void col_limits(const Params& dp, const Request& r, const ColMap<kCols>& cm, int t,
                                           int tok0, int (&lim)[kCols / 8][2]) {
#pragma unroll
  for (int h = 0; h < kCols / 8; ++h) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = tok0 + cm.tr[h][j];
      lim[h][j] = (cm.hl[h][j] < dp.group && tok < r.ntok)
                      ? col_limit(dp.p.causal, r.q_off, tok, r.seqlen_k) - t * kBlockSize
                      : 0;
    }
  }
}

// NVFP4: a key's raw bytes for this lane (dims [32c, 32c + 32), 16 bytes) and its scale columns
// 2c, 2c + 1 (adjacent bytes of the 128x4 layout), loaded a tile ahead of their conversion.
struct Fp4Raw {
  uint4 codes;
  uint32_t scales;  // bits 0..15
};
__device__ __forceinline__ Fp4Raw load_fp4_raw(const uint8_t* stage, int key, int c) {
  Fp4Raw r;
  r.codes = *reinterpret_cast<const uint4*>(stage + key * 64 + 16 * c);
  r.scales = *reinterpret_cast<const uint16_t*>(stage + Shape<kK4>::kDataBytes + nvfp4_area_pair_offset(key, c));
  return r;
}

// NVFP4: the A-fragment halves of a key for the 8 k-steps (kb[s] = {k index 2c.., 2c + 8..}) from
// its raw bytes: value x 2^-7 in fp16 (common/e2m1_word.cuh, exact).
__device__ __forceinline__ void convert_fp4(const Fp4Raw& r, uint32_t (&kb)[8][2]) {
  const uint32_t sc = nvfp4_scale_pair_x128(r.scales);  // halves: column 2c, 2c + 1, x 2^7
  const uint32_t words[4] = {r.codes.x, r.codes.y, r.codes.z, r.codes.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {  // dims d = 32c + 8w .. d + 7, scale column 2c + w / 2
    const uint32_t lo = e2m1_lo_codes(words[w]), hi = e2m1_hi_codes(words[w]);
    kb[2 * w][0] = hmul2_half_bits(codes_02(lo), sc, w >> 1);      // dims d, d + 4
    kb[2 * w][1] = hmul2_half_bits(codes_02(hi), sc, w >> 1);      // d + 1, d + 5
    kb[2 * w + 1][0] = hmul2_half_bits(codes_13(lo), sc, w >> 1);  // d + 2, d + 6
    kb[2 * w + 1][1] = hmul2_half_bits(codes_13(hi), sc, w >> 1);  // d + 3, d + 7
  }
}

// NVFP4: the B fragments of the pass's columns g (qa[s][0], qa[s][2]) and g + 8 (qa[s][1], qa[s][3])
// in load_k_frags_fp4's dim order, as exact fp16 values (e2m1 x e4m3); zero for padding columns.
__device__ __forceinline__ void load_q_frags_fp4(const Params& dp, const Request& r, int tok0, int g, int c,
                                                 uint32_t (&qa)[8][4]) {
  const ProxyScoreParams& p = dp.p;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const PassRow pr = pass_row(dp, r, tok0, g + 8 * h);
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    float s[2] = {0.0f, 0.0f};
    if (pr.valid) {
      const int64_t qrow = pr.qrow;
      const int head = pr.head;
      raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.q) + qrow * p.q_stride_token +
                                                 int64_t(head) * p.q_stride_head + 16 * c));
#pragma unroll
      for (int i = 0; i < 2; ++i)
        s[i] = e4m3_to_float(p.q_scale[nvfp4_scale_offset(qrow * p.num_heads + head, 2 * c + i)]) * 16384.0f;
    }
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t pr[4];  // dims (d, d + 1), (d + 2, d + 3), (d + 4, d + 5), (d + 6, d + 7)
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = e2m1x2_to<__half>((words[w] >> (8 * i)) & 0xFFu, s[w >> 1]);
#pragma unroll
      for (int o = 0; o < 2; ++o) {
        qa[2 * w + o][h] = __byte_perm(pr[o], pr[2 + o], 0x5410u);      // dims d + 2o, d + 2o + 4
        qa[2 * w + o][2 + h] = __byte_perm(pr[o], pr[2 + o], 0x7632u);  // d + 2o + 1, d + 2o + 5
      }
    }
  }
}

// The whole block (8 tiles of 16 keys) against the pass's kCols columns: this lane's maxima of
// columns 8h + 2c, 8h + 2c + 1 over its keys into v[h] (kMasked: key < lim[h][j], else -inf). Each
// k-step's converted K A-fragment feeds the MMA of every 8-column half h (B = qa[s][h], qa[s][2 + h]).
// NVFP4 (kK4): the caller multiplies the maxima by the logit scale (positive: the launcher checks),
// the same values as scaling each logit before the mask and the max (rounding is monotone).
template <typename Mma, int kK, bool kMasked, int kCols>
__device__ __forceinline__ void multiply_block_keys_m(const uint32_t (&qa)[8][4], const uint8_t* stage,
                                                      const int (&lim)[kCols / 8][2], int g, int c,
                                                      float (&v)[kCols / 8][2]) {
  constexpr int kHalves = kCols / 8;
  // MMA row g's key within its 8-key half: fp8 permuted for the 128-byte swizzle's banks, NVFP4 g.
  const int kr = kK == kK4 ? g : 2 * (g & 3) + (g >> 2);
  // NVFP4: the shared-memory loads of tile + 1 are issued before tile's conversion (their latency
  // was most of a warp's stalls with the loads next to their use).
  Fp4Raw next[2];
  if constexpr (kK == kK4) {
    next[0] = load_fp4_raw(stage, kr, c);
    next[1] = load_fp4_raw(stage, 8 + kr, c);
  }
#pragma unroll
  for (int tile = 0; tile < kBlockSize / 16; ++tile) {
    uint32_t lo[8][2], hi[8][2];
    if constexpr (kK == kK4) {
      const Fp4Raw cur[2] = {next[0], next[1]};
      if (tile + 1 < kBlockSize / 16) {
        next[0] = load_fp4_raw(stage, (tile + 1) * 16 + kr, c);
        next[1] = load_fp4_raw(stage, (tile + 1) * 16 + 8 + kr, c);
      }
      convert_fp4(cur[0], lo);
      convert_fp4(cur[1], hi);
    } else {
      load_k_frags<Mma, kK8, false, true>(stage, tile * 16 + kr, c, lo);
      load_k_frags<Mma, kK8, false, true>(stage, tile * 16 + 8 + kr, c, hi);
    }
    float acc[kHalves][4];
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const uint32_t a[4] = {lo[s][0], hi[s][0], lo[s][1], hi[s][1]};
#pragma unroll
      for (int h = 0; h < kHalves; ++h) mma_m16n8k16<Mma>(acc[h], a, qa[s][h], qa[s][2 + h]);
    }
    // acc[h][e]: key tile * 16 + 8 (e / 2) + kr, column 8h + 2c + e % 2.
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = acc[h][e];
        if constexpr (kMasked) x = tile * 16 + 8 * (e >> 1) + kr < lim[h][e & 1] ? x : neg_inf();
        v[h][e & 1] = max_nan(v[h][e & 1], x);
      }
    }
  }
}

// Consumer warps 0..kConsumers-1: units j = warp, warp + kConsumers, ... of the CTA's share (the
// warp's i-th unit is j = warp + kConsumers i, in stage 2 warp + i % 2). kSelf
// (decode_tma_issue=warps): the warp loads its own units, no producer warp: its lanes resolve its
// next 32 units at a time, it issues units 0 and 1 up front and unit i + 2 into the stage it has
// just finished with unit i (its own reads done: a proxy fence and a warp sync, no empty barrier).
template <typename Mma, int kK, bool kScaleQ, int kCols, bool kSelf>
__device__ __forceinline__ void consume(const TmaParams& tp, uint8_t* stages, int* flags, uint32_t full0,
                                        uint32_t empty0, int64_t u0, int64_t n, int warp, int lane) {
  using R = Ring<kK, kSelf>;
  constexpr int kHalves = kCols / 8;
  const Params& dp = tp.dp;
  const ProxyScoreParams& p = dp.p;
  const int g = lane >> 2, c = lane & 3;
  if (warp >= n) return;
  const int64_t my_units = (n - warp + R::kConsumers - 1) / R::kConsumers;
  const uint32_t stage0 = smem_addr(stages);
  UnitLoad batch;  // kSelf: lane l's is the warp's unit i0 + l
  int64_t i0 = 0;
  auto resolve_batch = [&](int64_t first) {
    i0 = first;
    batch = UnitLoad{};
    if (i0 + lane < my_units) batch = resolve_unit<kK>(dp, u0 + warp + (i0 + lane) * R::kConsumers);
  };
  auto issue = [&](int64_t i) {  // the warp's unit i (in the current batch) into its stage
    const int s = R::warp_stage(warp, i);
    issue_unit<kK>(tp, shfl_unit(batch, int(i - i0), kK == kK4), stage0 + s * R::kStageBytes, full0 + 8 * s,
                   flags + s, lane);
  };
  if constexpr (kSelf) {
    if (lane == 0) tma_prefetch_map(&tp.k_map);
    resolve_batch(0);
    for (int64_t i = 0; i < R::kStagesPerWarp && i < my_units; ++i) issue(i);
  }
  int64_t i = 0;
  int b, kh, t;
  unit_coords(dp, u0 + warp, b, kh, t);
  Request r;
  uint32_t qa[8][4];
  float qmul[2], cmul[kHalves][2];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) cmul[h][0] = cmul[h][1] = 1.0f;
  bool q_ready = false;
  const ColMap<kCols> cm = col_map<kCols>(dp, c);
  auto load_q = [&](int tok0) {  // the pass's Q fragments (and fp8 column scales) of request r
    if constexpr (kK == kK4) {
      load_q_frags_fp4(dp, r, tok0, g, c, qa);
    } else {
      load_q_frags<Mma, kK8, kScaleQ>(dp, r, tok0, qa, qmul);
      // Column 8h + 2c + j's scale is row 8h + 2c + j's (qmul[h] of the lanes of quad 2c + j).
#pragma unroll
      for (int h = 0; h < kHalves; ++h)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) cmul[h][jj] = __shfl_sync(0xFFFFFFFFu, qmul[h], (2 * c + jj) * 4);
    }
    q_ready = true;
  };
#pragma unroll 1
  for (int64_t j = warp; j < n; j += R::kConsumers) {
    const int s = R::warp_stage(warp, i);  // = R::unit_stage(j), without its division by kConsumers
    if (b != r.b || kh != r.kh) {
      load_request(dp, r, b, kh);
      q_ready = false;
      // A request of one pass: its Q loads now, while the block is still in flight, instead of
      // after the full wait (a round trip on every warp's path at the CTA's start and at each
      // new request). Q rows are read for any request with rows, loaded block or not.
      if (r.ntok > 0 && r.ntok <= dp.tokens) load_q(0);
    }
    mbar_wait(full0 + 8 * s, R::warp_parity(i));
    const bool loaded = flags[s] != 0;
    const uint8_t* stage = stages + s * R::kStageBytes;
#pragma unroll 1
    for (int tok0 = 0; tok0 < r.ntok; tok0 += dp.tokens) {
      float v[kHalves][2];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) v[h][0] = v[h][1] = neg_inf();
      if (loaded) {
        if (!q_ready || r.ntok > dp.tokens) load_q(tok0);
        int lim[kHalves][2];
#pragma unroll
        for (int h = 0; h < kHalves; ++h) lim[h][0] = lim[h][1] = 0;
        if (int64_t(t + 1) * kBlockSize <= col_limit(p.causal, r.q_off, tok0, r.seqlen_k)) {
          multiply_block_keys_m<Mma, kK, false, kCols>(qa, stage, lim, g, c, v);
        } else {
          col_limits<kCols>(dp, r, cm, t, tok0, lim);
          multiply_block_keys_m<Mma, kK, true, kCols>(qa, stage, lim, g, c, v);
        }
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) v[h][jj] = max_nan(v[h][jj], __shfl_xor_sync(0xFFFFFFFFu, v[h][jj], x));
            if constexpr (kScaleQ) v[h][jj] *= cmul[h][jj];
            if constexpr (kK == kK4) v[h][jj] *= dp.scale;  // > 0: the max of the scaled logits
          }
        }
      }
      // Every lane holds its columns' maxima: the lanes of g = h store the columns of half h.
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        if (g == h) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int hl = cm.hl[h][jj];
            const int tok = tok0 + cm.tr[h][jj];
            if (hl < dp.group && tok < r.ntok)
              p.out[(int64_t(kh * dp.group + hl) * p.max_k_tiles + t) * p.total_q + r.row_begin + tok] = v[h][jj];
          }
        }
      }
    }
    if constexpr (kSelf) {
      // This warp's generic-proxy reads of the stage are done before the TMA it issues rewrites it.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      const int64_t next = i + R::kStagesPerWarp;
      if (next < my_units) {
        if (next - i0 == 32) resolve_batch(next);
        issue(next);
      }
    } else {
      __syncwarp();  // every lane's reads of the stage are done
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
    ++i;
    t += R::kConsumers;
    while (t >= p.max_k_tiles) {
      t -= p.max_k_tiles;
      if (++kh == p.num_kv_heads) {
        kh = 0;
        ++b;
      }
    }
  }
}
#endif

template <typename Mma, int kK, bool kScaleQ, int kCols, bool kSelf>
__global__ void __launch_bounds__(Ring<kK, kSelf>::kCtaThreads, 1)
    proxy_decode_tma_kernel(const __grid_constant__ TmaParams tp) {
  static_assert(kCols == kProxyDecodeTmaCols || kCols == kProxyDecodeTmaMaxCols, "8 or 16 columns a pass");
  static_assert(kK == kK8 || kK == kK4, "fp8 or NVFP4 K");
  static_assert(kK != kK4 || (std::is_same_v<Mma, __half> && !kScaleQ), "NVFP4 q and K: fp16 MMAs");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using R = Ring<kK, kSelf>;
  const Params& dp = tp.dp;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t stage0 = smem_addr(smem);
  const uint32_t full0 = stage0 + R::kStages * R::kStageBytes, empty0 = full0 + 8 * R::kStages;
  int* flags = reinterpret_cast<int*>(smem + R::kStages * R::kStageBytes + 16 * R::kStages);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t u0 = dp.units * blockIdx.x / gridDim.x;
  const int64_t n = dp.units * (blockIdx.x + 1) / gridDim.x - u0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbar_init(full0 + 8 * s, full_arrivals<kK>(dp.p.kv.paged));
      mbar_init(empty0 + 8 * s, 1);  // unused with kSelf
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  if (!kSelf && warp == R::kConsumers)
    produce<kK>(tp, stage0, flags, full0, empty0, u0, n, lane);
  else
    consume<Mma, kK, kScaleQ, kCols, kSelf>(tp, smem, flags, full0, empty0, u0, n, warp, lane);
  fill_uncovered_rows<R::kCtaThreads>(dp);
#endif
}

// Launches the kernel of kCols columns a pass for fp8 or NVFP4 K where it applies (sm_90a device
// and binary, G <= kCols, no reduce_heads, a K map TMA can address; NVFP4: a 16-byte aligned scale
// tensor); false (nothing launched) otherwise. kSelf: the consumer warps issue their own loads.
template <typename Mma, int kK, bool kScaleQ, int kCols, bool kSelf>
bool launch(const Params& dp, cudaStream_t stream) {
  using R = Ring<kK, kSelf>;
  constexpr int kThreads = R::kCtaThreads;
  const ProxyScoreParams& p = dp.p;
  if (dp.group > kCols || p.reduce_heads) return false;
  if (kK == kK4 && reinterpret_cast<uintptr_t>(p.k.scale) % 16 != 0) return false;
  // NVFP4: the maxima are scaled after the max, which equals scaling each logit first only for a
  // positive finite scale (q_global_scale x k_global_scale x 2^7); any other takes the cp.async ring.
  if (kK == kK4 && !(dp.scale > 0.0f && dp.scale <= FLT_MAX)) return false;
  auto kernel = proxy_decode_tma_kernel<Mma, kK, kScaleQ, kCols, kSelf>;
  const int resident = prepare_sm90a_launch(kernel, kThreads, R::kSmemBytes);
  if (resident == 0) return false;
  TmaParams tp{};
  tp.dp = dp;
  tp.dp.tokens = kCols / dp.group;
  const bool mapped = kK == kK4 ? encode_kv_block_map(tp.k_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.k, p.kv,
                                                      p.num_kv_heads, 64, 64, 1, CU_TENSOR_MAP_SWIZZLE_NONE)
                                : encode_kv_block_map(tp.k_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.k, p.kv,
                                                      p.num_kv_heads, 128, 128, 1, CU_TENSOR_MAP_SWIZZLE_128B);
  if (!mapped) return false;
  const int64_t ctas = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(current_device_limits().num_sms) * resident, std::max<int64_t>(dp.units, 1)));
  kernel<<<unsigned(ctas), kThreads, R::kSmemBytes, stream>>>(tp);
  MSA_CHECK_LAUNCH();
  return true;
}

// The plan's columns per pass (tma_cols: 16 or else 8) and load issue (tma_self_issue).
template <typename Mma, int kK, bool kScaleQ>
bool launch_cols(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  auto with_issue = [&](auto cols) {
    return plan.tma_self_issue ? launch<Mma, kK, kScaleQ, decltype(cols)::value, true>(dp, stream)
                               : launch<Mma, kK, kScaleQ, decltype(cols)::value, false>(dp, stream);
  };
  return plan.tma_cols == kProxyDecodeTmaMaxCols ? with_issue(std::integral_constant<int, kProxyDecodeTmaMaxCols>{})
                                                 : with_issue(std::integral_constant<int, kProxyDecodeTmaCols>{});
}

// The MMA type and q scaling of the cp.async kernel's fp8 path (launch_proxy_decode).
template <typename Element>
bool launch_fp8(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    if (plan.f16_mma) {
      return dp.p.q_dtype == DType::kBF16 ? launch_cols<__half, kK8, true>(dp, plan, stream)
                                          : launch_cols<__half, kK8, false>(dp, plan, stream);
    }
  }
  return launch_cols<Element, kK8, false>(dp, plan, stream);
}

// NVFP4 q and K: fp16 MMAs (instantiated for bf16, the type proxy_score picks for NVFP4 q).
template <typename Element>
bool launch_fp4(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  return launch_cols<__half, kK4, false>(dp, plan, stream);
}

}  // namespace flashmsa::cuda::proxy::decode::tma

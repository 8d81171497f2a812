// msa_proxy_score decode with fp8 K through TMA, a warp per key block (plan option decode_fp8=tma,
// sm_90a; docs/design/proxy_score.md, "fp8 K through TMA, a warp per block"). Included by
// proxy_decode.cuh after the cp.async kernel, whose pieces it reuses (units, requests, Q fragments,
// the fp8 B-fragment loads, the -inf fill).
//
// One CTA per SM: warp 6 is the producer, warps 0..5 consume. The CTA's units are proxy_decode's
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
// ProxyScorePlan::fp8_tma_cols, a template parameter): Q's A fragments of load_q_frags are exactly
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
#pragma once

#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"

namespace flashmsa::cuda::proxy::decode::tma {

inline constexpr int kConsumers = 6;                    // consumer warps (0..5), a whole block each
inline constexpr int kCtaThreads = (kConsumers + 1) * 32;  // + the producer warp (6)
inline constexpr int kStageBytes = kBlockSize * 128;     // one 128-key fp8 block, 16 KB
inline constexpr int kStagesPerWarp = 2;                 // each consumer warp's own stages
inline constexpr int kStages = kConsumers * kStagesPerWarp;  // 192 KB in all

// Unit j of the CTA's share: its stage and the phase (of that stage's uses) it is.
__host__ __device__ constexpr int unit_stage(int64_t j) {
  return int(j % kConsumers) * kStagesPerWarp + int((j / kConsumers) % kStagesPerWarp);
}
__host__ __device__ constexpr uint32_t unit_parity(int64_t j) {
  return uint32_t(j / (int64_t(kConsumers) * kStagesPerWarp)) & 1u;
}
// Stages (1024-byte aligned: the 128-byte swizzle's period), full[S] and empty[S] mbarriers, the
// stages' loaded flags, and the alignment slack of the dynamic shared memory.
inline constexpr int kSmemBytes = kStages * kStageBytes + kStages * (2 * 8 + 4) + 1024;

struct TmaParams {
  Params dp;         // dp.tokens = kCols / G (kCols: the launch's columns per pass, 8 or 16)
  CUtensorMap k_map; // encode_kv_block_map: 128 bytes x 128 keys per box, 128-byte swizzle
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Warp 8: resolves 32 units at a time (lane l: unit j0 + l) and loads them in order.
__device__ __forceinline__ void produce(const TmaParams& tp, uint32_t stage0, int* flags, uint32_t full0,
                                        uint32_t empty0, int64_t u0, int64_t n, int lane) {
  const Params& dp = tp.dp;
  const ProxyScoreParams& p = dp.p;
  if (lane == 0) tma_prefetch_map(&tp.k_map);
#pragma unroll 1
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    int coord = -1;  // paged: the page, flat: the block's first row; -1: nothing to load
    int kh = 0;
    if (j0 + lane < n) {
      int b, t;
      unit_coords(dp, u0 + j0 + lane, b, kh, t);
      Request r;
      load_request(dp, r, b, kh);
      if (r.ntok > 0 && t < r.n_compute)
        coord = p.kv.paged ? int(kv_page(p.kv, b, t)) : int(kv_row_begin(p.kv, b) + int64_t(t) * kBlockSize);
    }
    const int m = n - j0 < 32 ? int(n - j0) : 32;
#pragma unroll 1
    for (int k = 0; k < m; ++k) {
      const int ck = __shfl_sync(0xFFFFFFFFu, coord, k);
      const int khk = __shfl_sync(0xFFFFFFFFu, kh, k);
      if (lane == 0) {
        const int64_t j = j0 + k;
        const int s = unit_stage(j);
        const uint32_t full = full0 + 8 * s;
        mbar_wait(empty0 + 8 * s, unit_parity(j) ^ 1u);
        flags[s] = ck >= 0;
        if (ck >= 0) {
          mbar_expect_tx(full, kStageBytes);
          if (p.kv.paged)
            tma_load_4d(stage0 + s * kStageBytes, &tp.k_map, full, 0, 0, khk, ck);
          else
            tma_load_3d(stage0 + s * kStageBytes, &tp.k_map, full, 0, khk, ck);
        } else {
          mbar_arrive(full);
        }
      }
    }
  }
}

// Per-key limits of the lane's columns 8h + 2c, 8h + 2c + 1 (h < kCols / 8) of pass tok0 against
// block t (0: none visible).
template <int kCols>
__device__ __forceinline__ void col_limits(const Params& dp, const Request& r, int t, int tok0, int c,
                                           int (&lim)[kCols / 8][2]) {
#pragma unroll
  for (int h = 0; h < kCols / 8; ++h) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = 8 * h + 2 * c + j;
      const int hl = col / dp.tokens;
      const int tok = tok0 + col - hl * dp.tokens;
      lim[h][j] =
          (hl < dp.group && tok < r.ntok) ? col_limit(dp.p.causal, r.q_off, tok, r.seqlen_k) - t * kBlockSize : 0;
    }
  }
}

// The whole block (8 tiles of 16 keys) against the pass's kCols columns: this lane's maxima of
// columns 8h + 2c, 8h + 2c + 1 over its keys into v[h] (kMasked: key < lim[h][j], else -inf). Each
// k-step's converted K A-fragment feeds the MMA of every 8-column half h (B = qa[s][h], qa[s][2 + h]).
template <typename Mma, bool kMasked, int kCols>
__device__ __forceinline__ void multiply_block_keys_m(const uint32_t (&qa)[8][4], const uint8_t* stage,
                                                      const int (&lim)[kCols / 8][2], int g, int c,
                                                      float (&v)[kCols / 8][2]) {
  constexpr int kHalves = kCols / 8;
  const int kr = 2 * (g & 3) + (g >> 2);  // MMA row g's key within its 8-key half
#pragma unroll
  for (int tile = 0; tile < kBlockSize / 16; ++tile) {
    uint32_t lo[8][2], hi[8][2];
    load_k_frags<Mma, kK8, false, true>(stage, tile * 16 + kr, c, lo);
    load_k_frags<Mma, kK8, false, true>(stage, tile * 16 + 8 + kr, c, hi);
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

// Warps 0..kConsumers-1: units j = warp, warp + kConsumers, ... of the CTA's share.
template <typename Mma, bool kScaleQ, int kCols>
__device__ __forceinline__ void consume(const Params& dp, const uint8_t* stages, const int* flags, uint32_t full0,
                                        uint32_t empty0, int64_t u0, int64_t n, int warp, int lane) {
  constexpr int kHalves = kCols / 8;
  const ProxyScoreParams& p = dp.p;
  const int g = lane >> 2, c = lane & 3;
  if (warp >= n) return;
  int b, kh, t;
  unit_coords(dp, u0 + warp, b, kh, t);
  Request r;
  uint32_t qa[8][4];
  float qmul[2], cmul[kHalves][2];
#pragma unroll
  for (int h = 0; h < kHalves; ++h) cmul[h][0] = cmul[h][1] = 1.0f;
  bool q_ready = false;
#pragma unroll 1
  for (int64_t j = warp; j < n; j += kConsumers) {
    const int s = unit_stage(j);
    if (b != r.b || kh != r.kh) {
      load_request(dp, r, b, kh);
      q_ready = false;
    }
    mbar_wait(full0 + 8 * s, unit_parity(j));
    const bool loaded = flags[s] != 0;
    const uint8_t* stage = stages + s * kStageBytes;
#pragma unroll 1
    for (int tok0 = 0; tok0 < r.ntok; tok0 += dp.tokens) {
      float v[kHalves][2];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) v[h][0] = v[h][1] = neg_inf();
      if (loaded) {
        if (!q_ready || r.ntok > dp.tokens) {
          load_q_frags<Mma, kK8, kScaleQ>(dp, r, tok0, qa, qmul);
          // Column 8h + 2c + j's scale is row 8h + 2c + j's (qmul[h] of the lanes of quad 2c + j).
#pragma unroll
          for (int h = 0; h < kHalves; ++h)
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) cmul[h][jj] = __shfl_sync(0xFFFFFFFFu, qmul[h], (2 * c + jj) * 4);
          q_ready = true;
        }
        int lim[kHalves][2];
#pragma unroll
        for (int h = 0; h < kHalves; ++h) lim[h][0] = lim[h][1] = 0;
        if (int64_t(t + 1) * kBlockSize <= col_limit(p.causal, r.q_off, tok0, r.seqlen_k)) {
          multiply_block_keys_m<Mma, false, kCols>(qa, stage, lim, g, c, v);
        } else {
          col_limits<kCols>(dp, r, t, tok0, c, lim);
          multiply_block_keys_m<Mma, true, kCols>(qa, stage, lim, g, c, v);
        }
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) v[h][jj] = max_nan(v[h][jj], __shfl_xor_sync(0xFFFFFFFFu, v[h][jj], x));
            if constexpr (kScaleQ) v[h][jj] *= cmul[h][jj];
          }
        }
      }
      // Every lane holds its columns' maxima: the lanes of g = h store the columns of half h.
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        if (g == h) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int col = 8 * h + 2 * c + jj;
            const int hl = col / dp.tokens;
            const int tok = tok0 + col - hl * dp.tokens;
            if (hl < dp.group && tok < r.ntok)
              p.out[(int64_t(kh * dp.group + hl) * p.max_k_tiles + t) * p.total_q + r.row_begin + tok] = v[h][jj];
          }
        }
      }
    }
    __syncwarp();  // every lane's reads of the stage are done
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
    t += kConsumers;
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

template <typename Mma, bool kScaleQ, int kCols>
__global__ void __launch_bounds__(kCtaThreads, 1) proxy_decode_tma_kernel(const __grid_constant__ TmaParams tp) {
  static_assert(kCols == kProxyDecodeTmaCols || kCols == kProxyDecodeTmaMaxCols, "8 or 16 columns a pass");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const Params& dp = tp.dp;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t stage0 = smem_addr(smem);
  const uint32_t full0 = stage0 + kStages * kStageBytes, empty0 = full0 + 8 * kStages;
  int* flags = reinterpret_cast<int*>(smem + kStages * kStageBytes + 16 * kStages);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t u0 = dp.units * blockIdx.x / gridDim.x;
  const int64_t n = dp.units * (blockIdx.x + 1) / gridDim.x - u0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == kConsumers)
    produce(tp, stage0, flags, full0, empty0, u0, n, lane);
  else
    consume<Mma, kScaleQ, kCols>(dp, smem, flags, full0, empty0, u0, n, warp, lane);
  fill_uncovered_rows<kCtaThreads>(dp);
#endif
}

// Launches the kernel of kCols columns a pass for fp8 K where it applies (sm_90a device and
// binary, G <= kCols, no reduce_heads, a K map TMA can address); false (nothing launched) otherwise.
template <typename Mma, bool kScaleQ, int kCols>
bool launch(const Params& dp, cudaStream_t stream) {
  const ProxyScoreParams& p = dp.p;
  if (dp.group > kCols || p.reduce_heads) return false;
  auto kernel = proxy_decode_tma_kernel<Mma, kScaleQ, kCols>;
  const int resident = prepare_sm90a_launch(kernel, kCtaThreads, kSmemBytes);
  if (resident == 0) return false;
  TmaParams tp{};
  tp.dp = dp;
  tp.dp.tokens = kCols / dp.group;
  if (!encode_kv_block_map(tp.k_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.k, p.kv, p.num_kv_heads, 128, 128, 1,
                           CU_TENSOR_MAP_SWIZZLE_128B))
    return false;
  const int64_t ctas = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(current_device_limits().num_sms) * resident, std::max<int64_t>(dp.units, 1)));
  kernel<<<unsigned(ctas), kCtaThreads, kSmemBytes, stream>>>(tp);
  MSA_CHECK_LAUNCH();
  return true;
}

// The plan's columns per pass (fp8_tma_cols: 16 or else 8).
template <typename Mma, bool kScaleQ>
bool launch_cols(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  return plan.fp8_tma_cols == kProxyDecodeTmaMaxCols ? launch<Mma, kScaleQ, kProxyDecodeTmaMaxCols>(dp, stream)
                                                     : launch<Mma, kScaleQ, kProxyDecodeTmaCols>(dp, stream);
}

// The MMA type and q scaling of the cp.async kernel's fp8 path (launch_proxy_decode).
template <typename Element>
bool launch_fp8(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    if (plan.f16_mma) {
      return dp.p.q_dtype == DType::kBF16 ? launch_cols<__half, true>(dp, plan, stream)
                                          : launch_cols<__half, false>(dp, plan, stream);
    }
  }
  return launch_cols<Element, false>(dp, plan, stream);
}

}  // namespace flashmsa::cuda::proxy::decode::tma

// Shared-selection tiles on Hopper (sm_90a): the attention of the tiles union_plan.cu qualified.
//
// Persistent CTAs of two warpgroups take qualifying (kv head, tile) pairs from a work counter. A
// tile is 128 / G consecutive tokens x the kv head's G query heads = 128 rows; warpgroup w owns
// rows 64 w .. 64 w + 63 (row = token * G + head). The CTA streams the tile's union of blocks
// through a two-stage cp.async K/V pipeline (all 256 threads load), and per block each warpgroup
//   S = Q K^T        8 x wgmma m64n128k16 (Q resident in shared memory for the whole tile)
//   online softmax   rows of tokens that did not select the block see nothing of it; the others
//                    their causal limit; lazy rescaling (slack 8, kv_major.cuh's rule)
//   O += P V         8 x wgmma m64n128k16, P from registers
// and finally writes out = O * v_global_scale / l and the LSEs, like the fused query-major path.
// Only bf16 / fp16 K and V (quantized caches always take the KV-major path). A row's result
// depends only on its tile's plan (union in q2k first-occurrence order), never on which CTA ran it
// (D11).
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kv_major_sm90.cuh"
#include "sparse_attn/wgmma_tile.cuh"

namespace flashmsa::sparse_attn {

struct UnionSm90Config {
  static constexpr int kThreads = 256;
  static constexpr int kQBytes = kUnionRows * 256;  // two 64-row wgmma tiles
  static constexpr int kKvBytes = kBlockSize * 256;
  static constexpr int kStages = 2;
  static constexpr int kQOffset = 0;
  static constexpr int kKvOffset = kQOffset + kQBytes;  // stage s: K at + 2 s kKvBytes, V after it
  static constexpr int kPlanBlockOffset = kKvOffset + kStages * 2 * kKvBytes;
  static constexpr int kMaxEntries = kUnionMaxTokens * 64;
  static constexpr int kPlanMaskOffset = kPlanBlockOffset + kMaxEntries * 4;
  static constexpr int kLimOffset = kPlanMaskOffset + kMaxEntries;
  static constexpr int kStateOffset = kLimOffset + kUnionMaxTokens * 4;
  static constexpr int kSmemBytes = kStateOffset + 64;
};

// What the CTA knows of its current tile (written by thread 0).
struct UnionTileState {
  int w;  // kh * num_tiles + tile, -1: no work left
  int kh;
  int r0;
  int b;
  int count;
  int seqlen_k;
};

#if MSA_HAS_WGMMA
// Online softmax of fragment row h over one block: keys >= lim are invisible (lim <= 0: the row
// sees nothing of the block and nothing changes). m is the running reference max (base 2, -inf
// before any visible key), l / lt this thread's partial sums; o's row is rescaled when m moves by
// more than the slack (the caller applies `alpha`, 1 when the row did not move).
template <bool kMask, bool kTemp>
MSA_DEVICE void union_softmax_row(float (&s)[16][4], int h, int lim, float sc, float temp, int tig, float& m,
                                  float& l, float& lt, float& alpha) {
  const float ext = row_extreme<kMask>(s, h, lim, sc, tig);
  const float mx = ext == neg_inf() ? neg_inf() : ext * fabsf(sc);
  const float m_old = m;
  const bool moved = mx > m_old + kLazyRescaleSlack;  // -inf + slack = -inf: the first visible key moves
  alpha = 1.0f;
  if (moved) {
    alpha = m_old == neg_inf() ? 0.0f : exp2_approx(m_old - mx);
    l *= alpha;
    if constexpr (kTemp) lt *= m_old == neg_inf() ? 0.0f : exp2_approx(temp * (m_old - mx));
    m = mx;
  }
  const float m_use = m == neg_inf() ? 0.0f : m;
  float sum = 0.0f, sum_t = 0.0f;
  row_exp_sum<kMask, kTemp>(s, h, lim, sc, temp, tig, m_use, sum, sum_t);
  l += sum;
  if constexpr (kTemp) lt += sum_t;
}
#endif

template <typename Elem>
__global__ void __launch_bounds__(UnionSm90Config::kThreads, 1) union_sm90_kernel(const __grid_constant__ UnionArgs a) {
#if MSA_HAS_WGMMA
  using Cfg = UnionSm90Config;
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = a.p;
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5, gid = lane >> 2, tig = lane & 3;
  const int G = a.group, t = a.tile_tokens;
  UnionTileState* s_state = reinterpret_cast<UnionTileState*>(smem + Cfg::kStateOffset);
  int* s_block = reinterpret_cast<int*>(smem + Cfg::kPlanBlockOffset);
  uint8_t* s_mask = smem + Cfg::kPlanMaskOffset;
  int* s_lim = reinterpret_cast<int*>(smem + Cfg::kLimOffset);
  const uint32_t sQ_addr = smem_addr(smem + Cfg::kQOffset);
  const uint32_t sKV_addr = smem_addr(smem + Cfg::kKvOffset);
  uint8_t* my_q = smem + Cfg::kQOffset + wg * (64 * 256);
  const uint32_t my_q_addr = smem_addr(my_q);
  const Elem* q = static_cast<const Elem*>(p.q);
  const float sc = a.scale_log2, temp = p.lse_temperature;
  check_smem_base(smem);
  // This thread's two fragment rows of the tile: token and head.
  int row_tok[2], row_head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 64 * wg + 16 * warp + gid + 8 * h;
    row_tok[h] = row / G;
    row_head[h] = row - row_tok[h] * G;
  }

  while (true) {
    if (tid == 0) {
      UnionTileState ts{};
      ts.w = -1;
      const int idx = atomicAdd(&a.control[1], 1);
      if (idx < a.control[0]) {
        ts.w = a.work[idx];
        ts.kh = ts.w / a.num_tiles;
        ts.r0 = (ts.w - ts.kh * a.num_tiles) * t;
        ts.b = find_sequence(p, ts.r0);
        ts.count = a.plan_count[ts.w];
        ts.seqlen_k = kv_seqlen(p.kv, ts.b);
      }
      *s_state = ts;
    }
    __syncthreads();
    const UnionTileState& ts = *s_state;
    if (ts.w < 0) break;
    const int kh = ts.kh, r0 = ts.r0, b = ts.b, U = ts.count, seqlen_k = ts.seqlen_k;
    for (int i = tid; i < U; i += Cfg::kThreads) {
      s_block[i] = a.plan_block[int64_t(ts.w) * a.max_entries + i];
      s_mask[i] = a.plan_mask[int64_t(ts.w) * a.max_entries + i];
    }
    if (tid < t) {
      const RowRange rr = q_rows(p.qi, p.total_q, b);
      s_lim[tid] = col_limit(p.causal, q_offset_of(p.q_offset, b, rr.len, seqlen_k), r0 + tid - rr.begin, seqlen_k);
    }
    // Q: 128 rows x 16 chunks; row = token * G + head, in warpgroup (row / 64)'s 64-row tile.
#pragma unroll
    for (int k = 0; k < kUnionRows * 16 / Cfg::kThreads; ++k) {
      const int c = tid + Cfg::kThreads * k;
      const int row = c >> 4, ch = c & 15;
      const int e = row / G, g = row - e * G;
      const Elem* src = q + int64_t(r0 + e) * p.q_stride_token + int64_t(kh * G + g) * p.q_stride_head + ch * 8;
      cp_async_16(sQ_addr + uint32_t(row >> 6) * (64 * 256) + Sw128Tile<64>::at(row & 63, ch), src);
    }
    __syncthreads();  // s_block / s_mask / s_lim
    auto issue_block = [&](int u) {  // K / V of union block u into stage u % 2 (an empty group past the end)
      if (u < U) {
        const int j0 = s_block[u] * kBlockSize;
        const int n_valid = min(kBlockSize, seqlen_k - j0);
        const uint32_t k_dst = sKV_addr + uint32_t(u & 1) * (2 * Cfg::kKvBytes);
        issue_kv_rows<Elem, KvKind::kNative, kBlockSize, Cfg::kThreads, Sw128Tile<kBlockSize>>(
            p.k, kv_offset(p.k, p.kv, b, kh, j0), 0, 1, n_valid, k_dst, tid);
        issue_kv_rows<Elem, KvKind::kNative, kBlockSize, Cfg::kThreads, Sw128Tile<kBlockSize>>(
            p.v, kv_offset(p.v, p.kv, b, kh, j0), 0, 1, n_valid, k_dst + Cfg::kKvBytes, tid);
      }
      cp_async_commit();
    };
    issue_block(0);  // with Q
    issue_block(1);

    float o[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    float m_row[2] = {neg_inf(), neg_inf()}, l_row[2] = {0.0f, 0.0f}, lt_row[2] = {0.0f, 0.0f};

#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      cp_async_wait<1>();
      fence_proxy_async_smem();
      __syncthreads();
      const uint32_t k_addr = sKV_addr + uint32_t(u & 1) * (2 * Cfg::kKvBytes);
      const uint32_t v_addr = k_addr + Cfg::kKvBytes;
      float s[16][4];
      wgmma_qk_tile<Elem>(s, my_q_addr, k_addr);

      const int j0 = s_block[u] * kBlockSize;
      const uint32_t msk = s_mask[u];
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lim = ((msk >> row_tok[h]) & 1u) ? min(kBlockSize, s_lim[row_tok[h]] - j0) : 0;
        if (lim >= kBlockSize) {
          if (a.has_temp) union_softmax_row<false, true>(s, h, lim, sc, temp, tig, m_row[h], l_row[h], lt_row[h], alpha[h]);
          else union_softmax_row<false, false>(s, h, lim, sc, temp, tig, m_row[h], l_row[h], lt_row[h], alpha[h]);
        } else {
          if (a.has_temp) union_softmax_row<true, true>(s, h, lim, sc, temp, tig, m_row[h], l_row[h], lt_row[h], alpha[h]);
          else union_softmax_row<true, false>(s, h, lim, sc, temp, tig, m_row[h], l_row[h], lt_row[h], alpha[h]);
        }
      }
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[j][e] *= alpha[e >> 1];
      }
      wgmma_pv_tile<Elem>(o, s, v_addr, true);
      __syncthreads();  // both warpgroups are done with stage u % 2
      issue_block(u + 2);
    }
    cp_async_wait<0>();

    // Epilogue: rows of the warp through its quarter of the warpgroup's (consumed) query tile.
    float mul[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 1);
      l_row[h] += __shfl_xor_sync(0xffffffffu, l_row[h], 2);
      if (a.has_temp) {
        lt_row[h] += __shfl_xor_sync(0xffffffffu, lt_row[h], 1);
        lt_row[h] += __shfl_xor_sync(0xffffffffu, lt_row[h], 2);
      }
      mul[h] = l_row[h] > 0.0f ? p.v_global_scale / l_row[h] : 0.0f;
    }
    int64_t row_off = -1;
    if (lane < 16) {
      const int row = 64 * wg + 16 * warp + lane;
      const int e = row / G, g = row - e * G;
      row_off = (int64_t(r0 + e) * p.num_heads + kh * G + g) * 128;
    }
    store_rows<kElemStoreKind<Elem>>(o, mul, my_q + warp * 16 * 256, p.out, row_off, lane);
    if (tig == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t idx = int64_t(r0 + row_tok[h]) * p.num_heads + kh * G + row_head[h];
        if (p.lse != nullptr) p.lse[idx] = row_lse2(m_row[h], l_row[h]) * kLn2;
        if (p.lse_temperature_out != nullptr) p.lse_temperature_out[idx] = row_lse2_t(m_row[h], lt_row[h], temp) * kLn2;
      }
    }
    __syncthreads();  // the query tile, plan and state are reused by the next tile
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs per SM of the union kernel, 0 where this device cannot run it.
template <typename Elem>
int union_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(union_sm90_kernel<Elem>, UnionSm90Config::kThreads,
                                              size_t(UnionSm90Config::kSmemBytes));
}

template <typename Elem>
void launch_union_sm90(const UnionArgs& args, int grid, cudaStream_t stream) {
  auto* kernel = union_sm90_kernel<Elem>;
  constexpr int smem = UnionSm90Config::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, UnionSm90Config::kThreads, size_t(smem));
  kernel<<<grid, UnionSm90Config::kThreads, smem, stream>>>(args);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

// Shared-selection tiles on Hopper (sm_90a): the attention of the tiles union_plan.cu qualified.
//
// A tile is 128 / G consecutive tokens x the kv head's G query heads = 128 rows (row = token * G +
// head). Persistent CTAs of three warpgroups, warp-specialized:
//   producer      (one warpgroup, 72 registers) takes qualifying (kv head, tile) pairs from a work
//                 counter, copies the tile's plan (union blocks ascending, token masks, causal
//                 limits) and Q into one of two tile buffers, then streams the union's K and V
//                 blocks through a two-stage ring (cp.async; completion signalled on mbarriers,
//                 common/mbarrier.cuh). It runs ahead into the next tile: the ring never drains
//                 between tiles.
//   2 consumers   (216 registers each) own rows 64 w .. 64 w + 63 and, per block,
//                   S = Q K^T        8 x wgmma m64n128k16 (Q resident for the tile)
//                   online softmax   rows of tokens that did not select the block see nothing of
//                                    it; the others their causal limit; lazy rescaling (slack 8,
//                                    kv_major.cuh's rule)
//                   O += P V         8 x wgmma m64n128k16, P from registers
//                 releasing K after S and V after P V (a block none of the warpgroup's tokens
//                 selected is only waited for and released); then out = O * v_global_scale / l and the
//                 LSEs, like the fused query-major path. The consumers never wait for each other,
//                 so one's softmax overlaps the other's MMAs (the earlier lock-step version, one
//                 __syncthreads per block, ran the M3 32K clustered case in 6.4 ms, this one in 4.9).
// bf16 / fp16 K and V, and fp8 ones dequantized by the producer into the ring (NVFP4 caches take
// the KV-major path). A row's result depends only on its tile's plan, never on which CTA ran it
// (D11).
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/mbarrier.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kv_major_sm90.cuh"
#include "sparse_attn/wgmma_tile.cuh"

namespace flashmsa::sparse_attn {

// What the consumers know of a tile (written by the producer with the plan).
struct UnionTileState {
  int w;  // kh * num_tiles + tile, -1: no work left
  int kh;
  int r0;
  int b;
  int count;
  int seqlen_k;
};

struct UnionTilePlan {
  UnionTileState st;
  int lim[kUnionMaxTokens];      // causal limit of each token of the tile
  int block[kUnionMaxBlocks];    // union blocks, ascending
  uint8_t mask[kUnionMaxBlocks]; // tokens of the tile that selected each
};

struct UnionSm90Config {
  static constexpr int kConsumerThreads = 256;  // two warpgroups
  static constexpr int kProducerThreads = 128;  // one warpgroup
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // Registers per thread: 168 at launch (65536 / 384); then the producer gives registers back to
  // the consumers (setmaxnreg). Each SM sub-partition holds one warp of every warpgroup and a
  // quarter of the register file: 2 x 216 + 72 = 3 x 168 (no spill since the plan copy's loop is
  // not unrolled; it kept one value of its tile loop in local memory before).
  static constexpr int kProducerRegs = 72;
  static constexpr int kConsumerRegs = 216;
  static constexpr int kTileBufs = 2;  // Q + plan of the current and the next tile
  static constexpr int kStages = 2;    // K / V ring
  static constexpr int kQBytes = kUnionRows * 256;  // two 64-row wgmma tiles
  static constexpr int kKvBytes = kBlockSize * 256;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kTileBufs * kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr int kPlanOffset = kVOffset + kStages * kKvBytes;
  static constexpr int kPlanBytes = (int(sizeof(UnionTilePlan)) + 15) / 16 * 16;
  // mbarriers: q_full[2], q_empty[2], k_full[2], k_empty[2], v_full[2], v_empty[2]
  static constexpr int kBarOffset = kPlanOffset + kTileBufs * kPlanBytes;
  static constexpr int kSmemBytes = kBarOffset + 12 * 8;
};
static_assert(UnionSm90Config::kTileBufs == 2 && UnionSm90Config::kStages == 2, "parity arithmetic below");

#if MSA_HAS_WGMMA
// Online softmax of both fragment rows of this thread over one block: keys >= lim[h] are
// invisible to row h (lim <= 0: the row sees nothing of the block and nothing changes). m is the
// running reference max (base 2, -inf before any visible key), l / lt this thread's partial sums;
// o's row is rescaled when m moves by more than the slack (the caller applies `alpha`, 1 when the
// row did not move). The two rows go through one pass (their chains interleave); each row's
// arithmetic is the one-row form's.
template <bool kMask, bool kTemp>
MSA_DEVICE void union_softmax_rows(float (&s)[16][4], const int (&lim)[2], float sc, float temp, int tig,
                                   float (&m)[2], float (&l)[2], float (&lt)[2], float (&alpha)[2]) {
  float ext[2], m_use[2];
  rows_extreme<kMask>(s, lim, sc, tig, ext);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx = ext[h] == neg_inf() ? neg_inf() : ext[h] * fabsf(sc);
    const float m_old = m[h];
    const bool moved = mx > m_old + kLazyRescaleSlack;  // -inf + slack = -inf: the first visible key moves
    alpha[h] = 1.0f;
    if (moved) {
      alpha[h] = m_old == neg_inf() ? 0.0f : exp2_approx(m_old - mx);
      l[h] *= alpha[h];
      if constexpr (kTemp) lt[h] *= m_old == neg_inf() ? 0.0f : exp2_approx(temp * (m_old - mx));
      m[h] = mx;
    }
    m_use[h] = m[h] == neg_inf() ? 0.0f : m[h];
  }
  float sum[2] = {0.0f, 0.0f}, sum_t[2] = {0.0f, 0.0f};
  rows_exp_sum<kMask, kTemp>(s, lim, sc, temp, tig, m_use, sum, sum_t);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += sum[h];
    if constexpr (kTemp) lt[h] += sum_t[h];
  }
}

// The next tile of the work list (one producer thread): its state, w = -1 when none is left.
MSA_DEVICE UnionTileState union_next_tile(const UnionArgs& a) {
  const SparseAttnParams& p = a.p;
  UnionTileState st{};
  st.w = -1;
  const int idx = atomicAdd(&a.control[1], 1);
  if (idx < a.control[0]) {
    st.w = a.work[idx];
    st.kh = st.w / a.num_tiles;
    st.r0 = (st.w - st.kh * a.num_tiles) * a.tile_tokens;
    st.b = find_sequence(p, st.r0);
    st.count = a.plan_count[st.w];
    st.seqlen_k = kv_seqlen(p.kv, st.b);
  }
  return st;
}

// The causal limits, union blocks and token masks of the tile pl.st names into pl, spread over
// `threads` producer threads (ptid < threads).
MSA_DEVICE void union_copy_plan(const UnionArgs& a, UnionTilePlan& pl, int ptid, int threads) {
  const SparseAttnParams& p = a.p;
  const int w = pl.st.w, b = pl.st.b, U = pl.st.count, seqlen_k = pl.st.seqlen_k;
  if (ptid < a.tile_tokens) {
    const RowRange rr = q_rows(p.qi, p.total_q, b);
    pl.lim[ptid] = col_limit(p.causal, q_offset_of(p.q_offset, b, rr.len, seqlen_k), pl.st.r0 + ptid - rr.begin, seqlen_k);
  }
#pragma unroll 1
  for (int i = ptid; i < U; i += threads) {
    pl.block[i] = a.plan_block[int64_t(w) * a.max_entries + i];
    pl.mask[i] = a.plan_mask[int64_t(w) * a.max_entries + i];
  }
}

// A consumer thread's two fragment rows of the tile (token, head) and the tokens with rows in its
// warpgroup (rows 64 wg .. 64 wg + 63; G = 128: both own token 0): a block none of them selected
// is skipped (nothing of it is visible to these rows).
struct UnionRows {
  int tok[2], head[2];
  uint32_t wg_mask;
};
MSA_DEVICE UnionRows union_rows(int wg, int warp, int gid, int G) {
  UnionRows r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 64 * wg + 16 * warp + gid + 8 * h;
    r.tok[h] = row / G;
    r.head[h] = row - r.tok[h] * G;
  }
  const int wg_tok = G >= 64 ? 1 : 64 / G;
  r.wg_mask = ((1u << wg_tok) - 1u) << (64 * wg / G);
  return r;
}

// The online softmax of both fragment rows over one block whose first lim[h] keys row h sees
// (<= 0: none), s becoming P, in the variant with_softmax_variant chooses. Where no row of the warp
// sees a key of the block (in a shared-selection tile: the warp's token, G >= 16 rows of one
// token per warp, did not select it; ~1 / 4 of the blocks a warp computes at 8K) the result is
// what the masked variant computes for it, P = 0 and m, l, lt unchanged (alpha 1), without its
// per-key work: the warp leaves the issue slots and the MUFU of its SM sub-partition to the other
// warpgroup's warp there. Warp-uniform (the masked variant shuffles over the whole warp).
MSA_DEVICE void union_softmax_rows_lim(float (&s)[16][4], const int (&lim)[2], bool has_temp, float sc, float temp,
                                       int tig, float (&m)[2], float (&l)[2], float (&lt)[2], float (&alpha)[2]) {
  if (__all_sync(0xffffffffu, lim[0] <= 0 && lim[1] <= 0)) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = 0.0f;
        // Opaque to the compiler: with P known to be 0 it would specialize the rest of the block
        // step (P's packing, the next MMA's operands) on it, and the second copy spilled (328
        // bytes in the TMA tile kernel).
        asm volatile("" : "+f"(s[j][e]));
      }
    alpha[0] = alpha[1] = 1.0f;
  } else {
    with_softmax_variant(lim, has_temp, [&](auto mask, auto tmp) {
      union_softmax_rows<decltype(mask)::value, decltype(tmp)::value>(s, lim, sc, temp, tig, m, l, lt, alpha);
    });
  }
}

// The online softmax of both fragment rows over union block u (first key j0, token mask msk): a row
// whose token did not select it sees nothing of it, the others their causal limit. s becomes P.
MSA_DEVICE void union_block_softmax(float (&s)[16][4], const UnionTilePlan& pl, const UnionRows& rows,
                                    uint32_t msk, int j0, bool has_temp, float sc, float temp, int tig,
                                    float (&m)[2], float (&l)[2], float (&lt)[2], float (&alpha)[2]) {
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = ((msk >> rows.tok[h]) & 1u) ? min(kBlockSize, pl.lim[rows.tok[h]] - j0) : 0;
  union_softmax_rows_lim(s, lim, has_temp, sc, temp, tig, m, l, lt, alpha);
}

// A union block none of the warpgroup's tokens selected: no MMA, m / l / o unchanged (exactly what
// the masked path computes). The slots are still waited for before they are released, so that
// this warpgroup's arrivals stay in the ring phase the producer is filling (an early release could
// complete a phase the other warpgroup is still reading). bars: the kernel's mbarriers (k_full at
// +32, k_empty +48, v_full +64, v_empty +80).
MSA_DEVICE void union_pass_block(uint32_t bars, int st, uint32_t parity) {
  mbar_wait_loop(bars + 32 + 8 * st, parity);
  mbar_arrive(bars + 48 + 8 * st);
  mbar_wait_loop(bars + 64 + 8 * st, parity);
  mbar_arrive(bars + 80 + 8 * st);
}

// A consumer thread's accumulator and row statistics at the start of a tile.
MSA_DEVICE void union_tile_init(float (&o)[16][4], float (&m)[2], float (&l)[2], float (&lt)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = neg_inf();
    l[h] = lt[h] = 0.0f;
  }
}

// o's rows times alpha, skipped when no row of the warp moved.
MSA_DEVICE void union_rescale(float (&o)[16][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] *= alpha[e >> 1];
  }
}

// The tile's outputs of a consumer warpgroup: out = O * v_global_scale / l through `stage` (its
// consumed 64-row query tile: 16 rows of 256 bytes per warp) and the LSEs, like the fused
// query-major path.
template <typename Elem>
MSA_DEVICE void union_epilogue(const UnionArgs& a, const UnionRows& rows, int kh, int r0, int wg, int warp,
                               int lane, float (&o)[16][4], const float (&m)[2], float (&l)[2], float (&lt)[2],
                               uint8_t* stage) {
  const SparseAttnParams& p = a.p;
  const int G = a.group, tig = lane & 3;
  const float temp = p.lse_temperature;
  float mul[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (a.has_temp) {
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 1);
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 2);
    }
    mul[h] = l[h] > 0.0f ? p.v_global_scale / l[h] : 0.0f;
  }
  int64_t row_off = -1;
  if (lane < 16) {
    const int row = 64 * wg + 16 * warp + lane;
    const int e = row / G, g = row - e * G;
    row_off = (int64_t(r0 + e) * p.num_heads + kh * G + g) * 128;
  }
  store_rows<kElemStoreKind<Elem>>(o, mul, stage + warp * 16 * 256, p.out, row_off, lane);
  if (tig == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t idx = int64_t(r0 + rows.tok[h]) * p.num_heads + kh * G + rows.head[h];
      if (p.lse != nullptr) p.lse[idx] = row_lse2(m[h], l[h]) * kLn2;
      if (p.lse_temperature_out != nullptr) p.lse_temperature_out[idx] = row_lse2_t(m[h], lt[h], temp) * kLn2;
    }
  }
}

// fp8 K / V: the raw rows of a block are copied into the upper half of its ring slot ([128][128]
// bytes at +16 KB, issue_kv_rows' layout) and dequantized in place into the slot's Sw128Tile<128>
// compute tile (exact: every e4m3 value is a bf16 and an fp16 value). Raw row r occupies exactly
// the bytes that the second half (dims 64..127) of compute row r goes to, so the eight threads of
// a row, which sit in one warp and each copied one 16-byte chunk of it, all read their chunk before
// any of them writes (__syncwarp); different rows never overlap. The writers fence their generic
// writes for the consumers' wgmma (async proxy) before they arrive on the slot's "full" barrier.
template <typename Elem>
MSA_DEVICE void union_fp8_dequantize_in_place(uint8_t* slot, int ptid) {
  const uint8_t* raw = slot + kBlockSize * 128;
  const int ch = ptid & 7;  // the raw chunk this thread copied: values 16 ch .. 16 ch + 15
#pragma unroll 2
  for (int i = 0; i < kBlockSize * 8 / UnionSm90Config::kProducerThreads; ++i) {
    const int row = (ptid >> 3) + (UnionSm90Config::kProducerThreads / 8) * i;
    const uint4 in = *reinterpret_cast<const uint4*>(raw + row * 128 + ch * 16);
    __syncwarp();
    uint4 lo, hi;
    e4m3x16_to<Elem>(in, lo, hi);
    *reinterpret_cast<uint4*>(slot + Sw128Tile<kBlockSize>::at(row, 2 * ch)) = lo;
    *reinterpret_cast<uint4*>(slot + Sw128Tile<kBlockSize>::at(row, 2 * ch + 1)) = hi;
  }
  fence_proxy_async_smem();
}

// The producer warpgroup: plans, Q and the K / V ring (see the top of the file). ptid: thread
// index within the warpgroup.
template <typename Elem, KvKind kKv>
MSA_DEVICE void union_producer(const UnionArgs& a, uint8_t* smem, uint32_t bars, int ptid) {
  using Cfg = UnionSm90Config;
  constexpr int T = Cfg::kProducerThreads;
  const SparseAttnParams& p = a.p;
  const int G = a.group;
  const uint32_t q_full = bars, q_empty = bars + 16, k_full = bars + 32, k_empty = bars + 48,
                 v_full = bars + 64, v_empty = bars + 80;
  const uint32_t sK_addr = smem_addr(smem + Cfg::kKOffset), sV_addr = smem_addr(smem + Cfg::kVOffset);
  const Elem* q = static_cast<const Elem*>(p.q);
  int kv = 0;  // K / V blocks issued so far (ring position)
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait(q_empty + 8 * tb, ((it >> 1) & 1) ^ 1);
    UnionTilePlan& pl = *reinterpret_cast<UnionTilePlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    if (ptid == 0) pl.st = union_next_tile(a);
    warpgroup_barrier(2);  // the tile's state, for every producer thread
    const int w = pl.st.w;
    if (w < 0) {
      // Publishes "no work left" (pl.st, written by this thread) to the consumers: the phase's
      // T + 1 arrivals at once.
      if (ptid == 0) mbar_arrive_count(q_full + 8 * tb, T + 1);
      return;
    }
    const int kh = pl.st.kh, r0 = pl.st.r0, b = pl.st.b, U = pl.st.count, seqlen_k = pl.st.seqlen_k;
    union_copy_plan(a, pl, ptid, T);
    // Q: 128 rows x 16 chunks of 16 bytes; row = token * G + head, in warpgroup (row / 64)'s tile.
    const uint32_t sQ_addr = smem_addr(smem + Cfg::kQOffset + tb * Cfg::kQBytes);
#pragma unroll 1
    for (int c = ptid; c < kUnionRows * 16; c += T) {
      const int row = c >> 4, ch = c & 15;
      const int e = row / G, g = row - e * G;
      const Elem* src = q + int64_t(r0 + e) * p.q_stride_token + int64_t(kh * G + g) * p.q_stride_head + ch * 8;
      cp_async_16(sQ_addr + uint32_t(row >> 6) * (64 * 256) + Sw128Tile<64>::at(row & 63, ch), src);
    }
    // q_full: T arrivals as each thread's Q copies land, and one plain arrive after the producers'
    // barrier, which publishes the plan (plain stores of every producer thread) to the consumers.
    mbar_arrive_cp_async_noinc(q_full + 8 * tb);
    warpgroup_barrier(2);  // the plan's blocks, written by all producer threads, are read by all
    if (ptid == 0) mbar_arrive(q_full + 8 * tb);

    if constexpr (kKv == KvKind::kNative) {
      for (int u = 0; u < U; ++u, ++kv) {
        const int st = kv & 1;
        const uint32_t parity = ((kv >> 1) & 1) ^ 1;
        const int j0 = pl.block[u] * kBlockSize;
        const int n_valid = min(kBlockSize, seqlen_k - j0);
        mbar_wait(k_empty + 8 * st, parity);
        issue_kv_rows<Elem, KvKind::kNative, kBlockSize, T, Sw128Tile<kBlockSize>>(
            p.k, kv_offset(p.k, p.kv, b, kh, j0), 0, 1, n_valid, sK_addr + st * Cfg::kKvBytes, ptid);
        mbar_arrive_cp_async_noinc(k_full + 8 * st);
        mbar_wait(v_empty + 8 * st, parity);
        issue_kv_rows<Elem, KvKind::kNative, kBlockSize, T, Sw128Tile<kBlockSize>>(
            p.v, kv_offset(p.v, p.kv, b, kh, j0), 0, 1, n_valid, sV_addr + st * Cfg::kKvBytes, ptid);
        mbar_arrive_cp_async_noinc(v_full + 8 * st);
      }
    } else {
      // fp8: this thread's raw copies of block u are in flight while it dequantizes block u - 1
      // (cp.async groups, in order: K(u - 1), V(u - 1), K(u), V(u)); the last block of the tile is
      // drained before the next tile's plan. A slot's "full" arrives after its dequantization.
      // No wait here depends on a consumer release that needs a later block: K(u) needs K(u - 2)
      // released (after S(u - 2), K(u - 2) dequantized at step u - 1), V(u) needs V(u - 2) released
      // (after P V(u - 2), and after S(u - 1) for consumers that look one block ahead: K(u - 1) is
      // dequantized and published just before).
      constexpr uint32_t kRawOffset = kBlockSize * 128;
      // One half of step u: the raw copy of block u into its slot, then block u - 1 dequantized
      // and published (K, then V: each with its own barriers and ring).
      auto step = [&](int u, const KVTensor& t, uint32_t empty, uint32_t full, int tile_off, bool last_wait0) {
        const int st = (kv + u) & 1, prev = (kv + u - 1) & 1;
        if (u < U) {
          const int j0 = pl.block[u] * kBlockSize;
          mbar_wait(empty + 8 * st, (((kv + u) >> 1) & 1) ^ 1);
          issue_kv_rows<Elem, KvKind::kFp8, kBlockSize, T>(t, kv_offset(t, p.kv, b, kh, j0), 0, 1,
                                                          min(kBlockSize, seqlen_k - j0),
                                                          smem_addr(smem + tile_off + st * Cfg::kKvBytes) + kRawOffset, ptid);
          cp_async_commit();
        }
        if (u > 0) {
          if (u < U) {
            cp_async_wait<2>();
          } else if (last_wait0) {
            cp_async_wait<0>();
          } else {
            cp_async_wait<1>();
          }
          union_fp8_dequantize_in_place<Elem>(smem + tile_off + prev * Cfg::kKvBytes, ptid);
          mbar_arrive(full + 8 * prev);
        }
      };
      for (int u = 0; u <= U; ++u) {
        step(u, p.k, k_empty, k_full, Cfg::kKOffset, false);
        step(u, p.v, v_empty, v_full, Cfg::kVOffset, true);
      }
      kv += U;
    }
  }
}
#endif

template <typename Elem, KvKind kKv>
__global__ void __launch_bounds__(UnionSm90Config::kThreads, 1) union_sm90_kernel(const __grid_constant__ UnionArgs a) {
  static_assert(kKv == KvKind::kNative || kKv == KvKind::kFp8, "NVFP4 K / V take the KV-major path");
#if MSA_HAS_WGMMA
  using Cfg = UnionSm90Config;
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = a.p;
  const int tid = threadIdx.x;
  check_smem_base(smem);
  const uint32_t bars = smem_addr(smem + Cfg::kBarOffset);
  const uint32_t q_full = bars, q_empty = bars + 16, k_full = bars + 32, k_empty = bars + 48,
                 v_full = bars + 64, v_empty = bars + 80;
  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(q_full + 8 * i, Cfg::kProducerThreads + 1);  // + the plan's publishing arrive
      mbar_init(q_empty + 8 * i, Cfg::kConsumerThreads);
      mbar_init(k_full + 8 * i, Cfg::kProducerThreads);
      mbar_init(k_empty + 8 * i, Cfg::kConsumerThreads);
      mbar_init(v_full + 8 * i, Cfg::kProducerThreads);
      mbar_init(v_empty + 8 * i, Cfg::kConsumerThreads);
    }
  }
  __syncthreads();  // the only CTA-wide barrier: producer and consumers part here
  if (tid >= Cfg::kConsumerThreads) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    union_producer<Elem, kKv>(a, smem, bars, tid - Cfg::kConsumerThreads);
    return;
  }
  setmaxnreg_inc<Cfg::kConsumerRegs>();

  // wg broadcast from lane 0: warp-uniform for the compiler too, so that the wgmma descriptors of
  // this warpgroup's query tile live in uniform registers (as in kv_major_sm90.cuh).
  const int wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5, gid = lane >> 2, tig = lane & 3;
  const int G = a.group;
  const uint32_t sK_addr = smem_addr(smem + Cfg::kKOffset), sV_addr = smem_addr(smem + Cfg::kVOffset);
  const float sc = a.scale_log2, temp = p.lse_temperature;
  const UnionRows rows = union_rows(wg, warp, gid, G);

  int kv = 0;  // K / V blocks consumed so far (ring position)
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait(q_full + 8 * tb, (it >> 1) & 1);
    const UnionTilePlan& pl = *reinterpret_cast<const UnionTilePlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    const int w = pl.st.w;
    if (w < 0) break;
    const int kh = pl.st.kh, r0 = pl.st.r0, U = pl.st.count;
    uint8_t* my_q = smem + Cfg::kQOffset + tb * Cfg::kQBytes + wg * (64 * 256);
    const uint32_t my_q_addr = smem_addr(my_q);
    fence_proxy_async_smem();  // Q landed through cp.async; wgmma reads it through the async proxy

    float o[16][4], m_row[2], l_row[2], lt_row[2];
    union_tile_init(o, m_row, l_row, lt_row);

#pragma unroll 1
    for (int u = 0; u < U; ++u, ++kv) {
      const int st = kv & 1;
      const uint32_t parity = (kv >> 1) & 1;
      const uint32_t msk = pl.mask[u];
      if ((msk & rows.wg_mask) == 0u) {
        union_pass_block(bars, st, parity);  // its rows would see nothing of the block
        continue;
      }
      mbar_wait(k_full + 8 * st, parity);
      fence_proxy_async_smem();
      float s[16][4];
      wgmma_qk_tile<Elem>(s, my_q_addr, sK_addr + st * Cfg::kKvBytes);
      mbar_arrive(k_empty + 8 * st);

      float alpha[2];
      union_block_softmax(s, pl, rows, msk, pl.block[u] * kBlockSize, a.has_temp, sc, temp, tig, m_row, l_row,
                          lt_row, alpha);
      union_rescale(o, alpha);
      mbar_wait(v_full + 8 * st, parity);
      fence_proxy_async_smem();
      wgmma_pv_tile<Elem>(o, s, sV_addr + st * Cfg::kKvBytes, true);
      mbar_arrive(v_empty + 8 * st);
    }

    // Epilogue: rows of the warp through its quarter of the warpgroup's (consumed) query tile.
    union_epilogue<Elem>(a, rows, kh, r0, wg, warp, lane, o, m_row, l_row, lt_row, my_q);
    mbar_arrive(q_empty + 8 * tb);  // Q buffer and plan tb are free for tile it + 2
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs per SM of the union kernel, 0 where this device cannot run it.
template <typename Elem, KvKind kKv>
int union_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(union_sm90_kernel<Elem, kKv>, UnionSm90Config::kThreads,
                                              size_t(UnionSm90Config::kSmemBytes));
}

template <typename Elem, KvKind kKv>
void launch_union_sm90(const UnionArgs& args, int grid, cudaStream_t stream) {
  auto* kernel = union_sm90_kernel<Elem, kKv>;
  constexpr int smem = UnionSm90Config::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, UnionSm90Config::kThreads, size_t(smem));
  kernel<<<grid, UnionSm90Config::kThreads, smem, stream>>>(args);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

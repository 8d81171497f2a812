// Shared-selection tiles on Hopper (sm_90a) with TMA loads and intra-warpgroup overlap: the
// plan option tile_kernel=tma (bf16 / fp16 K and V; union_sm90.cuh is the default tile kernel and
// the one for fp8 K and V). Same tiles, plans, masks, outputs and smem layout as union_sm90.cuh
// (read its header first); what differs:
//   producer      one warp (the other three of its warpgroup leave at once; 40 registers). Lanes
//                 take the tile and copy its plan; lane 0 loads Q (four 3-D boxes: 64 rows x 64
//                 dims of (token, head) rows per consumer warpgroup and half) and each union
//                 block's K and V (a 128-key box per 64-dim half: flat (dims, Hkv, total_k) at the
//                 block's first row, paged (dims, 128, Hkv, pages) at its page) with
//                 cp.async.bulk.tensor into the 128-byte-swizzled [2][rows][64] tiles the wgmma
//                 descriptors read, completing on the slots' "full" mbarriers (expect_tx). A block
//                 past the sequence's last key (n_valid < 128 keys) has its V rows n_valid..127
//                 zeroed by the warp before it is published (TMA reads those rows from the next
//                 sequence / the page's unused rows, and P = 0 times a NaN there would be NaN;
//                 K's rows there only reach scores the softmax masks by selection).
//   2 consumers   (232 registers) issue S_u = Q K_u^T, then O += P_{u-1} V_{u-1} (both wgmma
//                 groups in flight), wait for S_u alone (wgmma.wait_group 1), release K_u, run the
//                 softmax of block u while P V runs, then wait for it, release V_{u-1}, rescale O
//                 and keep P_u in registers (bf16 / fp16) for the next step: the tensor core works
//                 while the softmax runs (FlashAttention-3's intra-warpgroup pipelining). A block
//                 none of the warpgroup's tokens selected first completes the pending P V.
// The arithmetic per block is the old kernel's (same MMAs, same rescale order); a row's result
// depends only on its tile's plan (D11).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/union_sm90.cuh"

namespace flashmsa::sparse_attn {

struct UnionTmaArgs {
  CUtensorMap q_map;  // q as (128 dims, Hq, total_q), box (64, min(G, 64), 64 / min(G, 64))
  CUtensorMap k_map;  // common/tensor_map.h encode_kv_block_map, box0 64
  CUtensorMap v_map;
  UnionArgs u;
};

struct UnionTmaConfig : UnionSm90Config {
  // 65536 / 384 = 168 at launch; setmaxnreg then 40 + 2 x 232 = 3 x 168 (the proxy kernel's
  // split). 24 + 2 x 240 spills 16 bytes in the producer warp (the tile's plan copy, the work
  // counter, the page lookups), 32 + 2 x 232 8 bytes; the consumers need no more than 232.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  // mbarriers: UnionSm90Config's twelve, then v_fix (a partial block's V, waited for by the
  // producer warp before it zeroes the rows past the sequence).
  static constexpr int kSmemBytes = kBarOffset + 13 * 8;
};
static_assert(UnionTmaConfig::kProducerRegs + 2 * UnionTmaConfig::kConsumerRegs <=
                  3 * (65536 / UnionTmaConfig::kThreads / 8 * 8),
              "register split");
static_assert(UnionTmaConfig::kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");
static_assert(UnionTmaConfig::kQOffset % 1024 == 0 && UnionTmaConfig::kKOffset % 1024 == 0 &&
                  UnionTmaConfig::kVOffset % 1024 == 0,
              "swizzled tiles start on 1024-byte boundaries");

#if MSA_HAS_WGMMA
// TMA coordinates of one 128-key block of K or V of sequence b and kv head kh: paged maps at the
// block's page, flat ones at its first row (row0: the sequence's first row). The caller's plan holds
// only blocks with a valid page, so the page is >= 0 here.
struct KvBlockCoords {
  int c1, c2, c3;
};
MSA_DEVICE KvBlockCoords kv_block_coords(const SparseAttnParams& p, int b, int kh, int blk, int64_t row0) {
  return {p.kv.paged ? 0 : kh, p.kv.paged ? kh : int(row0 + blk * kBlockSize),
          p.kv.paged ? int(kv_page(p.kv, b, blk)) : 0};
}

// The block at c (its two 64-dim halves, one box each) into the [2][128][64] swizzled tile at dst,
// its bytes announced on bar (expect_tx, an arrival).
MSA_DEVICE void tma_load_kv_block(bool paged, const CUtensorMap* map, uint32_t dst, uint32_t bar,
                                  const KvBlockCoords& c) {
  mbar_expect_tx(bar, kBlockSize * 256);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (paged) tma_load_4d(dst + half * (kBlockSize * 128), map, bar, 64 * half, c.c1, c.c2, c.c3);
    else tma_load_3d(dst + half * (kBlockSize * 128), map, bar, 64 * half, c.c1, c.c2);
  }
}

// Zeroes rows n_valid..127 of a landed [2][128][64] tile (a warp, lane 0..31): TMA reads rows past
// a block's last visible key from wherever they lie (the next sequence, a page's unused rows), and
// P = 0 times a NaN there would be NaN. Fenced for the async proxy (wgmma reads, TMA overwrites).
MSA_DEVICE void zero_tile_rows_from(uint8_t* tile, int n_valid, int lane) {
  for (int c = n_valid * 8 + lane; c < kBlockSize * 8; c += 32) {  // 8 chunks of 16 bytes per row and half
    const int row = c >> 3, ch = c & 7;
    *reinterpret_cast<uint4*>(tile + row * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(tile + kBlockSize * 128 + row * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_proxy_async_smem();
}

// The producer warp (lane 0..31): see the top of the file.
template <typename Elem>
MSA_DEVICE void union_tma_producer(const UnionTmaArgs& ta, uint8_t* smem, uint32_t bars, int lane) {
  using Cfg = UnionTmaConfig;
  const UnionArgs& a = ta.u;
  const SparseAttnParams& p = a.p;
  const uint32_t q_full = bars, q_empty = bars + 16, k_full = bars + 32, k_empty = bars + 48,
                 v_full = bars + 64, v_empty = bars + 80, v_fix = bars + 96;
  const uint32_t sK_addr = smem_addr(smem + Cfg::kKOffset), sV_addr = smem_addr(smem + Cfg::kVOffset);
  if (lane == 0) {
    tma_prefetch_map(&ta.q_map);
    tma_prefetch_map(&ta.k_map);
    tma_prefetch_map(&ta.v_map);
  }
  // A consumer warpgroup's 64 rows: box_h heads x 64 / box_h tokens.
  const int G = a.group;
  int kv = 0;     // K / V blocks issued so far (ring position)
  int fixes = 0;  // partial blocks so far (v_fix's phase)
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait(q_empty + 8 * tb, ((it >> 1) & 1) ^ 1);
    UnionTilePlan& pl = *reinterpret_cast<UnionTilePlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    if (lane == 0) pl.st = union_next_tile(a);
    __syncwarp();
    if (pl.st.w < 0) {
      mbar_arrive(q_full + 8 * tb);  // publishes "no work left" (pl.st, lane 0's write)
      return;
    }
    union_copy_plan(a, pl, lane, 32);
    const int kh = pl.st.kh, b = pl.st.b, U = pl.st.count, seqlen_k = pl.st.seqlen_k;
    if (lane != 0) mbar_arrive(q_full + 8 * tb);  // this lane's plan writes
    __syncwarp();  // every lane has read pl.st / written its part before the producer moves on
    if (lane == 0) {
      const uint32_t sQ_addr = smem_addr(smem + Cfg::kQOffset + tb * Cfg::kQBytes);
      mbar_expect_tx(q_full + 8 * tb, Cfg::kQBytes);
#pragma unroll
      for (int wg = 0; wg < 2; ++wg)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          tma_load_3d(sQ_addr + uint32_t(wg * 64 * 256 + half * 64 * 128), &ta.q_map, q_full + 8 * tb, 64 * half,
                      kh * G + (64 * wg) % G, pl.st.r0 + (64 * wg) / G);
    }
    const int64_t row0 = p.kv.paged ? 0 : kv_row_begin(p.kv, b);
#pragma unroll 1
    for (int u = 0; u < U; ++u, ++kv) {
      const int st = kv & 1;
      const uint32_t parity = ((kv >> 1) & 1) ^ 1;
      const int blk = pl.block[u], j0 = blk * kBlockSize;
      const bool partial = seqlen_k - j0 < kBlockSize;
      const KvBlockCoords c = kv_block_coords(p, b, kh, blk, row0);
      const uint32_t sK = sK_addr + st * Cfg::kKvBytes, sV = sV_addr + st * Cfg::kKvBytes;
      if (lane == 0) {
        mbar_wait(k_empty + 8 * st, parity);
        tma_load_kv_block(p.kv.paged, &ta.k_map, sK, k_full + 8 * st, c);
        mbar_wait(v_empty + 8 * st, parity);
        tma_load_kv_block(p.kv.paged, &ta.v_map, sV, partial ? v_fix : v_full + 8 * st, c);
      }
      if (partial) {
        mbar_wait(v_fix, fixes & 1);
        ++fixes;
        zero_tile_rows_from(smem + Cfg::kVOffset + st * Cfg::kKvBytes, max(seqlen_k - j0, 0), lane);
        __syncwarp();
        if (lane == 0) mbar_arrive(v_full + 8 * st);
      }
    }
    __syncwarp();
  }
}
#endif

template <typename Elem>
__global__ void __launch_bounds__(UnionTmaConfig::kThreads, 1) union_tma_sm90_kernel(const __grid_constant__ UnionTmaArgs ta) {
#if MSA_HAS_WGMMA
  using Cfg = UnionTmaConfig;
  extern __shared__ __align__(1024) uint8_t smem[];
  const UnionArgs& a = ta.u;
  const SparseAttnParams& p = a.p;
  const int tid = threadIdx.x;
  check_smem_base(smem);
  const uint32_t bars = smem_addr(smem + Cfg::kBarOffset);
  const uint32_t q_full = bars, q_empty = bars + 16, k_full = bars + 32, k_empty = bars + 48,
                 v_full = bars + 64, v_empty = bars + 80, v_fix = bars + 96;
  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      // Every producer lane arrives after its own plan writes (lane 0 with the expect_tx of Q's
      // bytes), so that each write is released by its own thread's arrive: compute-sanitizer's
      // racecheck does not carry a __syncwarp + one lane's arrive over to the other lanes'
      // writes (H200 at bff5899: hazards on pl.lim / pl.mask with a single arrive).
      mbar_init(q_full + 8 * i, 32);
      mbar_init(q_empty + 8 * i, Cfg::kConsumerThreads);
      mbar_init(k_full + 8 * i, 1);
      mbar_init(k_empty + 8 * i, Cfg::kConsumerThreads);
      mbar_init(v_full + 8 * i, 1);
      mbar_init(v_empty + 8 * i, Cfg::kConsumerThreads);
    }
    mbar_init(v_fix, 1);
    fence_mbarrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier: producer and consumers part here
  if (tid >= Cfg::kConsumerThreads) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid < Cfg::kConsumerThreads + 32) union_tma_producer<Elem>(ta, smem, bars, tid - Cfg::kConsumerThreads);
    return;
  }
  setmaxnreg_inc<Cfg::kConsumerRegs>();

  // wg broadcast from lane 0: warp-uniform for the compiler too, so that the wgmma descriptors of
  // this warpgroup's query tile live in uniform registers (as in kv_major_sm90.cuh).
  const int wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5, gid = lane >> 2, tig = lane & 3;
  const uint32_t sK_addr = smem_addr(smem + Cfg::kKOffset), sV_addr = smem_addr(smem + Cfg::kVOffset);
  const float sc = a.scale_log2, temp = p.lse_temperature;
  const UnionRows rows = union_rows(wg, warp, gid, a.group);

  int kv = 0;  // K / V blocks consumed so far (ring position)
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait_loop(q_full + 8 * tb, (it >> 1) & 1);
    const UnionTilePlan& pl = *reinterpret_cast<const UnionTilePlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    if (pl.st.w < 0) break;
    const int kh = pl.st.kh, r0 = pl.st.r0, U = pl.st.count;
    uint8_t* my_q = smem + Cfg::kQOffset + tb * Cfg::kQBytes + wg * (64 * 256);
    const uint32_t my_q_addr = smem_addr(my_q);

    float o[16][4], m_row[2], l_row[2], lt_row[2];
    union_tile_init(o, m_row, l_row, lt_row);
    // The pending P V: P of the last computed block (packed) and its V slot.
    uint32_t pa[8][4];
    bool pending = false;
    int p_st = 0;
    uint32_t p_parity = 0;
    // Completes the pending P V (o += P V, waited for) and releases its V slot.
    auto flush = [&]() {
      mbar_wait_loop(v_full + 8 * p_st, p_parity);
      wgmma_pv_issue<Elem>(o, pa, sV_addr + p_st * Cfg::kKvBytes, true);
      wgmma_wait<0>();
      wgmma_fence_operand(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_fence_operand(pa[kk]);
      mbar_arrive(v_empty + 8 * p_st);
      pending = false;
    };

#pragma unroll 1
    for (int u = 0; u < U; ++u, ++kv) {
      const int st = kv & 1;
      const uint32_t parity = (kv >> 1) & 1;
      const uint32_t msk = pl.mask[u];
      // Warp-uniform to the compiler too (a lane's copy): no wgmma may sit in a branch it thinks
      // divergent (ptxas would serialize all of them, C7518).
      if (__shfl_sync(0xffffffffu, (msk & rows.wg_mask) == 0u, 0)) {
        // Nothing of the block is visible to these rows (union_sm90.cuh): its slots are waited
        // for and released. The pending P V goes first: its V slot must be released before
        // the producer can fill the ring past this block.
        if (pending) flush();
        union_pass_block(bars, st, parity);
        continue;
      }
      mbar_wait_loop(k_full + 8 * st, parity);
      float s[16][4];
      wgmma_qk_issue<Elem>(s, my_q_addr, sK_addr + st * Cfg::kKvBytes);
      if (pending) {
        mbar_wait_loop(v_full + 8 * p_st, p_parity);
        wgmma_pv_issue<Elem>(o, pa, sV_addr + p_st * Cfg::kKvBytes, true);
        wgmma_wait<1>();  // S_u done, P V of the previous block may still run
      } else {
        wgmma_wait<0>();
      }
      wgmma_fence_operand(s);
      mbar_arrive(k_empty + 8 * st);

      float alpha[2];
      union_block_softmax(s, pl, rows, msk, pl.block[u] * kBlockSize, a.has_temp, sc, temp, tig, m_row, l_row,
                          lt_row, alpha);
      // P V done (without a pending P V nothing is in flight: unconditional, so that on every
      // path the compiler sees no accumulator read while an MMA may run).
      wgmma_wait<0>();
      wgmma_fence_operand(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_fence_operand(pa[kk]);
      if (pending) mbar_arrive(v_empty + 8 * p_st);
      union_rescale(o, alpha);
      pack_p<Elem>(pa, s);
      pending = true;
      p_st = st;
      p_parity = parity;
    }
    if (pending) flush();

    // Epilogue: rows of the warp through its quarter of the warpgroup's (consumed) query tile.
    union_epilogue<Elem>(a, rows, kh, r0, wg, warp, lane, o, m_row, l_row, lt_row, my_q);
    fence_proxy_async_smem();  // the staging writes before the next TMA into this buffer
    mbar_arrive(q_empty + 8 * tb);  // Q buffer and plan tb are free for tile it + 2
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs per SM of the TMA tile kernel, 0 where this device cannot run it.
template <typename Elem>
int union_tma_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(union_tma_sm90_kernel<Elem>, UnionTmaConfig::kThreads,
                                              size_t(UnionTmaConfig::kSmemBytes));
}

// Encodes the maps of q, k and v (NotSupported where the driver rejects them; the planner's
// union_tma_applies keeps the calls it sends here within TMA's coordinates) and launches.
template <typename Elem>
void launch_union_tma_sm90(const UnionArgs& args, int grid, cudaStream_t stream) {
  const SparseAttnParams& p = args.p;
  UnionTmaArgs ta{};
  ta.u = args;
  const CUtensorMapDataType ty = flashmsa::cuda::tma_dtype_16<Elem>();
  const uint32_t box_h = uint32_t(args.group < 64 ? args.group : 64);
  const bool ok = flashmsa::cuda::encode_q_map_sw128(ta.q_map, ty, p, box_h, 64 / box_h) &&
                  flashmsa::cuda::encode_kv_maps_sw128(ta.k_map, ta.v_map, ty, p);
  MSA_CHECK_SUPPORTED(ok, "tile_kernel=tma: the driver rejected the TMA descriptors of q / k / v");
  auto* kernel = union_tma_sm90_kernel<Elem>;
  constexpr int smem = UnionTmaConfig::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, UnionTmaConfig::kThreads, size_t(smem));
  kernel<<<grid, UnionTmaConfig::kThreads, smem, stream>>>(ta);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

// The fp8 register kernel's stages filled by TMA (decode plan option regs_feed=tma; sm_90a): the
// pieces query_major_kernel<.., kTma = true> adds to its 16-row register variant (kv_regs.cuh).
//
// With cp.async every thread copies 16-byte chunks of the next block's raw K and V, and each
// block step waits for its own copies and then for every warp at a CTA barrier (the barrier also
// tells the issuing threads that the stage they refill is free). Here:
//   * thread 0 loads a block's raw K and V as two TMA boxes of 128 keys x 128 bytes (the maps of
//     common/tensor_map.h encode_kv_maps_raw8: uint8, 128-byte swizzle, which is the raw tile's
//     chunk swizzle `chunk ^ (key % 8)` of kv_regs.cuh raw8_at, so the stage holds the same bytes
//     at the same places), announced on the stage's full barrier (expect_tx of 32 KB);
//   * each warp waits for the stage's full barrier, computes its 32 keys and releases the stage on
//     its empty barrier (one arrival a warp); thread 0 waits for the 4 releases of a stage's
//     previous block before it loads the stage again. No CTA barrier per block: a warp waits only
//     for its data (and warp 0 for the slowest warp's release of the stage it refills).
// Blocks are counted over the CTA's items (`fed`): block g uses stage g % kStages, the n-th use of
// a stage waits full with parity n & 1 and empty with parity (n & 1) ^ 1 (passing at once for the
// first use; common/mbarrier.cuh).
// Rows past a partial block's last visible key hold whatever the page or the next sequence holds
// (cp.async zero-fills them): K there is masked by the softmax's select, but P = 0 times a NaN V
// byte is NaN, so each warp zeroes the V rows of its own keys past the last visible one, fenced for
// the async proxy (a later TMA overwrites them). The arithmetic is the cp.async kernel's: the
// results are bit-identical.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kernel_traits.h"

namespace flashmsa::sparse_attn {

// query_major_kernel's parameters with kTma: the maps of the raw fp8 K and V blocks.
struct QueryMajorTmaArgs : QueryMajorArgs {
  CUtensorMap k_map;  // common/tensor_map.h encode_kv_maps_raw8
  CUtensorMap v_map;
};

// A block's TMA coordinate as the kTma plan keeps it in TileDesc::pad: the page (paged) or the
// block's first row in the flat K / V (flat).
MSA_DEVICE int qm_tma_coord(const SparseAttnParams& p, int b, int64_t page, int j0) {
  return p.kv.paged ? int(page) : int(kv_row_begin(p.kv, b) + j0);
}

// The full / empty barriers of a CTA's kStages stages (2 x kStages mbarriers at bar0).
template <int kStages>
struct QmTmaBars {
  uint32_t bar0;
  MSA_DEVICE uint32_t full(int st) const { return bar0 + 8u * uint32_t(st); }
  MSA_DEVICE uint32_t empty(int st) const { return bar0 + 8u * uint32_t(kStages + st); }
};

// Thread 0, before a __syncthreads: the barriers (full: the loading thread's expect_tx arrival;
// empty: one arrival per warp) and the maps pulled into the cache.
template <int kStages, int kWarps>
MSA_DEVICE void qm_tma_init(const QueryMajorTmaArgs& args, const QmTmaBars<kStages>& bars) {
#if MSA_HAS_WGMMA
  tma_prefetch_map(&args.k_map);
  tma_prefetch_map(&args.v_map);
  for (int st = 0; st < kStages; ++st) {
    mbar_init(bars.full(st), 1);
    mbar_init(bars.empty(st), kWarps);
  }
  fence_mbarrier_init();
#else
  __trap();
#endif
}

// Thread 0: block g (over the CTA's items) of kv head kh, tile d, into stage g % kStages at
// stage_addr (K, then V 16 KB on), once every warp released the stage's previous block.
template <int kStages>
MSA_DEVICE void qm_tma_load(const QueryMajorTmaArgs& args, const QmTmaBars<kStages>& bars, const TileDesc& d,
                            int kh, uint32_t stage_addr, uint32_t g) {
#if MSA_HAS_WGMMA
  const int st = int(g % kStages);
  const uint32_t use = g / kStages;
  mbar_wait(bars.empty(st), (use & 1u) ^ 1u);
  mbar_expect_tx(bars.full(st), 2u * kBlockSize * 128u);
  const uint32_t v_addr = stage_addr + kBlockSize * 128u;
  if (args.p.kv.paged) {
    tma_load_4d(stage_addr, &args.k_map, bars.full(st), 0, 0, kh, d.pad);
    tma_load_4d(v_addr, &args.v_map, bars.full(st), 0, 0, kh, d.pad);
  } else {
    tma_load_3d(stage_addr, &args.k_map, bars.full(st), 0, kh, d.pad);
    tma_load_3d(v_addr, &args.v_map, bars.full(st), 0, kh, d.pad);
  }
#else
  __trap();
#endif
}

// Every lane of a warp: until block g's K and V have landed in its stage.
template <int kStages>
MSA_DEVICE void qm_tma_wait(const QmTmaBars<kStages>& bars, uint32_t g) {
#if MSA_HAS_WGMMA
  mbar_wait_loop(bars.full(int(g % kStages)), (g / kStages) & 1u);
#else
  __trap();
#endif
}

// A warp done with block g: one arrival on its stage's empty barrier (after the warp's reads).
template <int kStages>
MSA_DEVICE void qm_tma_release(const QmTmaBars<kStages>& bars, uint32_t g, int lane) {
#if MSA_HAS_WGMMA
  __syncwarp();
  if (lane == 0) mbar_arrive(bars.empty(int(g % kStages)));
#else
  __trap();
#endif
}

// A warp's keys key0 .. key0 + kWarpKeys - 1 of the raw V tile sV (kv_regs.cuh's [keys][128 bytes]
// layout) from key n_valid on, zeroed (a whole 128-byte row a key: the swizzle only permutes the
// chunks of a row), then fenced for the async proxy.
template <int kWarpKeys>
MSA_DEVICE void qm_tma_zero_v_rows(uint8_t* sV, int key0, int n_valid, int lane) {
#if MSA_HAS_WGMMA
  const int from = n_valid > key0 ? n_valid : key0;
  for (int c = from * 8 + lane; c < (key0 + kWarpKeys) * 8; c += 32)
    *reinterpret_cast<uint4*>(sV + c * 16) = make_uint4(0u, 0u, 0u, 0u);
  fence_proxy_async_smem();
  __syncwarp();
#else
  __trap();
#endif
}

// This thread's generic shared-memory writes ordered before later async-proxy writes to the same
// bytes (the previous item's merge and staging over the stages, before the next item's loads).
MSA_DEVICE void qm_tma_fence() {
#if MSA_HAS_WGMMA
  fence_proxy_async_smem();
#else
  __trap();
#endif
}

}  // namespace flashmsa::sparse_attn

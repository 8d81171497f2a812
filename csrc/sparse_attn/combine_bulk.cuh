// The KV-major combine of one launch group run inside the next group's sm_90a attention kernel
// (plan option combine=overlap; docs/design/sparse_attention.md#combine-overlap).
//
// Why: the separate combine kernel streams ~2 GB of bf16 partials per 32K launch group at ~3.7 TB/s
// with every SM (2.2 ms of a 32K random call, 9.2 ms of the 128K pipeline), while the attention
// kernels leave HBM two thirds idle (DRAM ~32 % of peak). A few SMs that pull their partials with
// bulk copies (cp.async.bulk, ~192 KB in flight per SM, no registers held) can stream several times
// the ~25 GB/s per SM the separate kernel averages (H200: 125-179 GB/s per SM on 13 SMs with the
// rest idle, benchmarks/micro/kv_stream.cu), so a group's combine costs fewer SM-seconds when it
// runs on a few SMs beside the next group's MMAs than on all of them alone.
//
// Measured on the H200 (204323f, M3 32K random): bit-identical and sanitizer-clean, but slower than
// the separate kernel (10.2 vs 8.09 ms of kernels; see the design doc), hence off by default. The
// fields in registers and the division-free slot scan below came after that run (not measured).
//
// A work unit is one (kv head, row) of the group: its topk x G partial rows of 256 bytes are one
// contiguous range (slot s, head g at row s * G + g), at most kCombineBulkMaxRows = 256 of them,
// one 64 KB shared-memory stage. Per unit:
//   1. lane 0 of warp 0 takes the unit from the group's counter (KvMajorControl::next_unit),
//      skipping rows done by shared-selection tiles, and bulk-copies its topk x G LSEs (<= 1 KB);
//   2. once they land, warp 0 finds the slots some head of which has an LSE that is not -inf: the
//      slots the attention kernel wrote (a pair writes all G heads of its slot; the list builder or
//      the previous combine set every other slot to -inf), and lane 0 bulk-copies only those
//      (G x 256 bytes each), so no byte the attention kernel did not write is read;
//   3. every warp merges heads g = warp, warp + 16, ... with merge_row, the separate combine's own
//      arithmetic over a shared-memory source (the same bits), and the LSEs read back are reset to
//      -inf for the next group of the buffer (reset_lse).
// Pipelining: a unit's LSEs are requested 8 units ahead, its values 3 units ahead (3 stages of 64
// KB: ~192 KB in flight per SM), the work counter's atomic one claim of 8 units ahead; loads carry
// an L2 evict-first policy: the partials are read once, while the attention CTAs beside them
// re-read K/V blocks and query rows from L2.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda_utils.h"
#include "common/mbarrier.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "sparse_attn/combine.cuh"

namespace flashmsa::sparse_attn {

// Shared memory of the in-kernel combine (from the start of the kernel's dynamic shared memory).
struct CombineBulkLayout {
  static constexpr int kStages = 3;     // units whose values are in flight or being merged
  static constexpr int kLseSlots = 8;   // units whose LSEs are requested (kStages ahead and more)
  static constexpr int kClaim = 8;      // units taken from the work counter by one atomic
  static constexpr int kStageBytes = kCombineBulkMaxRows * 256;  // a unit's partial rows
  static constexpr int kLseFloats = kCombineBulkMaxRows;         // a unit's LSEs
  static constexpr int kLseOffset = kStages * kStageBytes;
  static constexpr int kBarOffset = kLseOffset + kLseSlots * kLseFloats * 4;  // LSE barriers, then value ones
  static constexpr int kUnitOffset = kBarOffset + (kLseSlots + kStages) * 8;
  static constexpr int kSmemBytes = kUnitOffset + kLseSlots * 4;
  static_assert(kLseSlots > kStages, "a unit's LSE slot is refilled after its values were requested");
};

#if MSA_HAS_WGMMA
// merge_row's slot source for one head g of a unit staged in shared memory: the LSEs and values the
// bulk copies brought in; the temperature LSEs (when asked for) straight from global memory, as the
// separate combine reads them (and resets them). Scalars, not a CombineArgs reference: see below.
template <StoreKind kKind>
struct StagedSlots {
  static_assert(kKind == StoreKind::kBF16 || kKind == StoreKind::kF16, "KV-major partials are 16-bit");
  const float* lse_s;     // the unit's LSEs, [slot][G]
  const uint8_t* values;  // the unit's stage, row s * G + g at 256 (s * G + g)
  float* part_lse_t;      // temperature LSEs (global), or nullptr
  int64_t row0;           // partial row of slot 0, head g
  int group;
  int g;
  bool reset;
  MSA_DEVICE float lse(int s) const { return sanitize_lse(lse_s[s * group + g]); }
  MSA_DEVICE float lse_t(int s) const { return read_lse(part_lse_t, row0 + int64_t(s) * group, reset); }
  MSA_DEVICE Raw8 load(int s, int /*hl: in values*/) const {
    Raw8 r{};
    r.a = *reinterpret_cast<const uint4*>(values + (s * group + g) * 256);
    return r;
  }
};

// The units of combine `args` (rows [row_begin, + rows) of its launch group, every kv head) taken
// from *next_unit until none is left, by all kThreads threads of the CTA; smem: the kernel's dynamic
// shared memory, free on entry and on return (its barriers invalidated).
//
// Unit k of this CTA's sequence: its LSEs in slot k % kLseSlots (requested kLseSlots units ahead),
// its values in stage k % kStages (requested kStages units ahead, when the stage is freed). Lane 0
// of warp 0 claims units kClaim at a time (the next claim's atomic issued a batch ahead, so its
// round trip is hidden), skips rows done by shared-selection tiles (one flag read per tile) and
// issues the copies; per loop index warp 0 requests one unit's LSEs and one unit's values, and no
// thread waits for anything but the unit it merges (whose copies were requested units ago).
// Not inlined: the attention loop keeps more of its own register allocation (inlined, the merge's
// batch of loads pushed the kernel into 16 bytes of spills; not inlined, 0-8 bytes depending on
// this function's code: kv_major_sm90.cuh's kOverlap instantiation only). `args` lives in the kernel's
// parameter space, which a non-inlined function reaches only by generic loads, reloaded after
// every global store (the SASS of 204323f: ~50 LD.E of its fields, `group` inside the merge), so
// the fields are read once into registers here, and the units' (kv head, row) and slot indices
// avoid divisions on the per-unit path.
template <typename OutElem, StoreKind kKind, int kThreads>
__device__ __noinline__ void combine_units_bulk(const CombineArgs& args, int* next_unit, uint8_t* smem) {
  using L = CombineBulkLayout;
  constexpr int S = L::kStages, NL = L::kLseSlots, kWarps = kThreads / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rows = args.rows, row_begin = args.row_begin, row_stride = args.row_stride;
  const int num_heads = args.num_heads, num_slots = args.num_slots, G = args.group;
  const int units = args.num_kv_heads * rows;
  const uint8_t* const part_o = static_cast<const uint8_t*>(args.part_o);
  float* const part_lse = args.part_lse;
  float* const part_lse_t = args.part_lse_t;
  void* const out = args.out;
  float* const lse_out = args.lse;
  float* const lse_t_out = args.lse_t;
  const float v_scale = args.v_scale;
  const uint8_t* const union_done = args.union_done;
  const int union_tile_tokens = args.union_tile_tokens, union_num_tiles = args.union_num_tiles;
  const bool reset = args.reset_lse;
  const int unit_rows = num_slots * G;  // partial rows of a unit (<= 256)
  const uint32_t base = smem_addr(smem);
  const uint32_t bar_lse = base + L::kBarOffset, bar_val = bar_lse + 8 * NL;  // slot / stage i: + 8 i
  float* const s_lse = reinterpret_cast<float*>(smem + L::kLseOffset);
  int* const s_unit = reinterpret_cast<int*>(smem + L::kUnitOffset);  // by LSE slot
  // Unit u = kh * rows + rel: (kv head, row of the group). One division per unit and thread.
  auto row0_of = [&](int kh, int rel) { return (int64_t(kh) * row_stride + rel) * unit_rows; };

  // Lane 0 of warp 0: the claim state and the next unit whose row no tile did (-1: none left).
  int cur = 0, end = 0, pending = 0, flag_tile = -1;
  bool flag_done = false;
  auto next = [&]() -> int {
    for (;;) {
      if (cur == end) {
        if (pending >= units) return -1;  // for good: every later call lands here too
        cur = pending;                    // claimed a batch ago
        end = min(cur + L::kClaim, units);
        pending = atomicAdd(next_unit, L::kClaim);
      }
      const int u = cur++;
      if (union_done == nullptr) return u;
      const int kh = u / rows;
      const int tile_key = kh * union_num_tiles + (row_begin + u - kh * rows) / union_tile_tokens;
      if (tile_key != flag_tile) {
        flag_tile = tile_key;
        flag_done = union_done[tile_key] != 0;
      }
      if (!flag_done) return u;
    }
  };
  // Lane 0: unit u's LSEs into slot l.
  auto request_lse = [&](int l, int u, uint64_t policy) {
    const int kh = u / rows;
    mbar_expect_tx(bar_lse + 8 * l, uint32_t(unit_rows) * 4);
    bulk_load_hint(base + L::kLseOffset + l * L::kLseFloats * 4, part_lse + row0_of(kh, u - kh * rows),
                   uint32_t(unit_rows) * 4, bar_lse + 8 * l, policy);
  };
  // Warp 0: the values of unit index k (its LSEs in slot k % NL) into stage k % S: the slots with a
  // head whose LSE is not -inf (written by the attention kernel), G rows of 256 bytes each. Lane
  // `slot` tests its slot's G LSEs (slots < 64: two passes of the warp).
  auto request_values = [&](int k, uint64_t policy) {
    const int l = k % NL, st = k % S;
    const int u = s_unit[l];
    if (u < 0) return;
    mbar_wait(bar_lse + 8 * l, uint32_t(k / NL) & 1u);  // every lane reads the LSEs
    const float* lse = s_lse + l * L::kLseFloats;
    bool w0 = false, w1 = false;  // slots lane, lane + 32 written
    if (lane < num_slots)
      for (int g = 0; g < G; ++g) w0 |= lse[lane * G + g] != neg_inf();
    if (lane + 32 < num_slots)
      for (int g = 0; g < G; ++g) w1 |= lse[(lane + 32) * G + g] != neg_inf();
    const uint32_t lo = __ballot_sync(0xffffffffu, w0), hi = __ballot_sync(0xffffffffu, w1);
    if (lane == 0) {
      const int kh = u / rows;
      const uint32_t row_bytes = uint32_t(G) * 256;
      mbar_expect_tx(bar_val + 8 * st, uint32_t(__popc(lo) + __popc(hi)) * row_bytes);
      const uint8_t* src = part_o + row0_of(kh, u - kh * rows) * 256;
      const uint32_t dst = base + st * L::kStageBytes;
      for (uint32_t m = lo; m != 0; m &= m - 1) {
        const int slot = __ffs(m) - 1;
        bulk_load_hint(dst + slot * row_bytes, src + int64_t(slot) * row_bytes, row_bytes, bar_val + 8 * st, policy);
      }
      for (uint32_t m = hi; m != 0; m &= m - 1) {
        const int slot = 32 + __ffs(m) - 1;
        bulk_load_hint(dst + slot * row_bytes, src + int64_t(slot) * row_bytes, row_bytes, bar_val + 8 * st, policy);
      }
    }
    __syncwarp();
  };

  fence_proxy_async_smem();  // this CTA's earlier generic writes of this memory before the copies'
  if (tid == 0) {
    for (int i = 0; i < NL + S; ++i) mbar_init(bar_lse + 8 * i, 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  const uint64_t policy = l2_policy_evict_first();
  if (warp == 0) {
    if (lane == 0) {
      pending = atomicAdd(next_unit, L::kClaim);
      for (int l = 0; l < NL; ++l) {
        const int u = next();
        s_unit[l] = u;
        if (u >= 0) request_lse(l, u, policy);
      }
    }
    __syncwarp();
    for (int k = 0; k < S; ++k) request_values(k, policy);
  }
  __syncthreads();  // s_unit visible

#pragma unroll 1
  for (int k = 0;; ++k) {
    const int l = k % NL, st = k % S;
    const int u = s_unit[l];
    if (u < 0) break;  // CTA-uniform: the counter is exhausted for good
    mbar_wait(bar_lse + 8 * l, uint32_t(k / NL) & 1u);
    mbar_wait(bar_val + 8 * st, uint32_t(k / S) & 1u);
    const float* lse_s = s_lse + l * L::kLseFloats;
    const int kh = u / rows, rel = u - kh * rows;
    const int64_t row0 = row0_of(kh, rel);
    for (int g = warp; g < G; g += kWarps) {  // warp-uniform
      const StagedSlots<kKind> slots{lse_s, smem + st * L::kStageBytes + (lane & 15) * 16, part_lse_t, row0 + g,
                                     G, g, reset};
      const int64_t out_idx = (int64_t(row_begin) + rel) * num_heads + int64_t(kh) * G + g;
      merge_row<OutElem, kKind, StagedSlots<kKind>, false>(slots, num_slots, v_scale, out, lse_out, lse_t_out,
                                                           out_idx, lane);
    }
    if (reset)
      for (int t = tid; t < unit_rows; t += kThreads)
        if (lse_s[t] != neg_inf()) part_lse[row0 + t] = neg_inf();
    __syncthreads();  // LSE slot l and value stage st consumed
    if (warp == 0) {
      if (lane == 0) {  // unit k + NL into slot l
        const int u2 = next();
        s_unit[l] = u2;
        if (u2 >= 0) request_lse(l, u2, policy);
      }
      __syncwarp();
      request_values(k + S, policy);  // into stage st (its LSEs were requested NL - S units ago)
    }
    // The other warps read s_unit[l] again at loop index k + NL, after NL - 1 more barriers.
  }
  __syncthreads();  // every wait on the barriers is past
  if (tid == 0)
    for (int i = 0; i < NL + S; ++i) mbar_inval(bar_lse + 8 * i);
  __syncthreads();
}
#endif

}  // namespace flashmsa::sparse_attn

// KV-major sparse attention on Hopper (sm_90a): the same schedule, lists, items and partials as
// kv_major.cuh, with the block's attention done by warpgroup MMAs.
//
// A CTA is two warpgroups (256 threads), one per SM. Per item it loads the 128-key K and V block
// into 128-byte-swizzled tiles (dequantizing fp8 / NVFP4 through the idle query area) and the item's
// list entries into shared memory; then each warpgroup streams its share of the item's 64-row query
// tiles (rows = (token, head) pairs, gathered by cp.async through a 4-stage ring, 3 tiles in
// flight: the gathers come from HBM and need the depth) through the block:
//   S = Q K^T          8 x wgmma m64n128k16, Q and K from shared memory
//   P = 2^(S scale log2e - m)   one softmax over the block's 128 keys (no running rescale: a
//                      partial covers exactly one block), masked by each row's causal limit
//   O = P V            8 x wgmma m64n128k16, P from registers (the S accumulator layout is the A
//                      fragment layout), V read MN-major from the same tile layout as K
// and writes O / l (compute dtype, staged through the consumed query buffer for whole-chunk stores)
// and the log2 LSE as the row's partial, exactly where kv_major.cuh writes it; the combine kernel
// is shared. Each output row depends only on its own query row and the block (row-independent
// MMAs, a softmax reduced in a fixed order), so results are deterministic (D11).
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kv_major.cuh"
#include "sparse_attn/wgmma_tile.cuh"

namespace flashmsa::sparse_attn {

template <KvKind kKv>
struct KvMajorSm90Config {
  static constexpr int kWarpgroups = 4;  // consumers of one K/V block, each with its own query ring
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kTileRows = 64;   // query rows per wgmma tile
  static constexpr int kStages = 2;      // query ring per warpgroup: 1 tile in flight
  static constexpr int kKvTileBytes = kBlockSize * 256;  // K or V of one block, compute dtype
  static constexpr int kQTileBytes = kTileRows * 256;
  static constexpr int kRawBytes = 2 * kRawTileBytes<kKv, kBlockSize>;
  static constexpr int kQAreaBytes = kWarpgroups * kStages * kQTileBytes;
  // wgmma operands must be 1024-byte aligned (128-byte swizzle atoms): K, V, Q buffers are.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvTileBytes;
  static constexpr int kQOffset = kVOffset + kKvTileBytes;
  // Row tables per (warpgroup, stage): query element offset, partial index (int64), visible keys.
  static constexpr int kTables = kWarpgroups * kStages;
  static constexpr int kRowQOffset = kQOffset + kQAreaBytes;
  static constexpr int kRowSlotOffset = kRowQOffset + kTables * kTileRows * 8;
  static constexpr int kRowLimOffset = kRowSlotOffset + kTables * kTileRows * 8;
  // The item's list entries (the plan caps items at kKvm90MaxTokensPerItem tokens).
  static constexpr int kListOffset = kRowLimOffset + kTables * kTileRows * 4;
  // Two item records, used alternately (see the item loop).
  static constexpr int kItemOffset = kListOffset + kKvm90MaxTokensPerItem * 4;
  static constexpr int kSmemBytes = kItemOffset + 2 * 128;
  static_assert(kQTileBytes % 1024 == 0 && kKvTileBytes % 1024 == 0, "1024-byte aligned tiles");
  static_assert(kRawBytes <= kQAreaBytes, "raw K/V staging fits the query area");
};

#if MSA_HAS_WGMMA
// Fills the row table of one 64-row tile (threads 0-63 of the warpgroup, one row each): the query
// element offset, the partial row index and the block's visible-key count of (token, head) row
// `i` of the item (-1 / -1 / 0 for padding rows past the item).
MSA_DEVICE void kvm90_build_rows(const KvMajorArgs& args, const KvmItemState& is, const uint32_t* s_list,
                                 int tile, int64_t* s_q, int64_t* s_slot, int* s_lim, int wtid) {
  if (wtid >= 64) return;
  const SparseAttnParams& p = args.p;
  const int G = args.group;
  const int i = tile * 64 + wtid;
  int64_t qe = -1, slot_idx = -1;
  int lim = 0;
  if (tile >= 0 && i < is.rows) {
    const int e = i / G;
    const int g = i - e * G;
    const uint32_t v = s_list[e];
    const int rel = int(v >> 6), slot = int(v & 63u);
    const int r = args.row_begin + rel;
    qe = int64_t(r) * p.q_stride_token + int64_t(is.kh * G + g) * p.q_stride_head;
    slot_idx = ((int64_t(is.kh) * args.chunk_rows + rel) * p.topk + slot) * G + g;
    lim = max(0, min(kBlockSize, col_limit(p.causal, is.q_off, r - is.q_begin, is.seqlen_k) - is.j0));
  }
  s_q[wtid] = qe;
  s_slot[wtid] = slot_idx;
  s_lim[wtid] = lim;
}

// cp.async of one 64-row query tile (rows from the table; padding rows zero-filled) into `dst`,
// committed as one group (an empty group when the table is all padding).
template <typename Elem>
MSA_DEVICE void kvm90_issue_q(const Elem* q, const int64_t* s_q, uint32_t dst, int wtid) {
#pragma unroll
  for (int k = 0; k < 64 * 16 / 128; ++k) {
    const int c = wtid + 128 * k;
    const int row = c >> 4, ch = c & 15;
    const int64_t qe = s_q[row];
    const bool ok = qe >= 0;
    cp_async_16_zfill(dst + Sw128Tile<64>::at(row, ch), ok ? q + qe + ch * 8 : q, ok);
  }
  cp_async_commit();
}

// Softmax of fragment row h (0: row gid, 1: gid + 8 of the warp's 16) over one block's 128 keys,
// in base 2: x = S * sc (sc = scale * log2 e), m = max x over the visible keys (taken on the raw
// scores: max x = |sc| * max(S * sign(sc)), 0 when nothing is visible), P = 2^(x - m) =
// 2^fma(S, sc, -m) left in s, 0 for keys >= lim (kMask: only rows of the diagonal block have any).
// l = sum P and lt = sum 2^(T (x - m)) are reduced over the row's 4 threads.
template <bool kMask, bool kTemp>
MSA_DEVICE void block_softmax_row(float (&s)[16][4], int h, int lim, float sc, float temp, int tig, float& m,
                                  float& l, float& lt) {
  const float ext = row_extreme<kMask>(s, h, lim, sc, tig);
  const float m_use = ext == neg_inf() ? 0.0f : ext * fabsf(sc);
  float sum = 0.0f, sum_t = 0.0f;
  row_exp_sum<kMask, kTemp>(s, h, lim, sc, temp, tig, m_use, sum, sum_t);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if constexpr (kTemp) {
    sum_t += __shfl_xor_sync(0xffffffffu, sum_t, 1);
    sum_t += __shfl_xor_sync(0xffffffffu, sum_t, 2);
  }
  m = m_use;
  l = sum;
  lt = sum_t;
}
#endif

template <typename Elem, KvKind kKv>
__global__ void __launch_bounds__(KvMajorSm90Config<kKv>::kThreads, 1)
    kv_major_sm90_kernel(const __grid_constant__ KvMajorArgs args) {
#if MSA_HAS_WGMMA
  using Cfg = KvMajorSm90Config<kKv>;
  constexpr int S = Cfg::kStages;
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = args.p;
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5;  // warp within the warpgroup
  const int gid = lane >> 2, tig = lane & 3;
  KvmItemState* s_state = reinterpret_cast<KvmItemState*>(smem + Cfg::kItemOffset);
  uint32_t* s_list = reinterpret_cast<uint32_t*>(smem + Cfg::kListOffset);
  int64_t* s_rowq = reinterpret_cast<int64_t*>(smem + Cfg::kRowQOffset) + wg * S * 64;
  int64_t* s_rowslot = reinterpret_cast<int64_t*>(smem + Cfg::kRowSlotOffset) + wg * S * 64;
  int* s_rowlim = reinterpret_cast<int*>(smem + Cfg::kRowLimOffset) + wg * S * 64;
  uint8_t* sK = smem + Cfg::kKOffset;
  uint8_t* sV = smem + Cfg::kVOffset;
  uint8_t* s_qarea = smem + Cfg::kQOffset;
  uint8_t* my_q = s_qarea + wg * S * Cfg::kQTileBytes;
  const uint32_t sK_addr = smem_addr(sK), sV_addr = smem_addr(sV), sQ_addr = smem_addr(s_qarea);
  const uint32_t my_q_addr = smem_addr(my_q);
  const Elem* q = static_cast<const Elem*>(p.q);
  const float temp = p.lse_temperature;
  check_smem_base(smem);

#pragma unroll 1
  for (int parity = 0;; parity ^= 1) {
    // Item records alternate: thread 0 writes the next item's into the slot the current item did
    // not use, so the write is two CTA barriers away from any read of the record it replaces.
    // (The racecheck reports on the record were the warpgroups' unequal barrier counts, not the
    // single record: see the rounds below.)
    if (tid == 0) {
      s_state[parity] = fetch_kvm_item(args);
    }
    __syncthreads();
    // Read from shared memory where used (registers go to the accumulators).
    const KvmItemState& is = s_state[parity];
    if (is.kh < 0) break;

    // K / V block: native straight into the tiles (its cp.async group completes no later than the
    // first query tile's); quantized through the query area, dequantized before any query tile
    // is loaded. The item's list entries go to shared memory, so that building a tile's row table
    // never waits on global memory.
    {
      const int n_valid = min(kBlockSize, is.seqlen_k - is.j0);
      const int64_t k_off = kv_offset(p.k, p.kv, is.b, is.kh, is.j0);
      const int64_t v_off = kv_offset(p.v, p.kv, is.b, is.kh, is.j0);
      const int64_t srow = kKv == KvKind::kNvfp4 ? kv_scale_row(p.kv, p.num_kv_heads, is.b, is.kh, is.j0) : 0;
      const int step = scale_row_step(p);
      constexpr int T = Cfg::kThreads;
      if constexpr (kKv == KvKind::kNative) {
        issue_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(p.k, k_off, srow, step, n_valid, sK_addr, tid);
        issue_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(p.v, v_off, srow, step, n_valid, sV_addr, tid);
        cp_async_commit();
      } else {
        constexpr int kRawTile = kRawTileBytes<kKv, kBlockSize>;
        issue_kv_rows<Elem, kKv, kBlockSize, T>(p.k, k_off, srow, step, n_valid, sQ_addr, tid);
        issue_kv_rows<Elem, kKv, kBlockSize, T>(p.v, v_off, srow, step, n_valid, sQ_addr + kRawTile, tid);
        cp_async_commit();
      }
      const int tokens = is.rows / args.group;
      for (int e = tid; e < tokens; e += T) s_list[e] = args.list[is.start + e];
      if constexpr (kKv != KvKind::kNative) {
        constexpr int kRawTile = kRawTileBytes<kKv, kBlockSize>;
        cp_async_wait<0>();
        __syncthreads();
        convert_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(s_qarea, sK, tid);
        convert_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(s_qarea + kRawTile, sV, tid);
      }
      __syncthreads();  // the list is visible; raw bytes consumed before query tiles overwrite them
    }

    // Warpgroup wg takes tiles wg, wg + 2, ...: local tile i is tile wg + 2 i, in stage i % S.
    const int n_tiles = (is.rows + Cfg::kTileRows - 1) / Cfg::kTileRows;
    const int my_tiles = n_tiles > wg ? (n_tiles - wg + Cfg::kWarpgroups - 1) / Cfg::kWarpgroups : 0;
    auto prefetch = [&](int i) {  // row table and query loads of local tile i (an empty group past the end)
      const int st = i % S;
      kvm90_build_rows(args, is, s_list, i < my_tiles ? wg + Cfg::kWarpgroups * i : -1, s_rowq + st * 64,
                       s_rowslot + st * 64, s_rowlim + st * 64, wtid);
      warpgroup_barrier(wg);
      kvm90_issue_q<Elem>(q, s_rowq + st * 64, my_q_addr + st * Cfg::kQTileBytes, wtid);
    };
#pragma unroll 1
    for (int i = 0; i < S - 1; ++i) prefetch(i);

    // Every warpgroup runs the same number of rounds, the last one idle where it has a tile less:
    // the warpgroups then pass the same number of barriers per item. compute-sanitizer's racecheck
    // needs that: with unequal counts it reports hazards between the item record's write and the
    // reads of an earlier item although __syncthreads orders every one of them (the model of this
    // loop in scripts/racecheck_model.cu shows the reports with unequal rounds, none with equal).
    const int rounds = (n_tiles + Cfg::kWarpgroups - 1) / Cfg::kWarpgroups;
#pragma unroll 1
    for (int i = 0; i < rounds; ++i) {
      const int st = i % S;
      // Stage (i + S - 1) % S was last used by local tile i - 1, finished (epilogue included) by
      // every thread of the warpgroup before the barrier that ended it.
      prefetch(i + S - 1);
      cp_async_wait<S - 1>();    // this thread's copies of tile i (and of the K/V block) landed
      fence_proxy_async_smem();  // generic-proxy writes -> wgmma operand reads
      warpgroup_barrier(wg);
      if (i >= my_tiles) {  // idle round: the barrier that ends a round only
        warpgroup_barrier(wg);
        continue;
      }

      float s[16][4];
      wgmma_qk_tile<Elem>(s, my_q_addr + st * Cfg::kQTileBytes, sK_addr);
      // Softmax over the block's keys for this thread's rows r_h = 16 warp + gid + 8 h.
      const int* lims = s_rowlim + st * 64;
      float m_row[2], l_row[2], lt_row[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int lim = lims[16 * warp + gid + 8 * h];
        // Uniform choices outside the element loops (a branch per element otherwise).
        if (lim >= kBlockSize) {
          if (args.has_temp) {
            block_softmax_row<false, true>(s, h, lim, args.scale_log2, temp, tig, m_row[h], l_row[h], lt_row[h]);
          } else {
            block_softmax_row<false, false>(s, h, lim, args.scale_log2, temp, tig, m_row[h], l_row[h], lt_row[h]);
          }
        } else if (args.has_temp) {
          block_softmax_row<true, true>(s, h, lim, args.scale_log2, temp, tig, m_row[h], l_row[h], lt_row[h]);
        } else {
          block_softmax_row<true, false>(s, h, lim, args.scale_log2, temp, tig, m_row[h], l_row[h], lt_row[h]);
        }
      }

      float o[16][4];
      wgmma_pv_tile<Elem>(o, s, sV_addr, false);

      // Epilogue: warp w's 16 rows through its quarter of the consumed query buffer.
      const int64_t* slots = s_rowslot + st * 64;
      float mul[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) mul[h] = l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f;
      const int64_t slot_lane = lane < 16 ? slots[16 * warp + lane] : -1;
      store_rows<kElemStoreKind<Elem>>(o, mul, my_q + st * Cfg::kQTileBytes + warp * 16 * 256, args.part_o,
                                       slot_lane >= 0 ? slot_lane * 128 : -1, lane);
      if (tig == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t sl = slots[16 * warp + gid + 8 * h];
          if (sl >= 0) {
            args.part_lse[sl] = row_lse2(m_row[h], l_row[h]);
            if (args.part_lse_t != nullptr) args.part_lse_t[sl] = row_lse2_t(m_row[h], lt_row[h], temp);
          }
        }
      }
      warpgroup_barrier(wg);  // stage st (buffer and table) is free for local tile i + S
    }
    cp_async_wait<0>();  // the empty groups past the end
    __syncthreads();     // the block, the list and the item record are reused by the next item
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs of the sm_90a kernel resident per SM, 0 when this device cannot run it.
template <typename Elem, KvKind kKv>
int kv_major_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(kv_major_sm90_kernel<Elem, kKv>, KvMajorSm90Config<kKv>::kThreads,
                                              size_t(KvMajorSm90Config<kKv>::kSmemBytes));
}

template <typename Elem, KvKind kKv>
void launch_kv_major_sm90(const KvMajorArgs& args, int grid, cudaStream_t stream) {
  auto* kernel = kv_major_sm90_kernel<Elem, kKv>;
  constexpr int smem = KvMajorSm90Config<kKv>::kSmemBytes;
  constexpr int threads = KvMajorSm90Config<kKv>::kThreads;
  flashmsa::cuda::prepare_launch(kernel, threads, size_t(smem));
  kernel<<<grid, threads, smem, stream>>>(args);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

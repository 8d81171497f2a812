// KV-major sparse attention (docs/design/sparse_attention.md#schedule-b), the prefill schedule for
// many query rows.
//
// The list kernels (kv_major_lists.cu) invert the selections of a group of query rows into, per
// (kv head, sequence, block), the list of (row, q2k slot) pairs that use the block, and cut each
// list into items of at most kKvmMaxRowsPerItem query rows. This persistent kernel takes items
// from a work counter: it loads the item's 128-key K and V block once (dequantizing fp8 / NVFP4 in
// shared memory), then each of its 8 warps streams 32-row query tiles through it. A query row is a
// (token, head) pair, so any G packs densely and no token's rows are wasted. With a single block
// per row, the softmax runs over at most two 64-key halves; the warp writes the row's normalized
// output (compute dtype) and log2-domain LSE as the partial of slot (kh, row, q2k position), and
// the combine kernel merges a row's slots in q2k order. Every row's result depends only on its own
// Q and the block, never on which CTA, warp or tile position computed it, so the atomics that build
// the lists and hand out items do not make results depend on scheduling (D11).
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"

namespace flashmsa::sparse_attn {

// Base-2 headroom of the lazy softmax rescaling of the KV-major kernel (see softmax_step).
inline constexpr float kLazyRescaleSlack = 8.0f;

template <typename Elem, KvKind kKv>
struct KvMajorConfig {
  static constexpr int kWarps = kKvmMaxThreads / 32;
  static constexpr int kTileBytes = kBlockSize * 256;       // K or V of one block
  static constexpr int kQBufBytes = kKvmWarpRows * 256;     // one 32-row query tile
  // Keys per softmax step: 32 rows x 16 keys of scores (16 registers) next to the 32 x 128 output
  // accumulator (128 registers). ptxas hoists the next fragments' ldmatrix loads for latency, and
  // 32- or 64-key steps spill at 255 registers; the extra online-softmax rescales of 16-key steps
  // are FP32 work that hides under the MMAs (64 per step per warp).
  static constexpr int kStepKeys = 16;
  static constexpr int kRawBytes = 2 * kRawTileBytes<kKv, kBlockSize>;
  // Tiles first: ldm_base_* need 256-byte aligned tiles.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kTileBytes;
  static constexpr int kQOffset = kVOffset + kTileBytes;
  // Raw K/V bytes of quantized caches are staged in the query-tile area, which is idle while a
  // block loads: it holds >= 64 KB (8 warps x 1 stage), the raw fp8 block needs 32 KB.
  static constexpr int q_area_bytes(int q_stages) {
    const int q_area = kWarps * q_stages * kQBufBytes;
    return q_area > kRawBytes ? q_area : kRawBytes;
  }
  static constexpr int item_offset(int q_stages) { return kQOffset + q_area_bytes(q_stages); }
  static constexpr int smem_bytes(int q_stages) { return item_offset(q_stages) + 128; }
  static_assert(kKvmWarpRows == 32, "two m16 tiles per warp");
};

// The current item as the warps need it (computed once by thread 0). The last four fields are the
// item's parts of a row's values (kv_major_sm90.cuh's row tables), so that a row adds only its own:
// for the row of list entry (rel, slot) and head g,
//   query element offset  q_item + rel x q_stride_token + g x q_stride_head
//   partial index         slot_item + (rel x topk + slot) x G + g
//   visible keys          clamp(lim_base + rel, 0, lim_cap)
//                         (= clamp(col_limit(causal, q_off, row_begin + rel - q_begin, seqlen_k) - j0,
//                         0, 128): lim_base is q_off - q_begin + row_begin + 1 - j0 clamped to
//                         +-2^30, or 2^30 without causal masking; lim_cap min(128, seqlen_k - j0))
struct KvmItemState {
  int kh;  // -1: no item left
  int b;
  int j0;  // first key of the block
  int start;
  int rows;  // tokens * G
  int seqlen_k;
  int q_begin;
  int lim_base;
  int64_t q_off;
  int lim_cap;
  int pad;
  int64_t q_item;
  int64_t slot_item;
};

static_assert(sizeof(KvmItemState) <= 128, "item record fits its shared-memory slot");

// What lane L knows about row L of its warp's current 32-row query tile.
struct KvmRow {
  int64_t q_elem;  // element offset of the row's query vector, -1 for padding rows
  int64_t slot;    // partial index (slot * G + head), -1 for padding rows
  int lim;         // keys [0, lim) of the block are visible to the row (0 for padding)
};

// Takes the next item from the work counter (one thread) and reads its record (the scan kernel
// wrote what the item start needs: no reads of the sequence tables here).
MSA_DEVICE KvmItemState fetch_kvm_item(const KvMajorArgs& args) {
  const int idx = atomicAdd(&args.control->next_item, 1);
  KvmItemState is{};
  is.kh = -1;
  if (idx < min(args.control->num_items, args.max_items)) {
    const KvMajorItem it = args.items[idx];
    is.kh = it.kh;
    is.b = it.b;
    is.j0 = it.t * kBlockSize;
    is.start = it.start;
    is.rows = it.count * args.group;
    is.seqlen_k = it.seqlen_k;
    is.q_begin = it.q_begin;
    is.q_off = it.q_off;
    const SparseAttnParams& p = args.p;
    constexpr int64_t kBound = int64_t(1) << 30;
    is.lim_base = p.causal ? int(clamp64(it.q_off - it.q_begin + args.row_begin + 1 - is.j0, -kBound, kBound))
                           : int(kBound);
    is.lim_cap = min(kBlockSize, it.seqlen_k - is.j0);
    is.q_item = int64_t(args.row_begin) * p.q_stride_token + int64_t(it.kh) * args.group * p.q_stride_head;
    is.slot_item = int64_t(it.kh) * args.chunk_rows * p.topk * args.group;
  }
  return is;
}

template <typename Elem, KvKind kKv>
__global__ void __launch_bounds__(kKvmMaxThreads, 1)
    kv_major_kernel(const __grid_constant__ KvMajorArgs args) {
  using Cfg = KvMajorConfig<Elem, kKv>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = args.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  KvmItemState* s_state = reinterpret_cast<KvmItemState*>(smem + Cfg::item_offset(args.q_stages));
  uint8_t* sK = smem + Cfg::kKOffset;
  uint8_t* sV = smem + Cfg::kVOffset;
  uint8_t* s_qarea = smem + Cfg::kQOffset;
  const uint32_t sK_addr = smem_addr(sK), sV_addr = smem_addr(sV);
  uint8_t* my_q = s_qarea + warp * args.q_stages * Cfg::kQBufBytes;
  const int G = args.group;
  const float temp = p.lse_temperature;
  const Elem* q = static_cast<const Elem*>(p.q);
  check_smem_base(smem);

  while (true) {
    if (tid == 0) {
      // Thread 0 fetches the next item and the per-item values the warps need for every tile;
      // keeping them in shared memory (not registers) leaves the registers to the accumulators.
      *s_state = fetch_kvm_item(args);
    }
    __syncthreads();
    if (s_state->kh < 0) break;

    {
      const int kh = s_state->kh, b = s_state->b, j0 = s_state->j0;
      const int n_valid = min(kBlockSize, s_state->seqlen_k - j0);
      // The list builder only emits blocks with a valid page, so kv_offset is >= 0 here.
      const int64_t k_off = kv_offset(p.k, p.kv, b, kh, j0);
      const int64_t v_off = kv_offset(p.v, p.kv, b, kh, j0);
      const int64_t srow =
          kKv == KvKind::kNvfp4 ? kv_scale_row(p.kv, p.num_kv_heads, b, kh, j0) : 0;
      const int step = scale_row_step(p);
      if constexpr (kKv == KvKind::kNative) {
        issue_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(p.k, k_off, srow, step, n_valid, sK_addr, tid);
        issue_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(p.v, v_off, srow, step, n_valid, sV_addr, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
      } else {
        constexpr int kRawTile = kRawTileBytes<kKv, kBlockSize>;
        issue_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(p.k, k_off, srow, step, n_valid,
                                                            smem_addr(s_qarea), tid);
        issue_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(p.v, v_off, srow, step, n_valid,
                                                            smem_addr(s_qarea) + kRawTile, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        convert_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(s_qarea, sK, tid);
        convert_kv_rows<Elem, kKv, kBlockSize, kKvmMaxThreads>(s_qarea + kRawTile, sV, tid);
        __syncthreads();
      }
    }

    const int rows = s_state->rows;
    const int n_wt = (rows + kKvmWarpRows - 1) / kKvmWarpRows;
    auto row_info = [&](int wt) {
      const volatile KvmItemState* is = s_state;
      KvmRow info{-1, -1, 0};
      const int i = wt * kKvmWarpRows + lane;
      if (i < is->rows) {
        const int kh = is->kh;
        const int e = i / G;
        const int g = i - e * G;
        const uint32_t v = args.list[is->start + e];
        const int rel = int(v >> 6), slot = int(v & 63u);
        const int r = args.row_begin + rel;
        info.q_elem = int64_t(r) * p.q_stride_token + int64_t(kh * G + g) * p.q_stride_head;
        info.slot = ((int64_t(kh) * args.chunk_rows + rel) * p.topk + slot) * G + g;
        const int lim = col_limit(p.causal, is->q_off, r - is->q_begin, is->seqlen_k) - is->j0;
        info.lim = max(0, min(kBlockSize, lim));
      }
      return info;
    };
    auto issue_q = [&](const KvmRow& info, uint8_t* buf) {
#pragma unroll
      for (int i = 0; i < kKvmWarpRows * 16 / 32; ++i) {
        const int c = lane + 32 * i;
        const int row = c >> 4, ch = c & 15;
        const int64_t qe = __shfl_sync(0xffffffffu, info.q_elem, row);
        const bool ok = qe >= 0;
        cp_async_16_zfill(smem_addr(buf) + swizzle_128x16b_bytes(row, ch), ok ? q + qe + ch * 8 : q,
                          ok);
      }
      cp_async_commit();
    };

    if (warp < n_wt) {
      KvmRow cur = row_info(warp);
      if (args.q_stages == 2) issue_q(cur, my_q);
      for (int k = 0, wt = warp; wt < n_wt; ++k, wt += Cfg::kWarps) {
        uint8_t* buf = my_q + (args.q_stages == 2 ? (k & 1) : 0) * Cfg::kQBufBytes;
        KvmRow nxt{-1, -1, 0};
        const int wt_next = wt + Cfg::kWarps;
        if (args.q_stages == 1) {
          issue_q(cur, buf);
          cp_async_wait<0>();
        } else if (wt_next < n_wt) {
          nxt = row_info(wt_next);
          issue_q(nxt, my_q + ((k + 1) & 1) * Cfg::kQBufBytes);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncwarp();

        int lim[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) lim[mt][h] = __shfl_sync(0xffffffffu, cur.lim, mt * 16 + h * 8 + gid);
        const int lim_max = __reduce_max_sync(0xffffffffu, cur.lim);
        // Steps below every row's limit (all but the diagonal block's, and a tile's padding rows)
        // need no mask.
        const int lim_min = __reduce_min_sync(0xffffffffu, cur.lim);

        float o[2][16][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int d = 0; d < 16; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][d][e] = 0.0f;
        SoftmaxState<2> st;
        st.init();
        // Lazy rescaling (softmax_step): a row's reference max moves only when a step's max exceeds
        // it by more than the slack (P <= 2^8), which skips most of the o rescales of the 8 steps.
        // Temperature terms are 2^(T (x - m)) <= 2^(T slack), so the slack shrinks to 8 / T for
        // T > 1 (and 0, the eager rule, for a T <= 0 the validator would have refused).
        const float rescale_slack =
            !args.has_temp ? kLazyRescaleSlack
                           : (temp > 1.0f ? kLazyRescaleSlack / temp : (temp > 0.0f ? kLazyRescaleSlack : 0.0f));
        const uint32_t q_base = ldm_base_a(smem_addr(buf), 0, lane);
#pragma unroll 1
        for (int key0 = 0; key0 < lim_max; key0 += Cfg::kStepKeys) {  // no row sees keys >= lim_max
          float s[2][Cfg::kStepKeys / 8][4];
          gemm_qk<Elem, 2, Cfg::kStepKeys / 8>(s, q_base, ldm_base_k(sK_addr, key0, lane));
          int lim_rel[2][2];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) lim_rel[mt][h] = lim[mt][h] - key0;
          if (key0 + Cfg::kStepKeys <= lim_min) {
            softmax_step<2, Cfg::kStepKeys / 8, false>(s, o, st, lim_rel, args.scale_log2, args.has_temp,
                                                       temp, lane, rescale_slack);
          } else {
            softmax_step<2, Cfg::kStepKeys / 8, true>(s, o, st, lim_rel, args.scale_log2, args.has_temp,
                                                      temp, lane, rescale_slack);
          }
          gemm_pv<Elem, 2, Cfg::kStepKeys / 8>(o, s, ldm_base_v(sV_addr, key0, lane));
        }
        st.quad_reduce();

        // The query tile's buffer stages the output rows. gemm_qk re-reads Q with ldmatrix at every
        // step, and the shuffles since the last one order no memory: without this barrier a lane's
        // staging store may overtake another lane's last ldmatrix of rows 0-15 (a WAR hazard that
        // racecheck reports). Rows 16-31 (mt = 1) are ordered by store_rows' own final __syncwarp.
        __syncwarp();
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float mul[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) mul[h] = st.l[mt][h] > 0.0f ? 1.0f / st.l[mt][h] : 0.0f;
          const int64_t slot_row = __shfl_sync(0xffffffffu, cur.slot, mt * 16 + (lane & 15));
          const int64_t row_off = lane < 16 && slot_row >= 0 ? slot_row * 128 : -1;
          store_rows<kElemStoreKind<Elem>, true>(o[mt], mul, buf + mt * 16 * 256, args.part_o, row_off, lane);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t slot_h = __shfl_sync(0xffffffffu, cur.slot, mt * 16 + h * 8 + gid);
            if (tig == 0 && slot_h >= 0) {
              args.part_lse[slot_h] = row_lse2(st.m[mt][h], st.l[mt][h]);
              if (args.part_lse_t != nullptr)
                args.part_lse_t[slot_h] = row_lse2_t(st.m[mt][h], st.lt[mt][h], temp);
            }
          }
        }
        cur = args.q_stages == 2 ? nxt : row_info(wt_next);
      }
    }
    __syncthreads();  // the block and the item record are reused by the next item
  }
}

template <typename Elem, KvKind kKv>
int kv_major_smem_bytes(int q_stages) {
  return KvMajorConfig<Elem, kKv>::smem_bytes(q_stages);
}

template <typename Elem, KvKind kKv>
int kv_major_ctas_per_sm(int q_stages) {
  const int smem = kv_major_smem_bytes<Elem, kKv>(q_stages);
  if (smem > flashmsa::cuda::current_device_limits().max_smem_per_block_optin) return 0;
  return flashmsa::cuda::prepare_launch(kv_major_kernel<Elem, kKv>, kKvmMaxThreads, size_t(smem));
}

template <typename Elem, KvKind kKv>
void launch_kv_major(const KvMajorArgs& args, int grid, cudaStream_t stream) {
  auto* kernel = kv_major_kernel<Elem, kKv>;
  const int smem = kv_major_smem_bytes<Elem, kKv>(args.q_stages);
  flashmsa::cuda::prepare_launch(kernel, kKvmMaxThreads, size_t(smem));  // cached smem opt-in
  kernel<<<grid, kKvmMaxThreads, smem, stream>>>(args);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

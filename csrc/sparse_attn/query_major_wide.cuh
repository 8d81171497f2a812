// Query-major decode with 8 warps per CTA (decode plan option split_warps=8): the batch-1 to
// batch-8 calls that split (auto), and where forced fused calls (the merge writes the outputs),
// bf16 / fp16 K/V (kKv = kNative) or fp8 e4m3 K/V (kKv = kFp8), G <= 16 (one m16 tile of query
// heads).
//
// The 4-warp kernel (query_major.cuh) cuts each 128-key block into two 64-key tiles and gives each
// warp 16 keys of each: a warp's chain per block is two rounds of Q K^T, softmax and P V, and then
// warp 0 alone merges the other three warps' states (64 accumulators each) before it stores the
// partial. Here a CTA of 8 warps takes a whole block as one 128-key tile, warp w its keys
// 16 w .. 16 w + 15: one round per block, twice the warps in flight per SM scheduler. K and V are
// separate cp.async groups of one 64 KB stage: Q K^T and the softmax run while V still lands, and
// the next block's K is issued as soon as every warp is past its Q K^T (its V once every warp is past
// P V). The 8 states are merged by all 8 warps at once, warp w the head dims 16 w .. 16 w + 15 of
// the 16 rows, each adding the 8 warps' values in warp order (deterministic), and every warp stores
// its dims of the partial (or of the output) straight from registers. Partial layout, LSEs and the
// combine are the 4-warp kernel's. Not bit-identical to it (each warp sums other keys, and the merge
// is one of 8 states, not of 4): within the tests' tolerance against the CPU reference.
// fp8 K/V: the raw e4m3 blocks (16 KB each, kv_regs.cuh's chunk-swizzled layout) stay in shared
// memory and each warp converts its 16 keys straight into fp16 MMA fragments, as the 4-warp
// register kernel (kernel=regs, kv_regs.cuh) does for its 32: Q as fp16 fragments stashed over the
// Q tile, bf16 rows scaled by a power of two (row_mul undoes it on the logits), the lazy rescale,
// P rounded to fp16, and head dims permuted in the accumulators (undone by the store).
// split=cluster (kCluster, sm_90): the splits of a row run as one thread-block cluster, each CTA on
// an SM of its own (launched with kQmWideClusterSmemBytes of shared memory); each writes its merged
// partial, exactly as it would store it to the workspace, into its shared memory, and after a
// cluster barrier the CTAs merge the rows with cluster_merge (query_major.cuh: the combine's own
// code and slot order), so the outputs equal split=blocks on 8 warps with the same split count, bit
// for bit, without the workspace partials and the combine kernel.
// docs/design/sparse_attention.md, "Decode split over 8 warps (split_warps=8)" and "#b1-cluster8".
#pragma once

#include <cuda_runtime_api.h>

#include <climits>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kv_regs.cuh"
#include "sparse_attn/launch.h"
#include "sparse_attn/query_major.cuh"

namespace flashmsa::sparse_attn {

struct QueryMajorWideConfig {
  static constexpr int kThreads = kQmWideThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTileKeys = kBlockSize;         // one tile per block
  static constexpr int kWarpKeys = kTileKeys / kWarps;  // 16: one k16 step of P V
  static constexpr int kNT = kWarpKeys / 8;
  static constexpr int kTileBytes = kTileKeys * 256;    // K or V of a block, 128 dims x 2 bytes
  static constexpr int kRawTileBytes = kTileKeys * 128;  // fp8: the raw e4m3 K or V of a block
  // Merge: each warp's 64 accumulators per lane, [warp][64][32 lanes] (over the stage).
  static constexpr int kMergeBytes = kWarps * 64 * 32 * 4;
  static constexpr int kUnionBytes = 2 * kTileBytes > kMergeBytes ? 2 * kTileBytes : kMergeBytes;
  static constexpr int kQOffset = 0;
  static constexpr int kTilesOffset = kQOffset + 16 * 256;
  static constexpr int kListOffset = kTilesOffset + kMaxTopk * int(sizeof(TileDesc));
  static constexpr int kMiscOffset = kListOffset + kMaxTopk * 4;
  // Per warp and row (16): m, l, lt of its state after the loop, [3][kWarps][16] floats.
  static constexpr int kStatsOffset = kMiscOffset + 128;
  static constexpr int kUnionOffset = (kStatsOffset + 3 * kWarps * 16 * 4 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kUnionOffset + kUnionBytes;
  static_assert(kWarpKeys == 16, "16 keys per warp: one k16 step of P V");
  static_assert(kUnionOffset % 256 == 0, "256-byte aligned tiles (ldm_base_* swizzle)");
  static_assert(kSmemBytes <= 99 * 1024, "fits the smallest SM80+ shared memory (sm_86 / sm_89)");
};

// split=cluster: the CTA's partial rows ([16][128] values of the partial kind, normalised by l)
// and their log2 LSEs after the kernel's own buffers, as cluster_merge reads them.
struct QueryMajorWideClusterLayout {
  static constexpr int kRows = 16;
  static constexpr int kWarps = QueryMajorWideConfig::kWarps;
  static constexpr int kPartOffset = (QueryMajorWideConfig::kSmemBytes + 15) / 16 * 16;
  static constexpr int kLseOffset = kPartOffset + kRows * 128 * 4;
  static constexpr int kLseTOffset = kLseOffset + kRows * 4;
  static constexpr int kEnd = kLseTOffset + kRows * 4;
  static constexpr int kSmemBytes = kEnd > kQmWideClusterSmemBytes ? kEnd : kQmWideClusterSmemBytes;
  static_assert(2 * (kQmWideClusterSmemBytes + 1024) > 228 * 1024, "one CTA per sm_90 SM");
  static_assert(kSmemBytes <= 227 * 1024, "fits an sm_90 CTA");
};

// The cluster kernel runs one CTA per SM, so its registers are not capped at 128.
template <typename Elem, KvKind kKv, bool kCluster>
__global__ void __launch_bounds__(kQmWideThreads, kCluster ? kQmWideClusterCtasPerSm : kQmWideCtasPerSm)
    query_major_wide_kernel(const __grid_constant__ QueryMajorArgs args) {
  static_assert(kKv == KvKind::kNative || kKv == KvKind::kFp8, "16-bit or fp8 K/V");
  if constexpr (kCluster) {  // no clusters below sm_90: never planned there (prepare_cluster_launch)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
    __trap();
    return;
#endif
  }
  constexpr bool kFp8 = kKv == KvKind::kFp8;
  using Cfg = QueryMajorWideConfig;
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = args.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  uint8_t* sQ = smem + Cfg::kQOffset;
  TileDesc* s_tiles = reinterpret_cast<TileDesc*>(smem + Cfg::kTilesOffset);
  int* s_misc = reinterpret_cast<int*>(smem + Cfg::kMiscOffset);
  float* s_stats = reinterpret_cast<float*>(smem + Cfg::kStatsOffset);
  uint8_t* s_union = smem + Cfg::kUnionOffset;
  // K and V of the stage: compute tiles (16-bit), or raw e4m3 tiles (fp8) at rK / rV.
  const uint32_t sK = smem_addr(s_union), sV = sK + uint32_t(kFp8 ? Cfg::kRawTileBytes : Cfg::kTileBytes);
  [[maybe_unused]] const uint8_t* const rK = s_union;
  [[maybe_unused]] const uint8_t* const rV = s_union + Cfg::kRawTileBytes;
  check_smem_base(smem);
  const float temp = p.lse_temperature;
  const int key0 = warp * Cfg::kWarpKeys;

  for (int64_t item = blockIdx.x; item < args.num_items; item += gridDim.x) {
    // The 4-warp kernel's item order (splits fastest); row_tiles is 1 (G <= 16).
    const int split = int(item % args.splits);
    int64_t rest = item / args.splits;
    const int rt = int(rest % args.row_tiles);
    rest /= args.row_tiles;
    const int kh = int(rest % p.num_kv_heads);
    const int r = int(rest / p.num_kv_heads);

    __syncthreads();  // the previous item is done with every shared buffer
    // Warp 0 plans the item while warps 4-7 load its query rows.
    if (warp == 0) {
      const int n = plan_query_major_item<1, Cfg::kTileKeys>(args, r, kh, split, s_tiles, lane);
      if (lane == 0) s_misc[0] = n;
    } else if (tid >= kQmThreads) {
      load_query_rows<Elem, 16>(args, r, kh, rt, sQ, tid - kQmThreads);
    }
    cp_async_commit();
    __syncthreads();
    const int n_tiles = s_misc[0];

    // K and V of tile t as two commit groups (V's may land while Q K^T runs).
    auto issue = [&](const KVTensor& t, int64_t off, int n_valid, uint32_t dst) {
      if constexpr (kFp8) {
        issue_fp8_rows_swizzled<Cfg::kTileKeys, Cfg::kThreads>(t, off, n_valid, dst, tid);
      } else {
        issue_kv_rows<Elem, KvKind::kNative, Cfg::kTileKeys, Cfg::kThreads>(t, off, 0, 0, n_valid, dst, tid);
      }
      cp_async_commit();
    };
    if (n_tiles > 0) {  // uniform
      issue(p.k, s_tiles[0].k_off, s_tiles[0].n_valid, sK);
      issue(p.v, s_tiles[0].v_off, s_tiles[0].n_valid, sV);
    }
    // fp8: per fragment row, the factor from the fp16 logits to base-2 softmax units.
    [[maybe_unused]] float row_mul[2] = {0.0f, 0.0f};
    if constexpr (kFp8) {
      if (n_tiles > 0) {  // uniform
        // Q landed once only K's and V's groups may be pending. Every warp reads the 16 rows and
        // keeps its row factors; then warp 0 (every warp has the same fragments) overwrites the
        // Q tile with the fp16 fragments qk_fp8_regs reads; the loop's first barrier orders them.
        cp_async_wait<2>();
        __syncthreads();
        uint32_t qa[8][4];
        load_q_frags_f16<Elem>(sQ, 0, lane, args.scale_log2, qa, row_mul);
        __syncthreads();
        if (warp == 0) stash_q_frags(qa, sQ, lane);
      }
    }

    float o[1][16][4] = {};
    SoftmaxState<1> st;
    st.init();

    for (int i = 0; i < n_tiles; ++i) {
      const int n_valid = s_tiles[i].n_valid;
      const bool more = i + 1 < n_tiles;
      cp_async_wait<1>();
      __syncthreads();  // K of tile i landed (and Q); V may be in flight
      const int lim_rel = n_valid - key0;
      int lim[1][2] = {{lim_rel, lim_rel}};
      float s[1][Cfg::kNT][4];
      if (lim_rel > 0) {  // warp-uniform: skip a slice past the tile's last visible key
        if constexpr (kFp8) {
          qk_fp8_regs<Cfg::kNT>(s[0], sQ, rK, key0, lane);
          regs_softmax_step(s, o, st, lim, row_mul, args.has_temp, temp, lane);
        } else {
          gemm_qk<Elem, 1, Cfg::kNT>(s, ldm_base_a(smem_addr(sQ), 0, lane), ldm_base_k(sK, key0, lane));
          softmax_step<1, Cfg::kNT>(s, o, st, lim, args.scale_log2, args.has_temp, temp, lane);
        }
      }
      cp_async_wait<0>();
      __syncthreads();  // V of tile i landed; every warp is past its Q K^T of tile i
      if (more) issue(p.k, s_tiles[i + 1].k_off, s_tiles[i + 1].n_valid, sK);
      if (lim_rel > 0) {
        if constexpr (kFp8) {
          pv_fp8_regs<Cfg::kNT>(o[0], s[0], rV, key0, lane);
        } else {
          gemm_pv<Elem, 1, Cfg::kNT>(o, s, ldm_base_v(sV, key0, lane));
        }
      }
      if (more) {
        __syncthreads();  // every warp is past its P V of tile i
        issue(p.v, s_tiles[i + 1].v_off, s_tiles[i + 1].n_valid, sV);
      }
    }
    st.quad_reduce();
    cp_async_wait<0>();  // Q's copies too, when the item has no tile
    __syncthreads();  // every warp is done with the stage: it holds the merge from here on

    // Each warp's state: its accumulators in fragment order, its rows' m, l, lt.
    float* s_acc = reinterpret_cast<float*>(s_union);
#pragma unroll
    for (int d = 0; d < 16; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[(warp * 64 + d * 4 + e) * 32 + lane] = o[0][d][e];
    if (tig == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = gid + 8 * h;
        s_stats[(0 * Cfg::kWarps + warp) * 16 + row] = st.m[0][h];
        s_stats[(1 * Cfg::kWarps + warp) * 16 + row] = st.l[0][h];
        s_stats[(2 * Cfg::kWarps + warp) * 16 + row] = st.lt[0][h];
      }
    }
    __syncthreads();

    // Warp w: n8 tiles 2 w, 2 w + 1 of rows gid, gid + 8, merged over the 8 warps in warp order
    // (16-bit: head dims 16 w .. + 15; fp8: the permuted dims 32 tig + 16 e + 2 w + j, kv_regs.cuh).
    float v[2][2][2];  // [h][j][pair]
    float m_row[2], l_row[2], lt_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = gid + 8 * h;
      float m_all = neg_inf();
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) m_all = fmaxf(m_all, s_stats[w * 16 + row]);
      const float m_use = m_all == neg_inf() ? 0.0f : m_all;
      float l = 0.0f, lt = 0.0f;
#pragma unroll
      for (int j = 0; j < 2; ++j) v[h][j][0] = v[h][j][1] = 0.0f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) {
        const float m_w = s_stats[w * 16 + row];
        const float f = merge_factor(m_w, m_use);
        l += s_stats[(Cfg::kWarps + w) * 16 + row] * f;
        if (args.has_temp) lt += s_stats[(2 * Cfg::kWarps + w) * 16 + row] * merge_factor_t(m_w, m_use, temp);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            v[h][j][c] += s_acc[(w * 64 + (2 * warp + j) * 4 + 2 * h + c) * 32 + lane] * f;
      }
      m_row[h] = m_all;
      l_row[h] = l;
      lt_row[h] = lt;
    }

    // Rows gid, gid + 8 are heads rt * 16 + row of kv head kh (rows past G are not stored).
    // kPartial: a split's partial (saturated, attention_core.cuh sat_partial).
    auto store = [&]<StoreKind kKind, bool kPartial = true>(void* base, int64_t (&row_elem)[2], const float (&mul)[2]) {
      constexpr int kE = store_kind_bytes(kKind);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (row_elem[h] < 0) continue;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if constexpr (kFp8) {  // pair: n8 tiles 2 w, 2 w + 1 (dims 2 w, 2 w + 1 past 32 tig + 16 j)
            const int64_t e = row_elem[h] + 32 * tig + 16 * j + 2 * warp;
            store_pair<kKind, kPartial>(static_cast<uint8_t*>(base) + e * kE, v[h][0][j] * mul[h], v[h][1][j] * mul[h]);
          } else {
            const int64_t e = row_elem[h] + (2 * warp + j) * 8 + 2 * tig;
            store_pair<kKind, kPartial>(static_cast<uint8_t*>(base) + e * kE, v[h][j][0] * mul[h], v[h][j][1] * mul[h]);
          }
        }
      }
    };
    int64_t row_elem[2];
    float mul[2];
    if (args.write_final) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int hh = rt * 16 + gid + 8 * h;
        const int64_t idx = int64_t(r) * p.num_heads + kh * args.group + hh;
        row_elem[h] = hh < args.group ? idx * 128 : -1;
        mul[h] = l_row[h] > 0.0f ? p.v_global_scale / l_row[h] : 0.0f;
        if (warp == 0 && tig == 0 && hh < args.group) {
          if (p.lse != nullptr) p.lse[idx] = row_lse2(m_row[h], l_row[h]) * kLn2;
          if (p.lse_temperature_out != nullptr)
            p.lse_temperature_out[idx] = row_lse2_t(m_row[h], lt_row[h], temp) * kLn2;
        }
      }
      store.template operator()<kElemStoreKind<Elem>, false>(p.out, row_elem, mul);
    } else if constexpr (kCluster) {
      // The partial, as the workspace would hold it, at tile row gid + 8 h of this CTA's shared
      // memory; then the cluster's CTAs merge the rows.
      using Cl = QueryMajorWideClusterLayout;
      float* const s_lse = reinterpret_cast<float*>(smem + Cl::kLseOffset);
      float* const s_lse_t = reinterpret_cast<float*>(smem + Cl::kLseTOffset);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = gid + 8 * h;
        const int hh = rt * 16 + row;
        row_elem[h] = hh < args.group ? int64_t(row) * 128 : -1;
        mul[h] = l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f;
        if (warp == 0 && tig == 0 && hh < args.group) {
          s_lse[row] = row_lse2(m_row[h], l_row[h]);
          if (args.has_temp) s_lse_t[row] = row_lse2_t(m_row[h], lt_row[h], temp);
        }
      }
      void* const part = smem + Cl::kPartOffset;
      switch (args.part_kind) {
        case StoreKind::kF32: store.template operator()<StoreKind::kF32>(part, row_elem, mul); break;
        case StoreKind::kBF16: store.template operator()<StoreKind::kBF16>(part, row_elem, mul); break;
        case StoreKind::kF16: store.template operator()<StoreKind::kF16>(part, row_elem, mul); break;
        default: store.template operator()<StoreKind::kFP8>(part, row_elem, mul); break;
      }
      cluster_merge<Elem, Cl>(args, smem, r, kh, rt, split, warp, lane);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int hh = rt * 16 + gid + 8 * h;
        // Slot (kh, row, split, head) of the combine's layout.
        const int64_t slot = ((int64_t(kh) * p.total_q + r) * args.splits + split) * args.group + hh;
        row_elem[h] = hh < args.group ? slot * 128 : -1;
        mul[h] = l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f;
        if (warp == 0 && tig == 0 && hh < args.group) {
          args.part_lse[slot] = row_lse2(m_row[h], l_row[h]);
          if (args.part_lse_t != nullptr) args.part_lse_t[slot] = row_lse2_t(m_row[h], lt_row[h], temp);
        }
      }
      switch (args.part_kind) {
        case StoreKind::kF32: store.template operator()<StoreKind::kF32>(args.part_o, row_elem, mul); break;
        case StoreKind::kBF16: store.template operator()<StoreKind::kBF16>(args.part_o, row_elem, mul); break;
        case StoreKind::kF16: store.template operator()<StoreKind::kF16>(args.part_o, row_elem, mul); break;
        default: store.template operator()<StoreKind::kFP8>(args.part_o, row_elem, mul); break;
      }
    }
  }
}

template <typename Elem, KvKind kKv, bool kCluster>
void launch_query_major_wide(const QueryMajorArgs& args, cudaStream_t stream) {
  using Cfg = QueryMajorWideConfig;
  auto* kernel = query_major_wide_kernel<Elem, kKv, kCluster>;
  MSA_CHECK(args.row_tiles >= 1 && args.group <= 16 * args.row_tiles && args.mtp_tokens == 0,
            "msa_sparse_decode_attention: split_warps=8 planned for MTP union items or 64-row tiles (planner bug)");
  if constexpr (kCluster) {
    // One cluster per (row, kv head, row tile): its splits are consecutive items, one CTA each
    // (no grid-stride loop: every CTA of a cluster must reach its barriers).
    constexpr int kSmem = QueryMajorWideClusterLayout::kSmemBytes;
    const int max_size = flashmsa::cuda::prepare_cluster_launch(kernel, Cfg::kThreads, kSmem);
    MSA_CHECK(!args.write_final && args.row_tiles == 1 && args.splits >= 1 && args.splits <= max_size &&
                  args.num_items % args.splits == 0 && args.num_items <= int64_t(INT_MAX),
              "msa_sparse_decode_attention: split=cluster on 8 warps with ", args.splits, " splits of ",
              args.num_items, " items, clusters of at most ", max_size, " CTAs here (planner bug)");
    launch_cluster(kernel, args, unsigned(args.num_items), Cfg::kThreads, kSmem, unsigned(args.splits), stream);
  } else {
    flashmsa::cuda::prepare_launch(kernel, Cfg::kThreads, Cfg::kSmemBytes);  // cached smem opt-in
    // Items beyond the largest grid are picked up by the grid-stride loop.
    const int64_t grid = args.num_items < int64_t(INT_MAX) ? args.num_items : int64_t(INT_MAX);
    kernel<<<unsigned(grid), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
    MSA_CUDA_CHECK(cudaGetLastError());
  }
}

// split=cluster on 8 warps: the largest cluster (in CTAs, 0 where clusters cannot run) the cluster
// kernel of this compute dtype and K/V kind gets on the current device, at one CTA per SM.
template <typename Elem, KvKind kKv>
int query_major_wide_cluster_max() {
  return flashmsa::cuda::prepare_cluster_launch(query_major_wide_kernel<Elem, kKv, true>, kQmWideThreads,
                                                QueryMajorWideClusterLayout::kSmemBytes);
}

}  // namespace flashmsa::sparse_attn

// Planning of the shared-selection tiles (kernel_traits.h UnionArgs): one warp per (kv head, tile
// of 128 / G tokens). It classifies the tile's q2k entries exactly as the KV-major list builder
// does (a used, visible, valid-page entry is a pair), sets one bit per pair in a per-token bitmap
// over the tile's block range, and reads the union off the OR of the bitmaps in ascending block
// order, each block with the mask of the tokens that selected it. The tile qualifies when all its
// tokens are in one sequence, its union has at most kUnionMaxBlocks blocks and the (token, block)
// products the tile kernel computes are <= 1.5 x pairs (kernel_traits.h; the plan option
// tile_max_waste replaces the 1.5). Qualifying tiles get done = 1 and a place in the work list (taken with an atomic: the order of
// the list does not matter, a tile's result depends only on its own plan); the others get done = 0
// and are left to the KV-major path, as are tiles whose pairs span more than 32 x kPlanMaxRangeWords
// blocks (8192: all of a 1M-token context).
// tile_bound=adaptive (wide_waste_milli > 0): the plan kernel writes the plans of the tiles within
// either bound, marks them done = 1 (within the bound) or 2 (within the wide one only) and counts
// the pairs of all tiles and of those within the wide bound (control[2..3] as 64-bit counters;
// tiles across a sequence boundary are not counted); a second kernel then takes the wide bound
// when those hold at least kUnionWideShareMilli / 1000 of the pairs, sets every done to 0 / 1 and
// fills the work list. The list builder and the combine run after it and read only 0 / 1.
#include <cuda_runtime_api.h>

#include <climits>

#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr int kPlanWarpsPerCta = 4;
constexpr int kPlanMaxRangeWords = 256;

__global__ void __launch_bounds__(kPlanWarpsPerCta * 32) union_plan_kernel(const __grid_constant__ UnionArgs a) {
  // Per warp and token of the tile: bit j of the bitmap = block lo + j selected (a pair).
  __shared__ uint32_t s_bits[kPlanWarpsPerCta][kUnionMaxTokens][kPlanMaxRangeWords];
  const SparseAttnParams& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kPlanWarpsPerCta + warp;
  const bool wide = a.wide_waste_milli > 0;
  unsigned long long* const pair_counts = reinterpret_cast<unsigned long long*>(a.control + 2);
  if (w >= int64_t(p.num_kv_heads) * a.num_tiles) return;  // warp-uniform
  const int kh = int(w / a.num_tiles), tile = int(w % a.num_tiles);
  const int t = a.tile_tokens, topk = p.topk;
  const int r0 = tile * t;
  uint32_t (*bits)[kPlanMaxRangeWords] = s_bits[warp];

  // One sequence must hold all the tile's rows (a partial last tile or a tile across a sequence
  // boundary does not qualify).
  const int b = r0 + t <= p.total_q ? find_sequence(p, r0) : -1;
  bool ok = b >= 0;
  int seqlen_k = 0, nb = 0;
  RowRange rr{0, 0};
  if (ok) {
    rr = q_rows(p.qi, p.total_q, b);
    ok = r0 + t <= rr.begin + rr.len;
    seqlen_k = kv_seqlen(p.kv, b);
    nb = num_blocks(seqlen_k);
  }
  if (!ok) {
    if (lane == 0) a.done[w] = 0;
    return;
  }
  const int64_t q_off = q_offset_of(p.q_offset, b, rr.len, seqlen_k);

  // Classify: blk[e][k] = block of the lane's entry k of token e when it is a pair, else -1.
  int blk[kUnionMaxTokens][2];
  int lo = INT_MAX, hi = -1, my_pairs = 0;
#pragma unroll
  for (int e = 0; e < kUnionMaxTokens; ++e) {
    blk[e][0] = blk[e][1] = -1;
    if (e >= t) continue;  // warp-uniform
    const int r = r0 + e;
    const WarpQ2k wl = warp_q2k_list(q2k_row(p, kh, r), topk, nb, lane);
    const int lim = col_limit(p.causal, q_off, r - rr.begin, seqlen_k);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int v = wl.v[k];
      const bool pair = lane + 32 * k < topk && wl.used[k] && int64_t(v) * kBlockSize < lim &&
                        (!p.kv.paged || kv_page(p.kv, b, v) >= 0);
      if (pair) {
        blk[e][k] = v;
        lo = min(lo, v);
        hi = max(hi, v);
        ++my_pairs;
      }
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  const int pairs = __reduce_add_sync(0xffffffffu, my_pairs);
  const int words = hi >= lo ? (hi - lo) / 32 + 1 : 0;
  if (words > kPlanMaxRangeWords) {
    if (lane == 0) {
      a.done[w] = 0;
      if (wide) atomicAdd(&pair_counts[0], static_cast<unsigned long long>(pairs));
    }
    return;
  }

  for (int e = 0; e < t; ++e)
    for (int i = lane; i < words; i += 32) bits[e][i] = 0u;
  __syncwarp();
#pragma unroll
  for (int e = 0; e < kUnionMaxTokens; ++e)
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (blk[e][k] >= 0) atomicOr(&bits[e][(blk[e][k] - lo) >> 5], 1u << ((blk[e][k] - lo) & 31));
  __syncwarp();

  // Union size, then (if the tile qualifies) its blocks in ascending order with their token masks.
  auto union_word = [&](int i) {
    uint32_t x = 0;
    for (int e = 0; e < t; ++e) x |= bits[e][i];
    return x;
  };
  // Work the tile kernel does: each consumer warpgroup (64 rows, t / 2 tokens) computes only the
  // union blocks its own tokens selected (union_sm90.cuh), i.e. (u0 + u1) x t / 2 (token, block)
  // products with u0 / u1 the unions of the two halves; t = 1 (G = 128): both warpgroups hold the
  // one token, u x 1.
  const int half = t / 2;
  int u = 0, u_halves = 0;
  for (int i0 = 0; i0 < words; i0 += 32) {
    const int i = i0 + lane;
    uint32_t h0 = 0u, h1 = 0u;
    if (i < words)
      for (int e = 0; e < t; ++e) (e < half ? h0 : h1) |= bits[e][i];
    u += __reduce_add_sync(0xffffffffu, __popc(h0 | h1));
    u_halves += __reduce_add_sync(0xffffffffu, __popc(h0) + __popc(h1));
  }
  const int64_t computed = t == 1 ? int64_t(u) : int64_t(u_halves) * half;
  const bool qualifies =
      computed * 1000 <= int64_t(a.max_waste_milli) * pairs && u <= kUnionMaxBlocks;
  const bool within_wide =
      wide && computed * 1000 <= int64_t(a.wide_waste_milli) * pairs && u <= kUnionMaxBlocks;
  if (qualifies || within_wide) {
    int* out_block = a.plan_block + w * a.max_entries;
    uint8_t* out_mask = a.plan_mask + w * a.max_entries;
    int base = 0;
    for (int i0 = 0; i0 < words; i0 += 32) {
      const int i = i0 + lane;
      uint32_t x = i < words ? union_word(i) : 0u;
      const int cnt = __popc(x);
      int incl = cnt;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int up = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += up;
      }
      int rank = base + incl - cnt;
      while (x != 0u) {
        const int bit = __ffs(x) - 1;
        x &= x - 1u;
        uint32_t mask = 0;
        for (int e = 0; e < t; ++e) mask |= ((bits[e][i] >> bit) & 1u) << e;
        out_block[rank] = lo + 32 * i + bit;
        out_mask[rank] = uint8_t(mask);
        ++rank;
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  if (lane == 0) {
    if (wide) {  // the second kernel decides and fills the work list
      a.done[w] = qualifies ? 1 : within_wide ? 2 : 0;
      if (qualifies || within_wide) a.plan_count[w] = u;
      atomicAdd(&pair_counts[0], static_cast<unsigned long long>(pairs));
      if (qualifies || within_wide) atomicAdd(&pair_counts[1], static_cast<unsigned long long>(pairs));
    } else {
      a.done[w] = qualifies ? 1 : 0;
      if (qualifies) {
        a.plan_count[w] = u;
        a.work[atomicAdd(&a.control[0], 1)] = int(w);
      }
    }
  }
}

// tile_bound=adaptive's decision (after union_plan_kernel, one thread per tile): the wide bound when
// the tiles within it hold at least kUnionWideShareMilli / 1000 of the counted pairs; done 0 / 1
// and the work list as union_plan_kernel writes them without it.
constexpr int kAdaptiveThreads = 256;

__global__ void __launch_bounds__(kAdaptiveThreads) union_adaptive_kernel(const __grid_constant__ UnionArgs a) {
  const int64_t w = int64_t(blockIdx.x) * kAdaptiveThreads + threadIdx.x;
  if (w >= int64_t(a.p.num_kv_heads) * a.num_tiles) return;
  const unsigned long long* pair_counts = reinterpret_cast<const unsigned long long*>(a.control + 2);
  const bool take_wide = pair_counts[1] * 1000ull >= static_cast<unsigned long long>(kUnionWideShareMilli) * pair_counts[0];
  const uint8_t c = a.done[w];
  const bool q = c == 1 || (c == 2 && take_wide);
  a.done[w] = q ? 1 : 0;
  if (q) a.work[atomicAdd(&a.control[0], 1)] = int(w);
}

}  // namespace

void launch_union_plan(const UnionArgs& a, cudaStream_t stream) {
  MSA_CHECK(a.tile_tokens <= kUnionMaxTokens && a.p.topk <= 64, "union plan: tile of ", a.tile_tokens,
            " tokens x topk ", a.p.topk, " is out of range");
  // control: two counters, then (tile_bound=adaptive) two 64-bit pair counts (kUnionControlBytes),
  // cleared by the caller's earlier kernel (launch_kv_major_prepare).
  MSA_CHECK(reinterpret_cast<uintptr_t>(a.control) % 8 == 0, "union plan: misaligned control words");
  const int64_t warps = int64_t(a.p.num_kv_heads) * a.num_tiles;
  const int64_t grid = (warps + kPlanWarpsPerCta - 1) / kPlanWarpsPerCta;
  MSA_CHECK(grid <= INT_MAX, "msa_sparse_attention: too many query tiles");
  union_plan_kernel<<<unsigned(grid), kPlanWarpsPerCta * 32, 0, stream>>>(a);
  MSA_CUDA_CHECK(cudaGetLastError());
  if (a.wide_waste_milli > 0) {
    union_adaptive_kernel<<<unsigned((warps + kAdaptiveThreads - 1) / kAdaptiveThreads), kAdaptiveThreads, 0, stream>>>(a);
    MSA_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace flashmsa::sparse_attn

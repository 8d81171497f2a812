// Planning of the shared-selection tiles (kernel_traits.h UnionArgs): one warp per (kv head, tile
// of 128 / G tokens). It classifies the tile's q2k entries exactly as the KV-major list builder
// does (a used, visible, valid-page entry is a pair), keeps the first occurrence of each block in
// q2k order (token by token, slot by slot) as the tile's union with the mask of the tokens that
// selected it, and decides whether the tile qualifies: all its tokens in one sequence and
// union size x tokens <= 1.5 x pairs (kernel_traits.h). Qualifying tiles get done = 1 and a place in the
// work list (taken with an atomic: the order of the list does not matter, a tile's result depends
// only on its own plan); the others get done = 0 and are left to the KV-major path.
#include <cuda_runtime_api.h>

#include <climits>

#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr int kPlanWarpsPerCta = 8;
// Entries a warp classifies: tile_tokens * topk <= 8 * 64 (G >= 16).
constexpr int kPlanMaxEntries = kUnionMaxTokens * 64;

__global__ void __launch_bounds__(kPlanWarpsPerCta * 32) union_plan_kernel(const __grid_constant__ UnionArgs a) {
  __shared__ int s_ent[kPlanWarpsPerCta][kPlanMaxEntries];
  const SparseAttnParams& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kPlanWarpsPerCta + warp;
  if (w >= int64_t(p.num_kv_heads) * a.num_tiles) return;  // warp-uniform
  const int kh = int(w / a.num_tiles), tile = int(w % a.num_tiles);
  const int t = a.tile_tokens, topk = p.topk, n = t * topk;
  const int r0 = tile * t;
  int* ent = s_ent[warp];

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

  // Classify: ent[i] = block of entry i = (token i / topk, slot i % topk) when it is a pair, else -1.
  for (int e = 0; e < t; ++e) {
    const int r = r0 + e;
    const WarpQ2k wl = warp_q2k_list(p.q2k + (int64_t(kh) * p.total_q + r) * topk, topk, nb, lane);
    const int lim = col_limit(p.causal, q_off, r - rr.begin, seqlen_k);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int slot = lane + 32 * k;
      if (slot >= topk) break;
      const int blk = wl.v[k];
      const bool pair = wl.used[k] && int64_t(blk) * kBlockSize < lim &&
                        (p.kv.page_table == nullptr || kv_page(p.kv, b, blk) >= 0);
      ent[e * topk + slot] = pair ? blk : -1;
    }
  }
  __syncwarp();

  // First occurrences in entry order, their token masks, union size and pair count.
  int pairs = 0, u = 0;
  int* out_block = a.plan_block + w * a.max_entries;
  uint8_t* out_mask = a.plan_mask + w * a.max_entries;
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    const int val = i < n ? ent[i] : -1;
    bool first = val >= 0;
    uint32_t mask = 0;
    if (val >= 0) {
      for (int e = 0, j0 = 0; e < t; ++e, j0 += topk) {
        for (int j = j0; j < j0 + topk; ++j) {
          if (ent[j] == val) {
            mask |= 1u << e;
            first &= j >= i;
          }
        }
      }
    }
    pairs += __popc(__ballot_sync(0xffffffffu, val >= 0));
    const uint32_t firsts = __ballot_sync(0xffffffffu, first);
    if (first) {
      const int rank = u + __popc(firsts & ((1u << lane) - 1u));
      out_block[rank] = val;
      out_mask[rank] = uint8_t(mask);
    }
    u += __popc(firsts);
  }
  const bool qualifies = int64_t(u) * t * kUnionMaxWasteDen <= int64_t(kUnionMaxWasteNum) * pairs;
  if (lane == 0) {
    a.done[w] = qualifies ? 1 : 0;
    if (qualifies) {
      a.plan_count[w] = u;
      a.work[atomicAdd(&a.control[0], 1)] = int(w);
    }
  }
}

}  // namespace

void launch_union_plan(const UnionArgs& a, cudaStream_t stream) {
  MSA_CHECK(a.tile_tokens * a.p.topk <= kPlanMaxEntries, "union plan: too many entries per tile");
  MSA_CUDA_CHECK(cudaMemsetAsync(a.control, 0, 2 * sizeof(int), stream));
  const int64_t warps = int64_t(a.p.num_kv_heads) * a.num_tiles;
  const int64_t grid = (warps + kPlanWarpsPerCta - 1) / kPlanWarpsPerCta;
  MSA_CHECK(grid <= INT_MAX, "msa_sparse_attention: too many query tiles");
  union_plan_kernel<<<unsigned(grid), kPlanWarpsPerCta * 32, 0, stream>>>(a);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

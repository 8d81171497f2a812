// Host-side schedule choices of the sparse-attention ops, as plain functions of the shapes (so the
// grids are static under CUDA-graph capture). docs/design/sparse_attention.md gives the reasoning;
// where a rule was set by an H200 measurement, its comment names the run.
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashmsa/types.h"

namespace flashmsa::sparse_attn {

// Query-major split-K: for small batches, enough CTAs for ~3 per SM (one wave at the 3 resident
// 16-row CTAs per SM), because one item streams at most topk blocks and leaves SMs idle otherwise.
// Splitting costs the partial write + combine (a 5 us launch at decode size), so once the items
// alone give one CTA per SM the fused path is taken: measured on an H200 at B = 64, 32K context
// (items = 64 x 4 x 1 = 256 >= 132 SMs), fused 73 us vs split-4 86 us + combine 5 us.
inline constexpr int kQmTargetCtasPerSm = 3;

// Splits of each (row, kv head, row tile) item's used blocks. force_fused: 1 -> 1 (fused);
// 0 -> at least 2 (the split + combine path, even when the grid is already full); -1 -> heuristic.
// The count is rounded so that no split of a full list is empty.
// ctas_per_sm: the resident CTAs of the kernel that runs (2 for the register-converting decode
// kernel, whose 105 KB of shared memory allow no third). max_splits: at most this many (split=cluster:
// the largest cluster of the device, a cluster holding the splits of one row).
// waves (decode plan option split_rule=waves, auto's): where the call splits, the count s minimizing
// ceil(items * s / target) * (ceil(topk / s) + kSplitStartBlocks), waves of the resident CTAs times
// a split's time in blocks, its start included (the fewest splits on ties), instead of
// ceil(target / items), which can spill a second, partial wave (B32 / M3 on the 8-warp kernel: 3
// splits = 384 CTAs for 264 slots; waves: 2 = 256).
// fused_items: the call runs fused from this many items (-1: num_sms, one item per SM).
inline constexpr int kSplitStartBlocks = 1;
// A split's start (its plan, Q and first block's latency) costs about a block of its stream. Without
// it the waves rule priced a wave of one-block splits like one block, so between its measured
// batches it chose many waves of them: M3 B28 (112 items, 2 CTAs per SM) 16 splits = 1792 CTAs, B24
// 8 = 768, where one wave of 2 splits holds them (H200 at 831d3e5, 32K paged, us: fp8 B28 71.2 and
// B24 42.2 against B32's 35.4 on 2 splits; bf16 B28 67.2, B24 49.1 against B32's 48.3). The term
// changes no count at the batches measured before it (B1, B8, B16, B32: the same counts).

// The sm_90a MTP wgmma kernel's split starts at ~5 blocks: a union item's ~10 us start (its plan,
// Q, the ring's first stages) against ~2.1 us a block (profile at 4e71e32: B32 fp8, DRAM 41 %,
// issue 28 %). Priced at one block, the waves rule split 64-96 union items 3-4 ways into 2-3 rounds
// of the 132 persistent CTAs (H200 at 455afa9, 32K paged, 4 tokens, fp8, us: B17 3 splits 52.3, B20
// 3 splits 55.1, B24 4 splits 61.9, against B28 and B33 fused, one item a CTA, 46.3 and 46.2).
// At 5 they run fused from 66 items (B17 at M3); 64 items (B16) keep 2 splits, one round. Fused
// (H200 at 7ba3923): B17 44.3, B20 45.1, B24 45.8 us; bf16 B24 41.6 (77.2 on 4 splits at 37fd6f5).
inline constexpr int kWgmmaSplitStartBlocks = 5;

// start_blocks: a split's start in blocks of its stream (kSplitStartBlocks, or the wgmma kernel's).
inline int query_major_splits(int64_t items, int topk, int num_sms, int force_fused,
                              int ctas_per_sm = kQmTargetCtasPerSm, int max_splits = 64, bool waves = false,
                              int64_t fused_items = -1, int start_blocks = kSplitStartBlocks) {
  if (force_fused == 1 || items <= 0) return 1;
  const int64_t target = int64_t(ctas_per_sm) * num_sms;
  int64_t splits = items >= (fused_items < 0 ? num_sms : fused_items) ? 1 : (target + items - 1) / items;
  splits = std::min<int64_t>({splits, topk, max_splits});
  if (waves && splits > 1) {
    int64_t best = 0, best_cost = 0;
    for (int64_t s = 1; s <= std::min<int64_t>(topk, max_splits); ++s) {
      const int64_t cost = ((items * s + target - 1) / target) * ((topk + s - 1) / s + start_blocks);
      if (best == 0 || cost < best_cost) best = s, best_cost = cost;
    }
    splits = best;
  }
  if (force_fused == 0) splits = std::max<int64_t>(splits, std::min(2, topk));
  const int64_t per_split = (topk + splits - 1) / splits;
  return int((topk + per_split - 1) / per_split);
}

// Decode MTP union items (query_major.cuh plan_mtp_item): one item per (request, kv head) over the
// union of the request's tokens' selections, rows = tokens x G. They need uniform seqlen_q in 2..4
// (a byte per token in a tile's visible-key counts), tokens x G <= 64 rows (one 64-row tile) and
// tokens x topk <= 64 entries (the plan's two entries per lane).
inline bool mtp_union_applies(bool has_cu_seqlens_q, int seqlen_q, int group, int topk, int64_t batch,
                              int64_t total_q) {
  return !has_cu_seqlens_q && seqlen_q >= 2 && seqlen_q <= 4 && seqlen_q * group <= 64 &&
         seqlen_q * topk <= 64 && batch * seqlen_q == total_q;
}

// mtp=auto: union items only where they beat per-token items. A union item loads each block of
// the request's union once for all its tokens but is one 64-row item per (request, kv head), with a
// ~10 us start (its plan) before the first block lands; per-token items split each token's list over
// more CTAs, so at small batches they fill the GPU sooner. H200 at 4a4ffcb, 32K paged, us per call
// (per-token / union; union is the wgmma kernel for 16-bit K/V where items x 2 > SMs):
//   bf16 4 tokens: B1 18.0 / 25.3, B2 20.4 / 23.8, B4 24.4 / 25.1, B8 37.1 / 31.6, B64 173 / 82;
//   bf16 3 tokens: B4 32.3 / 25.0, B8 43.3 / 31.6, B32 66.8 / 50.8;
//   bf16 2 tokens: B1 15.6 / 24.8, B16 36.3 / 40.3, B24 53.4 / 60.5, B32 54.8 / 50.3, B64 106.7 / 88.7;
//   fp8 4 tokens: B1 18.0 / 35.8, B16 34.4 / 47.9, B32 63.7 / 65.9, B48 93.3 / 76.7, B64 123 / 76.9;
//   fp8 3 tokens: B32 55.1 / 69.0, B64 93.8 / 90.2 (kept per token); fp8 2 tokens: B64 64.7 / 88.7;
//   NVFP4 4 tokens: B16 63.1 / 64.1, B24 112.8 / 105.6, B32 112.7 / 100.5;
//   NVFP4 3 tokens: B16 62.7 / 63.4, B32 113.0 / 99.4, B64 162.1 / 145.3; NVFP4 2 tokens: B64 114.3 / 139.7.
// items: batch x kv heads (the union items).
// fp8_wgmma: fp8 union items would run on the sm_90a wgmma kernel (wgmma_fp8; mtp_wgmma_unsupported
// says where), which pays from more items than half the SMs, as for 16-bit K/V: H200 at 455afa9,
// 4 tokens, per-token / union on wgmma (fused from B17, kWgmmaSplitStartBlocks): B16 34.4 / 42.8 (2
// splits), B28 62.9 / 46.3, B32 63.5 / 46.0, B33 63.8 / 46.2; at 7ba3923 B17 53.3 / 44.3, B20 53.8
// / 45.1, B24 54.7 / 45.8; the register union kernel elsewhere pays only past a wave (B32 63.7 /
// 65.9 above).
inline bool mtp_union_pays(DType kv, int seqlen_q, int64_t items, int num_sms, bool fp8_wgmma = false) {
  switch (kv) {
    case DType::kFP8E4M3:  // 4 tokens only; past a wave on the register kernel, half one on wgmma
      return seqlen_q == 4 && (fp8_wgmma ? 2 * items > num_sms : items > num_sms);
    case DType::kNVFP4:
      return seqlen_q >= 3 && 2 * items > num_sms;
    default:  // 16-bit K/V
      return seqlen_q >= 3 ? items >= num_sms / 8 : 4 * items > 3 * num_sms;
  }
}

// The items from which a decode call runs fused. The fp8 register kernel on per-token 16-row items:
// from 70 % of one item per SM; one CTA streaming its item's 16 fp8 blocks beats 2 splits a row
// sharing the SMs plus the combine (H200 at 831d3e5, M3 paged 32K, us, auto's split / fused: B24 (96
// items) 42.2 / 28.2, B28 (112) 71.2 / 28.4, B32 (128) 35.4 / 28.8; H100 at e5d3136, B32 41.3 /
// 35.0). Every other kernel: one item per SM (bf16 at B32: 48.3 split / 49.9 fused).
inline int64_t query_major_fused_items(int num_sms, bool fp8_regs_rows16) {
  return fp8_regs_rows16 ? (int64_t(7) * num_sms + 9) / 10 : int64_t(num_sms);
}

// 16-bit K/V on per-token 16-row items that run fused (items >= SMs): auto's shared-memory kernel
// (3 CTAs per SM) unless its items spill past one wave and the register kernel's waves (2 CTAs per
// SM, regs_ctas) leave fewer CTA slots idle in their last one. H200, M3 paged, one token, us, smem
// / regs: B64 (256 items, one wave of either) 72.5 / 72.1 (673903e) and within 1 % in every run
// since 054c9ce, B96 (384: one wave of 396 slots) 101.8 / 121.2, B128 (512: 396 + 116 against 264
// + 248) 162.0 / 136.9 (831d3e5; 161.3 / 137.1 at a9d99bd, 162.8 / 137.0 at 673903e; 128K context
// 173-174 / 137).
inline bool decode_16bit_takes_regs(int64_t items, int num_sms, int regs_ctas) {
  const int64_t smem_slots = int64_t(kQmTargetCtasPerSm) * num_sms, regs_slots = int64_t(regs_ctas) * num_sms;
  if (regs_ctas <= 0 || num_sms <= 0 || items <= smem_slots) return false;
  auto idle = [items](int64_t slots) { return (items + slots - 1) / slots * slots - items; };
  return idle(regs_slots) < idle(smem_slots);
}

// Resident CTAs per SM that split-K aims at: the streaming decode variant and MTP union items keep
// 2 (105 KB of shared memory; 64-row tiles), the other query-major configurations 3.
inline int query_major_target_ctas(bool regs, bool mtp_union) {
  return regs || mtp_union ? 2 : kQmTargetCtasPerSm;
}

// Prefill: the KV-major schedule pays a fixed cost per launch (list building, partial traffic of
// ~2 * 4 KB per (token, kv head, block) at G = 16) that only large prefills amortize; query-major
// moves every selected block once per token but has no setup. Below this many query rows the
// query-major schedule is used.
inline constexpr int kKvMajorMinRows = 1024;

// KV-major partials of one launch group are bounded by this many bytes; larger prefills run as
// several equal launch groups of query rows (each rebuilding its lists and ending with a tail of
// idle SMs, ~0.1 ms per group at 32K tokens). 1 GiB keeps the caller-visible workspace of a
// 32K-token M3 prefill near 1.1 GB (9 groups); 4 GiB would save ~0.4 ms there but ask inference
// engines for ~6 GB of scratch, which they size up front for the longest prefill.
inline constexpr int64_t kKvMajorPartialBudget = int64_t(1) << 30;

// Bytes of KV-major workspace per query row of a launch group: per (kv head, q2k slot) a list entry
// and G partial rows (128 values in the compute dtype + the log2 LSE [+ temperature LSE]).
inline int64_t kv_major_bytes_per_row(int num_kv_heads, int topk, int group, bool has_temp) {
  return int64_t(num_kv_heads) * topk * (4 + int64_t(group) * (128 * 2 + 4 * (has_temp ? 2 : 1)));
}

}  // namespace flashmsa::sparse_attn

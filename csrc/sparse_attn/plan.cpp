// The attention planner of plan.h: prefill schedule, KV-major kernel, launch groups, shared-
// selection tiles, decode splits, and the workspace layout of each. Host-only and pure (the device
// facts come in), so tests/cpp/test_plan_host.cpp checks every choice on the CPU.
// docs/design/sparse_attention.md gives the reasoning behind the numbers (heuristics.h,
// kernel_traits.h).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "sparse_attn/heuristics.h"
#include "sparse_attn/kernel_traits.h"

namespace flashmsa {

namespace {

using namespace sparse_attn;

// Why split=cluster falls back to splitting by blocks (the plan text names it).
constexpr const char* kClusterOneSplit = "one split a row at the cluster kernel's CTAs per SM (nothing to merge)";
constexpr const char* kClusterGridTooLarge = "more items than one grid holds";

const char* tma_rows_unsupported(const SparseAttnParams& p);  // below

bool compute_is_bf16(const SparseAttnParams& p) { return p.q_dtype != DType::kFP16; }

DType compute_dtype(const SparseAttnParams& p) { return compute_is_bf16(p) ? DType::kBF16 : DType::kFP16; }

// K and V stored in the compute dtype (not fp8 / NVFP4): what the 16-bit-only kernels load.
bool kv_in_compute_dtype(const SparseAttnParams& p) {
  return p.k.dtype == compute_dtype(p) && p.v.dtype == compute_dtype(p);
}

StoreKind compute_store_kind(const SparseAttnParams& p) {
  return compute_is_bf16(p) ? StoreKind::kBF16 : StoreKind::kF16;
}

// options / facts: decode only (prefill passes the defaults: smem kernel, per-token items).
QueryMajorPlan plan_query_major(const SparseAttnParams& p, int num_sms, int force_fused,
                                StoreKind part_kind, WorkspaceLayout& ws,
                                const SparseDecodeOptions& options = {},
                                const SparseAttnDeviceFacts& facts = {}) {
  QueryMajorPlan plan;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t union_items = int64_t(p.batch) * p.num_kv_heads;  // one per (request, kv head)
  // mtp: union (or kernel=wgmma, which runs union items only) takes union items where they apply;
  // auto where they also pay (heuristics.h), fp8 ones on the wgmma kernel where auto would take it.
  const bool fp8_wgmma = options.kernel == DecodeKernel::kAuto && p.k.dtype == DType::kFP8E4M3 &&
                         mtp_wgmma_unsupported(p, true, facts, options) == nullptr;
  const bool mtp = options.mtp != DecodeMtp::kPerToken &&
                   mtp_union_applies(p.qi.cu_seqlens_q != nullptr, p.qi.seqlen_q, group, p.topk,
                                     p.batch, p.total_q) &&
                   (options.mtp == DecodeMtp::kUnion || options.kernel == DecodeKernel::kWgmma ||
                    mtp_union_pays(p.k.dtype, p.qi.seqlen_q, union_items, num_sms, fp8_wgmma));
  plan.mtp_tokens = mtp ? p.qi.seqlen_q : 0;
  // kernel=wgmma: the sm_90a union kernel where it runs; elsewhere the call is planned as auto.
  // auto takes it for the MTP union items it runs (16-bit q, K and V) when there are more items
  // than half the SMs (items x 2 > SMs). H200, 32K, 4 tokens, bf16, wgmma against the
  // smem union kernel:
  //   B64 (256 items): 99.0 vs 104.1 us at 054c9ce;
  //   B32 (128 items): 54.9 vs 74.1 us at 37fd6f5;
  //   B24 (96 items): 77.2 vs 93.8 us at 37fd6f5;
  //   B16 (64 items): 47.8 vs 47.5 us at 37fd6f5 (even);
  //   B8: 39.9 vs 36.3 us, B1: 32.8 vs 29.6 us at 37fd6f5 (the smem kernel's splits win).
  const bool auto_wgmma = options.kernel == DecodeKernel::kAuto && mtp && num_sms > 0 &&
                          2 * union_items > int64_t(num_sms);
  if (options.kernel == DecodeKernel::kWgmma || auto_wgmma) {
    const char* why = mtp_wgmma_unsupported(p, mtp, facts, options);
    if (options.kernel == DecodeKernel::kWgmma) plan.wgmma_fallback = why;
    plan.wgmma = why == nullptr;
    // wgmma_pipe=ahead: the planner warp ahead of the loader, auto's too (H200 at 42bbb91: B64 /
    // 32K MTP sq 4 bf16 91.7 vs 98.7 us inline).
    plan.wgmma_ahead = plan.wgmma && options.wgmma_pipe != DecodeWgmmaPipe::kInline;
    // wgmma_fp8: fp8 K/V converted in place by the kernel's converter warps (on, and auto where
    // mtp_wgmma_unsupported says: H200 at 831d3e5, B34-B128 / 32K sq 4, never slower than auto's
    // union register kernel before it, B96 103.7 vs 151.4 us; at 455afa9 B28-B33 46.2-46.3 us
    // against per-token items' 62.9-63.8).
    plan.wgmma_fp8 = plan.wgmma && p.k.dtype == DType::kFP8E4M3;
  }
  const DecodeKernel kernel = options.kernel == DecodeKernel::kWgmma ? DecodeKernel::kAuto : options.kernel;
  const int regs_ctas = facts.decode_regs_ctas, cluster_max = facts.decode_cluster_max;
  // G <= 16 fills one m16 tile per token (M3: G = 16 exactly); larger groups and MTP union items
  // (tokens x G rows) take 64-row tiles.
  plan.warps_m = group <= 16 && !mtp ? 1 : 4;
  // auto: regs for fp8 and NVFP4 K/V (converted in registers: the point of the kernel), smem for
  // 16-bit K/V (the two within 1 %); MTP union items: regs for fp8 K/V (H200 at 441d02d, B64/32K,
  // 4 tokens: 79.7 vs 119.7 us).
  // Forced regs: 16-row tiles where the device has the 105 KB of shared memory; MTP union items
  // with fp8 K/V (64-row tiles, 86 KB: every SM80+ GPU); NVFP4 / bf16 / fp16 union items and
  // G > 16 keep smem (NVFP4 union items in registers: 168.3 vs 153.1 us for the smem union kernel
  // at 5b22cb3, removed).
  // 16-bit K/V: auto takes regs for fused calls whose items overrun the smem kernel's wave and
  // fill the register kernel's better (decode_16bit_takes_regs: B128 / M3 on the H200 at 831d3e5,
  // 136.9 vs 162.0 us); a forced split keeps smem.
  const bool quantized_kv = p.k.dtype == DType::kFP8E4M3 || p.k.dtype == DType::kNVFP4;
  const bool regs_16bit = kernel == DecodeKernel::kAuto && !quantized_kv && !mtp && plan.warps_m == 1 &&
                          force_fused != 0 &&
                          decode_16bit_takes_regs(int64_t(p.total_q) * p.num_kv_heads, num_sms, regs_ctas);
  const bool want_regs = !plan.wgmma && (kernel == DecodeKernel::kRegs ||
                                         (kernel == DecodeKernel::kAuto && (quantized_kv || regs_16bit)));
  plan.regs = want_regs && (mtp ? p.k.dtype == DType::kFP8E4M3 : plan.warps_m == 1 && regs_ctas > 0);
  // nvfp4_cvt: the 16-row register kernel's NVFP4 conversion a word at a time (auto, word) or a
  // byte at a time (H200 at f4fdc62, B64/32K: word 61.4 vs 67.8 us; B1 30.0 vs 29.3 us).
  plan.nvfp4_word = plan.regs && !mtp && p.k.dtype == DType::kNVFP4 &&
                    options.nvfp4_cvt != DecodeNvfp4Cvt::kByte;
  const int rows = 16 * plan.warps_m;
  plan.row_tiles = mtp ? 1 : (group + rows - 1) / rows;
  const int64_t items = mtp ? union_items
                            : int64_t(p.total_q) * p.num_kv_heads * plan.row_tiles;
  // The wgmma kernel runs one CTA per SM (its 226 KB of shared memory).
  const int target_ctas = plan.wgmma ? facts.decode_mtp_wgmma_ctas : query_major_target_ctas(plan.regs, mtp);
  // split_rule: auto = waves (H200 at 43dca7a, 32K paged: B32 bf16 49.1 vs 57.7 us, fp8 35.6 vs 46.4;
  // B1 / B8 / B16 the same counts).
  const bool waves = options.split_rule != DecodeSplitRule::kCeil;
  // The fp8 register kernel on per-token 16-row items runs fused from 70 % of an item per SM
  // (query_major_fused_items; H200 at 831d3e5). split=cluster keeps one item per SM: its rows
  // merge in distributed shared memory without the combine.
  const bool fp8_regs_rows16 = plan.regs && !mtp && plan.warps_m == 1 &&
                               p.k.dtype == DType::kFP8E4M3 && options.split != DecodeSplit::kCluster;
  plan.splits = query_major_splits(items, p.topk, num_sms, force_fused, target_ctas, 64, waves,
                                   query_major_fused_items(num_sms, fp8_regs_rows16),
                                   plan.wgmma ? kWgmmaSplitStartBlocks : kSplitStartBlocks);
  plan.fused = plan.splits == 1 && force_fused != 0;
  plan.part_kind = part_kind;
  // split=cluster: where the call splits, the splits of a row as one cluster of at most
  // cluster_max CTAs (the split count capped there), a CTA per item (the grid is the items).
  if (options.split == DecodeSplit::kCluster && !plan.fused) {
    if (mtp)
      plan.cluster_fallback = "MTP union items keep the combine kernel (mtp=per_token items run in clusters)";
    else if (cluster_max < 2)
      plan.cluster_fallback = "no thread-block clusters here (needs an sm_90 GPU and the library's sm_90a image)";
    else if (items * std::min(plan.splits, cluster_max) > INT_MAX)
      plan.cluster_fallback = kClusterGridTooLarge;
    if (plan.cluster_fallback == nullptr) {
      // The split count again, capped at the largest cluster: where that leaves one split a row,
      // there is nothing to merge, and the call splits by blocks as planned above.
      const int splits = query_major_splits(items, p.topk, num_sms, force_fused, target_ctas, cluster_max, waves);
      if (splits >= 2) {
        plan.cluster = true;
        plan.splits = splits;
      } else {
        plan.cluster_fallback = kClusterOneSplit;
      }
    }
  }
  // split_warps=8: 8 warps per split CTA (query_major_wide.cuh) where the call splits by blocks on
  // the shared-memory kernel with 16-row tiles and 16-bit K/V; the split count as for 4 warps at
  // 2 CTAs per SM. auto takes it wherever it applies (H200 at 43c70d4, B1 / 32K bf16: 20.2 vs
  // 22.0 us, the graphed decode step 30.2 vs 31.8 us); a forced 8 names why it falls back.
  // fp8 K/V (with kernel=auto): the 8-warp kernel converting in registers as kernel=regs does, in
  // place of the 4-warp register kernel, where forced, and for auto where each split holds one
  // block (a CTA's whole work is one block: its chain is the batch-1 latency). H200 at a9d99bd,
  // fp8 paged, decode 8 vs 4 warps: B1 / 8K 16.1 vs 17.3 us, / 32K 16.0 vs 18.7, / 128K 15.2 vs
  // 18.4 (graphed steps B1 / 32K 24.4 vs 26.3, / 128K 28.7 vs 30.7); with 2 blocks a split (B8)
  // 19.6 vs 20.1, 21.8 vs 19.6, 20.6 vs 21.9 (steps even), B32 35.3 vs 34.2: not taken there.
  // A forced 8 also runs fused calls (its merge writes the outputs); auto keeps 4 warps there.
  if (options.split_warps != DecodeSplitWarps::k4) {
    const bool forced = options.split_warps == DecodeSplitWarps::k8;
    const bool fp8_kv = p.k.dtype == DType::kFP8E4M3 && p.v.dtype == DType::kFP8E4M3;
    const int wide_splits = query_major_splits(items, p.topk, num_sms, force_fused, kQmWideCtasPerSm, 64, waves);
    const bool fp8_wide = fp8_kv && kernel == DecodeKernel::kAuto && (forced || wide_splits >= p.topk);
    const char* why = nullptr;
    if (plan.fused && !forced)
      why = "the call does not split (fused)";
    else if (mtp)
      why = "MTP union items (64-row tiles)";
    else if (plan.wgmma || (plan.regs && !fp8_wide))
      why = "kernel=regs / wgmma";
    else if (plan.warps_m != 1)
      why = "G > 16 (64-row tiles)";
    else if (fp8_kv && !fp8_wide)
      why = "fp8 K/V under kernel=smem (the 8-warp kernel converts fp8 in registers, under kernel=auto)";
    else if (!kv_in_compute_dtype(p) && !fp8_wide)
      why = "NVFP4 K/V (the 8-warp kernel reads 16-bit K and V of the compute dtype, or fp8)";
    else if (plan.cluster && facts.decode_wide_cluster_max < 2)
      why = "no 8-warp cluster kernel here (split=cluster runs the 4-warp one)";
    if (why == nullptr) {
      plan.wide = true;
      plan.regs = false;  // fp8: the 8-warp kernel converts in registers itself
      // split=cluster: one CTA per SM (kQmWideClusterCtasPerSm), at most the largest cluster;
      // where that leaves one split a row (e.g. M3 at B31 on 132 SMs: 124 items) or more CTAs
      // than one grid holds, the call splits by blocks on 8 warps instead.
      const int cluster_splits =
          plan.cluster ? query_major_splits(items, p.topk, num_sms, force_fused, kQmWideClusterCtasPerSm,
                                            facts.decode_wide_cluster_max, waves)
                       : 0;
      if (plan.cluster && (cluster_splits < 2 || items * cluster_splits > INT_MAX)) {
        plan.cluster = false;
        plan.cluster_fallback = cluster_splits < 2 ? kClusterOneSplit : kClusterGridTooLarge;
      }
      if (plan.cluster)
        plan.splits = cluster_splits;
      else if (!plan.fused)
        plan.splits = wide_splits;
    } else if (forced) {
      plan.split_warps_fallback = why;
    }
  }
  // regs_feed=tma: the 16-row fp8 register kernel's stages filled by TMA where it runs (auto:
  // cp_async; H100 at b1dd4fa, M3 fp8 32K: B32 50.7 vs 43.2 us, B64 57.9 vs 57.2, B128 107.9 vs
  // 104.6); a call it does not take names why.
  if (options.regs_feed == DecodeRegsFeed::kTma) {
    const bool fp8_kv = p.k.dtype == DType::kFP8E4M3 && p.v.dtype == DType::kFP8E4M3;
    const char* why = nullptr;
    if (!fp8_kv)
      why = "16-bit or NVFP4 K/V (the TMA feed loads raw fp8 blocks)";
    else if (!plan.regs || plan.mtp_tokens > 0 || plan.warps_m != 1)
      why = "not the 16-row register kernel (kernel=smem / wgmma, the 8-warp kernel, MTP union items or G > 16)";
    else if (plan.cluster)
      why = "split=cluster (its cluster kernels fill their stages by cp.async)";
    else if (facts.decode_regs_tma_ctas <= 0)
      why = "the TMA-fed register kernel cannot run on this device (needs an sm_90 GPU and the library's "
            "sm_90a image)";
    else
      why = tma_rows_unsupported(p);
    plan.regs_tma_fallback = why;
    plan.regs_tma = why == nullptr;
  }
  plan.num_items = items * plan.splits;
  // combine_loads: with (auto, H200 at dda49c5) or after, where a combine runs.
  plan.combine_with = !plan.fused && !plan.cluster && options.combine_loads != DecodeCombineLoads::kAfter;
  // kernel=wgmma: persistent CTAs, at most one per SM and item (a CTA takes items blockIdx.x,
  // + grid, ...).
  if (plan.wgmma)
    plan.grid = int(std::min<int64_t>(plan.num_items, int64_t(facts.decode_mtp_wgmma_ctas) * num_sms));
  if (!plan.fused && !plan.cluster) {
    const int64_t slots = int64_t(p.total_q) * p.num_heads * plan.splits;
    plan.part_o_off = ws.take("qm.part_o", size_t(slots) * 128 * store_kind_bytes(part_kind));
    plan.part_lse_off = ws.take("qm.part_lse", size_t(slots) * 4);
    if (p.lse_temperature_out != nullptr) plan.part_lse_t_off = ws.take("qm.part_lse_t", size_t(slots) * 4);
  }
  return plan;
}

// CTAs per SM of the shared-selection tile kernel for this call, 0 when it does not apply: NVFP4
// K / V take the KV-major path, and a tile is 128 query rows of whole tokens with at most
// kUnionMaxTokens tokens (G in {16, 32, 64, 128}).
int tile_ctas(const SparseAttnParams& p, const SparseAttnDeviceFacts& facts) {
  const int group = p.num_heads / p.num_kv_heads;
  if (p.k.dtype == DType::kNVFP4 || group < kUnionRows / kUnionMaxTokens || kUnionRows % group != 0) return 0;
  return facts.tile_ctas;
}

}  // namespace

namespace {

// The rows a TMA kernel's maps of q and K / V describe: at least one K / V row (a map of an empty
// flat tensor or page pool is rejected by the driver: such calls have no keys to read anyway), and
// 32-bit coordinates (q rows, flat K/V rows: a box reaches 128 past the last block).
const char* tma_rows_unsupported(const SparseAttnParams& p) {
  if ((!p.kv.paged && p.kv.total_k <= 0) || (p.kv.paged && p.kv.num_pages <= 0))
    return "no K/V rows (an empty K/V tensor: a TMA map needs at least one row)";
  if (p.total_q >= (int64_t(1) << 31) || (!p.kv.paged && p.kv.total_k >= (int64_t(1) << 31) - kBlockSize))
    return "q or K/V rows beyond TMA's 32-bit coordinates";
  return nullptr;
}

}  // namespace

const char* mtp_wgmma_unsupported(const SparseAttnParams& p, bool mtp, const SparseAttnDeviceFacts& facts,
                                  const SparseDecodeOptions& options) {
  if (!mtp)
    return "no MTP union items in this call (per-token items, or mtp=per_token): the wgmma kernel runs "
           "union items only";
  const DType compute = compute_dtype(p);
  if (p.q_dtype != compute) return "fp8 q (the wgmma kernel loads bf16 / fp16 q by TMA)";
  const bool fp8_kv = p.k.dtype == DType::kFP8E4M3 && p.v.dtype == DType::kFP8E4M3;
  // wgmma_fp8=auto: on where kernel=wgmma is named, and for auto's pick from more union items than
  // half the SMs, as for 16-bit K/V (H200 at 831d3e5, 32K, 4 tokens, us, auto's union register
  // kernel / wgmma_fp8=on: B34 75.3 / 74.0, B48 77.0 / 74.4, B64 78.0 / 74.8, B80 149.9 / 102.9, B96
  // 151.4 / 103.7, B128 153.8 / 133.1; at 455afa9, per-token items / wgmma_fp8=on: B16 34.4 / 42.8,
  // B28 62.9 / 46.3, B33 63.8 / 46.2; mtp_union_pays).
  const int64_t union_items = int64_t(p.batch) * p.num_kv_heads;
  if (fp8_kv && options.wgmma_fp8 == DecodeWgmmaFp8::kOff)
    return "fp8 K/V with wgmma_fp8=off (the wgmma kernel converts them only with wgmma_fp8=on or auto)";
  if (fp8_kv && options.wgmma_fp8 == DecodeWgmmaFp8::kAuto && options.kernel != DecodeKernel::kWgmma &&
      2 * union_items <= facts.num_sms)
    return "fp8 K/V with at most one union item per two SMs (wgmma_fp8=auto converts them on the wgmma "
           "kernel from more union items than half the SMs, where it was measured faster; wgmma_fp8=on "
           "forces it)";
  if (fp8_kv && options.wgmma_pipe == DecodeWgmmaPipe::kInline)
    return "fp8 K/V with wgmma_pipe=inline (wgmma_fp8=on runs the ahead pipe's planner and loader warps)";
  if (!fp8_kv && !kv_in_compute_dtype(p))
    return "NVFP4 K/V (the wgmma kernel loads 16-bit K and V of the compute dtype, or fp8 with "
           "wgmma_fp8=on)";
  if (facts.decode_mtp_wgmma_ctas <= 0 || facts.num_sms <= 0)
    return "the wgmma kernel cannot run on this device (needs an sm_90 GPU and the library's sm_90a image)";
  return tma_rows_unsupported(p);
}

const char* tile_tma_unsupported(const SparseAttnParams& p, const SparseAttnDeviceFacts& facts) {
  if (!kv_in_compute_dtype(p))
    return "fp8 / NVFP4 K/V (the TMA kernel loads 16-bit K and V of the compute dtype)";
  if (facts.tile_tma_ctas <= 0) return "the TMA tile kernel cannot run on this device";
  return tma_rows_unsupported(p);
}

const char* kv_major_tma_unsupported(const SparseAttnParams& p, const SparseAttnDeviceFacts& facts,
                                     int64_t chunk_rows) {
  if (!kv_in_compute_dtype(p))
    return "fp8 / NVFP4 K/V (the TMA kernel loads 16-bit K and V of the compute dtype)";
  if (facts.kv_major_tma_ctas <= 0) return "the TMA KV-major kernel cannot run on this device";
  // A token's G heads are whole 8-row swizzle atoms of a 64-row tile: one box per token and half.
  const int group = p.num_heads / p.num_kv_heads;
  if (group % 8 != 0 || (64 % group != 0 && group % 64 != 0))
    return "G is not a multiple of 8 that divides 64 or a multiple of 64";
  // TMA boxes take 16-byte aligned strides; coordinates are 32-bit (q rows, flat K/V rows (a box
  // reaches 128 past the last block), partial rows).
  if ((p.q_stride_head * 2) % 16 != 0 || (p.q_stride_token * 2) % 16 != 0)
    return "q strides that are not multiples of 16 bytes";
  if (const char* why = tma_rows_unsupported(p)) return why;
  const int64_t part_rows = int64_t(p.num_kv_heads) * chunk_rows * p.topk * group;
  if (part_rows >= (int64_t(1) << 31)) return "partial rows beyond TMA's 32-bit coordinates";
  return nullptr;
}

namespace {

// False when no KV-major kernel fits this device. with_tiles: also plan the shared-selection tiles
// where they apply.
bool plan_kv_major(const SparseAttnParams& p, const SparseAttnOptions& o, const SparseAttnDeviceFacts& facts,
                   bool with_tiles, KvMajorPlan& plan, WorkspaceLayout& ws) {
  plan = KvMajorPlan{};
  int ctas = 0;
  // tma where it applies (checked once the launch groups are known, below); it falls back to the
  // kernel auto would take.
  if (o.kv_major_kernel != KvMajorKernel::kMmaSync) {
    ctas = facts.kv_major_wgmma_ctas;
    MSA_CHECK_SUPPORTED(ctas > 0 || o.kv_major_kernel != KvMajorKernel::kWgmma, "kv_major_kernel=wgmma: the "
                        "warpgroup-MMA kernel needs an sm_90 GPU and a library built for sm_90a");
    plan.kernel = KvMajorKernel::kWgmma;
    plan.q_stages = 2;
  }
  for (int stages = 2; stages >= 1 && ctas == 0; --stages) {
    ctas = facts.kv_major_mma_sync_ctas[stages - 1];
    plan.kernel = KvMajorKernel::kMmaSync;
    plan.q_stages = stages;
  }
  if (ctas <= 0) return false;

  const int group = p.num_heads / p.num_kv_heads;
  const bool has_temp = p.lse_temperature_out != nullptr;
  const int64_t per_row = kv_major_bytes_per_row(p.num_kv_heads, p.topk, group, has_temp);
  int64_t chunk = std::max<int64_t>(1, kKvMajorPartialBudget / per_row);
  if (o.chunk_rows > 0) chunk = o.chunk_rows;
  // (row << 6 | slot) list entries and int list offsets bound one group's pairs.
  chunk = std::min<int64_t>({chunk, p.total_q, (int64_t(1) << 28) / (int64_t(p.num_kv_heads) * p.topk)});
  chunk = std::max<int64_t>(chunk, 1);
  // Equal launch groups: each group's persistent kernel ends with a tail of unevenly finishing
  // CTAs, and a small last group (e.g. 536 of 32K rows at a 4029-row cap) pays a whole launch
  // sequence for little work.
  const int64_t groups = std::max<int64_t>(1, (int64_t(p.total_q) + chunk - 1) / chunk);
  chunk = std::max<int64_t>(1, (int64_t(p.total_q) + groups - 1) / groups);
  plan.chunk_rows = int(chunk);
  plan.groups = int((int64_t(p.total_q) + chunk - 1) / chunk);
  if (o.kv_major_kernel == KvMajorKernel::kTma) {
    plan.tma_fallback = kv_major_tma_unsupported(p, facts, plan.chunk_rows);
    if (plan.tma_fallback == nullptr) {
      plan.kernel = KvMajorKernel::kTma;
      plan.q_stages = 4;
      ctas = facts.kv_major_tma_ctas;
    }
  }
  // The partials by TMA stores (kv_major_store auto or tma): a warp's 16 rows must be 16 consecutive
  // heads of one token and so 16 consecutive partial rows (G % 16 == 0), within TMA's coordinates.
  if (o.kv_major_store != KvMajorStore::kStg) {
    const int64_t part_rows = int64_t(p.num_kv_heads) * plan.chunk_rows * p.topk * group;
    plan.store_fallback = plan.kernel != KvMajorKernel::kWgmma ? "not the warpgroup-MMA KV-major kernel"
                          : group % 16 != 0                    ? "G not a multiple of 16"
                          : part_rows >= (int64_t(1) << 31)    ? "partial rows beyond TMA's 32-bit coordinates"
                                                               : nullptr;
    plan.tma_store = plan.store_fallback == nullptr;
  }
  // The MUFU row math on the kernel that has it: auto's and approx's (a forced approx elsewhere says
  // why); precise only where named.
  if (o.kv_major_math != KvMajorMath::kPrecise) {
    plan.approx_math = plan.kernel == KvMajorKernel::kWgmma;
    if (o.kv_major_math == KvMajorMath::kApprox && !plan.approx_math)
      plan.math_fallback = "not the warpgroup-MMA KV-major kernel";
  }

  const int64_t nb_bound = p.kv.paged ? int64_t(p.batch) * p.kv.max_pages
                                     : p.kv.total_k / kBlockSize + p.batch + 1;
  MSA_CHECK(nb_bound * p.num_kv_heads < INT_MAX, "msa_sparse_attention: too many KV blocks (",
            nb_bound, " per kv head) for the KV-major schedule");
  plan.nb_bound = int(std::max<int64_t>(nb_bound, 1));
  plan.tokens_per_item = std::max(1, kKvmMaxRowsPerItem / group);
  if (plan.kernel == KvMajorKernel::kWgmma)
    plan.tokens_per_item = std::min(plan.tokens_per_item, kKvm90MaxTokensPerItem);
  if (plan.kernel == KvMajorKernel::kTma)
    plan.tokens_per_item = std::min(plan.tokens_per_item, kKvmTmaMaxTokensPerItem);
  // Items: every list contributes ceil(count / tokens_per_item) <= count / tpi + 1, and at most
  // min(columns, pairs) lists are non-empty.
  const int64_t pairs = int64_t(p.num_kv_heads) * plan.chunk_rows * p.topk;
  const int64_t max_items = (pairs + plan.tokens_per_item - 1) / plan.tokens_per_item +
                            std::min<int64_t>(int64_t(p.num_kv_heads) * plan.nb_bound, pairs);
  plan.max_items = int(max_items);
  plan.grid = int(std::max<int64_t>(1, std::min<int64_t>(max_items, int64_t(ctas) * facts.num_sms)));
  plan.num_sms = facts.num_sms;

  // lists=once (and auto): every group's lists at once (group j's part of each array at j times the size of
  // one group's), within kKvMajorListsOnceBudget.
  const int64_t counters = int64_t(p.num_kv_heads) * plan.nb_bound;
  const int64_t per_group_lists = 2 * counters * 4 + int64_t(sizeof(KvMajorControl)) +
                                  max_items * int64_t(sizeof(KvMajorItem)) + pairs * 4;
  int64_t list_groups = 1;
  if (o.lists != KvMajorLists::kPerGroup) {
    plan.lists_once_bytes = per_group_lists * plan.groups;
    plan.lists_fallback = plan.lists_once_bytes > kKvMajorListsOnceBudget;
    if (!plan.lists_fallback) {
      plan.lists = KvMajorLists::kOnce;
      list_groups = plan.groups;
    }
  }
  plan.block_base_off = ws.take("kvm.block_base", size_t(p.batch + 1) * 4);
  plan.counts_off = ws.take("kvm.counts", size_t(list_groups * counters) * 4);
  plan.cursors_off = ws.take("kvm.cursors", size_t(list_groups * counters) * 4);
  plan.control_off = ws.take("kvm.control", size_t(list_groups) * sizeof(KvMajorControl));
  plan.items_off = ws.take("kvm.items", size_t(list_groups * max_items) * sizeof(KvMajorItem));
  plan.list_off = ws.take("kvm.list", size_t(list_groups * pairs) * 4);
  plan.part_o_off = ws.take("kvm.part_o", size_t(pairs) * group * 128 * 2);
  plan.part_lse_off = ws.take("kvm.part_lse", size_t(pairs) * group * 4);
  if (has_temp) plan.part_lse_t_off = ws.take("kvm.part_lse_t", size_t(pairs) * group * 4);
  const int tctas = with_tiles ? tile_ctas(p, facts) : 0;
  if (tctas > 0) {
    plan.tiles = true;
    plan.tile_tokens = kUnionRows / group;
    plan.num_tiles = int((int64_t(p.total_q) + plan.tile_tokens - 1) / plan.tile_tokens);
    plan.tile_max_entries = plan.tile_tokens * p.topk;
    const size_t tiles = size_t(p.num_kv_heads) * plan.num_tiles;
    // auto and tma: the TMA kernel where it runs (auto quietly, a forced tma names the reason in
    // the plan text), else cp_async.
    if (o.tile_kernel != TileKernel::kCpAsync) plan.tile_fallback = tile_tma_unsupported(p, facts);
    plan.tile_kernel = o.tile_kernel != TileKernel::kCpAsync && plan.tile_fallback == nullptr ? TileKernel::kTma
                                                                                              : TileKernel::kCpAsync;
    plan.tile_grid = (plan.tile_kernel == TileKernel::kTma ? facts.tile_tma_ctas : tctas) * facts.num_sms;
    plan.tile_max_waste_milli = o.tile_max_waste_milli > 0 ? o.tile_max_waste_milli
                                : plan.tile_kernel != TileKernel::kTma ? kUnionMaxWasteMilli
                                : p.total_q <= kUnionSmallRows  ? kUnionMaxWasteMilliSmall
                                                                : kUnionMaxWasteMilliTma;
    // tile_bound=adaptive: the wide bound 3.0 beside a lower one, decided on the device; auto takes
    // it with the TMA tiles' default bound from kUnionSmallRows + 1 to kUnionAdaptiveRows rows.
    const bool adaptive = o.tile_bound == TileBound::kAdaptive ||
                          (o.tile_bound == TileBound::kAuto && o.tile_max_waste_milli == 0 &&
                           plan.tile_kernel == TileKernel::kTma && p.total_q > kUnionSmallRows &&
                           p.total_q <= kUnionAdaptiveRows);
    plan.tile_wide_waste_milli = adaptive && plan.tile_max_waste_milli < kUnionMaxWasteMilliSmall
                                     ? kUnionMaxWasteMilliSmall
                                     : 0;
    plan.tile_done_off = ws.take("tile.done", tiles);
    plan.tile_count_off = ws.take("tile.count", tiles * 4);
    plan.tile_block_off = ws.take("tile.block", tiles * plan.tile_max_entries * 4);
    plan.tile_mask_off = ws.take("tile.mask", tiles * plan.tile_max_entries);
    plan.tile_work_off = ws.take("tile.work", tiles * 4);
    plan.tile_control_off = ws.take("tile.control", kUnionControlBytes);  // union_plan.cu's control words
  }
  return true;
}

void check_options(const SparseAttnOptions& o) {
  MSA_CHECK(o.chunk_rows >= 0, "chunk_rows must be positive (0: the default), got ", o.chunk_rows);
  MSA_CHECK(o.tile_max_waste_milli == 0 || (o.tile_max_waste_milli >= 1000 && o.tile_max_waste_milli <= 8000),
            "tile_max_waste must be a number from 1 to 8, got ", o.tile_max_waste_milli / 1000.0);
}

}  // namespace

SparseAttnPlan plan_sparse_attention(const SparseAttnParams& p, const SparseAttnOptions& o,
                                     const SparseAttnDeviceFacts& facts) {
  check_options(o);
  SparseAttnPlan plan;
  if (p.total_q <= 0) return plan;
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0,
            "msa_sparse_attention: num_qo_heads must be a multiple of num_kv_heads");
  const bool forced = o.schedule != PrefillSchedule::kAuto;
  const bool kv_major = forced ? o.schedule != PrefillSchedule::kQueryMajor : p.total_q >= kKvMajorMinRows;
  const bool with_tiles = !forced || o.schedule == PrefillSchedule::kHybrid;
  if (kv_major && plan_kv_major(p, o, facts, with_tiles, plan.kvm, plan.workspace)) {
    plan.schedule = plan.kvm.tiles ? PrefillSchedule::kHybrid : PrefillSchedule::kKvMajor;
    plan.bytes = plan.workspace.bytes;
    return plan;
  }
  MSA_CHECK_SUPPORTED(!(forced && kv_major), "schedule=", option_name(o.schedule),
                      ": the KV-major kernel does not fit this GPU's shared memory");
  plan.schedule = PrefillSchedule::kQueryMajor;
  plan.workspace = WorkspaceLayout{};
  plan.qm = plan_query_major(p, facts.num_sms, -1, compute_store_kind(p), plan.workspace);
  plan.bytes = plan.workspace.bytes;
  return plan;
}

SparseAttnPlan plan_sparse_decode(const SparseDecodeParams& dp, const SparseAttnDeviceFacts& facts,
                                  const SparseDecodeOptions& options) {
  const SparseAttnParams& p = dp.attn;
  SparseAttnPlan plan;
  if (p.total_q <= 0) return plan;
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0,
            "msa_sparse_decode_attention: num_qo_heads must be a multiple of num_kv_heads");
  StoreKind part_kind = compute_store_kind(p);
  switch (dp.partial_dtype) {
    case PartialDType::kFloat32: part_kind = StoreKind::kF32; break;
    case PartialDType::kBF16: part_kind = StoreKind::kBF16; break;
    case PartialDType::kFP16:
      if (p.v.dtype != DType::kBF16) part_kind = StoreKind::kF16;
      break;
    case PartialDType::kFP8E4M3:
      if (p.v.dtype == DType::kFP8E4M3) part_kind = StoreKind::kFP8;
      break;
    case PartialDType::kDefault: break;
  }
  // A split's partial output is a convex combination of V rows as the kernel reads them (before
  // v_scale / v_global_scale), so its dtype must hold their range, or it saturates (fp8, SATFINITE)
  // or overflows (fp16): fp8 e4m3 (|x| <= 448) holds fp8 V only, fp16 every V but bf16 (NVFP4
  // dequantizes to at most 6 x 448 = 2688). A partial_dtype that does not hold V's range gives way
  // to the compute dtype above (docs/semantics.md#decode); the fuzzer found NVFP4 V with fp8
  // partials off by 4x on the H200 (values above 448 clamped).
  plan.schedule = PrefillSchedule::kQueryMajor;
  plan.qm = plan_query_major(p, facts.num_sms, dp.force_fused, part_kind, plan.workspace, options, facts);
  plan.bytes = plan.workspace.bytes;
  return plan;
}

}  // namespace flashmsa

// describe(plan): the kernel and schedule of a call and the reason, in one line (plan_describe.h).
// The reasons restate the planners' rules (plan.cpp, sparse_attn/plan.cpp) from the plan they made,
// the call's params and the options it was given.
#include "flashmsa/plan_describe.h"

#include <sstream>
#include <string>

#include "sparse_attn/heuristics.h"

using flashmsa::sparse_attn::kKvMajorMinRows;

namespace flashmsa {

namespace {

const char* store_kind_name(StoreKind k) {
  switch (k) {
    case StoreKind::kF32: return "float32";
    case StoreKind::kBF16: return "bf16";
    case StoreKind::kF16: return "fp16";
    case StoreKind::kFP8: return "fp8";
  }
  return "?";
}

void query_major_details(std::ostringstream& s, const QueryMajorPlan& qm) {
  s << "; " << qm.warps_m << (qm.warps_m == 1 ? " warp" : " warps") << " per row tile, "
    << qm.row_tiles << " row tile(s) per (token, kv head)";
  if (qm.fused)
    s << "; fused: outputs written directly";
  else if (qm.cluster)
    s << "; split-K: " << qm.splits << " chunks per row, split=cluster (a cluster of " << qm.splits
      << " CTAs per row" << (qm.wide ? ", one per SM," : "") << " merges its " << store_kind_name(qm.part_kind)
      << " partials through distributed shared memory; no combine)";
  else
    s << "; split-K: " << qm.splits << " chunks per row, " << store_kind_name(qm.part_kind)
      << " partials + combine" << (qm.combine_with ? " (combine_loads=with: values loaded with the LSEs)" : "");
  if (qm.cluster_fallback != nullptr) s << " (split=cluster falls back to blocks: " << qm.cluster_fallback << ")";
  if (qm.wide)
    s << "; split_warps=8 (8 warps per CTA share each 128-key block, 16 keys each, and merge their "
         "states in warp order)";
  if (qm.split_warps_fallback != nullptr)
    s << " (split_warps=8 falls back to 4 warps: " << qm.split_warps_fallback << ")";
}

void workspace(std::ostringstream& s, size_t bytes) { s << "; workspace " << bytes << " bytes"; }

}  // namespace

std::string describe(const SparseAttnPlan& plan, const SparseAttnParams& p,
                     const SparseAttnOptions& o) {
  std::ostringstream s;
  if (p.total_q <= 0) return "no query rows: nothing runs";
  const bool forced = o.schedule != PrefillSchedule::kAuto;
  s << "schedule=" << option_name(plan.schedule) << " (";
  if (forced) {
    s << "forced by the option schedule=" << option_name(o.schedule);
  } else if (plan.schedule == PrefillSchedule::kQueryMajor) {
    if (p.total_q < kKvMajorMinRows)
      s << "auto: " << p.total_q << " rows < " << kKvMajorMinRows
        << ", a CTA per (token, kv head) fills the GPU";
    else
      s << "auto: no KV-major kernel fits this GPU's shared memory";
  } else {
    s << "auto: " << p.total_q << " rows >= " << kKvMajorMinRows;
    if (plan.schedule == PrefillSchedule::kKvMajor)
      s << "; no shared-selection tiles: the tile kernel needs an sm_90a build on an sm_90 GPU, "
           "G in {16, 32, 64, 128} and 16-bit or fp8 K/V";
  }
  s << ")";
  if (plan.schedule == PrefillSchedule::kQueryMajor) {
    query_major_details(s, plan.qm);
  } else {
    const KvMajorPlan& kvm = plan.kvm;
    if (kvm.tiles)
      s << "; shared-selection tiles of " << kvm.tile_tokens << " tokens (" << kvm.num_tiles
        << " per kv head) run first where the union of their selections is at most "
        << kvm.tile_max_waste_milli / 1000.0 << "x a token's";
    if (kvm.tiles && kvm.tile_wide_waste_milli > 0)
      s << " (tile_bound=" << (o.tile_bound == TileBound::kAuto ? "auto, adaptive at this size" : "adaptive")
        << ": " << kvm.tile_wide_waste_milli / 1000.0
        << "x where the tiles within it hold nearly all pairs)";
    if (kvm.tiles)
      s << ", KV-major for the other rows; tile_kernel=" << option_name(kvm.tile_kernel);
    if (kvm.tiles && kvm.tile_fallback != nullptr && o.tile_kernel == TileKernel::kTma)
      s << " (tile_kernel=tma falls back to cp_async: " << kvm.tile_fallback << ")";
    else if (kvm.tiles && kvm.tile_fallback != nullptr)
      s << " (auto: the TMA kernel cannot run: " << kvm.tile_fallback << ")";
    else if (kvm.tiles && o.tile_kernel != TileKernel::kAuto)
      s << " (forced by the option)";
    else if (kvm.tiles)
      s << " (auto: TMA loads, S of the next block in flight during the softmax)";
    s << "; kv_major_kernel=" << option_name(kvm.kernel) << " (";
    if (kvm.tma_fallback != nullptr)
      s << "kv_major_kernel=tma falls back: " << kvm.tma_fallback;
    else if (kvm.kernel == KvMajorKernel::kTma)
      s << "forced by the option: a TMA producer warp (the next item's K/V prefetched), two consumer "
           "warpgroups, S of the next tile in flight during the softmax, partials by TMA stores";
    else if (o.kv_major_kernel != KvMajorKernel::kAuto)
      s << "forced by the option kv_major_kernel=" << option_name(o.kv_major_kernel);
    else if (kvm.kernel == KvMajorKernel::kWgmma)
      s << "auto: the sm_90a warpgroup-MMA kernel runs on this GPU";
    else
      s << "auto: the sm_90a kernel cannot run here (needs an sm_90 GPU and an sm_90a build)";
    s << ", " << kvm.q_stages << " query-tile stage(s))";
    const bool store_forced = o.kv_major_store == KvMajorStore::kTma;
    if (kvm.tma_store)
      s << "; kv_major_store=tma (" << (store_forced ? "forced by the option" : "auto")
        << ": the partials by two TMA stores per warp and tile)";
    else if (kvm.store_fallback != nullptr && store_forced)
      s << "; kv_major_store=stg (kv_major_store=tma falls back: " << kvm.store_fallback << ")";
    else if (kvm.store_fallback != nullptr && kvm.kernel == KvMajorKernel::kWgmma)
      s << "; kv_major_store=stg (auto: " << kvm.store_fallback << ")";
    if (kvm.approx_math)
      s << "; kv_major_math=approx (" << (o.kv_major_math == KvMajorMath::kApprox ? "forced by the option" : "auto")
        << ": the row LSEs' log2 and 1 / l by MUFU approximations)";
    else if (o.kv_major_math == KvMajorMath::kPrecise && kvm.kernel == KvMajorKernel::kWgmma)
      s << "; kv_major_math=precise (forced by the option: the row LSEs' log2 and 1 / l correctly rounded)";
    else if (kvm.math_fallback != nullptr)
      s << "; kv_major_math=precise (kv_major_math=approx falls back: " << kvm.math_fallback << ")";
    s << "; " << kvm.groups << " launch group(s) of "
      << kvm.chunk_rows << " rows" << (o.chunk_rows > 0 ? " (chunk_rows option)" : "")
      << ", grid " << kvm.grid << " CTAs";
    if (kvm.lists == KvMajorLists::kOnce)
      s << "; lists=once (" << (o.lists == KvMajorLists::kOnce ? "forced by the option" : "auto")
        << ": the work lists of all " << kvm.groups << " group(s) in one count / scan / scatter, "
        << kvm.lists_once_bytes << " bytes)";
    else if (kvm.lists_fallback)
      s << "; lists=per_group (" << (o.lists == KvMajorLists::kOnce ? "lists=once falls back" : "auto")
        << ": the lists of all " << kvm.groups << " groups would take " << kvm.lists_once_bytes << " bytes > "
        << kKvMajorListsOnceBudget << ")";
    else if (o.lists == KvMajorLists::kPerGroup)
      s << "; lists=per_group (forced by the option)";
  }
  workspace(s, plan.bytes);
  return s.str();
}

std::string describe_decode(const SparseAttnPlan& plan, const SparseAttnParams& p) {
  if (p.total_q <= 0) return "no query rows: nothing runs";
  std::ostringstream s;
  if (plan.qm.mtp_tokens > 0)
    s << "schedule=query_major, mtp=union (a CTA per (request, kv head) streams the union of its "
      << plan.qm.mtp_tokens << " tokens' blocks once)";
  else
    s << "schedule=query_major (decode always: a CTA per (token, kv head) streams its blocks)";
  if (plan.qm.wgmma) {
    s << "; kernel=wgmma (sm_90a: TMA loads of each item's union blocks through a 3-stage K / V ring by "
         "a producer warp, one warpgroup's wgmma tiles of all 64 rows; a persistent grid of "
      << plan.qm.grid << " CTAs, one per SM)";
    if (plan.qm.wgmma_ahead)
      s << "; wgmma_pipe=ahead (a planner warp plans the next item and its K / V coordinates while a "
           "loader warp streams this one's blocks, K one block ahead of V)";
    if (plan.qm.wgmma_fp8)
      s << "; wgmma_fp8=on (fp8 K/V: each raw 16 KB K or V block by TMA into its ring stage, converted "
           "exactly in place into fp16 by a warpgroup of 4 converter warps; the MMAs and softmax in fp16, "
           "bf16 q scaled into fp16 per item)";
  } else if (plan.qm.wgmma_fallback != nullptr) {
    s << "; kernel=wgmma falls back to auto's kernel: " << plan.qm.wgmma_fallback;
  }
  if (plan.qm.regs && plan.qm.mtp_tokens > 0) {  // fp8 K/V only
    s << "; kernel=regs (the 4 warps split the keys of Q K^T and the head dims of P V over all "
         "rows, 2 stages of 32 KB; fp8 K/V converted in registers)";
  } else if (plan.qm.regs) {
    if (p.k.dtype == DType::kNVFP4)
      s << "; kernel=regs (5 stages at 2 CTAs per SM; NVFP4 K/V converted in registers"
        << (plan.qm.nvfp4_word ? ", nvfp4_cvt=word: a word of 8 codes at a time)" : ")");
    else if (p.k.dtype == DType::kFP8E4M3)
      s << "; kernel=regs (3 stages at 2 CTAs per SM; fp8 K/V converted in registers"
        << (plan.qm.regs_tma ? "; regs_feed=tma: each block's raw K and V loaded by one thread as two TMA "
                               "boxes, the warps waiting and releasing stages on mbarriers)"
                             : ")");
    else
      s << "; kernel=regs (3 stages at 2 CTAs per SM)";
  }
  if (plan.qm.regs_tma_fallback != nullptr)
    s << "; regs_feed=tma falls back to cp_async: " << plan.qm.regs_tma_fallback;
  if (plan.qm.wide && p.k.dtype == DType::kFP8E4M3)
    s << "; fp8 K/V converted in registers by the 8-warp kernel (16 keys a warp)";
  query_major_details(s, plan.qm);
  workspace(s, plan.bytes);
  return s.str();
}

std::string describe(const ProxyScorePlan& plan, const ProxyScoreOptions& o) {
  std::ostringstream s;
  // The kernel an option names (the _only forms keep it without a fallback).
  ProxyKernel named = o.kernel;
  if (named == ProxyKernel::kSm90Only || named == ProxyKernel::kSm90F16 || named == ProxyKernel::kSm90F16Only)
    named = ProxyKernel::kSm90;
  if (named == ProxyKernel::kSm90SsOnly) named = ProxyKernel::kSm90Ss;
  if (named == ProxyKernel::kDecodeOnly || named == ProxyKernel::kDecodeF16 ||
      named == ProxyKernel::kDecodeF16Only)
    named = ProxyKernel::kDecode;
  s << "kernel=" << option_name(plan.kernel) << " (";
  if (o.kernel == ProxyKernel::kAuto && plan.kernel == ProxyKernel::kDecode)
    s << "auto: short queries, at most " << kProxyDecodeAutoMaxRows
      << " rows (heads x max_seqlen_q) per request and KV head: the decode streaming kernel"
      << (plan.f16_mma ? ", fp16 MMAs for fp8 K" : "");
  else if (o.kernel == ProxyKernel::kAuto)
    s << "auto: the sm_90a TMA + wgmma kernel where it runs (an sm_90 GPU, 16-bit or fp8 q with K "
         "of its dtype, 16-bit q with fp8 K, or NVFP4 q and K; no reduce_heads), else the portable "
         "mma.sync kernel"
      << (plan.fp8_q ? "; fp16 MMAs for fp8 q and K (Q's raw bytes converted in registers)"
          : plan.f16_mma ? "; fp16 MMAs for fp8 K with bf16 q (Q in registers) or NVFP4 q and K (value x 2^-7)"
                         : "");
  else if (named == plan.kernel && plan.f16_mma && plan.kernel == ProxyKernel::kSm90)
    s << "forced by the option kernel=" << option_name(o.kernel)
      << "; fp16 MMAs for fp8 K with bf16 or fp8 q (Q in registers) and for NVFP4 q and K (other operands: "
         "as sm90)";
  else if (named == plan.kernel && plan.f16_mma)
    s << "forced by the option kernel=" << option_name(o.kernel) << "; fp16 MMAs for fp8 K";
  else if (named == plan.kernel)
    s << "forced by the option kernel=" << option_name(o.kernel);
  else
    s << "the option kernel=" << option_name(o.kernel) << " does not apply to this call";
  s << ")";
  if (plan.kernel == ProxyKernel::kDecode) {
    s << "; decode_ctas=" << plan.decode_ctas;
    if (o.decode_ctas != 0 && plan.decode_ctas != o.decode_ctas)
      s << " (the option decode_ctas does not apply to 16-bit K)";
    else if (o.decode_ctas != 0)
      s << " (forced: CTAs per SM)";
    else
      s << " (auto: CTAs per SM; fp8 K 3, NVFP4 4, 16-bit K 2)";
    s << "; decode_ilp=" << plan.decode_ilp
      << (o.decode_ilp != 0 ? " (forced: key blocks per iteration)" : " (auto: key blocks per iteration)");
    if (plan.nvfp4_word)
      s << "; nvfp4_cvt=word (" << (o.nvfp4_cvt == DecodeNvfp4Cvt::kWord ? "forced" : "auto")
        << ": NVFP4 K a word of 8 codes at a time)";
    if (plan.tma_nvfp4)
      s << "; decode_nvfp4=tma (" << (o.decode_nvfp4 == DecodeTma::kTma ? "forced" : "auto")
        << ": NVFP4 K by TMA, a warp per key block"
        << (plan.tma_cols == kProxyDecodeTmaMaxCols ? ", 16 query columns a pass" : "") << ", where it applies)";
    else if (plan.tma)
      s << "; decode_fp8=tma (" << (o.decode_fp8 == DecodeTma::kTma ? "forced" : "auto")
        << ": fp8 K by TMA, a warp per key block"
        << (plan.tma_cols == kProxyDecodeTmaMaxCols ? ", 16 query columns a pass" : "") << ", where it applies)";
    if (plan.tma_self_issue)
      s << "; decode_tma_issue=warps (" << (o.decode_tma_issue == DecodeTmaIssue::kWarps ? "forced" : "auto")
        << ": each consumer warp loads its own blocks)";
  }
  return s.str();
}

std::string describe(const TopkSelectPlan& plan, const TopkSelectParams& p,
                     const TopkSelectOptions& o, const TopkSelectDeviceFacts& facts) {
  std::ostringstream s;
  s << "kernel=" << option_name(plan.kernel) << " (";
  switch (o.kernel) {
    case TopkKernel::kAuto:
      s << "auto: ";
      if (plan.kernel == TopkKernel::kNet) {
        s << "net: rows choose <= " << kTopkNetMaxCarry << " of <= " << kTopkNetMaxSpan << " blocks";
        break;
      }
      s << "net does not run: " << topk_net_unsupported(p) << "; ";
      [[fallthrough]];
    case TopkKernel::kBySize: {
      const long long groups = (static_cast<long long>(p.num_tokens) + 31) / 32 * p.num_heads;
      const bool radix = plan.kernel == TopkKernel::kRadixUniform;
      s << "by_size: " << groups << " groups of 32 rows " << (radix ? ">=" : "<") << " "
        << kTopkRadixMinGroupsPerSm << " per SM x " << facts.num_sms << " SMs";
      if (!radix) {
        const long long rows = static_cast<long long>(p.num_tokens) * p.num_heads;
        s << ", " << rows << " rows " << (plan.kernel == TopkKernel::kWarpPerRow8 ? ">" : "<=") << " "
          << kTopkSplitMaxRowsPerSm << " per SM";
      }
      break;
    }
    default:
      s << "forced by the option kernel=" << option_name(o.kernel);
      if (plan.net_fallback != nullptr) s << ", which falls back: " << plan.net_fallback;
      break;
  }
  s << "); " << p.num_tokens << " tokens x " << p.num_heads << " heads over " << p.num_blocks
    << " blocks, top-" << p.topk;
  if (plan.kernel == TopkKernel::kNet) {
    s << "; " << plan.net_lanes << (plan.net_lanes == 1 ? " lane" : " lanes") << " per row, "
      << plan.net_words << " words per lane";
    if (plan.net_pivot > 0) {
      s << "; a pivot first ("
        << (o.net_pivot == TopkNetPivot::kOn ? "net_pivot=on" : "net_pivot auto: a decode-sized call")
        << "): " << plan.net_pivot << " scores a lane, the networks where more than 32 survive";
      const bool forced = o.net_pivot_mode != TopkPivotMode::kAuto;
      if (plan.net_pivot_mode == TopkPivotMode::kRankCta) {
        s << "; a CTA of 4 warps a row (" << plan.net_pivot / 4 << " of those scores each), ordered by counting ("
          << (forced ? "net_pivot_mode=rank_cta" : "net_pivot_mode auto") << ")";
      } else {
        s << "; a warp a row, ordered by sorts (" << (forced ? "net_pivot_mode=sort" : "net_pivot_mode auto") << ")";
      }
    } else if (plan.net_pivot_fallback != nullptr) {
      s << "; net_pivot=on does not apply: " << plan.net_pivot_fallback;
    }
  }
  if (plan.kernel == TopkKernel::kWarpDigits) {
    s << (p.num_blocks <= kTopkDigitsChunk
              ? "; every row one chunk: thresholds by 8-bit digits, a warp per CTA"
              : "; rows of one chunk by 8-bit digits, longer ones as warp_split");
  }
  return s.str();
}

}  // namespace flashmsa

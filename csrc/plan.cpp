// Option parsing, the workspace layout and the small planners (proxy score, top-k) of plan.h. The
// attention planner is sparse_attn/plan.cpp.
#include "flashmsa/plan.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "flashmsa/error.h"

namespace flashmsa {

namespace {

template <typename E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<PrefillSchedule> kSchedules[] = {{PrefillSchedule::kAuto, "auto"},
                                                 {PrefillSchedule::kQueryMajor, "query_major"},
                                                 {PrefillSchedule::kKvMajor, "kv_major"},
                                                 {PrefillSchedule::kHybrid, "hybrid"}};
constexpr Named<KvMajorKernel> kKvMajorKernels[] = {{KvMajorKernel::kAuto, "auto"},
                                                    {KvMajorKernel::kMmaSync, "mma_sync"},
                                                    {KvMajorKernel::kWgmma, "wgmma"},
                                                    {KvMajorKernel::kTma, "tma"}};
constexpr Named<KvMajorStore> kKvMajorStores[] = {
    {KvMajorStore::kAuto, "auto"}, {KvMajorStore::kStg, "stg"}, {KvMajorStore::kTma, "tma"}};
constexpr Named<KvMajorMath> kKvMajorMaths[] = {
    {KvMajorMath::kAuto, "auto"}, {KvMajorMath::kPrecise, "precise"}, {KvMajorMath::kApprox, "approx"}};
constexpr Named<TileKernel> kTileKernels[] = {
    {TileKernel::kAuto, "auto"}, {TileKernel::kCpAsync, "cp_async"}, {TileKernel::kTma, "tma"}};
constexpr Named<TileBound> kTileBounds[] = {
    {TileBound::kAuto, "auto"}, {TileBound::kFixed, "fixed"}, {TileBound::kAdaptive, "adaptive"}};
constexpr Named<KvMajorLists> kKvMajorListsNames[] = {
    {KvMajorLists::kAuto, "auto"}, {KvMajorLists::kPerGroup, "per_group"}, {KvMajorLists::kOnce, "once"}};
constexpr Named<ProxyKernel> kProxyKernels[] = {
    {ProxyKernel::kAuto, "auto"},      {ProxyKernel::kMmaSync, "mma_sync"},
    {ProxyKernel::kSm90, "sm90"},      {ProxyKernel::kSm90Only, "sm90_only"},
    {ProxyKernel::kSm90Ss, "sm90_ss"}, {ProxyKernel::kSm90SsOnly, "sm90_ss_only"},
    {ProxyKernel::kDecode, "decode"},  {ProxyKernel::kDecodeOnly, "decode_only"},
    {ProxyKernel::kDecodeF16, "decode_f16"}, {ProxyKernel::kDecodeF16Only, "decode_f16_only"},
    {ProxyKernel::kSm90F16, "sm90_f16"},     {ProxyKernel::kSm90F16Only, "sm90_f16_only"}};
constexpr Named<TopkKernel> kTopkKernels[] = {{TopkKernel::kAuto, "auto"},
                                              {TopkKernel::kWarpPerRow, "warp_per_row"},
                                              {TopkKernel::kWarpPerRow8, "warp_per_row_8"},
                                              {TopkKernel::kRadix, "radix"},
                                              {TopkKernel::kBySize, "by_size"},
                                              {TopkKernel::kRadix1Buf, "radix_1buf"},
                                              {TopkKernel::kWarpSplit, "warp_split"},
                                              {TopkKernel::kRadixUniform, "radix_uniform"},
                                              {TopkKernel::kWarpDigits, "warp_digits"},
                                              {TopkKernel::kNet, "net"}};

constexpr Named<DecodeKernel> kDecodeKernels[] = {{DecodeKernel::kAuto, "auto"},
                                                 {DecodeKernel::kSmem, "smem"},
                                                 {DecodeKernel::kRegs, "regs"},
                                                 {DecodeKernel::kWgmma, "wgmma"}};

constexpr Named<int> kDecodeCtas[] = {{0, "auto"}, {2, "2"}, {3, "3"}, {4, "4"}};
constexpr Named<int> kDecodeIlp[] = {{0, "auto"}, {1, "1"}, {2, "2"}};
constexpr Named<int> kNetLanes[] = {{0, "auto"}, {1, "1"},   {2, "2"},  {4, "4"},
                                    {8, "8"},    {16, "16"}, {32, "32"}};

constexpr Named<TopkNetPivot> kNetPivots[] = {
    {TopkNetPivot::kAuto, "auto"}, {TopkNetPivot::kOff, "off"}, {TopkNetPivot::kOn, "on"}};
constexpr Named<TopkPivotMode> kPivotModes[] = {{TopkPivotMode::kAuto, "auto"},
                                                {TopkPivotMode::kSort, "sort"},
                                                {TopkPivotMode::kRankCta, "rank_cta"}};

constexpr Named<DecodeMtp> kDecodeMtps[] = {{DecodeMtp::kAuto, "auto"},
                                            {DecodeMtp::kPerToken, "per_token"},
                                            {DecodeMtp::kUnion, "union"}};

constexpr Named<DecodeNvfp4Cvt> kDecodeNvfp4Cvts[] = {{DecodeNvfp4Cvt::kAuto, "auto"},
                                                     {DecodeNvfp4Cvt::kByte, "byte"},
                                                     {DecodeNvfp4Cvt::kWord, "word"}};
constexpr Named<DecodeTma> kDecodeTmas[] = {{DecodeTma::kAuto, "auto"}, {DecodeTma::kCta, "cta"}, {DecodeTma::kTma, "tma"}};
constexpr Named<DecodeTmaIssue> kDecodeTmaIssues[] = {
    {DecodeTmaIssue::kAuto, "auto"}, {DecodeTmaIssue::kProducer, "producer"}, {DecodeTmaIssue::kWarps, "warps"}};
constexpr Named<DecodeSplit> kDecodeSplits[] = {{DecodeSplit::kAuto, "auto"},
                                               {DecodeSplit::kBlocks, "blocks"},
                                               {DecodeSplit::kCluster, "cluster"}};
constexpr Named<DecodeSplitWarps> kDecodeSplitWarps[] = {
    {DecodeSplitWarps::kAuto, "auto"}, {DecodeSplitWarps::k4, "4"}, {DecodeSplitWarps::k8, "8"}};
constexpr Named<DecodeCombineLoads> kDecodeCombineLoads[] = {
    {DecodeCombineLoads::kAuto, "auto"}, {DecodeCombineLoads::kAfter, "after"}, {DecodeCombineLoads::kWith, "with"}};
constexpr Named<DecodeSplitRule> kDecodeSplitRules[] = {
    {DecodeSplitRule::kAuto, "auto"}, {DecodeSplitRule::kCeil, "ceil"}, {DecodeSplitRule::kWaves, "waves"}};
constexpr Named<DecodeWgmmaPipe> kDecodeWgmmaPipes[] = {
    {DecodeWgmmaPipe::kAuto, "auto"}, {DecodeWgmmaPipe::kInline, "inline"}, {DecodeWgmmaPipe::kAhead, "ahead"}};
constexpr Named<DecodeWgmmaFp8> kDecodeWgmmaFp8s[] = {
    {DecodeWgmmaFp8::kAuto, "auto"}, {DecodeWgmmaFp8::kOff, "off"}, {DecodeWgmmaFp8::kOn, "on"}};
constexpr Named<DecodeRegsFeed> kDecodeRegsFeeds[] = {
    {DecodeRegsFeed::kAuto, "auto"}, {DecodeRegsFeed::kCpAsync, "cp_async"}, {DecodeRegsFeed::kTma, "tma"}};

template <typename E, size_t N>
const char* name_of(const Named<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <typename E, size_t N>
E parse_enum(const Named<E> (&table)[N], std::string_view option, std::string_view value) {
  std::string names;
  for (size_t i = 0; i < N; ++i) {
    if (value == table[i].name) return table[i].value;
    names += i == 0 ? "" : (i + 1 == N ? " or " : ", ");
    names += table[i].name;
  }
  MSA_FAIL(option, " must be ", names, ", got '", value, "'");
}

int64_t parse_positive_int(std::string_view option, std::string_view value) {
  const std::string s(value);
  char* end = nullptr;
  errno = 0;
  const long long v = s.empty() ? 0 : std::strtoll(s.c_str(), &end, 10);
  MSA_CHECK(!s.empty() && errno == 0 && *end == '\0' && v > 0 && v <= INT32_MAX, option,
            " must be a positive integer, got '", value, "'");
  return v;
}

// A number x in [lo, hi], returned as round(x * 1000).
int parse_milli(std::string_view option, std::string_view value, double lo, double hi) {
  const std::string s(value);
  char* end = nullptr;
  const double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
  MSA_CHECK(!s.empty() && *end == '\0' && v >= lo && v <= hi, option, " must be a number from ", lo,
            " to ", hi, ", got '", value, "'");
  return int(std::lround(v * 1000.0));
}

// Calls set(name, value) for every "name=value" of a comma-separated list; empty text is no option.
template <typename Set>
void for_each_option(const char* op, std::string_view text, Set&& set) {
  std::string seen = ",";
  for (bool more = !text.empty(); more;) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    more = comma != std::string_view::npos;
    if (more) text = text.substr(comma + 1);
    const size_t eq = item.find('=');
    MSA_CHECK(eq != std::string_view::npos && eq > 0, op, ": plan options are name=value pairs "
              "separated by commas, got '", item, "'");
    const std::string_view name = item.substr(0, eq);
    const std::string key = std::string(name) + ",";
    MSA_CHECK(seen.find("," + key) == std::string::npos, op, ": option ", name, " given twice");
    seen += key;
    set(name, item.substr(eq + 1));
  }
}

}  // namespace

size_t WorkspaceLayout::take(const char* name, size_t n) {
  MSA_CHECK(num_sections < kMaxWorkspaceSections, "workspace layout: more than ",
            kMaxWorkspaceSections, " sections");
  const size_t off = bytes;
  sections[num_sections++] = WorkspaceSection{name, off, n};
  bytes += (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  return off;
}

const char* option_name(PrefillSchedule v) { return name_of(kSchedules, v); }
const char* option_name(KvMajorKernel v) { return name_of(kKvMajorKernels, v); }
const char* option_name(KvMajorStore v) { return name_of(kKvMajorStores, v); }
const char* option_name(KvMajorMath v) { return name_of(kKvMajorMaths, v); }
const char* option_name(TileKernel v) { return name_of(kTileKernels, v); }
const char* option_name(TileBound v) { return name_of(kTileBounds, v); }
const char* option_name(KvMajorLists v) { return name_of(kKvMajorListsNames, v); }
const char* option_name(ProxyKernel v) { return name_of(kProxyKernels, v); }
const char* option_name(TopkKernel v) { return name_of(kTopkKernels, v); }
const char* option_name(TopkPivotMode v) { return name_of(kPivotModes, v); }
const char* option_name(DecodeKernel v) { return name_of(kDecodeKernels, v); }
const char* option_name(DecodeMtp v) { return name_of(kDecodeMtps, v); }
const char* option_name(DecodeNvfp4Cvt v) { return name_of(kDecodeNvfp4Cvts, v); }
const char* option_name(DecodeTma v) { return name_of(kDecodeTmas, v); }
const char* option_name(DecodeTmaIssue v) { return name_of(kDecodeTmaIssues, v); }
const char* option_name(DecodeSplit v) { return name_of(kDecodeSplits, v); }
const char* option_name(DecodeWgmmaPipe v) { return name_of(kDecodeWgmmaPipes, v); }
const char* option_name(DecodeWgmmaFp8 v) { return name_of(kDecodeWgmmaFp8s, v); }
const char* option_name(DecodeSplitWarps v) { return name_of(kDecodeSplitWarps, v); }
const char* option_name(DecodeSplitRule v) { return name_of(kDecodeSplitRules, v); }
const char* option_name(DecodeCombineLoads v) { return name_of(kDecodeCombineLoads, v); }
const char* option_name(DecodeRegsFeed v) { return name_of(kDecodeRegsFeeds, v); }

SparseDecodeOptions parse_sparse_decode_options(std::string_view text) {
  SparseDecodeOptions o;
  for_each_option("msa_sparse_decode_attention", text, [&](std::string_view name, std::string_view value) {
    if (name == "kernel") {
      o.kernel = parse_enum(kDecodeKernels, name, value);
    } else if (name == "mtp") {
      o.mtp = parse_enum(kDecodeMtps, name, value);
    } else if (name == "nvfp4_cvt") {
      o.nvfp4_cvt = parse_enum(kDecodeNvfp4Cvts, name, value);
    } else if (name == "split") {
      o.split = parse_enum(kDecodeSplits, name, value);
    } else if (name == "wgmma_pipe") {
      o.wgmma_pipe = parse_enum(kDecodeWgmmaPipes, name, value);
    } else if (name == "wgmma_fp8") {
      o.wgmma_fp8 = parse_enum(kDecodeWgmmaFp8s, name, value);
    } else if (name == "split_warps") {
      o.split_warps = parse_enum(kDecodeSplitWarps, name, value);
    } else if (name == "split_rule") {
      o.split_rule = parse_enum(kDecodeSplitRules, name, value);
    } else if (name == "combine_loads") {
      o.combine_loads = parse_enum(kDecodeCombineLoads, name, value);
    } else if (name == "regs_feed") {
      o.regs_feed = parse_enum(kDecodeRegsFeeds, name, value);
    } else {
      MSA_FAIL("msa_sparse_decode_attention: unknown plan option '", name,
               "' (options: kernel, mtp, nvfp4_cvt, split, wgmma_fp8, wgmma_pipe, split_warps, split_rule, "
               "combine_loads, regs_feed)");
    }
  });
  return o;
}

SparseAttnOptions parse_sparse_attention_options(std::string_view text) {
  SparseAttnOptions o;
  for_each_option("msa_sparse_attention", text, [&](std::string_view name, std::string_view value) {
    if (name == "schedule") {
      o.schedule = parse_enum(kSchedules, name, value);
    } else if (name == "kv_major_kernel") {
      o.kv_major_kernel = parse_enum(kKvMajorKernels, name, value);
    } else if (name == "chunk_rows") {
      o.chunk_rows = parse_positive_int(name, value);
    } else if (name == "tile_max_waste") {
      o.tile_max_waste_milli = parse_milli(name, value, 1.0, 8.0);
    } else if (name == "tile_kernel") {
      o.tile_kernel = parse_enum(kTileKernels, name, value);
    } else if (name == "lists") {
      o.lists = parse_enum(kKvMajorListsNames, name, value);
    } else if (name == "tile_bound") {
      o.tile_bound = parse_enum(kTileBounds, name, value);
    } else if (name == "kv_major_store") {
      o.kv_major_store = parse_enum(kKvMajorStores, name, value);
    } else if (name == "kv_major_math") {
      o.kv_major_math = parse_enum(kKvMajorMaths, name, value);
    } else {
      MSA_FAIL("msa_sparse_attention: unknown plan option '", name,
               "' (options: schedule, kv_major_kernel, chunk_rows, tile_max_waste, tile_kernel, lists, "
               "tile_bound, kv_major_store, kv_major_math)");
    }
  });
  return o;
}

ProxyScoreOptions parse_proxy_score_options(std::string_view text) {
  ProxyScoreOptions o;
  for_each_option("msa_proxy_score", text, [&](std::string_view name, std::string_view value) {
    if (name == "kernel") {
      o.kernel = parse_enum(kProxyKernels, name, value);
    } else if (name == "decode_ctas") {
      o.decode_ctas = parse_enum(kDecodeCtas, name, value);
    } else if (name == "decode_ilp") {
      o.decode_ilp = parse_enum(kDecodeIlp, name, value);
    } else if (name == "nvfp4_cvt") {
      o.nvfp4_cvt = parse_enum(kDecodeNvfp4Cvts, name, value);
    } else if (name == "decode_fp8") {
      o.decode_fp8 = parse_enum(kDecodeTmas, name, value);
    } else if (name == "decode_nvfp4") {
      o.decode_nvfp4 = parse_enum(kDecodeTmas, name, value);
    } else if (name == "decode_tma_issue") {
      o.decode_tma_issue = parse_enum(kDecodeTmaIssues, name, value);
    } else {
      MSA_FAIL("msa_proxy_score: unknown plan option '", name,
               "' (options: kernel, decode_ctas, decode_ilp, nvfp4_cvt, decode_fp8, decode_nvfp4, decode_tma_issue)");
    }
  });
  return o;
}

TopkSelectOptions parse_topk_select_options(std::string_view text) {
  TopkSelectOptions o;
  for_each_option("msa_topk_select", text, [&](std::string_view name, std::string_view value) {
    if (name == "kernel") {
      o.kernel = parse_enum(kTopkKernels, name, value);
    } else if (name == "net_lanes") {
      o.net_lanes = parse_enum(kNetLanes, name, value);
    } else if (name == "net_pivot") {
      o.net_pivot = parse_enum(kNetPivots, name, value);
    } else if (name == "net_pivot_mode") {
      o.net_pivot_mode = parse_enum(kPivotModes, name, value);
    } else {
      MSA_FAIL("msa_topk_select: unknown plan option '", name,
               "' (options: kernel, net_lanes, net_pivot, net_pivot_mode)");
    }
  });
  return o;
}

bool proxy_decode_runs(const ProxyScoreParams& p) {
  if (p.num_kv_heads <= 0 || p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0) return false;
  if (p.num_heads / p.num_kv_heads > 16) return false;
  if (p.reduce_heads && p.num_kv_heads != 1) return false;
  return (p.q_dtype == DType::kNVFP4) == (p.k.dtype == DType::kNVFP4);
}

bool proxy_auto_takes_decode(const ProxyScoreParams& p) {
  if (!proxy_decode_runs(p)) return false;
  const int64_t group = p.num_heads / p.num_kv_heads;
  return group * std::max(p.qi.max_seqlen_q, 1) <= kProxyDecodeAutoMaxRows;
}

ProxyScorePlan plan_proxy_score(const ProxyScoreParams& p, const ProxyScoreOptions& options) {
  ProxyScorePlan plan;
  switch (options.kernel) {
    case ProxyKernel::kAuto:
      plan.kernel = proxy_auto_takes_decode(p) ? ProxyKernel::kDecode : ProxyKernel::kSm90;
      // fp8 K: fp16 MMAs, on the decode kernel (bit-identical to the bf16 MMAs and faster on the
      // H200 at 1aad2ee: B64/32K 105 vs 125 us) and on the sm_90a kernel with bf16 q (its
      // launcher; bit-identical and faster at b66f97b: 32K prefill 874.8 vs 1067.6 us); NVFP4 q
      // and K on the sm_90a kernel's fp16 MMAs (value x 2^-7; H200 at 5cb9800: 32K prefill 1352.0
      // vs 1805.0 us; the decode kernel runs NVFP4 on fp16 MMAs whatever the flag).
      plan.f16_mma = p.k.dtype == DType::kFP8E4M3 ||
                     (p.k.dtype == DType::kNVFP4 && plan.kernel == ProxyKernel::kSm90);
      // fp8 q with fp8 K on the sm_90a kernel (Q's raw bytes by TMA, converted exactly in
      // registers; bit for bit the bf16 upcasts on its bf16 MMAs): H200 at 831d3e5, 32K prefill
      // 854.3 vs 1736.5 us on mma.sync (H100 at e5d3136: 836.1 vs 1724.0).
      plan.fp8_q = plan.kernel == ProxyKernel::kSm90 && p.q_dtype == DType::kFP8E4M3 &&
                   p.k.dtype == DType::kFP8E4M3;
      break;
    case ProxyKernel::kMmaSync: plan.kernel = ProxyKernel::kMmaSync; break;
    case ProxyKernel::kSm90: plan = {ProxyKernel::kSm90, false}; break;
    case ProxyKernel::kSm90Only: plan = {ProxyKernel::kSm90, true}; break;
    case ProxyKernel::kSm90Ss: plan = {ProxyKernel::kSm90Ss, false}; break;
    case ProxyKernel::kSm90SsOnly: plan = {ProxyKernel::kSm90Ss, true}; break;
    case ProxyKernel::kDecode:
      // Calls the decode kernel does not run take mma_sync; decode_only keeps the kernel and its
      // launcher refuses them (NotImplementedError).
      plan.kernel = proxy_decode_runs(p) ? ProxyKernel::kDecode : ProxyKernel::kMmaSync;
      break;
    case ProxyKernel::kDecodeOnly: plan = {ProxyKernel::kDecode, true}; break;
    case ProxyKernel::kDecodeF16:
      plan.kernel = proxy_decode_runs(p) ? ProxyKernel::kDecode : ProxyKernel::kMmaSync;
      plan.f16_mma = plan.kernel == ProxyKernel::kDecode;
      break;
    case ProxyKernel::kDecodeF16Only: plan = {ProxyKernel::kDecode, true, true}; break;
    case ProxyKernel::kSm90F16: plan = {ProxyKernel::kSm90, false, true, true}; break;
    case ProxyKernel::kSm90F16Only: plan = {ProxyKernel::kSm90, true, true, true}; break;
  }
  // CTAs per SM of the decode kernel for fp8 / NVFP4 K: the option, else 3 for fp8 and 4 for NVFP4
  // (H200 at b1fafdd, B64/32K: fp8 87.5 us at 3, 88.2 at 4, 105.0 at 2; NVFP4 119.6 at 4, 122.8 at
  // 3, 145.5 at 2; batch 1 unchanged). 16-bit K: 2 (3 stages of 32 KB; 89 % of copy).
  if (p.k.dtype == DType::kFP8E4M3)
    plan.decode_ctas = options.decode_ctas != 0 ? options.decode_ctas : 3;
  else if (p.k.dtype == DType::kNVFP4)
    plan.decode_ctas = options.decode_ctas != 0 ? options.decode_ctas : 4;
  // Key blocks per decode-kernel iteration: the option, else 2 for fp8 K from kProxyDecodeIlpMinBatch
  // requests on and 1 otherwise (H200, 32K context, fp8: B64 84.4 vs 87.4 us at f4fdc62, 78.2 vs
  // 81.5 at a1af6c4; B1 10.4 vs 8.9 us at a1af6c4, where a CTA holds about one block and no pair
  // forms; bf16 and NVFP4 within the noise at B64, slower at B1).
  plan.decode_ilp = options.decode_ilp != 0 ? options.decode_ilp
                    : (p.k.dtype == DType::kFP8E4M3 && p.batch >= kProxyDecodeIlpMinBatch) ? 2
                                                                                           : 1;
  // NVFP4 K on the decode kernel: a word (8 codes) at a time unless nvfp4_cvt=byte (H200 at
  // 27436c2: B64 / 32K 103.5 vs 118.2 us, B1 10.3 vs 11.2 us; docs/design/proxy_score.md, "NVFP4 a
  // word at a time").
  plan.nvfp4_word = plan.kernel == ProxyKernel::kDecode && p.k.dtype == DType::kNVFP4 &&
                    options.nvfp4_cvt != DecodeNvfp4Cvt::kByte;
  // fp8 K on the decode kernel: the TMA-fed warp-per-block kernel where forced, and for auto at any
  // batch when a request's rows (G x max_seqlen_q) fit one pass of it; else the CTA-wide cp.async
  // ring (H200, 32K context, fp8 K: at 054c9ce B64 sq 1 74.5 vs 81.2 us, B1 9.2 vs 8.9; at 3cebf5e
  // B64 sq 4, one 16-column pass, 78.2 vs 85.5 us, where two 8-column passes were 115.5 vs 88.4 at
  // 054c9ce; from 16 requests on until the page ids were read beside the lengths and each
  // request's Q before its first block's wait, after which B1 took 8.2 vs 9.2 us at 32K and 11.3
  // vs 14.5 at 128K; docs/design/proxy_score.md, "fp8 K through TMA, a warp per block"). Its
  // passes cover 8 columns where the rows fit them, else 16 (one conversion of each K fragment
  // for two MMAs). Where the kernel cannot run (not sm_90a, reduce_heads) the launcher takes the
  // cp.async ring.
  const int64_t group = p.num_heads / std::max(p.num_kv_heads, 1);
  const int64_t cols = group * std::max(p.qi.max_seqlen_q, 1);
  const bool fits8 = cols <= kProxyDecodeTmaCols;
  const bool auto_tma = options.decode_fp8 == DecodeTma::kAuto && p.batch >= 1 && cols <= kProxyDecodeTmaMaxCols;
  // NVFP4 K (decode_nvfp4): the TMA kernel where forced, and for auto at any batch where a request's
  // rows fit one pass of it (H200 at 900266d, 32K context: B64 sq 1 67.6 vs 104.1 us, sq 4 74.7 vs
  // 104.7, B1 9.8 vs 10.8; docs/design/proxy_score.md, "NVFP4 K through TMA").
  const bool fp8_tma = p.k.dtype == DType::kFP8E4M3 && (options.decode_fp8 == DecodeTma::kTma || auto_tma);
  const bool nvfp4_tma = p.k.dtype == DType::kNVFP4 &&
                         (options.decode_nvfp4 == DecodeTma::kTma ||
                          (options.decode_nvfp4 == DecodeTma::kAuto && cols <= kProxyDecodeTmaMaxCols));
  plan.tma = plan.kernel == ProxyKernel::kDecode && (fp8_tma || nvfp4_tma);
  plan.tma_nvfp4 = plan.tma && nvfp4_tma;
  // Loads issued by each consumer warp for itself: forced, or auto's for NVFP4 K above
  // kProxyDecodeTmaProducerMaxUnits units (H200 at 9738086, B64 / 32K: sq 1 55.8 vs 73.4 us, sq 4
  // 68.3 vs 79.0; the producer warp below them, plan.h); fp8 K keeps the producer warp under auto
  // (72.3 vs 71.4 us, 78.8 vs 77.3 at sq 4: its stream is near copy speed already).
  const int64_t units = proxy_decode_units(p);
  plan.tma_self_issue = plan.tma && (options.decode_tma_issue == DecodeTmaIssue::kWarps ||
                                     (options.decode_tma_issue == DecodeTmaIssue::kAuto && plan.tma_nvfp4 &&
                                      units > kProxyDecodeTmaProducerMaxUnits));
  plan.tma_cols = plan.tma && !fits8 ? kProxyDecodeTmaMaxCols : kProxyDecodeTmaCols;
  return plan;
}

const char* topk_net_unsupported(const TopkSelectParams& p) {
  if (topk_carry(p) > kTopkNetMaxCarry)
    return "rows choose more than 31 blocks (topk - force_begin - force_end)";
  if (p.num_blocks > kTopkNetMaxSpan) return "more than 32768 blocks per row";
  return nullptr;
}

const char* topk_net_pivot_unsupported(const TopkSelectParams& p) {
  if (topk_carry(p) >= 16) return "rows choose more than 15 blocks";
  if (p.num_blocks > kTopkNetPivotMaxSpan) return "more than 1024 blocks per row";
  return nullptr;
}

int topk_net_lanes(const TopkSelectParams& p, int num_sms) {
  const int64_t rows = int64_t(p.num_tokens) * int64_t(p.num_heads);
  const int64_t want = int64_t(kTopkNetMinWarpsPerSm) * num_sms * 32;  // lanes
  int lanes = 1;
  while (lanes < 32 && rows * lanes < want && 16 * (2 * lanes) <= p.num_blocks) lanes *= 2;
  return lanes;
}

namespace {

TopkKernel topk_by_size(const TopkSelectParams& p, const TopkSelectDeviceFacts& facts) {
  const int64_t groups = (int64_t(p.num_tokens) + 31) / 32 * int64_t(p.num_heads);
  const int64_t rows = int64_t(p.num_tokens) * int64_t(p.num_heads);
  return groups >= int64_t(kTopkRadixMinGroupsPerSm) * facts.num_sms ? TopkKernel::kRadixUniform
         : rows <= int64_t(kTopkSplitMaxRowsPerSm) * facts.num_sms
             ? (p.num_blocks <= kTopkDigitsChunk ? TopkKernel::kWarpDigits : TopkKernel::kWarpSplit)
             : TopkKernel::kWarpPerRow8;
}

}  // namespace

TopkSelectPlan plan_topk_select(const TopkSelectParams& p, const TopkSelectOptions& options,
                                const TopkSelectDeviceFacts& facts) {
  MSA_CHECK(options.net_pivot != TopkNetPivot::kOff || options.net_pivot_mode == TopkPivotMode::kAuto,
            "msa_topk_select: net_pivot_mode=", option_name(options.net_pivot_mode),
            " orders the pivot path, which net_pivot=off turns off");
  TopkSelectPlan plan;
  switch (options.kernel) {
    case TopkKernel::kWarpPerRow: plan.kernel = TopkKernel::kWarpPerRow; break;
    case TopkKernel::kWarpPerRow8: plan.kernel = TopkKernel::kWarpPerRow8; break;
    case TopkKernel::kRadix: plan.kernel = TopkKernel::kRadix; break;
    case TopkKernel::kRadix1Buf: plan.kernel = TopkKernel::kRadix1Buf; break;
    case TopkKernel::kWarpSplit: plan.kernel = TopkKernel::kWarpSplit; break;
    case TopkKernel::kRadixUniform: plan.kernel = TopkKernel::kRadixUniform; break;
    case TopkKernel::kWarpDigits: plan.kernel = TopkKernel::kWarpDigits; break;
    case TopkKernel::kNet:
      plan.net_fallback = topk_net_unsupported(p);
      plan.kernel = plan.net_fallback == nullptr ? TopkKernel::kNet : topk_by_size(p, facts);
      break;
    // auto: net where it runs (H200 at 3488394: prefill 32K 69.8 vs 86.4 us, 4 x 128K x 1024
    // 459.8 vs 869.6 us, B1 / 128K 1 x 4 x 1024 8.5 vs 10.4 us, 64 x 4 x 256 8.2 vs 8.5 us, against
    // by_size), else by_size.
    case TopkKernel::kAuto:
      plan.kernel = topk_net_unsupported(p) == nullptr ? TopkKernel::kNet : topk_by_size(p, facts);
      break;
    case TopkKernel::kBySize: plan.kernel = topk_by_size(p, facts); break;
  }
  if (plan.kernel == TopkKernel::kNet) {
    plan.net_lanes = options.net_lanes > 0 ? options.net_lanes : topk_net_lanes(p, facts.num_sms);
    plan.net_words = topk_carry(p) < 16 ? 16 : 32;
    // net_pivot: forced on where it applies (else the plan text says why); auto on for
    // decode-sized calls, those the lanes rule gives >= kTopkNetPivotMinLanes lanes a row (not a
    // forced net_lanes); H200 at dda49c5 (TopkNetPivot).
    bool pivot = false;
    if (options.net_pivot == TopkNetPivot::kOn) {
      MSA_CHECK(options.net_lanes == 0 || options.net_lanes == 32,
                "msa_topk_select: net_pivot=on runs 32 lanes per row, got net_lanes=",
                options.net_lanes);
      plan.net_pivot_fallback = topk_net_pivot_unsupported(p);
      pivot = plan.net_pivot_fallback == nullptr;
    } else if (options.net_pivot == TopkNetPivot::kAuto) {
      pivot = options.net_lanes == 0 && plan.net_lanes >= kTopkNetPivotMinLanes &&
              topk_net_pivot_unsupported(p) == nullptr;
    }
    if (pivot) {
      plan.net_lanes = 32;
      plan.net_pivot = p.num_blocks <= 256 ? 8 : p.num_blocks <= 512 ? 16 : 32;
      // auto: rank_cta from 16 scores a lane, sort at 8 (TopkPivotMode; H200 at 0e3ed29 / 9903d0a).
      plan.net_pivot_mode = options.net_pivot_mode != TopkPivotMode::kAuto ? options.net_pivot_mode
                            : plan.net_pivot >= kTopkPivotCtaMinSlots      ? TopkPivotMode::kRankCta
                                                                           : TopkPivotMode::kSort;
    }
  }
  return plan;
}

}  // namespace flashmsa

// describe(plan) (include/flashmsa/plan_describe.h): each plan's line names the schedule and kernel
// the planner chose and the reason, for the library's choice (auto) and for forced options.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "flashmsa/plan.h"
#include "flashmsa/plan_describe.h"

namespace flashmsa {
namespace {

SparseAttnParams attn(int total_q, int hq = 64, int hkv = 4) {
  SparseAttnParams p{};
  p.batch = 1;
  p.total_q = total_q;
  p.num_heads = hq;
  p.num_kv_heads = hkv;
  p.topk = 16;
  p.q_dtype = DType::kBF16;
  p.out_dtype = DType::kBF16;
  p.k.dtype = DType::kBF16;
  p.v.dtype = DType::kBF16;
  p.kv.batch = 1;
  p.kv.total_k = total_q < 128 ? 128 : total_q;
  p.lse_temperature = 1.0f;
  return p;
}

SparseAttnDeviceFacts hopper() {
  SparseAttnDeviceFacts f;
  f.num_sms = 132;
  f.kv_major_wgmma_ctas = 1;
  f.kv_major_mma_sync_ctas[0] = 2;
  f.kv_major_mma_sync_ctas[1] = 1;
  f.tile_ctas = 1;
  return f;
}

// An sm_90a build on Hopper whose TMA tile kernel runs (hopper() has only the cp.async one).
SparseAttnDeviceFacts hopper_tma() {
  SparseAttnDeviceFacts f = hopper();
  f.tile_tma_ctas = 1;
  return f;
}

SparseAttnDeviceFacts ampere() {
  SparseAttnDeviceFacts f;
  f.num_sms = 108;
  f.kv_major_mma_sync_ctas[0] = 2;
  f.kv_major_mma_sync_ctas[1] = 1;
  return f;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PlanDescribe, PrefillAutoSmallIsQueryMajorWithItsReason) {
  const SparseAttnParams p = attn(100);
  const SparseAttnOptions o;
  const std::string d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "schedule=query_major (auto: 100 rows < 1024")) << d;
  EXPECT_TRUE(has(d, "workspace ")) << d;
  EXPECT_FALSE(has(d, "kv_major_kernel")) << d;
}

TEST(PlanDescribe, PrefillAutoLargeOnHopperIsHybridWgmma) {
  const SparseAttnParams p = attn(32768);
  const SparseAttnOptions o;
  const SparseAttnPlan plan = plan_sparse_attention(p, o, hopper());
  ASSERT_EQ(plan.schedule, PrefillSchedule::kHybrid);
  const std::string d = describe(plan, p, o);
  EXPECT_TRUE(has(d, "schedule=hybrid (auto: 32768 rows >= 1024)")) << d;
  EXPECT_TRUE(has(d, "shared-selection tiles of 8 tokens")) << d;
  EXPECT_TRUE(has(d, "kv_major_kernel=wgmma (auto: the sm_90a warpgroup-MMA kernel runs")) << d;
  EXPECT_TRUE(has(d, "launch group(s) of")) << d;
}

TEST(PlanDescribe, PrefillAutoLargeOnAmpereSaysWhyNotTheSm90Kernels) {
  const SparseAttnParams p = attn(32768);
  const SparseAttnOptions o;
  const SparseAttnPlan plan = plan_sparse_attention(p, o, ampere());
  ASSERT_EQ(plan.schedule, PrefillSchedule::kKvMajor);
  const std::string d = describe(plan, p, o);
  EXPECT_TRUE(has(d, "schedule=kv_major (auto: 32768 rows >= 1024; no shared-selection tiles"))
      << d;
  EXPECT_TRUE(has(d, "kv_major_kernel=mma_sync (auto: the sm_90a kernel cannot run here")) << d;
}

TEST(PlanDescribe, TileKernelIsNamedWithItsFallback) {
  const SparseAttnDeviceFacts f = hopper_tma();
  SparseAttnOptions o;
  const SparseAttnParams p = attn(32768);
  std::string a = describe(plan_sparse_attention(p, o, f), p, o);
  EXPECT_TRUE(has(a, "tile_kernel=tma (auto: TMA loads")) << a;
  a = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(a, "tile_kernel=cp_async (auto: the TMA kernel cannot run: the TMA tile kernel cannot run "
                     "on this device)")) << a;
  o.tile_kernel = TileKernel::kCpAsync;
  a = describe(plan_sparse_attention(p, o, f), p, o);
  EXPECT_TRUE(has(a, "tile_kernel=cp_async (forced by the option)")) << a;
  o.tile_kernel = TileKernel::kTma;
  std::string d = describe(plan_sparse_attention(p, o, f), p, o);
  EXPECT_TRUE(has(d, "tile_kernel=tma (forced by the option")) << d;
  d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "tile_kernel=cp_async (tile_kernel=tma falls back to cp_async: the TMA tile kernel "
                     "cannot run on this device)")) << d;
}

TEST(PlanDescribe, AdaptiveTileBoundIsNamed) {
  const SparseAttnParams p = attn(32768);
  SparseAttnOptions o;
  std::string d = describe(plan_sparse_attention(p, o, hopper_tma()), p, o);
  EXPECT_TRUE(has(d, "at most 2x a token's (tile_bound=auto, adaptive at this size: 3x where the tiles "
                     "within it hold nearly all pairs), KV-major for the other rows")) << d;
  d = describe(plan_sparse_attention(attn(65536), o, hopper_tma()), attn(65536), o);
  EXPECT_TRUE(has(d, "at most 2x a token's, KV-major for the other rows")) << d;
  o.tile_bound = TileBound::kFixed;
  d = describe(plan_sparse_attention(p, o, hopper_tma()), p, o);
  EXPECT_TRUE(has(d, "at most 2x a token's, KV-major for the other rows")) << d;
  o.tile_bound = TileBound::kAdaptive;
  d = describe(plan_sparse_attention(p, o, hopper_tma()), p, o);
  EXPECT_TRUE(has(d, "at most 2x a token's (tile_bound=adaptive: 3x where the tiles within it hold nearly "
                     "all pairs), KV-major for the other rows")) << d;
}

TEST(PlanDescribe, KvMajorTmaRunsOrSaysWhyNot) {
  const SparseAttnParams p = attn(4096);
  SparseAttnOptions o;
  o.schedule = PrefillSchedule::kKvMajor;
  o.kv_major_kernel = KvMajorKernel::kTma;
  SparseAttnDeviceFacts f = hopper();
  f.kv_major_tma_ctas = 1;
  const std::string d = describe(plan_sparse_attention(p, o, f), p, o);
  EXPECT_TRUE(has(d, "kv_major_kernel=tma (forced by the option: a TMA producer warp")) << d;
  EXPECT_TRUE(has(d, "4 query-tile stage(s)")) << d;
  const std::string w = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(w, "kv_major_kernel=wgmma (kv_major_kernel=tma falls back: the TMA KV-major kernel cannot "
                     "run on this device")) << w;
  SparseAttnParams fp8 = attn(4096);
  fp8.k.dtype = fp8.v.dtype = DType::kFP8E4M3;
  const std::string q = describe(plan_sparse_attention(fp8, o, f), fp8, o);
  EXPECT_TRUE(has(q, "kv_major_kernel=wgmma (kv_major_kernel=tma falls back: fp8 / NVFP4 K/V")) << q;
}

// The plan text of a KV-major call.
std::string kvm_text(const SparseAttnParams& p, const SparseAttnOptions& o, const SparseAttnDeviceFacts& f) {
  return describe(plan_sparse_attention(p, o, f), p, o);
}

TEST(PlanDescribe, KvMajorTmaStoreRunsOrSaysWhyNot) {
  SparseAttnOptions o;
  o.schedule = PrefillSchedule::kKvMajor;
  o.kv_major_store = KvMajorStore::kTma;
  const SparseAttnParams m3 = attn(4096), g4 = attn(4096, 16, 4);
  const SparseAttnOptions a;
  SparseAttnOptions s = o;
  s.kv_major_store = KvMajorStore::kStg;
  const std::pair<std::string, std::string> cases[] = {
      {kvm_text(m3, o, hopper()),
       "query-tile stage(s)); kv_major_store=tma (forced by the option: the partials by two TMA stores per warp "
       "and tile); "},
      {kvm_text(g4, o, hopper()), "; kv_major_store=stg (kv_major_store=tma falls back: G not a multiple of 16)"},
      {kvm_text(m3, a, hopper()), "; kv_major_store=tma (auto: the partials by two TMA stores per warp and tile)"},
      {kvm_text(g4, a, hopper()), "; kv_major_store=stg (auto: G not a multiple of 16)"},
  };
  for (const auto& [text, part] : cases) EXPECT_TRUE(has(text, part)) << text;
  // stg named, or auto off the warpgroup-MMA kernel: nothing said about the stores.
  for (const std::string& text : {kvm_text(m3, s, hopper()), kvm_text(m3, a, ampere())})
    EXPECT_FALSE(has(text, "kv_major_store")) << text;
}

TEST(PlanDescribe, KvMajorApproxMathRunsOrSaysWhyNot) {
  SparseAttnOptions o;
  o.schedule = PrefillSchedule::kKvMajor;
  o.kv_major_math = KvMajorMath::kApprox;
  const SparseAttnParams m3 = attn(4096);
  const SparseAttnOptions a;
  SparseAttnOptions p = o;
  p.kv_major_math = KvMajorMath::kPrecise;
  const std::pair<std::string, std::string> cases[] = {
      {kvm_text(m3, o, hopper()),
       "; kv_major_math=approx (forced by the option: the row LSEs' log2 and 1 / l by MUFU approximations)"},
      {kvm_text(m3, o, ampere()),
       "; kv_major_math=precise (kv_major_math=approx falls back: not the warpgroup-MMA KV-major kernel)"},
      {kvm_text(m3, a, hopper()), "; kv_major_math=approx (auto: the row LSEs' log2 and 1 / l by MUFU approximations)"},
      {kvm_text(m3, p, hopper()),
       "; kv_major_math=precise (forced by the option: the row LSEs' log2 and 1 / l correctly rounded)"},
  };
  for (const auto& [text, part] : cases) EXPECT_TRUE(has(text, part)) << text;
  const std::string amp = kvm_text(m3, a, ampere());
  EXPECT_FALSE(has(amp, "kv_major_math")) << amp;
}

TEST(PlanDescribe, PrefillForcedOptionsAreNamed) {
  const SparseAttnParams p = attn(4096);
  SparseAttnOptions o;
  o.schedule = PrefillSchedule::kKvMajor;
  o.kv_major_kernel = KvMajorKernel::kMmaSync;
  o.chunk_rows = 1000;
  const std::string d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "schedule=kv_major (forced by the option schedule=kv_major)")) << d;
  EXPECT_TRUE(has(d, "kv_major_kernel=mma_sync (forced by the option kv_major_kernel=mma_sync")) << d;
  EXPECT_TRUE(has(d, "(chunk_rows option)")) << d;
  o = SparseAttnOptions{};
  o.schedule = PrefillSchedule::kQueryMajor;
  const std::string q = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(q, "schedule=query_major (forced by the option schedule=query_major)")) << q;
}

TEST(PlanDescribe, ListsOnceIsNamedWithItsFallback) {
  SparseAttnOptions o;
  const SparseAttnParams p = attn(32768);
  std::string d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "; lists=once (auto: the work lists of all 9 group(s) in one count / scan / scatter, "))
      << d;
  o.lists = KvMajorLists::kPerGroup;
  d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "; lists=per_group (forced by the option)")) << d;
  o.lists = KvMajorLists::kOnce;
  d = describe(plan_sparse_attention(p, o, hopper()), p, o);
  EXPECT_TRUE(has(d, "; lists=once (forced by the option: the work lists of all 9 group(s) in one count / "
                     "scan / scatter, ")) << d;
  const SparseAttnParams big = attn(1 << 21);
  d = describe(plan_sparse_attention(big, o, hopper()), big, o);
  EXPECT_TRUE(has(d, "; lists=per_group (lists=once falls back: the lists of all 521 groups would take ")) << d;
  EXPECT_TRUE(has(d, " > 1073741824)")) << d;
  o.lists = KvMajorLists::kAuto;
  d = describe(plan_sparse_attention(big, o, hopper()), big, o);
  EXPECT_TRUE(has(d, "; lists=per_group (auto: the lists of all 521 groups would take ")) << d;
}

TEST(PlanDescribe, EmptyCallRunsNothing) {
  const SparseAttnParams p = attn(0);
  EXPECT_EQ(describe(plan_sparse_attention(p, {}, hopper()), p, {}), "no query rows: nothing runs");
}

TEST(PlanDescribe, DecodeRegsNamesItsConversion) {
  SparseAttnDeviceFacts f = hopper();
  f.decode_regs_ctas = 2;
  SparseDecodeOptions regs;
  regs.kernel = DecodeKernel::kRegs;
  SparseDecodeParams dp{};
  dp.attn = attn(64);
  dp.force_fused = -1;
  const struct {
    DType kv;
    const char* text;
  } cases[] = {{DType::kBF16, "; kernel=regs (3 stages at 2 CTAs per SM)"},
               {DType::kFP8E4M3, "; kernel=regs (3 stages at 2 CTAs per SM; fp8 K/V converted in registers)"},
               {DType::kNVFP4, "; kernel=regs (5 stages at 2 CTAs per SM; NVFP4 K/V converted in registers, "
                               "nvfp4_cvt=word: a word of 8 codes at a time)"}};
  for (const auto& c : cases) {
    dp.attn.k.dtype = dp.attn.v.dtype = c.kv;
    const std::string d = describe_decode(plan_sparse_decode(dp, f, regs), dp.attn);
    EXPECT_TRUE(has(d, c.text)) << d;
  }
  // nvfp4_cvt=word (the default): named for NVFP4 K/V under the register kernel only; byte is not.
  SparseDecodeOptions word = regs;
  word.nvfp4_cvt = DecodeNvfp4Cvt::kWord;
  EXPECT_TRUE(has(describe_decode(plan_sparse_decode(dp, f, word), dp.attn),
                  "NVFP4 K/V converted in registers, nvfp4_cvt=word: a word of 8 codes at a time)"));
  SparseDecodeOptions byte = regs;
  byte.nvfp4_cvt = DecodeNvfp4Cvt::kByte;
  EXPECT_FALSE(has(describe_decode(plan_sparse_decode(dp, f, byte), dp.attn), "nvfp4_cvt"));
  // auto: regs for NVFP4 (the last case's K/V) and fp8, smem for 16-bit K/V.
  EXPECT_TRUE(has(describe_decode(plan_sparse_decode(dp, f), dp.attn), "kernel=regs"));
  dp.attn.k.dtype = dp.attn.v.dtype = DType::kBF16;
  const std::string d = describe_decode(plan_sparse_decode(dp, f), dp.attn);
  EXPECT_FALSE(has(d, "kernel=regs")) << d;
}

TEST(PlanDescribe, DecodeRegsFeedTmaOrWhyNot) {
  SparseAttnDeviceFacts f = hopper();
  f.decode_regs_ctas = 2;
  f.decode_regs_tma_ctas = 2;
  SparseDecodeParams dp{};
  dp.attn = attn(64);
  dp.force_fused = -1;
  dp.attn.k.dtype = dp.attn.v.dtype = DType::kFP8E4M3;
  const SparseDecodeOptions tma = parse_sparse_decode_options("regs_feed=tma");
  const std::string on = describe_decode(plan_sparse_decode(dp, f, tma), dp.attn);
  EXPECT_TRUE(has(on, "; kernel=regs (3 stages at 2 CTAs per SM; fp8 K/V converted in registers; regs_feed=tma: "
                      "each block's raw K and V loaded by one thread as two TMA boxes")) << on;
  EXPECT_FALSE(has(on, "falls back")) << on;
  // auto and cp_async name nothing; where tma does not apply the plan says why.
  EXPECT_FALSE(has(describe_decode(plan_sparse_decode(dp, f), dp.attn), "regs_feed"));
  f.decode_regs_tma_ctas = 0;
  const std::string off = describe_decode(plan_sparse_decode(dp, f, tma), dp.attn);
  EXPECT_TRUE(has(off, "; regs_feed=tma falls back to cp_async: the TMA-fed register kernel cannot run on this "
                       "device")) << off;
}

TEST(PlanDescribe, DecodeMtpUnionRegsNamesItsConversion) {
  SparseDecodeOptions both;
  both.kernel = DecodeKernel::kRegs;
  both.mtp = DecodeMtp::kUnion;
  SparseDecodeParams dp{};
  dp.attn = attn(64);  // 16 requests of 4 tokens, G = 16
  dp.attn.batch = dp.attn.kv.batch = 16;
  dp.attn.qi.seqlen_q = 4;
  dp.force_fused = -1;
  const struct {
    DType kv;
    const char* text;  // empty: the smem union kernel (no kernel=regs)
  } cases[] = {{DType::kBF16, ""},
               {DType::kFP8E4M3, "; kernel=regs (the 4 warps split the keys of Q K^T and the head dims of "
                                 "P V over all rows, 2 stages of 32 KB; fp8 K/V converted in registers)"},
               // NVFP4: the smem union kernel (its register path measured slower at 5b22cb3, removed).
               {DType::kNVFP4, ""}};
  for (const auto& c : cases) {
    dp.attn.k.dtype = dp.attn.v.dtype = c.kv;
    const std::string d = describe_decode(plan_sparse_decode(dp, hopper(), both), dp.attn);
    EXPECT_TRUE(has(d, "mtp=union")) << d;
    if (*c.text == 0) {
      EXPECT_FALSE(has(d, "kernel=regs")) << d;
    } else {
      EXPECT_TRUE(has(d, c.text)) << d;
    }
    // auto at B64 (union items for each K/V type): fp8 union items in registers, the others in
    // the smem union kernel.
    SparseDecodeParams b64 = dp;
    b64.attn = attn(256);
    b64.attn.batch = b64.attn.kv.batch = 64;
    b64.attn.qi.seqlen_q = 4;
    b64.attn.k.dtype = b64.attn.v.dtype = c.kv;
    const std::string a = describe_decode(plan_sparse_decode(b64, hopper()), b64.attn);
    EXPECT_TRUE(has(a, "mtp=union")) << a;
    EXPECT_EQ(has(a, "kernel=regs"), c.kv == DType::kFP8E4M3) << a;
    // auto at B16: union items for 16-bit K/V only (heuristics.h mtp_union_pays).
    const std::string a16 = describe_decode(plan_sparse_decode(dp, hopper()), dp.attn);
    EXPECT_EQ(has(a16, "mtp=union"), c.kv == DType::kBF16) << a16;
  }
}

TEST(PlanDescribe, DecodeNamesTheWgmmaKernelOrWhyNot) {
  SparseDecodeOptions w;
  w.kernel = DecodeKernel::kWgmma;
  SparseDecodeParams dp{};
  dp.attn = attn(256);  // 64 requests of 4 tokens, G = 16
  dp.attn.batch = dp.attn.kv.batch = 64;
  dp.attn.qi.seqlen_q = 4;
  dp.force_fused = -1;
  SparseAttnDeviceFacts f = hopper();
  f.decode_mtp_wgmma_ctas = 1;
  const std::string d = describe_decode(plan_sparse_decode(dp, f, w), dp.attn);
  EXPECT_TRUE(has(d, "mtp=union")) << d;
  EXPECT_TRUE(has(d, "; kernel=wgmma (sm_90a: TMA loads")) << d;
  EXPECT_TRUE(has(d, "a persistent grid of 132 CTAs")) << d;
  EXPECT_TRUE(has(d, "; wgmma_pipe=ahead (a planner warp plans the next item")) << d;  // auto's pipe
  SparseDecodeOptions wi = w;
  wi.wgmma_pipe = DecodeWgmmaPipe::kInline;
  EXPECT_FALSE(has(describe_decode(plan_sparse_decode(dp, f, wi), dp.attn), "wgmma_pipe"));
  SparseDecodeOptions wa = w;
  wa.wgmma_pipe = DecodeWgmmaPipe::kAhead;
  const std::string a = describe_decode(plan_sparse_decode(dp, f, wa), dp.attn);
  EXPECT_TRUE(has(a, "; kernel=wgmma (sm_90a: TMA loads")) << a;
  EXPECT_TRUE(has(a, "; wgmma_pipe=ahead (a planner warp plans the next item")) << a;
  const std::string no_dev = describe_decode(plan_sparse_decode(dp, hopper(), w), dp.attn);
  EXPECT_TRUE(has(no_dev, "kernel=wgmma falls back to auto's kernel: the wgmma kernel cannot run on this device"))
      << no_dev;
  dp.attn.k.dtype = dp.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions w_off = w;
  w_off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  const std::string fp8 = describe_decode(plan_sparse_decode(dp, f, w_off), dp.attn);
  EXPECT_TRUE(has(fp8, "kernel=wgmma falls back to auto's kernel: fp8 K/V with wgmma_fp8=off")) << fp8;
  EXPECT_TRUE(has(fp8, "; kernel=regs (the 4 warps split")) << fp8;
  EXPECT_FALSE(has(fp8, "wgmma_fp8=on (")) << fp8;
  // wgmma_fp8=auto where kernel=wgmma is named: as on.
  const std::string fp8_auto = describe_decode(plan_sparse_decode(dp, f, w), dp.attn);
  EXPECT_TRUE(has(fp8_auto, "; wgmma_fp8=on (fp8 K/V: each raw 16 KB K or V block by TMA")) << fp8_auto;
  SparseDecodeOptions w8 = w;
  w8.wgmma_fp8 = DecodeWgmmaFp8::kOn;
  const std::string on = describe_decode(plan_sparse_decode(dp, f, w8), dp.attn);
  EXPECT_TRUE(has(on, "; kernel=wgmma (sm_90a: TMA loads of each item's union blocks through a 3-stage K / V ring"))
      << on;
  EXPECT_TRUE(has(on, "; wgmma_pipe=ahead (a planner warp")) << on;
  EXPECT_TRUE(has(on, "; wgmma_fp8=on (fp8 K/V: each raw 16 KB K or V block by TMA")) << on;
  EXPECT_FALSE(has(on, "kernel=regs")) << on;
  w8.wgmma_pipe = DecodeWgmmaPipe::kInline;
  const std::string inl = describe_decode(plan_sparse_decode(dp, f, w8), dp.attn);
  EXPECT_TRUE(has(inl, "kernel=wgmma falls back to auto's kernel: fp8 K/V with wgmma_pipe=inline")) << inl;
  // auto takes it for these fp8 union items (256, more than the SMs: wgmma_fp8=auto) and names it.
  const std::string fp8_auto_kernel = describe_decode(plan_sparse_decode(dp, f), dp.attn);
  EXPECT_TRUE(has(fp8_auto_kernel, "; kernel=wgmma (sm_90a")) << fp8_auto_kernel;
  EXPECT_TRUE(has(fp8_auto_kernel, "; wgmma_fp8=on (fp8 K/V")) << fp8_auto_kernel;
}

// auto takes the wgmma kernel for 16-bit MTP union items when there are more items (requests x kv
// heads) than half the SMs: B17 x 4 = 68 > 66 on 132 SMs, B16 x 4 = 64 not (H200 at 37fd6f5: B24
// and B32 faster on it, B16 even, B8 and B1 slower).
TEST(PlanDescribe, DecodeAutoTakesWgmmaAboveHalfTheSms) {
  SparseAttnDeviceFacts f = hopper();
  f.decode_mtp_wgmma_ctas = 1;
  for (const int batch : {1, 8, 16, 17, 24, 32, 64}) {
    SparseDecodeParams dp{};
    dp.attn = attn(4 * batch);  // batch requests of 4 tokens, G = 16
    dp.attn.batch = dp.attn.kv.batch = batch;
    dp.attn.qi.seqlen_q = 4;
    dp.force_fused = -1;
    const std::string d = describe_decode(plan_sparse_decode(dp, f), dp.attn);
    EXPECT_EQ(has(d, "mtp=union"), batch >= 4) << d;  // per-token items at B1 (mtp_union_pays)
    EXPECT_EQ(has(d, "kernel=wgmma"), 2 * batch * 4 > 132) << "batch " << batch << ": " << d;
    // fp8 K/V: union items on the wgmma kernel from more than half the SMs too (mtp_union_pays,
    // wgmma_fp8=auto: the H200 runs at 831d3e5 and 455afa9): B17 up here; per-token items below.
    dp.attn.k.dtype = dp.attn.v.dtype = DType::kFP8E4M3;
    const std::string q = describe_decode(plan_sparse_decode(dp, f), dp.attn);
    EXPECT_EQ(has(q, "kernel=wgmma"), 2 * batch * 4 > 132) << q;
    EXPECT_EQ(has(q, "mtp=union"), 2 * batch * 4 > 132) << q;
  }
}

TEST(PlanDescribe, DecodeNamesFusedOrSplit) {
  SparseDecodeParams dp{};
  dp.attn = attn(64);
  dp.force_fused = -1;
  const std::string d = describe_decode(plan_sparse_decode(dp, hopper()), dp.attn);
  EXPECT_TRUE(has(d, "schedule=query_major (decode always")) << d;
  EXPECT_TRUE(has(d, "fused") || has(d, "split-K")) << d;
  dp.force_fused = 0;
  const std::string split = describe_decode(plan_sparse_decode(dp, hopper()), dp.attn);
  // auto: combine_loads=with (H200 at dda49c5); after names nothing.
  EXPECT_TRUE(has(split, "partials + combine (combine_loads=with: values loaded with the LSEs)")) << split;
  const std::string after = describe_decode(
      plan_sparse_decode(dp, hopper(), parse_sparse_decode_options("combine_loads=after")), dp.attn);
  EXPECT_TRUE(has(after, "partials + combine")) << after;
  EXPECT_FALSE(has(after, "combine_loads")) << after;
}

TEST(PlanDescribe, DecodeSplitCluster) {
  SparseDecodeParams dp{};
  dp.attn = attn(1);
  dp.attn.qi.seqlen_q = 1;
  dp.force_fused = -1;
  dp.partial_dtype = PartialDType::kDefault;
  SparseDecodeOptions o;
  o.split = DecodeSplit::kCluster;
  SparseAttnDeviceFacts f = hopper();
  f.decode_cluster_max = 16;
  const std::string c = describe_decode(plan_sparse_decode(dp, f, o), dp.attn);
  EXPECT_TRUE(has(c, "split=cluster (a cluster of 16 CTAs per row merges its bf16 partials through "
                     "distributed shared memory; no combine)")) << c;
  EXPECT_TRUE(has(c, "workspace 0 bytes")) << c;
  f.decode_cluster_max = 0;
  const std::string b = describe_decode(plan_sparse_decode(dp, f, o), dp.attn);
  EXPECT_TRUE(has(b, "partials + combine (combine_loads=with: values loaded with the LSEs) (split=cluster falls back to blocks: no thread-block clusters here")) << b;
  // MTP union items keep the combine.
  f.decode_cluster_max = 16;
  SparseDecodeParams mtp = dp;
  mtp.attn = attn(4);
  mtp.attn.batch = mtp.attn.kv.batch = 1;
  mtp.attn.qi.seqlen_q = 4;
  SparseDecodeOptions ou = o;
  ou.mtp = DecodeMtp::kUnion;
  const std::string m = describe_decode(plan_sparse_decode(mtp, f, ou), mtp.attn);
  EXPECT_TRUE(has(m, "mtp=union")) << m;
  EXPECT_TRUE(has(m, "split=cluster falls back to blocks: MTP union items")) << m;
  // mtp=auto at one request: per-token items, which do run in clusters.
  const std::string pt = describe_decode(plan_sparse_decode(mtp, f, o), mtp.attn);
  EXPECT_FALSE(has(pt, "mtp=union")) << pt;
  EXPECT_TRUE(has(pt, "split=cluster (a cluster of")) << pt;
}

TEST(PlanDescribe, DecodeSplitWarps) {
  SparseDecodeParams dp{};
  dp.attn = attn(1);
  dp.attn.qi.seqlen_q = 1;
  dp.force_fused = -1;
  SparseDecodeOptions o;
  o.split_warps = DecodeSplitWarps::k8;
  const SparseAttnDeviceFacts f = hopper();
  const std::string w = describe_decode(plan_sparse_decode(dp, f, o), dp.attn);
  EXPECT_TRUE(has(w, "partials + combine (combine_loads=with: values loaded with the LSEs); split_warps=8 (8 "
                     "warps per CTA share each 128-key block, 16 keys each, and merge their states in warp "
                     "order)")) << w;
  const std::string d = describe_decode(plan_sparse_decode(dp, f), dp.attn);
  EXPECT_EQ(d, w);  // auto: 8 warps where they apply
  SparseDecodeOptions four;
  four.split_warps = DecodeSplitWarps::k4;
  const std::string d4 = describe_decode(plan_sparse_decode(dp, f, four), dp.attn);
  EXPECT_FALSE(has(d4, "split_warps")) << d4;
  o.kernel = DecodeKernel::kRegs;
  SparseAttnDeviceFacts r = f;
  r.decode_regs_ctas = 2;
  const std::string fb = describe_decode(plan_sparse_decode(dp, r, o), dp.attn);
  EXPECT_TRUE(has(fb, "(split_warps=8 falls back to 4 warps: kernel=regs / wgmma)")) << fb;
  // fp8 K/V: the 8-warp kernel converting in registers where forced.
  dp.attn.k.dtype = dp.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions w8;
  w8.split_warps = DecodeSplitWarps::k8;
  const std::string f8 = describe_decode(plan_sparse_decode(dp, r, w8), dp.attn);
  EXPECT_TRUE(has(f8, "; fp8 K/V converted in registers by the 8-warp kernel (16 keys a warp)")) << f8;
  EXPECT_TRUE(has(f8, "; split_warps=8 (8 warps per CTA")) << f8;
  EXPECT_FALSE(has(f8, "kernel=regs")) << f8;
}

TEST(PlanDescribe, ProxyAndTopk) {
  ProxyScoreParams pp{};
  const ProxyScoreOptions auto_o;
  EXPECT_EQ(describe(plan_proxy_score(pp, auto_o), auto_o),
            "kernel=sm90 (auto: the sm_90a TMA + wgmma kernel where it runs (an sm_90 GPU, 16-bit or "
            "fp8 q with K of its dtype, 16-bit q with fp8 K, or NVFP4 q and K; no reduce_heads), else the portable "
            "mma.sync kernel)");
  pp.num_heads = 4;  // M3's indexer decode: 4 heads over one index-K head, one token per request
  pp.num_kv_heads = 1;
  pp.qi.max_seqlen_q = 1;
  pp.q_dtype = pp.k.dtype = DType::kBF16;
  std::string dp = describe(plan_proxy_score(pp, auto_o), auto_o);
  EXPECT_TRUE(has(dp, "kernel=decode (auto: short queries, at most 16 rows")) << dp;
  EXPECT_FALSE(has(dp, "fp16 MMAs")) << dp;
  pp.k.dtype = DType::kFP8E4M3;  // fp8 index-K: auto's fp16 MMAs named
  EXPECT_TRUE(has(describe(plan_proxy_score(pp, auto_o), auto_o),
                  "the decode streaming kernel, fp16 MMAs for fp8 K)"));
  ProxyScoreOptions ctas3;
  ctas3.decode_ctas = 3;
  EXPECT_TRUE(has(describe(plan_proxy_score(pp, ctas3), ctas3), "; decode_ctas=3 (forced: CTAs per SM)"));
  pp.k.dtype = DType::kBF16;
  EXPECT_TRUE(has(describe(plan_proxy_score(pp, ctas3), ctas3),
                  "; decode_ctas=2 (the option decode_ctas does not apply to 16-bit K)"));
  EXPECT_TRUE(has(describe(plan_proxy_score(pp, auto_o), auto_o), "; decode_ctas=2 (auto: CTAs per SM"));
  ProxyScoreOptions ilp2;
  ilp2.decode_ilp = 2;
  EXPECT_TRUE(has(describe(plan_proxy_score(pp, ilp2), ilp2), "; decode_ilp=2 (forced: key blocks per iteration)"));
  // nvfp4_cvt=word: named for NVFP4 K on the decode kernel only (forced or auto's choice); byte is
  // not.
  ProxyScoreOptions word, byte;
  word.nvfp4_cvt = DecodeNvfp4Cvt::kWord;
  byte.nvfp4_cvt = DecodeNvfp4Cvt::kByte;
  EXPECT_FALSE(has(describe(plan_proxy_score(pp, word), word), "nvfp4_cvt"));  // 16-bit K
  {
    ProxyScoreParams fp4 = pp;
    fp4.q_dtype = DType::kNVFP4;
    fp4.k.dtype = DType::kNVFP4;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, word), word),
                    "; nvfp4_cvt=word (forced: NVFP4 K a word of 8 codes at a time)"));
    EXPECT_FALSE(has(describe(plan_proxy_score(fp4, byte), byte), "nvfp4_cvt"));
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, {}), {}),
                    "; nvfp4_cvt=word (auto: NVFP4 K a word of 8 codes at a time)"));
  }
  // decode_fp8=tma: named for fp8 K on the decode kernel only, forced or auto's (any batch, one
  // pass); cta is not named.
  {
    ProxyScoreOptions tma;
    tma.decode_fp8 = DecodeTma::kTma;
    EXPECT_FALSE(has(describe(plan_proxy_score(pp, tma), tma), "decode_fp8"));  // 16-bit K
    ProxyScoreParams fp8 = pp;
    fp8.k.dtype = DType::kFP8E4M3;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp8, tma), tma),
                    "; decode_fp8=tma (forced: fp8 K by TMA, a warp per key block, where it applies)"));
    EXPECT_FALSE(has(describe(plan_proxy_score(fp8, {}), {}), "decode_fp8"));  // batch 0
    fp8.batch = 1;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp8, {}), {}),
                    "; decode_fp8=tma (auto: fp8 K by TMA, a warp per key block, where it applies)"));
    fp8.batch = 64;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp8, {}), {}),
                    "; decode_fp8=tma (auto: fp8 K by TMA, a warp per key block, where it applies)"));
    ProxyScoreOptions cta;
    cta.decode_fp8 = DecodeTma::kCta;
    EXPECT_FALSE(has(describe(plan_proxy_score(fp8, cta), cta), "decode_fp8"));
    // G 4 x 4 tokens: 16 columns a pass, forced or auto's.
    fp8.qi.max_seqlen_q = 4;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp8, tma), tma),
                    "; decode_fp8=tma (forced: fp8 K by TMA, a warp per key block, 16 query columns a pass, "
                    "where it applies)"));
    EXPECT_TRUE(has(describe(plan_proxy_score(fp8, {}), {}),
                    "; decode_fp8=tma (auto: fp8 K by TMA, a warp per key block, 16 query columns a pass, "
                    "where it applies)"));
    fp8.qi.max_seqlen_q = 5;  // two passes: auto keeps the cp.async ring
    EXPECT_FALSE(has(describe(plan_proxy_score(fp8, {}), {}), "decode_fp8"));
  }
  // decode_nvfp4=tma: named for NVFP4 K on the decode kernel, forced or auto's; cta is not named;
  // not for fp8 K.
  {
    ProxyScoreOptions tma;
    tma.decode_nvfp4 = DecodeTma::kTma;
    ProxyScoreParams fp4 = pp;
    fp4.k.dtype = DType::kNVFP4;
    fp4.q_dtype = DType::kNVFP4;
    fp4.batch = 64;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, tma), tma),
                    "; decode_nvfp4=tma (forced: NVFP4 K by TMA, a warp per key block, where it applies)"));
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, {}), {}),
                    "; decode_nvfp4=tma (auto: NVFP4 K by TMA, a warp per key block, where it applies)"));
    ProxyScoreOptions cta;
    cta.decode_nvfp4 = DecodeTma::kCta;
    EXPECT_FALSE(has(describe(plan_proxy_score(fp4, cta), cta), "=tma"));
    fp4.qi.max_seqlen_q = 4;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, tma), tma),
                    "; decode_nvfp4=tma (forced: NVFP4 K by TMA, a warp per key block, 16 query columns a pass, "
                    "where it applies)"));
    ProxyScoreParams fp8 = pp;
    fp8.k.dtype = DType::kFP8E4M3;
    EXPECT_FALSE(has(describe(plan_proxy_score(fp8, tma), tma), "decode_nvfp4"));
    // decode_tma_issue=warps: named where the TMA kernel runs.
    ProxyScoreOptions warps;
    warps.decode_tma_issue = DecodeTmaIssue::kWarps;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, warps), warps),
                    "; decode_tma_issue=warps (forced: each consumer warp loads its own blocks)"));
    EXPECT_FALSE(has(describe(plan_proxy_score(fp4, {}), {}), "decode_tma_issue"));  // few units: the producer
    fp4.batch = 64;  // 64 x 256 blocks: auto's consumer warps issue their own
    fp4.max_k_tiles = 256;
    EXPECT_TRUE(has(describe(plan_proxy_score(fp4, {}), {}),
                    "; decode_tma_issue=warps (auto: each consumer warp loads its own blocks)"));
    fp8.batch = 64;  // auto's fp8 TMA kernel keeps its producer warp
    EXPECT_FALSE(has(describe(plan_proxy_score(fp8, {}), {}), "decode_tma_issue"));
    warps.decode_nvfp4 = DecodeTma::kCta;
    EXPECT_FALSE(has(describe(plan_proxy_score(fp4, warps), warps), "decode_tma_issue"));
  }
  pp.k.dtype = DType::kBF16;
  const struct {
    ProxyKernel kernel;
    const char* text;
  } forced_cases[] = {
      {ProxyKernel::kSm90Only, "kernel=sm90 (forced by the option kernel=sm90_only)"},
      {ProxyKernel::kSm90F16Only, "kernel=sm90 (forced by the option kernel=sm90_f16_only; fp16 MMAs for fp8 K "
                                  "with bf16 or fp8 q (Q in registers) and for NVFP4 q and K (other operands: "
                                  "as sm90))"},
      {ProxyKernel::kMmaSync, "kernel=mma_sync (forced by the option kernel=mma_sync)"},
      {ProxyKernel::kDecodeF16, "kernel=decode (forced by the option kernel=decode_f16; fp16 MMAs for fp8 K)"
       "; decode_ctas=2 (auto: CTAs per SM; fp8 K 3, NVFP4 4, 16-bit K 2)"
       "; decode_ilp=1 (auto: key blocks per iteration)"},
      {ProxyKernel::kDecodeOnly, "kernel=decode (forced by the option kernel=decode_only)"
       "; decode_ctas=2 (auto: CTAs per SM; fp8 K 3, NVFP4 4, 16-bit K 2)"
       "; decode_ilp=1 (auto: key blocks per iteration)"}};
  for (const auto& c : forced_cases) {
    ProxyScoreOptions forced;
    forced.kernel = c.kernel;
    EXPECT_EQ(describe(plan_proxy_score(pp, forced), forced), c.text);
  }
  TopkSelectParams tp{};
  tp.num_heads = 4;
  tp.num_blocks = 256;
  tp.num_tokens = 32768;
  tp.topk = 16;
  TopkSelectDeviceFacts facts;
  facts.num_sms = 132;
  TopkSelectOptions o;
  std::string d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=net (auto: net: rows choose <= 31 of <= 32768 blocks); 32768 tokens x 4 heads over 256 blocks, top-16; 2 lanes per row, 32 words per lane")) << d;
  tp.topk = 40;  // net does not run: auto is by_size
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=radix_uniform (auto: net does not run: rows choose more than 31 blocks (topk - force_begin - force_end); by_size: 4096 groups of 32 rows >= 4 per SM x 132 SMs")) << d;
  tp.topk = 16;
  o.kernel = TopkKernel::kBySize;  // 1024 groups x 4 heads = 4096 >= 4 x 132
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=radix_uniform (by_size: 4096 groups of 32 rows >= 4 per SM x 132 SMs")) << d;
  tp.num_tokens = 64;  // 2 groups x 4 heads = 8 < 528; 256 rows <= 528, rows of one chunk
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_digits (by_size: 8 groups of 32 rows < 4 per SM x 132 SMs, 256 rows <= 4 per SM); 64 tokens x 4 heads over 256 blocks, top-16; every row one chunk")) << d;
  tp.num_blocks = 257;  // two chunks a row: warp_split
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_split (by_size: 8 groups of 32 rows < 4 per SM x 132 SMs, 256 rows <= 4 per SM)")) << d;
  tp.num_blocks = 256;
  tp.num_tokens = 256;  // 8 groups x 4 heads = 32 < 528; 1024 rows > 528
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_per_row_8 (by_size: 32 groups of 32 rows < 4 per SM x 132 SMs, 1024 rows > 4 per SM)")) << d;
  o.kernel = TopkKernel::kRadix;
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=radix (forced by the option kernel=radix)")) << d;
  o.kernel = TopkKernel::kRadix1Buf;
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=radix_1buf (forced by the option kernel=radix_1buf)")) << d;
  o.kernel = TopkKernel::kRadixUniform;
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=radix_uniform (forced by the option kernel=radix_uniform)")) << d;
  o.kernel = TopkKernel::kWarpSplit;
  tp.num_tokens = 1;
  tp.num_blocks = 1024;
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_split (forced by the option kernel=warp_split)")) << d;
  o.kernel = TopkKernel::kBySize;  // the B1 / 128K decode call: warp_split (H200 at 2f7070a)
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_split (by_size: 4 groups of 32 rows < 4 per SM x 132 SMs, 4 rows <= 4 per SM)")) << d;
  o.kernel = TopkKernel::kAuto;  // ... and net under auto (H200 at 3488394), 32 lanes a row
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=net (auto: net: rows choose <= 31 of <= 32768 blocks); 1 tokens x 4 heads over 1024 blocks, top-16; 32 lanes per row, 32 words per lane")) << d;
  EXPECT_FALSE(has(d, "pivot")) << d;  // 16 chosen: no pivot
  tp.force_end = 1;  // vLLM's M3 call: 15 chosen, the pivot under auto
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "; 32 lanes per row, 16 words per lane; a pivot first (net_pivot auto: a decode-sized call): 32 scores a lane, the networks where more than 32 survive; a CTA of 4 warps a row (8 of those scores each), ordered by counting (net_pivot_mode auto)")) << d;
  tp.force_end = 0;
  EXPECT_FALSE(has(d, "digits")) << d;
  o.kernel = TopkKernel::kWarpDigits;  // 1024 blocks: rows of several chunks run as warp_split
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_digits (forced by the option kernel=warp_digits); 1 tokens x 4 heads over 1024 blocks, top-16; rows of one chunk by 8-bit digits, longer ones as warp_split")) << d;
  tp.num_tokens = 64;
  tp.num_blocks = 256;  // the decode call: every row one chunk
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_digits (forced by the option kernel=warp_digits); 64 tokens x 4 heads over 256 blocks, top-16; every row one chunk: thresholds by 8-bit digits, a warp per CTA")) << d;
  o.kernel = TopkKernel::kNet;  // 256 rows of 256 blocks: 16 lanes a row; 16 chosen: 32 words
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=net (forced by the option kernel=net); 64 tokens x 4 heads over 256 blocks, top-16; 16 lanes per row, 32 words per lane")) << d;
  tp.topk = 40;  // 40 chosen: net falls back to by_size's kernel
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "kernel=warp_digits (forced by the option kernel=net, which falls back: rows choose more than 31 blocks (topk - force_begin - force_end)); 64 tokens x 4 heads over 256 blocks, top-40")) << d;
  EXPECT_FALSE(has(d, "lanes per row")) << d;
  // net_pivot=on: a warp per row with 8 scores a lane at 256 blocks; 16 chosen: not applicable.
  tp.topk = 16;
  tp.force_end = 1;
  o = parse_topk_select_options("net_pivot=on");
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "; 32 lanes per row, 16 words per lane; a pivot first (net_pivot=on): 8 scores a lane, the networks where more than 32 survive")) << d;
  EXPECT_TRUE(has(d, "8 scores a lane, the networks where more than 32 survive; a warp a row, ordered by sorts (net_pivot_mode auto)")) << d;
  o = parse_topk_select_options("net_pivot=on,net_pivot_mode=sort");
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "8 scores a lane, the networks where more than 32 survive; a warp a row, ordered by sorts (net_pivot_mode=sort)")) << d;
  o = parse_topk_select_options("net_pivot_mode=rank_cta");
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "(2 of those scores each), ordered by counting (net_pivot_mode=rank_cta)")) << d;
  o = parse_topk_select_options("net_pivot=on");
  tp.force_end = 0;
  d = describe(plan_topk_select(tp, o, facts), tp, o, facts);
  EXPECT_TRUE(has(d, "; 16 lanes per row, 32 words per lane; net_pivot=on does not apply: rows choose more than 15 blocks")) << d;
}

}  // namespace
}  // namespace flashmsa

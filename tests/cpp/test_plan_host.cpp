// The planner (include/flashmsa/plan.h, csrc/plan.cpp, csrc/sparse_attn/plan.cpp) on the CPU:
// which schedule and kernel each call gets for given options and device facts, the launch groups,
// the tile-waste bound, decode splits, the workspace layout, and the parsing of option text.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "flashmsa/types.h"
#include "sparse_attn/heuristics.h"
#include "sparse_attn/kernel_traits.h"

namespace flashmsa {
namespace {

constexpr int kMinRows = 1024;  // heuristics.h kKvMajorMinRows

int g_dummy[4];

// Shapes only: the planner never reads tensor memory.
SparseAttnParams attn(int total_q, int hq = 64, int hkv = 4, int topk = 16, DType kv = DType::kBF16) {
  SparseAttnParams p{};
  p.batch = 1;
  p.total_q = total_q;
  p.num_heads = hq;
  p.num_kv_heads = hkv;
  p.topk = topk;
  p.q_dtype = DType::kBF16;
  p.out_dtype = DType::kBF16;
  p.k.dtype = kv;
  p.v.dtype = kv;
  p.kv.batch = 1;
  p.kv.total_k = std::max(total_q, 128);
  p.lse_temperature = 1.0f;
  return p;
}

SparseAttnParams paged(SparseAttnParams p, int batch, int max_pages) {
  p.batch = batch;
  p.kv.batch = batch;
  p.kv.paged = true;
  p.kv.page_table = g_dummy;
  p.kv.max_pages = max_pages;
  return p;
}

SparseAttnParams with_temperature(SparseAttnParams p) {
  p.lse_temperature_out = reinterpret_cast<float*>(g_dummy);
  return p;
}

// An H200-like device: 132 SMs, every kernel variant runnable.
SparseAttnDeviceFacts hopper() {
  SparseAttnDeviceFacts f;
  f.num_sms = 132;
  f.kv_major_wgmma_ctas = 1;
  f.kv_major_mma_sync_ctas[0] = 2;
  f.kv_major_mma_sync_ctas[1] = 1;
  f.tile_ctas = 1;
  return f;
}

// An A100-like device: no sm_90a kernels.
SparseAttnDeviceFacts ampere() {
  SparseAttnDeviceFacts f = hopper();
  f.num_sms = 108;
  f.kv_major_wgmma_ctas = 0;
  f.tile_ctas = 0;
  return f;
}

// The same device without the TMA-fed register kernel (an sm_90 GPU without the sm_90a image).
SparseAttnDeviceFacts hopper_without_regs_tma(SparseAttnDeviceFacts f) {
  f.decode_regs_tma_ctas = 0;
  return f;
}

SparseAttnOptions opts(PrefillSchedule s, KvMajorKernel k = KvMajorKernel::kAuto) {
  SparseAttnOptions o;
  o.schedule = s;
  o.kv_major_kernel = k;
  return o;
}

void expect_error(const std::function<void()>& fn, ErrorKind kind, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no flashmsa::Error thrown (expected one containing '" << needle << "')";
}

// Sections follow each other, each starting 256-byte aligned right after the previous one (its
// bytes rounded up): aligned, non-overlapping, and together exactly the plan's bytes.
void expect_layout_sound(const SparseAttnPlan& plan) {
  const WorkspaceLayout& ws = plan.workspace;
  EXPECT_EQ(plan.bytes, ws.bytes);
  EXPECT_EQ(ws.bytes % kWorkspaceAlign, 0u);
  size_t next = 0;
  for (int i = 0; i < ws.num_sections; ++i) {
    const WorkspaceSection& s = ws.sections[i];
    EXPECT_EQ(s.offset % kWorkspaceAlign, 0u) << s.name;
    EXPECT_EQ(s.offset, next) << s.name;
    EXPECT_GT(s.bytes, 0u) << s.name;
    next = s.offset + (s.bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  }
  EXPECT_EQ(next, ws.bytes);
}

const WorkspaceSection* section(const SparseAttnPlan& plan, const std::string& name) {
  for (int i = 0; i < plan.workspace.num_sections; ++i)
    if (name == plan.workspace.sections[i].name) return &plan.workspace.sections[i];
  return nullptr;
}

// ---- schedule ----------------------------------------------------------------------------------

TEST(PlanSchedule, AutoIsQueryMajorBelowTheThresholdAndHybridAbove) {
  const SparseAttnPlan small = plan_sparse_attention(attn(kMinRows - 1), {}, hopper());
  EXPECT_EQ(small.schedule, PrefillSchedule::kQueryMajor);
  const SparseAttnPlan large = plan_sparse_attention(attn(kMinRows), {}, hopper());
  EXPECT_EQ(large.schedule, PrefillSchedule::kHybrid);
  EXPECT_TRUE(large.kvm.tiles);
  EXPECT_EQ(large.kvm.kernel, KvMajorKernel::kWgmma);
}

TEST(PlanSchedule, AutoAboveTheThresholdWithoutTilesIsKvMajor) {
  // No tile kernel on the device, NVFP4 K/V (no tile instantiation) and groups whose tokens do
  // not fill a 128-row tile (G = 8, G = 48) take the KV-major schedule alone.
  EXPECT_EQ(plan_sparse_attention(attn(4096), {}, ampere()).schedule, PrefillSchedule::kKvMajor);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 64, 4, 16, DType::kNVFP4), {}, hopper()).schedule,
            PrefillSchedule::kKvMajor);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 32, 4), {}, hopper()).schedule, PrefillSchedule::kKvMajor);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 48, 1), {}, hopper()).schedule, PrefillSchedule::kKvMajor);
  for (int g : {16, 32, 64, 128})
    EXPECT_EQ(plan_sparse_attention(attn(4096, g, 1), {}, hopper()).schedule, PrefillSchedule::kHybrid) << g;
  // fp8 K/V keep the tiles.
  EXPECT_EQ(plan_sparse_attention(attn(4096, 64, 4, 16, DType::kFP8E4M3), {}, hopper()).schedule,
            PrefillSchedule::kHybrid);
}

TEST(PlanSchedule, AutoFallsBackToQueryMajorWhenNoKvMajorKernelFits) {
  SparseAttnDeviceFacts none = ampere();
  none.kv_major_mma_sync_ctas[0] = none.kv_major_mma_sync_ctas[1] = 0;
  const SparseAttnPlan plan = plan_sparse_attention(attn(8192), {}, none);
  EXPECT_EQ(plan.schedule, PrefillSchedule::kQueryMajor);
  expect_layout_sound(plan);
  expect_error([&] { plan_sparse_attention(attn(8192), opts(PrefillSchedule::kKvMajor), none); },
               ErrorKind::kNotSupported, "schedule=kv_major");
  expect_error([&] { plan_sparse_attention(attn(10), opts(PrefillSchedule::kHybrid), none); },
               ErrorKind::kNotSupported, "schedule=hybrid");
}

TEST(PlanSchedule, ForcedSchedules) {
  EXPECT_EQ(plan_sparse_attention(attn(8192), opts(PrefillSchedule::kQueryMajor), hopper()).schedule,
            PrefillSchedule::kQueryMajor);
  // kv_major is the KV-major schedule alone, whatever the size and even where tiles could run.
  const SparseAttnPlan kvm = plan_sparse_attention(attn(10), opts(PrefillSchedule::kKvMajor), hopper());
  EXPECT_EQ(kvm.schedule, PrefillSchedule::kKvMajor);
  EXPECT_FALSE(kvm.kvm.tiles);
  EXPECT_EQ(section(kvm, "tile.done"), nullptr);
  const SparseAttnPlan hyb = plan_sparse_attention(attn(10), opts(PrefillSchedule::kHybrid), hopper());
  EXPECT_EQ(hyb.schedule, PrefillSchedule::kHybrid);
  EXPECT_TRUE(hyb.kvm.tiles);
  EXPECT_EQ(hyb.kvm.tile_tokens, 128 / 16);
  EXPECT_EQ(hyb.kvm.num_tiles, 2);  // ceil(10 / 8)
  EXPECT_EQ(hyb.kvm.tile_max_entries, 8 * 16);
  EXPECT_EQ(hyb.kvm.tile_grid, 132);
  // hybrid where the tile kernel cannot run is the KV-major schedule.
  EXPECT_EQ(plan_sparse_attention(attn(10), opts(PrefillSchedule::kHybrid), ampere()).schedule,
            PrefillSchedule::kKvMajor);
  // The tiles run with either KV-major kernel.
  const SparseAttnPlan mixed =
      plan_sparse_attention(attn(10), opts(PrefillSchedule::kHybrid, KvMajorKernel::kMmaSync), hopper());
  EXPECT_TRUE(mixed.kvm.tiles);
  EXPECT_EQ(mixed.kvm.kernel, KvMajorKernel::kMmaSync);
}

TEST(PlanSchedule, EmptyCallNeedsNothing) {
  const SparseAttnPlan plan = plan_sparse_attention(attn(0), opts(PrefillSchedule::kKvMajor), ampere());
  EXPECT_EQ(plan.bytes, 0u);
  EXPECT_EQ(plan.workspace.num_sections, 0);
}

// ---- KV-major kernel ---------------------------------------------------------------------------

TEST(PlanKernel, WgmmaWhereItCanRunElseMmaSync) {
  const KvMajorPlan h = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor), hopper()).kvm;
  EXPECT_EQ(h.kernel, KvMajorKernel::kWgmma);
  EXPECT_EQ(h.q_stages, 2);
  EXPECT_EQ(h.tokens_per_item, 256);  // 4096 rows / G = 16 (under the sm_90a cap of 1024 tokens)
  const KvMajorPlan a = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor), ampere()).kvm;
  EXPECT_EQ(a.kernel, KvMajorKernel::kMmaSync);
  EXPECT_EQ(a.q_stages, 2);
  EXPECT_EQ(a.grid, std::min(a.max_items, 1 * 108));
  // G = 1: 4096 rows per item on mma_sync, capped at 1024 tokens on wgmma.
  EXPECT_EQ(plan_sparse_attention(attn(4096, 4, 4), opts(PrefillSchedule::kKvMajor), ampere()).kvm.tokens_per_item, 4096);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 4, 4), opts(PrefillSchedule::kKvMajor), hopper()).kvm.tokens_per_item, 1024);
}

TEST(PlanKernel, MmaSyncStagesFollowSharedMemory) {
  SparseAttnDeviceFacts f = ampere();
  f.kv_major_mma_sync_ctas[1] = 0;  // two query stages do not fit, one does
  const KvMajorPlan k = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor), f).kvm;
  EXPECT_EQ(k.kernel, KvMajorKernel::kMmaSync);
  EXPECT_EQ(k.q_stages, 1);
  EXPECT_EQ(k.grid, std::min(k.max_items, 2 * 108));
}

TEST(PlanKernel, ForcedKernels) {
  const KvMajorPlan m = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kMmaSync), hopper()).kvm;
  EXPECT_EQ(m.kernel, KvMajorKernel::kMmaSync);
  EXPECT_EQ(m.grid, std::min(m.max_items, 1 * 132));  // mma_sync's 1 CTA / SM at two stages
  const KvMajorPlan w = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kWgmma), hopper()).kvm;
  EXPECT_EQ(w.kernel, KvMajorKernel::kWgmma);
  expect_error([&] { plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kWgmma), ampere()); },
               ErrorKind::kNotSupported, "kv_major_kernel=wgmma");
  // A forced kernel of a schedule that does not run is not an error (auto below the threshold).
  EXPECT_EQ(plan_sparse_attention(attn(100), opts(PrefillSchedule::kAuto, KvMajorKernel::kWgmma), ampere()).schedule,
            PrefillSchedule::kQueryMajor);
}

TEST(PlanKernel, TmaOnlyWhenNamedAndFallsBackSayingWhy) {
  SparseAttnDeviceFacts f = hopper();
  f.kv_major_tma_ctas = 1;
  // auto never takes it (not yet measured on the GPU).
  EXPECT_EQ(plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor), f).kvm.kernel, KvMajorKernel::kWgmma);
  const KvMajorPlan t = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kTma), f).kvm;
  EXPECT_EQ(t.kernel, KvMajorKernel::kTma);
  EXPECT_EQ(t.tma_fallback, nullptr);
  EXPECT_EQ(t.grid, std::min(t.max_items, 1 * 132));
  EXPECT_EQ(t.tokens_per_item, 256);  // 4096 / G = 16, the TMA kernel's cap
  // G = 8: 512 tokens by rows, capped at 256; G = 64 and G = 128 run too.
  EXPECT_EQ(plan_sparse_attention(attn(4096, 32, 4), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kTma), f)
                .kvm.tokens_per_item, 256);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 64, 1), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kTma), f)
                .kvm.kernel, KvMajorKernel::kTma);
  EXPECT_EQ(plan_sparse_attention(attn(4096, 128, 1), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kTma), f)
                .kvm.kernel, KvMajorKernel::kTma);
  // The same lists and workspace as wgmma but for the item cap (equal here: 256 tokens both).
  const KvMajorPlan w = plan_sparse_attention(attn(4096), opts(PrefillSchedule::kKvMajor, KvMajorKernel::kWgmma), f).kvm;
  EXPECT_EQ(t.chunk_rows, w.chunk_rows);
  EXPECT_EQ(t.max_items, w.max_items);
  auto fallback = [&](const SparseAttnParams& p, const SparseAttnDeviceFacts& facts, KvMajorKernel to,
                      const std::string& why) {
    const KvMajorPlan k = plan_sparse_attention(p, opts(PrefillSchedule::kHybrid, KvMajorKernel::kTma), facts).kvm;
    EXPECT_EQ(k.kernel, to);
    ASSERT_NE(k.tma_fallback, nullptr);
    EXPECT_NE(std::string(k.tma_fallback).find(why), std::string::npos) << k.tma_fallback;
    if (to == KvMajorKernel::kWgmma) EXPECT_LE(k.tokens_per_item, 1024);  // the wgmma kernel's cap
  };
  fallback(attn(4096, 64, 4, 16, DType::kFP8E4M3), f, KvMajorKernel::kWgmma, "fp8");
  fallback(attn(4096, 64, 4, 16, DType::kNVFP4), f, KvMajorKernel::kWgmma, "NVFP4");
  fallback(attn(4096), hopper(), KvMajorKernel::kWgmma, "cannot run on this device");
  fallback(attn(4096), ampere(), KvMajorKernel::kMmaSync, "cannot run on this device");
  fallback(attn(4096, 16, 4), f, KvMajorKernel::kWgmma, "G is not");   // G = 4
  fallback(attn(4096, 96, 4), f, KvMajorKernel::kWgmma, "G is not");   // G = 24
  SparseAttnParams strided = attn(4096);
  strided.q_stride_head = 132;  // 264 bytes
  fallback(strided, f, KvMajorKernel::kWgmma, "16 bytes");
  SparseAttnParams huge = attn(4096);
  huge.kv.total_k = (int64_t(1) << 31) - 100;
  fallback(huge, f, KvMajorKernel::kWgmma, "32-bit coordinates");
  SparseAttnParams empty = attn(4096);
  empty.kv.total_k = 0;
  fallback(empty, f, KvMajorKernel::kWgmma, "no K/V rows");
}

// The KV-major schedule with a kernel and a kv_major_store option.
SparseAttnOptions kvm_opts(KvMajorKernel k, KvMajorStore st = KvMajorStore::kAuto) {
  SparseAttnOptions o = opts(PrefillSchedule::kKvMajor, k);
  o.kv_major_store = st;
  return o;
}

// The partials by TMA stores: auto's and tma's on the warpgroup-MMA kernel with G a multiple of 16
// (H200 at 73ba220: faster), elsewhere stg with the reason; stg only where named.
TEST(PlanKernel, TmaStoreWhereItAppliesElseFallsBackSayingWhy) {
  const KvMajorPlan stg =
      plan_sparse_attention(attn(4096), kvm_opts(KvMajorKernel::kAuto, KvMajorStore::kStg), hopper()).kvm;
  EXPECT_FALSE(stg.tma_store);
  EXPECT_EQ(stg.store_fallback, nullptr);
  for (KvMajorStore st : {KvMajorStore::kAuto, KvMajorStore::kTma}) {
    SCOPED_TRACE(option_name(st));
    auto named = [&](KvMajorKernel k) { return kvm_opts(k, st); };
    const KvMajorPlan t = plan_sparse_attention(attn(4096), named(KvMajorKernel::kAuto), hopper()).kvm;
    EXPECT_EQ(t.kernel, KvMajorKernel::kWgmma);
    EXPECT_TRUE(t.tma_store);
    EXPECT_EQ(t.store_fallback, nullptr);
    // The same lists, items and grid as with stg.
    EXPECT_EQ(t.chunk_rows, stg.chunk_rows);
    EXPECT_EQ(t.max_items, stg.max_items);
    EXPECT_EQ(t.grid, stg.grid);
    for (int hq : {128, 256, 512})  // G = 32, 64, 128
      EXPECT_TRUE(plan_sparse_attention(attn(4096, hq, 4), named(KvMajorKernel::kAuto), hopper()).kvm.tma_store)
          << hq;
    auto fallback = [&](const SparseAttnParams& p, const SparseAttnDeviceFacts& f, KvMajorKernel k,
                        const std::string& because) {
      const KvMajorPlan x = plan_sparse_attention(p, named(k), f).kvm;
      EXPECT_FALSE(x.tma_store);
      ASSERT_NE(x.store_fallback, nullptr);
      EXPECT_NE(std::string(x.store_fallback).find(because), std::string::npos) << x.store_fallback;
    };
    fallback(attn(4096, 16, 4), hopper(), KvMajorKernel::kAuto, "multiple of 16");  // G = 4
    fallback(attn(4096, 32, 4), hopper(), KvMajorKernel::kAuto, "multiple of 16");  // G = 8
    fallback(attn(4096, 96, 4), hopper(), KvMajorKernel::kAuto, "multiple of 16");  // G = 24
    fallback(attn(4096), hopper(), KvMajorKernel::kMmaSync, "warpgroup-MMA");
    fallback(attn(4096), ampere(), KvMajorKernel::kAuto, "warpgroup-MMA");
  }
  // The default options (auto schedule, auto store) on Hopper: TMA stores.
  EXPECT_TRUE(plan_sparse_attention(attn(4096), SparseAttnOptions{}, hopper()).kvm.tma_store);
  EXPECT_EQ(parse_sparse_attention_options("kv_major_store=tma").kv_major_store, KvMajorStore::kTma);
  EXPECT_EQ(parse_sparse_attention_options("kv_major_store=stg").kv_major_store, KvMajorStore::kStg);
  expect_error([] { parse_sparse_attention_options("kv_major_store=ldg"); }, ErrorKind::kValue, "kv_major_store");
  // kv_major_gather (the query rows by TMA boxes) was removed: bit-identical and slower (73ba220).
  expect_error([] { parse_sparse_attention_options("kv_major_gather=tma"); }, ErrorKind::kValue,
               "unknown plan option 'kv_major_gather'");
}

// kv_major_math: approx (auto's and approx's) on the warpgroup-MMA kernel (any G, any K/V kind), a
// forced approx elsewhere says why, precise only where named; the lists, items and grid unchanged.
TEST(PlanKernel, ApproxRowMathOnTheWgmmaKernelUnlessPreciseIsNamed) {
  SparseAttnOptions o = kvm_opts(KvMajorKernel::kAuto);
  o.kv_major_math = KvMajorMath::kPrecise;
  const KvMajorPlan a = plan_sparse_attention(attn(4096), o, hopper()).kvm;
  EXPECT_FALSE(a.approx_math);
  EXPECT_EQ(a.math_fallback, nullptr);
  for (KvMajorMath m : {KvMajorMath::kAuto, KvMajorMath::kApprox}) {
    o.kv_major_math = m;
    for (int hq : {16, 64, 512}) {  // G = 4, 16, 128
      const KvMajorPlan t = plan_sparse_attention(attn(4096, hq, 4), o, hopper()).kvm;
      EXPECT_TRUE(t.approx_math) << hq;
      EXPECT_EQ(t.math_fallback, nullptr) << hq;
    }
  }
  EXPECT_TRUE(plan_sparse_attention(attn(4096), SparseAttnOptions{}, hopper()).kvm.approx_math);
  // auto off the warpgroup-MMA kernel: precise, nothing to explain.
  const KvMajorPlan m = plan_sparse_attention(attn(4096), kvm_opts(KvMajorKernel::kMmaSync), hopper()).kvm;
  EXPECT_FALSE(m.approx_math);
  EXPECT_EQ(m.math_fallback, nullptr);
  const KvMajorPlan t = plan_sparse_attention(attn(4096), o, hopper()).kvm;
  EXPECT_EQ(t.chunk_rows, a.chunk_rows);
  EXPECT_EQ(t.max_items, a.max_items);
  EXPECT_EQ(t.grid, a.grid);
  EXPECT_TRUE(t.tma_store);  // independent of the stores
  for (const auto& [facts, kernel] : {std::pair{hopper(), KvMajorKernel::kMmaSync}, std::pair{ampere(), KvMajorKernel::kAuto}}) {
    SparseAttnOptions f = kvm_opts(kernel);
    f.kv_major_math = KvMajorMath::kApprox;
    const KvMajorPlan x = plan_sparse_attention(attn(4096), f, facts).kvm;
    EXPECT_FALSE(x.approx_math);
    ASSERT_NE(x.math_fallback, nullptr);
    EXPECT_NE(std::string(x.math_fallback).find("warpgroup-MMA"), std::string::npos) << x.math_fallback;
  }
  EXPECT_EQ(parse_sparse_attention_options("kv_major_math=approx").kv_major_math, KvMajorMath::kApprox);
  EXPECT_EQ(parse_sparse_attention_options("kv_major_math=precise").kv_major_math, KvMajorMath::kPrecise);
  expect_error([] { parse_sparse_attention_options("kv_major_math=fast"); }, ErrorKind::kValue,
               "kv_major_math must be auto, precise or approx, got 'fast'");
}

// What the TMA KV-major kernel's launcher builds its maps on (kv_major_tma_sm90.cuh): the partial
// store map is (128 dims, Hkv x chunk_rows x topk x G rows) of the compute dtype with a 256-byte
// row stride on kvm.part_o, and an item's list fits the kernel's 256-token shared-memory slot. So
// for every G the kernel takes, flat and paged, with and without the temperature LSE: 16-bit
// partials of exactly 128 elements per row, sections 256-byte aligned (TMA needs 16), partial rows
// within 32-bit coordinates, items of at most 256 tokens and 4096 rows.
TEST(PlanKernel, TmaWorkspaceMatchesItsTensorMaps) {
  SparseAttnDeviceFacts f = hopper();
  f.kv_major_tma_ctas = 1;
  float lse_t[1];
  for (int hq : {32, 64, 128, 256, 512}) {  // G = 8 .. 128 at 4 kv heads
    for (bool is_paged : {false, true}) {
      for (bool temp : {false, true}) {
        for (DType dt : {DType::kBF16, DType::kFP16}) {
          SparseAttnParams p = attn(4096, hq, 4, 16, dt);
          p.q_dtype = p.out_dtype = dt;
          if (is_paged) {
            p = paged(p, 1, 32);
            p.kv.num_pages = 32;
          }
          if (temp) p.lse_temperature_out = lse_t;
          const int G = hq / 4;
          const std::string what = "G " + std::to_string(G) + (is_paged ? " paged" : " flat") +
                                   (temp ? " temp" : "") + (dt == DType::kFP16 ? " fp16" : " bf16");
          for (PrefillSchedule s : {PrefillSchedule::kKvMajor, PrefillSchedule::kHybrid}) {
            const SparseAttnPlan plan = plan_sparse_attention(p, opts(s, KvMajorKernel::kTma), f);
            const KvMajorPlan& k = plan.kvm;
            ASSERT_EQ(k.kernel, KvMajorKernel::kTma) << what << (k.tma_fallback ? k.tma_fallback : "");
            expect_layout_sound(plan);
            EXPECT_GE(k.tokens_per_item, 1) << what;
            EXPECT_LE(k.tokens_per_item, 256) << what;  // kKvmTmaMaxTokensPerItem: the list slot
            EXPECT_LE(int64_t(k.tokens_per_item) * G, 4096) << what;
            const int64_t rows = int64_t(4) * k.chunk_rows * 16 * G;
            EXPECT_LT(rows, int64_t(1) << 31) << what;
            const WorkspaceSection* o = section(plan, "kvm.part_o");
            const WorkspaceSection* lse = section(plan, "kvm.part_lse");
            const WorkspaceSection* lt = section(plan, "kvm.part_lse_t");
            ASSERT_NE(o, nullptr);
            ASSERT_NE(lse, nullptr);
            EXPECT_EQ(o->offset, k.part_o_off) << what;
            EXPECT_EQ(o->offset % kWorkspaceAlign, 0u) << what;
            EXPECT_EQ(o->bytes, size_t(rows) * 128 * 2) << what;  // the o map: 256-byte rows
            EXPECT_EQ(lse->offset, k.part_lse_off) << what;
            EXPECT_EQ(lse->bytes, size_t(rows) * 4) << what;
            ASSERT_EQ(lt != nullptr, temp) << what;
            if (temp) {
              EXPECT_EQ(lt->offset, k.part_lse_t_off) << what;
              EXPECT_EQ(lt->bytes, size_t(rows) * 4) << what;
            }
          }
        }
      }
    }
  }
}

// ---- launch groups -----------------------------------------------------------------------------

TEST(PlanGroups, ChunkRowsGiveEqualLaunchGroups) {
  struct Case {
    int total_q, chunk_rows, groups, rows;
  } cases[] = {{511, 1, 511, 1}, {511, 37, 14, 37}, {511, 500, 2, 256}, {511, 511, 1, 511},
               {511, 100000, 1, 511}, {300, 7, 43, 7}};
  for (const Case& c : cases) {
    SparseAttnOptions o = opts(PrefillSchedule::kKvMajor);
    o.chunk_rows = c.chunk_rows;
    const KvMajorPlan k = plan_sparse_attention(attn(c.total_q, 16, 2), o, hopper()).kvm;
    EXPECT_EQ(k.groups, c.groups) << c.total_q << " / " << c.chunk_rows;
    EXPECT_EQ(k.chunk_rows, c.rows) << c.total_q << " / " << c.chunk_rows;
    EXPECT_GE(int64_t(k.groups) * k.chunk_rows, c.total_q);
    EXPECT_LT(int64_t(k.groups - 1) * k.chunk_rows, c.total_q);
  }
}

TEST(PlanGroups, DefaultGroupsKeepPartialsUnderTheBudget) {
  // M3 at 32K rows: 4 * 16 * (4 + 16 * (256 + 4)) bytes per row -> 4029 rows per 1 GiB -> 9 equal
  // groups of 3641 rows.
  const SparseAttnPlan p = plan_sparse_attention(attn(32768), {}, hopper());
  EXPECT_EQ(p.kvm.groups, 9);
  EXPECT_EQ(p.kvm.chunk_rows, 3641);
  const WorkspaceSection* part = section(p, "kvm.part_o");
  ASSERT_NE(part, nullptr);
  EXPECT_LE(part->bytes, size_t(1) << 30);
  EXPECT_EQ(part->bytes, size_t(4) * 3641 * 16 * 16 * 128 * 2);
  // A small prefill is one group.
  EXPECT_EQ(plan_sparse_attention(attn(2000), {}, hopper()).kvm.groups, 1);
}

// ---- work lists ---------------------------------------------------------------------------------

TEST(PlanLists, DefaultIsOnceAndOnceSizesEveryGroupsLists) {
  const SparseAttnParams p = attn(32768);
  SparseAttnOptions pg;
  pg.lists = KvMajorLists::kPerGroup;
  const SparseAttnPlan dflt = plan_sparse_attention(p, pg, hopper());
  EXPECT_EQ(dflt.kvm.lists, KvMajorLists::kPerGroup);
  EXPECT_FALSE(dflt.kvm.lists_fallback);
  SparseAttnOptions o;
  o.lists = KvMajorLists::kOnce;
  const SparseAttnPlan once = plan_sparse_attention(p, o, hopper());
  // auto (the default) plans exactly what once does where it fits.
  const SparseAttnPlan au = plan_sparse_attention(p, {}, hopper());
  EXPECT_EQ(au.kvm.lists, KvMajorLists::kOnce);
  EXPECT_EQ(au.bytes, once.bytes);
  expect_layout_sound(once);
  const KvMajorPlan& k = once.kvm;
  ASSERT_EQ(k.lists, KvMajorLists::kOnce);
  EXPECT_FALSE(k.lists_fallback);
  // The same groups, kernel, grid and partials as per_group: only the list arrays grow.
  EXPECT_EQ(k.groups, 9);
  EXPECT_EQ(k.chunk_rows, dflt.kvm.chunk_rows);
  EXPECT_EQ(k.max_items, dflt.kvm.max_items);
  EXPECT_EQ(k.grid, dflt.kvm.grid);
  EXPECT_EQ(section(once, "kvm.part_o")->bytes, section(dflt, "kvm.part_o")->bytes);
  EXPECT_EQ(section(once, "kvm.part_lse")->bytes, section(dflt, "kvm.part_lse")->bytes);
  for (const char* name : {"kvm.counts", "kvm.cursors", "kvm.control", "kvm.items", "kvm.list"})
    EXPECT_EQ(section(once, name)->bytes, size_t(9) * section(dflt, name)->bytes) << name;
  EXPECT_EQ(section(once, "kvm.list")->bytes, size_t(9) * 4 * 3641 * 16 * 4);
  EXPECT_EQ(section(once, "kvm.counts")->bytes, size_t(9) * 4 * (32768 / 128 + 2) * 4);
  const int64_t per_group = 2 * int64_t(4) * k.nb_bound * 4 + 8 +
                            int64_t(k.max_items) * 32 + 4 * 3641 * 16 * 4;
  EXPECT_EQ(k.lists_once_bytes, 9 * per_group);
  EXPECT_LT(k.lists_once_bytes, 10 << 20);  // 9.0 MB (docs/design/sparse_attention.md#work-lists)
  // One group: the same layout as per_group.
  const SparseAttnPlan small = plan_sparse_attention(attn(2000), o, hopper());
  EXPECT_EQ(small.kvm.lists, KvMajorLists::kOnce);
  EXPECT_EQ(small.kvm.groups, 1);
  EXPECT_EQ(small.bytes, plan_sparse_attention(attn(2000), pg, hopper()).bytes);
  // With tiles, paged K/V, a temperature LSE and small groups the layout stays sound.
  o.chunk_rows = 37;
  o.schedule = PrefillSchedule::kHybrid;
  const SparseAttnPlan h = plan_sparse_attention(paged(with_temperature(attn(1500, 32, 2, 7)), 3, 11), o, hopper());
  expect_layout_sound(h);
  EXPECT_EQ(h.kvm.lists, KvMajorLists::kOnce);
  EXPECT_EQ(h.kvm.groups, 41);
  EXPECT_EQ(section(h, "kvm.control")->bytes, size_t(41) * 8);
  EXPECT_EQ(section(h, "kvm.counts")->bytes, size_t(41) * 2 * 33 * 4);
}

TEST(PlanLists, OnceFallsBackToPerGroupBeyondTheBudget) {
  SparseAttnOptions o;
  o.lists = KvMajorLists::kOnce;
  // M3 at 1M tokens: 261 groups, 619 MB of lists (within 1 GiB).
  const KvMajorPlan m = plan_sparse_attention(attn(1 << 20), o, hopper()).kvm;
  EXPECT_EQ(m.groups, 261);
  EXPECT_EQ(m.lists, KvMajorLists::kOnce);
  EXPECT_FALSE(m.lists_fallback);
  EXPECT_GT(m.lists_once_bytes, 600000000);
  EXPECT_LE(m.lists_once_bytes, kKvMajorListsOnceBudget);
  // At 2M tokens they would take 1.9 GB: per_group, with the size it would have taken.
  const SparseAttnPlan big = plan_sparse_attention(attn(1 << 21), o, hopper());
  EXPECT_EQ(big.kvm.lists, KvMajorLists::kPerGroup);
  EXPECT_TRUE(big.kvm.lists_fallback);
  EXPECT_GT(big.kvm.lists_once_bytes, kKvMajorListsOnceBudget);
  SparseAttnOptions pg;
  pg.lists = KvMajorLists::kPerGroup;
  EXPECT_EQ(big.bytes, plan_sparse_attention(attn(1 << 21), pg, hopper()).bytes);
  // auto falls back the same way.
  const KvMajorPlan au = plan_sparse_attention(attn(1 << 21), {}, hopper()).kvm;
  EXPECT_EQ(au.lists, KvMajorLists::kPerGroup);
  EXPECT_TRUE(au.lists_fallback);
  // Query-major plans have no lists.
  o.schedule = PrefillSchedule::kQueryMajor;
  EXPECT_EQ(plan_sparse_attention(attn(32768), o, hopper()).schedule, PrefillSchedule::kQueryMajor);
}

// ---- tile kernel --------------------------------------------------------------------------------

TEST(PlanTileKernel, DefaultIsTmaWhereItRunsAndCpAsyncWhenForced) {
  SparseAttnDeviceFacts f = hopper();
  f.tile_tma_ctas = 1;
  // auto: the TMA kernel where it runs (H200 at d865e57: 4.03 vs 5.24 ms, 32K clustered), quietly
  // cp_async where it cannot (fp8 K/V, a device without it); cp_async when forced.
  SparseAttnPlan dflt = plan_sparse_attention(attn(4096), {}, f);
  EXPECT_EQ(dflt.kvm.tile_kernel, TileKernel::kTma);
  EXPECT_EQ(dflt.kvm.tile_fallback, nullptr);
  dflt = plan_sparse_attention(attn(4096, 64, 4, 16, DType::kFP8E4M3), {}, f);
  EXPECT_EQ(dflt.kvm.tile_kernel, TileKernel::kCpAsync);
  ASSERT_NE(dflt.kvm.tile_fallback, nullptr);
  EXPECT_EQ(plan_sparse_attention(attn(4096), {}, hopper()).kvm.tile_kernel, TileKernel::kCpAsync);
  SparseAttnOptions o;
  o.tile_kernel = TileKernel::kCpAsync;
  dflt = plan_sparse_attention(attn(4096), o, f);
  EXPECT_EQ(dflt.kvm.tile_kernel, TileKernel::kCpAsync);
  EXPECT_EQ(dflt.kvm.tile_fallback, nullptr);
  o.tile_kernel = TileKernel::kTma;
  for (int g : {16, 32, 64, 128}) {
    const SparseAttnPlan plan = plan_sparse_attention(attn(4096, g, 1), o, f);
    EXPECT_TRUE(plan.kvm.tiles) << g;
    EXPECT_EQ(plan.kvm.tile_kernel, TileKernel::kTma) << g;
    EXPECT_EQ(plan.kvm.tile_fallback, nullptr) << g;
    EXPECT_EQ(plan.kvm.tile_grid, 132) << g;
  }
  SparseAttnParams fp16 = attn(4096);
  fp16.q_dtype = fp16.out_dtype = fp16.k.dtype = fp16.v.dtype = DType::kFP16;
  EXPECT_EQ(plan_sparse_attention(fp16, o, f).kvm.tile_kernel, TileKernel::kTma);
  SparseAttnParams paged = attn(4096);
  paged.kv.paged = true;
  paged.kv.num_pages = 40;
  paged.kv.max_pages = 40;
  EXPECT_EQ(plan_sparse_attention(paged, o, f).kvm.tile_kernel, TileKernel::kTma);
}

TEST(PlanTileKernel, TmaFallsBackToCpAsyncAndSaysWhy) {
  SparseAttnDeviceFacts f = hopper();
  f.tile_tma_ctas = 1;
  SparseAttnOptions o;
  o.tile_kernel = TileKernel::kTma;
  auto fallback = [&](const SparseAttnParams& p, const SparseAttnDeviceFacts& facts, const std::string& why) {
    const SparseAttnPlan plan = plan_sparse_attention(p, o, facts);
    EXPECT_TRUE(plan.kvm.tiles);
    EXPECT_EQ(plan.kvm.tile_kernel, TileKernel::kCpAsync);
    ASSERT_NE(plan.kvm.tile_fallback, nullptr);
    EXPECT_NE(std::string(plan.kvm.tile_fallback).find(why), std::string::npos) << plan.kvm.tile_fallback;
    EXPECT_EQ(plan.kvm.tile_grid, 132);
  };
  fallback(attn(4096, 64, 4, 16, DType::kFP8E4M3), f, "fp8");
  fallback(attn(4096), hopper(), "cannot run on this device");
  SparseAttnParams huge = attn(4096);
  huge.kv.total_k = (int64_t(1) << 31) - 100;
  fallback(huge, f, "32-bit coordinates");
  SparseAttnParams empty = attn(4096);
  empty.kv.total_k = 0;
  fallback(empty, f, "no K/V rows");
  // No tiles (NVFP4 K/V, G = 8, the kv_major schedule): the option changes nothing.
  EXPECT_FALSE(plan_sparse_attention(attn(4096, 64, 4, 16, DType::kNVFP4), o, f).kvm.tiles);
  EXPECT_FALSE(plan_sparse_attention(attn(4096, 32, 4), o, f).kvm.tiles);
}

// ---- tile waste ---------------------------------------------------------------------------------

TEST(PlanTiles, WasteBoundDefaultsPerTileKernelAndFollowsTheOption) {
  // TMA tiles 3.0 up to 8192 rows, 2.0 above; cp.async tiles 1.5 (H200, session 26 at a60079e).
  SparseAttnDeviceFacts tma = hopper();
  tma.tile_tma_ctas = 1;
  ASSERT_EQ(plan_sparse_attention(attn(4096), {}, tma).kvm.tile_kernel, TileKernel::kTma);
  EXPECT_EQ(plan_sparse_attention(attn(4096), {}, tma).kvm.tile_max_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(8192), {}, tma).kvm.tile_max_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(8193), {}, tma).kvm.tile_max_waste_milli, 2000);
  EXPECT_EQ(plan_sparse_attention(attn(16384), {}, tma).kvm.tile_max_waste_milli, 2000);
  EXPECT_EQ(plan_sparse_attention(attn(32768), {}, tma).kvm.tile_max_waste_milli, 2000);
  EXPECT_EQ(plan_sparse_attention(attn(4096), {}, hopper()).kvm.tile_kernel, TileKernel::kCpAsync);
  EXPECT_EQ(plan_sparse_attention(attn(4096), {}, hopper()).kvm.tile_max_waste_milli, 1500);
  SparseAttnOptions o;
  o.tile_kernel = TileKernel::kCpAsync;
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, tma).kvm.tile_max_waste_milli, 1500);
  o.tile_max_waste_milli = 8000;
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, hopper()).kvm.tile_max_waste_milli, 8000);
  o.tile_max_waste_milli = 999;
  expect_error([&] { plan_sparse_attention(attn(4096), o, hopper()); }, ErrorKind::kValue, "tile_max_waste");
  o.tile_max_waste_milli = 8001;
  expect_error([&] { plan_sparse_attention(attn(4096), o, hopper()); }, ErrorKind::kValue, "tile_max_waste");
}

TEST(PlanTiles, AdaptiveBoundAddsTheWideBoundBelowIt) {
  // tile_bound=adaptive: 3.0 beside a lower bound (the default above 8192 rows, or a forced one),
  // nothing where the bound is 3.0 or more already; fixed: never; auto: with the TMA tiles' default
  // bound from 8193 to 40960 rows.
  SparseAttnDeviceFacts tma = hopper();
  tma.tile_tma_ctas = 1;
  SparseAttnOptions o;
  EXPECT_EQ(plan_sparse_attention(attn(8192), o, tma).kvm.tile_wide_waste_milli, 0);  // 3.0 already
  EXPECT_EQ(plan_sparse_attention(attn(8193), o, tma).kvm.tile_wide_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(32768), o, tma).kvm.tile_wide_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(40960), o, tma).kvm.tile_wide_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(40961), o, tma).kvm.tile_wide_waste_milli, 0);
  EXPECT_EQ(plan_sparse_attention(attn(32768), o, hopper()).kvm.tile_wide_waste_milli, 0);  // cp.async
  o.tile_max_waste_milli = 2000;  // a forced bound stays fixed under auto
  EXPECT_EQ(plan_sparse_attention(attn(32768), o, tma).kvm.tile_wide_waste_milli, 0);
  o.tile_max_waste_milli = 0;
  o.tile_bound = TileBound::kFixed;
  EXPECT_EQ(plan_sparse_attention(attn(32768), o, tma).kvm.tile_wide_waste_milli, 0);
  o.tile_bound = TileBound::kAdaptive;
  const SparseAttnPlan big = plan_sparse_attention(attn(32768), o, tma);
  EXPECT_EQ(big.kvm.tile_max_waste_milli, 2000);
  EXPECT_EQ(big.kvm.tile_wide_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, tma).kvm.tile_wide_waste_milli, 0);  // 3.0 already
  o.tile_max_waste_milli = 1000;
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, tma).kvm.tile_wide_waste_milli, 3000);
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, hopper()).kvm.tile_wide_waste_milli, 3000);  // cp.async
  o.tile_max_waste_milli = 4000;
  EXPECT_EQ(plan_sparse_attention(attn(4096), o, tma).kvm.tile_wide_waste_milli, 0);
  EXPECT_EQ(parse_sparse_attention_options("tile_bound=adaptive").tile_bound, TileBound::kAdaptive);
}

// ---- workspace layout ---------------------------------------------------------------------------

TEST(PlanWorkspace, SectionsAreAlignedDisjointAndSumToBytes) {
  const SparseAttnPlan plans[] = {
      plan_sparse_attention(attn(20, 8, 2, 5), {}, hopper()),  // query-major, split
      plan_sparse_attention(with_temperature(attn(20, 8, 2, 5)), {}, hopper()),
      plan_sparse_attention(attn(32768), {}, hopper()),
      plan_sparse_attention(with_temperature(attn(32768)), {}, hopper()),
      plan_sparse_attention(with_temperature(attn(3001, 48, 2, 33)), {}, ampere()),
      plan_sparse_attention(paged(with_temperature(attn(1500, 32, 2, 7)), 3, 11), opts(PrefillSchedule::kHybrid), hopper()),
  };
  for (const SparseAttnPlan& p : plans) {
    expect_layout_sound(p);
    EXPECT_GT(p.bytes, 0u);
  }
  // The named offsets are the sections'.
  const SparseAttnPlan& h = plans[3];
  ASSERT_EQ(h.schedule, PrefillSchedule::kHybrid);
  EXPECT_EQ(section(h, "kvm.list")->offset, h.kvm.list_off);
  EXPECT_EQ(section(h, "kvm.part_lse_t")->offset, h.kvm.part_lse_t_off);
  EXPECT_EQ(section(h, "tile.block")->offset, h.kvm.tile_block_off);
  EXPECT_EQ(section(h, "tile.control")->offset, h.kvm.tile_control_off);
  EXPECT_EQ(section(h, "tile.block")->bytes, size_t(4) * h.kvm.num_tiles * h.kvm.tile_max_entries * 4);
  // Without a temperature LSE there is no temperature section.
  EXPECT_EQ(section(plans[2], "kvm.part_lse_t"), nullptr);
  EXPECT_LT(plans[2].bytes, plans[3].bytes);
  // Paged: the block arrays span batch * max_pages columns per kv head.
  EXPECT_EQ(plans[5].kvm.nb_bound, 33);
  EXPECT_EQ(section(plans[5], "kvm.counts")->bytes, size_t(2) * 33 * 4);
}

TEST(PlanWorkspace, LayoutTakeRoundsEachSection) {
  WorkspaceLayout ws;
  EXPECT_EQ(ws.take("a", 1), 0u);
  EXPECT_EQ(ws.take("b", 256), 256u);
  EXPECT_EQ(ws.take("c", 257), 512u);
  EXPECT_EQ(ws.bytes, 1024u);
  EXPECT_EQ(ws.num_sections, 3);
}

// ---- decode -------------------------------------------------------------------------------------

SparseDecodeParams decode(int batch, int force_fused, PartialDType partial = PartialDType::kDefault) {
  SparseDecodeParams d{};
  d.attn = attn(batch, 64, 4, 16);
  d.attn.qi.seqlen_q = 1;
  d.force_fused = force_fused;
  d.partial_dtype = partial;
  return d;
}

// A partial dtype that cannot hold V's range (fp8: |x| <= 448; fp16: not bf16's) gives way to the
// compute dtype: NVFP4 V dequantizes up to 6 x 448, 16-bit V is unbounded.
TEST(PlanDecode, PartialDtypeHoldsTheRangeOfV) {
  auto kind = [](DType v, PartialDType partial, DType q = DType::kBF16) {
    SparseDecodeParams d = decode(64, 0, partial);
    d.attn.q_dtype = d.attn.out_dtype = q;
    d.attn.k.dtype = d.attn.v.dtype = v;
    return plan_sparse_decode(d, hopper(), {}).qm.part_kind;
  };
  const DType bf16 = DType::kBF16, fp16 = DType::kFP16, fp8 = DType::kFP8E4M3, fp4 = DType::kNVFP4;
  EXPECT_EQ(kind(fp8, PartialDType::kFP8E4M3), StoreKind::kFP8);
  EXPECT_EQ(kind(bf16, PartialDType::kFP8E4M3), StoreKind::kBF16);
  EXPECT_EQ(kind(fp4, PartialDType::kFP8E4M3), StoreKind::kBF16);
  EXPECT_EQ(kind(fp16, PartialDType::kFP8E4M3, fp16), StoreKind::kF16);
  EXPECT_EQ(kind(fp4, PartialDType::kFP16), StoreKind::kF16);
  EXPECT_EQ(kind(fp8, PartialDType::kFP16), StoreKind::kF16);
  EXPECT_EQ(kind(bf16, PartialDType::kFP16), StoreKind::kBF16);
  EXPECT_EQ(kind(bf16, PartialDType::kFloat32), StoreKind::kF32);
  EXPECT_EQ(kind(fp4, PartialDType::kBF16), StoreKind::kBF16);
}

TEST(PlanDecode, SplitsAndFused) {
  // 8 requests x 4 kv heads = 32 items < 132 SMs: ~3 CTAs per SM wants ceil(396 / 32) = 13
  // splits of 16 blocks, rounded so that no split is empty: 2 blocks per split, 8 splits.
  const SparseAttnPlan small = plan_sparse_decode(decode(8, -1), hopper(), {});
  EXPECT_EQ(small.schedule, PrefillSchedule::kQueryMajor);
  EXPECT_FALSE(small.qm.fused);
  EXPECT_EQ(small.qm.splits, 8);
  EXPECT_EQ(small.qm.num_items, int64_t(32) * small.qm.splits);
  expect_layout_sound(small);
  EXPECT_EQ(section(small, "qm.part_o")->bytes, size_t(8) * 64 * small.qm.splits * 128 * 2);
  // 64 requests x 4 kv heads = 256 items >= 132 SMs: fused, no workspace.
  const SparseAttnPlan big = plan_sparse_decode(decode(64, -1), hopper(), {});
  EXPECT_TRUE(big.qm.fused);
  EXPECT_EQ(big.qm.splits, 1);
  EXPECT_EQ(big.bytes, 0u);
  // force_fused = 1: fused whatever the size; 0: at least two splits.
  const SparseAttnPlan fused = plan_sparse_decode(decode(2, 1), hopper(), {});
  EXPECT_TRUE(fused.qm.fused);
  EXPECT_EQ(fused.bytes, 0u);
  const SparseAttnPlan split = plan_sparse_decode(decode(64, 0), hopper(), {});
  EXPECT_FALSE(split.qm.fused);
  EXPECT_EQ(split.qm.splits, 2);
  // The partial dtype sizes the partial outputs.
  const SparseAttnPlan f32 = plan_sparse_decode(decode(64, 0, PartialDType::kFloat32), hopper(), {});
  SparseDecodeParams fp8_call = decode(64, 0, PartialDType::kFP8E4M3);
  fp8_call.attn.k.dtype = fp8_call.attn.v.dtype = DType::kFP8E4M3;
  const SparseAttnPlan fp8 = plan_sparse_decode(fp8_call, hopper(), {});
  EXPECT_EQ(f32.qm.part_kind, StoreKind::kF32);
  EXPECT_EQ(fp8.qm.part_kind, StoreKind::kFP8);
  EXPECT_EQ(section(f32, "qm.part_o")->bytes, 4 * section(fp8, "qm.part_o")->bytes);
  expect_layout_sound(f32);
  // G = 64: 64-row tiles.
  SparseDecodeParams g64 = decode(8, -1);
  g64.attn.num_kv_heads = 1;
  EXPECT_EQ(plan_sparse_decode(g64, hopper(), {}).qm.warps_m, 4);
  EXPECT_EQ(plan_sparse_decode(decode(8, -1), hopper(), {}).qm.warps_m, 1);
}

TEST(PlanDecode, RegsKernelOnlyWhereItApplies) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;  // 105 KB of shared memory per CTA fit
  SparseAttnDeviceFacts a100 = ampere();
  a100.decode_regs_ctas = 2;
  auto fp8 = [](int batch, int hq = 64) {
    SparseDecodeParams d = decode(batch, -1);
    d.attn.num_heads = hq;
    d.attn.k.dtype = d.attn.v.dtype = DType::kFP8E4M3;
    return d;
  };
  SparseDecodeOptions regs;
  regs.kernel = DecodeKernel::kRegs;
  SparseDecodeOptions smem;
  smem.kernel = DecodeKernel::kSmem;
  EXPECT_TRUE(plan_sparse_decode(fp8(30), h200, regs).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(fp8(30), h200, {}).qm.regs);     // auto: regs for fp8 K/V
  EXPECT_FALSE(plan_sparse_decode(decode(30, -1), h200, {}).qm.regs);  // auto: smem for bf16
  EXPECT_FALSE(plan_sparse_decode(fp8(30), h200, smem).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(decode(30, -1), h200, regs).qm.regs);   // bf16 K/V: 3 stages
  SparseDecodeParams nvfp4 = decode(30, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  EXPECT_TRUE(plan_sparse_decode(nvfp4, h200, regs).qm.regs);   // NVFP4: converted in registers
  EXPECT_TRUE(plan_sparse_decode(nvfp4, h200, {}).qm.regs);      // ... by auto too
  EXPECT_FALSE(plan_sparse_decode(nvfp4, h200, smem).qm.regs);
  EXPECT_FALSE(plan_sparse_decode(fp8(30, 128), h200, regs).qm.regs);    // G = 32: 64-row tiles
  SparseAttnDeviceFacts sm89 = a100;
  sm89.decode_regs_ctas = 0;  // below the kernel's 105 KB of shared memory
  EXPECT_FALSE(plan_sparse_decode(fp8(30), sm89, regs).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(fp8(30), a100, regs).qm.regs);
  // Its 2 resident CTAs per SM set the split target: 22 x 4 = 88 items want ceil(264 / 88) = 3
  // splits under split_rule=ceil (3 CTAs per SM: ceil(396 / 88) = 5, rounded to 4 splits of 4
  // blocks).
  SparseDecodeOptions regs_ceil = regs, smem_ceil = smem;
  regs_ceil.split_rule = smem_ceil.split_rule = DecodeSplitRule::kCeil;
  EXPECT_EQ(plan_sparse_decode(fp8(22), h200, regs_ceil).qm.splits, 3);
  EXPECT_EQ(plan_sparse_decode(fp8(22), h200, smem_ceil).qm.splits, 4);
  // auto's waves: 3 splits (264 CTAs, one wave at 264; 4 would spill 88 CTAs into a second).
  EXPECT_EQ(plan_sparse_decode(fp8(22), h200, regs).qm.splits, 3);
  // From 70 % of an item per SM the fp8 register kernel runs fused (query_major_fused_items): 30 x
  // 4 = 120 and 24 x 4 = 96 items of 132 SMs, not 23 x 4 = 92; the smem kernel and NVFP4 keep one
  // item per SM; a forced split still splits.
  EXPECT_TRUE(plan_sparse_decode(fp8(30), h200, regs).qm.fused);
  EXPECT_TRUE(plan_sparse_decode(fp8(24), h200, {}).qm.fused);
  EXPECT_FALSE(plan_sparse_decode(fp8(23), h200, {}).qm.fused);
  EXPECT_FALSE(plan_sparse_decode(fp8(30), h200, smem).qm.fused);
  EXPECT_FALSE(plan_sparse_decode(nvfp4, h200, {}).qm.fused);
  SparseDecodeParams forced_split = fp8(30);
  forced_split.force_fused = 0;
  EXPECT_EQ(plan_sparse_decode(forced_split, h200, {}).qm.splits, 2);
  // 16-bit K/V: auto takes regs for fused calls past the smem kernel's one wave (396 slots on 132
  // SMs) whose last register-kernel wave (264 slots) idles fewer slots: B128 (512 items: 16 idle
  // against 280), B100 (400: 128 against 392), B256 (1024: 32 against 164); not B96 (384: one smem
  // wave), B64, nor the ties B133 (532: 260 idle either way) and B192 (768: 24 either way).
  const struct { int batch; bool regs; } sixteen[] = {{32, false}, {64, false}, {96, false}, {99, false},
                                                      {100, true}, {112, true}, {128, true}, {132, true},
                                                      {133, false}, {192, false}, {256, true}};
  for (const auto& c : sixteen) {
    const QueryMajorPlan got = plan_sparse_decode(decode(c.batch, -1), h200, {}).qm;
    EXPECT_EQ(got.regs, c.regs) << c.batch;
    EXPECT_TRUE(got.fused || c.batch < 33) << c.batch;
  }
  EXPECT_FALSE(plan_sparse_decode(decode(128, 0), h200, {}).qm.regs);  // a forced split keeps smem
  EXPECT_FALSE(plan_sparse_decode(decode(128, -1), h200, smem).qm.regs);
  EXPECT_FALSE(plan_sparse_decode(decode(128, -1), sm89, {}).qm.regs);  // no register kernel there
  // Prefill never takes it.
  SparseAttnParams p = fp8(30).attn;
  EXPECT_FALSE(plan_sparse_attention(p, {}, h200).qm.regs);
}

TEST(PlanDecode, Nvfp4WordConversionOnlyUnderTheRegisterKernelWithNvfp4) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  SparseDecodeParams nvfp4 = decode(30, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  SparseDecodeOptions word;
  word.nvfp4_cvt = DecodeNvfp4Cvt::kWord;
  SparseDecodeOptions regs_word = word;
  regs_word.kernel = DecodeKernel::kRegs;
  SparseDecodeOptions smem_word = word;
  smem_word.kernel = DecodeKernel::kSmem;
  SparseDecodeOptions byte;
  byte.nvfp4_cvt = DecodeNvfp4Cvt::kByte;
  EXPECT_TRUE(plan_sparse_decode(nvfp4, h200, word).qm.nvfp4_word);       // auto takes regs
  EXPECT_TRUE(plan_sparse_decode(nvfp4, h200, regs_word).qm.nvfp4_word);
  EXPECT_TRUE(plan_sparse_decode(nvfp4, h200, {}).qm.nvfp4_word);         // default: word
  EXPECT_FALSE(plan_sparse_decode(nvfp4, h200, byte).qm.nvfp4_word);
  EXPECT_FALSE(plan_sparse_decode(nvfp4, h200, smem_word).qm.nvfp4_word);  // smem kernel
  // The same plan otherwise: items, splits, workspace.
  const SparseAttnPlan a = plan_sparse_decode(nvfp4, h200, regs_word);
  const SparseAttnPlan b = plan_sparse_decode(nvfp4, h200, byte);
  EXPECT_TRUE(a.qm.regs && b.qm.regs);
  EXPECT_EQ(a.qm.splits, b.qm.splits);
  EXPECT_EQ(a.qm.num_items, b.qm.num_items);
  EXPECT_EQ(a.bytes, b.bytes);
  SparseAttnDeviceFacts sm89 = h200;
  sm89.decode_regs_ctas = 0;  // no register kernel: nothing to convert a word at a time
  EXPECT_FALSE(plan_sparse_decode(nvfp4, sm89, regs_word).qm.nvfp4_word);
  SparseDecodeParams fp8 = decode(30, -1);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_FALSE(plan_sparse_decode(fp8, h200, regs_word).qm.nvfp4_word);
  EXPECT_FALSE(plan_sparse_decode(decode(30, -1), h200, regs_word).qm.nvfp4_word);  // bf16
  SparseDecodeParams g32 = nvfp4;
  g32.attn.num_heads = 128;  // G = 32: 64-row tiles, the smem kernel
  EXPECT_FALSE(plan_sparse_decode(g32, h200, regs_word).qm.nvfp4_word);
}

// split_warps=8: where the call splits by blocks on the smem kernel with 16-row tiles and 16-bit K/V,
// 8 warps per CTA (same partial layout and combine; the split count for 2 CTAs per SM); elsewhere
// the 4-warp kernel, and the plan says why (auto: the same choice, silent where it does not apply).
TEST(PlanDecode, SplitWarps8WhereItRuns) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  h200.decode_cluster_max = 16;
  SparseDecodeOptions w8;
  w8.split_warps = DecodeSplitWarps::k8;
  // B1 / M3: 4 items want ceil(264 / 4) = 66 splits, 16 at topk 16: one block per CTA, as with 4
  // warps; the same workspace (partials + combine).
  const SparseAttnPlan b1 = plan_sparse_decode(decode(1, -1), h200, w8);
  const SparseAttnPlan d1 = plan_sparse_decode(decode(1, -1), h200, {});
  EXPECT_TRUE(b1.qm.wide);
  EXPECT_EQ(b1.qm.split_warps_fallback, nullptr);
  EXPECT_FALSE(b1.qm.fused || b1.qm.cluster || b1.qm.regs);
  EXPECT_EQ(b1.qm.splits, 16);
  EXPECT_EQ(b1.qm.num_items, 4 * 16);
  EXPECT_EQ(b1.bytes, d1.bytes);
  EXPECT_TRUE(d1.qm.wide);  // auto: 8 warps where they apply
  EXPECT_EQ(d1.qm.splits, 16);
  EXPECT_EQ(plan_sparse_decode(decode(64, -1), h200, {}).qm.split_warps_fallback, nullptr);  // auto, fused
  EXPECT_FALSE(plan_sparse_decode(decode(64, -1), h200, {}).qm.wide);
  SparseDecodeOptions w4;
  w4.split_warps = DecodeSplitWarps::k4;
  EXPECT_FALSE(plan_sparse_decode(decode(1, -1), h200, w4).qm.wide);
  EXPECT_EQ(plan_sparse_decode(decode(1, -1), h200, w4).qm.split_warps_fallback, nullptr);
  // B8: 32 items want ceil(264 / 32) = 9 splits: 2 blocks each, 8 splits.
  EXPECT_EQ(plan_sparse_decode(decode(8, -1), h200, w8).qm.splits, 8);
  EXPECT_TRUE(plan_sparse_decode(decode(8, -1), h200, w8).qm.wide);
  // A forced split at B64 runs it, and so does a forced 8 on a fused call (the merge writes the
  // outputs: no workspace); auto keeps 4 warps on fused calls.
  EXPECT_TRUE(plan_sparse_decode(decode(64, 0), h200, w8).qm.wide);
  const SparseAttnPlan b64 = plan_sparse_decode(decode(64, -1), h200, w8);
  EXPECT_TRUE(b64.qm.wide && b64.qm.fused);
  EXPECT_EQ(b64.qm.splits, 1);
  EXPECT_EQ(b64.qm.split_warps_fallback, nullptr);
  EXPECT_EQ(b64.bytes, 0u);
  auto why = [&](const SparseDecodeParams& dp, SparseDecodeOptions o, const char* what) {
    o.split_warps = DecodeSplitWarps::k8;
    const SparseAttnPlan pl = plan_sparse_decode(dp, h200, o);
    EXPECT_FALSE(pl.qm.wide) << what;
    ASSERT_NE(pl.qm.split_warps_fallback, nullptr) << what;
    EXPECT_NE(std::string(pl.qm.split_warps_fallback).find(what), std::string::npos) << pl.qm.split_warps_fallback;
  };
  SparseDecodeOptions cluster;
  cluster.split = DecodeSplit::kCluster;
  why(decode(1, -1), cluster, "split=cluster");
  SparseDecodeOptions regs;
  regs.kernel = DecodeKernel::kRegs;
  why(decode(1, -1), regs, "kernel=regs");
  SparseDecodeParams fp8 = decode(1, -1);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions smem;
  smem.kernel = DecodeKernel::kSmem;
  why(fp8, smem, "fp8 K/V under kernel=smem");
  why(fp8, regs, "kernel=regs");
  // fp8 K/V under kernel=auto: the 8-warp kernel converting in registers (not the 4-warp register
  // kernel), with the 16-bit kernel's splits and workspace, where forced and for auto where a
  // split holds one block (B1: 16 splits of one block); auto keeps kernel=regs at two blocks a
  // split (B8), a forced 8 runs it there too.
  const SparseAttnPlan f8 = plan_sparse_decode(fp8, h200, w8);
  const SparseAttnPlan fa = plan_sparse_decode(fp8, h200, {});
  SparseDecodeOptions fp8_w4;
  fp8_w4.split_warps = DecodeSplitWarps::k4;
  const SparseAttnPlan f4 = plan_sparse_decode(fp8, h200, fp8_w4);
  EXPECT_TRUE(f8.qm.wide);
  EXPECT_FALSE(f8.qm.regs);
  EXPECT_EQ(f8.qm.split_warps_fallback, nullptr);
  EXPECT_EQ(f8.qm.splits, 16);
  EXPECT_EQ(f8.bytes, f4.bytes);
  EXPECT_TRUE(fa.qm.wide && !fa.qm.regs);
  EXPECT_EQ(fa.qm.splits, 16);
  EXPECT_FALSE(f4.qm.wide);
  EXPECT_TRUE(f4.qm.regs);
  EXPECT_EQ(f4.qm.split_warps_fallback, nullptr);
  SparseDecodeParams fp8_b8 = decode(8, -1);
  fp8_b8.attn.k.dtype = fp8_b8.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_FALSE(plan_sparse_decode(fp8_b8, h200, {}).qm.wide);
  EXPECT_TRUE(plan_sparse_decode(fp8_b8, h200, {}).qm.regs);
  EXPECT_EQ(plan_sparse_decode(fp8_b8, h200, {}).qm.split_warps_fallback, nullptr);
  EXPECT_TRUE(plan_sparse_decode(fp8_b8, h200, w8).qm.wide);
  EXPECT_EQ(plan_sparse_decode(fp8_b8, h200, w8).qm.splits, 8);
  SparseDecodeParams fp8_b64 = decode(64, -1);
  fp8_b64.attn.k.dtype = fp8_b64.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(plan_sparse_decode(fp8_b64, h200, w8).qm.wide && plan_sparse_decode(fp8_b64, h200, w8).qm.fused);
  EXPECT_FALSE(plan_sparse_decode(fp8_b64, h200, {}).qm.wide);  // auto: the register kernel, fused
  SparseDecodeParams nvfp4 = decode(1, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  why(nvfp4, smem, "NVFP4 K/V");
  why(nvfp4, {}, "kernel=regs");  // auto: regs for NVFP4 K/V
  SparseDecodeParams g32 = decode(1, -1);
  g32.attn.num_heads = 128;
  why(g32, {}, "G > 16");
}

// split=cluster where the 8-warp kernel applies (and the device has its cluster kernel): the
// clusters run on 8 warps, one CTA per SM, the split count planned for that; split_warps=4 (or a
// device without the 8-warp cluster kernel) keeps the 4-warp clusters.
TEST(PlanDecode, SplitClusterOn8Warps) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  h200.decode_cluster_max = 16;
  h200.decode_wide_cluster_max = 16;
  SparseDecodeOptions cluster;
  cluster.split = DecodeSplit::kCluster;
  // B1 / M3: 4 items, one CTA per SM: 16 splits of one block, a cluster of 16; no workspace.
  const SparseAttnPlan b1 = plan_sparse_decode(decode(1, -1), h200, cluster);
  EXPECT_TRUE(b1.qm.cluster && b1.qm.wide);
  EXPECT_EQ(b1.qm.cluster_fallback, nullptr);
  EXPECT_EQ(b1.qm.split_warps_fallback, nullptr);
  EXPECT_EQ(b1.qm.splits, 16);
  EXPECT_EQ(b1.qm.num_items, 4 * 16);
  EXPECT_EQ(b1.bytes, 0u);
  // B8: 32 items at one CTA per SM: 4 splits of 4 blocks (one wave of 128 CTAs), where the blocks
  // split on 8 warps (2 CTAs per SM) takes 8 of 2.
  const SparseAttnPlan b8 = plan_sparse_decode(decode(8, -1), h200, cluster);
  EXPECT_TRUE(b8.qm.cluster && b8.qm.wide);
  EXPECT_EQ(b8.qm.splits, 4);
  EXPECT_EQ(plan_sparse_decode(decode(8, -1), h200, {}).qm.splits, 8);
  // fp8 K/V (kernel=auto): the 8-warp kernel converting in registers, in clusters.
  SparseDecodeParams fp8 = decode(1, -1);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  const SparseAttnPlan f = plan_sparse_decode(fp8, h200, cluster);
  EXPECT_TRUE(f.qm.cluster && f.qm.wide && !f.qm.regs);
  EXPECT_EQ(f.qm.splits, 16);
  // split_warps=4: the 4-warp cluster kernel.
  SparseDecodeOptions c4 = cluster;
  c4.split_warps = DecodeSplitWarps::k4;
  const SparseAttnPlan b1_4 = plan_sparse_decode(decode(1, -1), h200, c4);
  EXPECT_TRUE(b1_4.qm.cluster && !b1_4.qm.wide);
  EXPECT_EQ(b1_4.qm.splits, 16);
  // Clusters of at most 8 CTAs for the 8-warp kernel: 8 splits of 2 blocks.
  SparseAttnDeviceFacts eight = h200;
  eight.decode_wide_cluster_max = 8;
  EXPECT_EQ(plan_sparse_decode(decode(1, -1), eight, cluster).qm.splits, 8);
  // No 8-warp cluster kernel: the 4-warp clusters; a forced split_warps=8 says why.
  SparseAttnDeviceFacts no_wide = h200;
  no_wide.decode_wide_cluster_max = 0;
  const SparseAttnPlan nw = plan_sparse_decode(decode(1, -1), no_wide, cluster);
  EXPECT_TRUE(nw.qm.cluster && !nw.qm.wide);
  EXPECT_EQ(nw.qm.split_warps_fallback, nullptr);
  SparseDecodeOptions c8 = cluster;
  c8.split_warps = DecodeSplitWarps::k8;
  const SparseAttnPlan nw8 = plan_sparse_decode(decode(1, -1), no_wide, c8);
  EXPECT_FALSE(nw8.qm.wide);
  ASSERT_NE(nw8.qm.split_warps_fallback, nullptr);
  EXPECT_NE(std::string(nw8.qm.split_warps_fallback).find("no 8-warp cluster kernel"), std::string::npos);
  // Where one CTA per SM leaves one split a row (M3 at B31: 124 items on 132 SMs; the blocks split
  // on 8 warps takes 2), there is nothing to merge in a cluster: the blocks split, and the plan
  // says why.
  const SparseAttnPlan b31 = plan_sparse_decode(decode(31, -1), h200, cluster);
  EXPECT_FALSE(b31.qm.cluster || b31.qm.fused);
  EXPECT_TRUE(b31.qm.wide);
  EXPECT_EQ(b31.qm.splits, plan_sparse_decode(decode(31, -1), h200, {}).qm.splits);
  EXPECT_GE(b31.qm.splits, 2);
  ASSERT_NE(b31.qm.cluster_fallback, nullptr);
  EXPECT_NE(std::string(b31.qm.cluster_fallback).find("nothing to merge"), std::string::npos);
  EXPECT_GT(b31.bytes, 0u);  // the partials and the combine, as split=blocks
  // MTP union items and NVFP4 K/V stay off the 8-warp clusters.
  SparseDecodeParams nv = decode(1, -1);
  nv.attn.k.dtype = nv.attn.v.dtype = DType::kNVFP4;
  EXPECT_FALSE(plan_sparse_decode(nv, h200, cluster).qm.wide);
}

// split=cluster: where the call splits and the device has clusters, the splits of a row run as one
// cluster (capped at its largest size, no workspace); elsewhere blocks, and the plan says why.
TEST(PlanDecode, SplitClusterWhereItRuns) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  h200.decode_cluster_max = 16;
  SparseDecodeOptions cluster;
  cluster.split = DecodeSplit::kCluster;
  // B1 / M3: 4 items want ceil(396 / 4) = 99 splits, 16 at topk 16: one block per CTA, a cluster of
  // 16 per (token, kv head); no partials, no workspace.
  const SparseAttnPlan b1 = plan_sparse_decode(decode(1, -1), h200, cluster);
  EXPECT_TRUE(b1.qm.cluster);
  EXPECT_EQ(b1.qm.cluster_fallback, nullptr);
  EXPECT_FALSE(b1.qm.fused);
  EXPECT_EQ(b1.qm.splits, 16);
  EXPECT_EQ(b1.qm.num_items, 4 * 16);
  EXPECT_EQ(b1.bytes, 0u);
  // The default (and blocks) split the same way through the workspace and the combine.
  SparseDecodeOptions blocks;
  blocks.split = DecodeSplit::kBlocks;
  for (const SparseDecodeOptions& o : {SparseDecodeOptions{}, blocks}) {
    const SparseAttnPlan d = plan_sparse_decode(decode(1, -1), h200, o);
    EXPECT_FALSE(d.qm.cluster);
    EXPECT_EQ(d.qm.splits, 16);
    EXPECT_GT(d.bytes, 0u);
  }
  // Clusters of at most 8: 8 splits of 2 blocks.
  SparseAttnDeviceFacts eight = h200;
  eight.decode_cluster_max = 8;
  EXPECT_EQ(plan_sparse_decode(decode(1, -1), eight, cluster).qm.splits, 8);
  // topk 12 in clusters of 8: 2 blocks per split, 6 splits (none empty).
  SparseDecodeParams t12 = decode(1, -1);
  t12.attn.topk = 12;
  EXPECT_EQ(plan_sparse_decode(t12, eight, cluster).qm.splits, 6);
  // B8: 32 items want 13 splits, 2 blocks each: 8.
  EXPECT_EQ(plan_sparse_decode(decode(8, -1), h200, cluster).qm.splits, 8);
  EXPECT_TRUE(plan_sparse_decode(decode(8, -1), h200, cluster).qm.cluster);
  // The streaming variant (fp8) and 64-row tiles (G = 32) run in clusters too.
  SparseDecodeParams fp8 = decode(1, -1);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  const SparseAttnPlan f = plan_sparse_decode(fp8, h200, cluster);
  EXPECT_TRUE(f.qm.regs && f.qm.cluster);
  SparseDecodeParams g32 = decode(1, -1);
  g32.attn.num_heads = 128;
  const SparseAttnPlan g = plan_sparse_decode(g32, h200, cluster);
  EXPECT_TRUE(g.qm.cluster);
  EXPECT_EQ(g.qm.warps_m, 4);
  // A forced split (force_fused = 0) at B64 runs in clusters; a fused call ignores the option.
  EXPECT_TRUE(plan_sparse_decode(decode(64, 0), h200, cluster).qm.cluster);
  const SparseAttnPlan fused = plan_sparse_decode(decode(64, -1), h200, cluster);
  EXPECT_TRUE(fused.qm.fused);
  EXPECT_FALSE(fused.qm.cluster);
  EXPECT_EQ(fused.qm.cluster_fallback, nullptr);
  // No clusters (A100, or no sm_90a image): blocks, and why.
  SparseAttnDeviceFacts a100 = ampere();
  const SparseAttnPlan a = plan_sparse_decode(decode(1, -1), a100, cluster);
  EXPECT_FALSE(a.qm.cluster);
  ASSERT_NE(a.qm.cluster_fallback, nullptr);
  EXPECT_NE(std::string(a.qm.cluster_fallback).find("no thread-block clusters"), std::string::npos);
  EXPECT_EQ(a.qm.splits, plan_sparse_decode(decode(1, -1), a100, {}).qm.splits);
  EXPECT_EQ(a.bytes, plan_sparse_decode(decode(1, -1), a100, {}).bytes);
  // NVFP4 K/V in clusters with either conversion (auto: word).
  SparseDecodeParams nvfp4 = decode(1, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  const SparseAttnPlan w = plan_sparse_decode(nvfp4, h200, cluster);
  EXPECT_TRUE(w.qm.cluster && w.qm.regs && w.qm.nvfp4_word);
  SparseDecodeOptions cluster_byte = cluster;
  cluster_byte.nvfp4_cvt = DecodeNvfp4Cvt::kByte;
  const SparseAttnPlan b = plan_sparse_decode(nvfp4, h200, cluster_byte);
  EXPECT_TRUE(b.qm.cluster && b.qm.regs && !b.qm.nvfp4_word);
  // Prefill never takes it.
  EXPECT_FALSE(plan_sparse_attention(decode(1, -1).attn, {}, h200).qm.cluster);
}

SparseDecodeParams mtp_call(int batch, int seqlen_q, int hq = 64, int topk = 16) {
  SparseDecodeParams d{};
  d.attn = attn(batch * seqlen_q, hq, 4, topk);
  d.attn.batch = d.attn.kv.batch = batch;
  d.attn.qi.seqlen_q = seqlen_q;
  d.force_fused = -1;
  d.partial_dtype = PartialDType::kDefault;
  return d;
}

TEST(PlanDecode, MtpUnionItemsOnlyWhereTheyApply) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  SparseDecodeOptions u;
  u.mtp = DecodeMtp::kUnion;
  SparseDecodeOptions per_token;
  per_token.mtp = DecodeMtp::kPerToken;
  // M3 with 4 tokens per request: 4 x 16 = 64 rows and 4 x 16 = 64 list entries per item.
  const QueryMajorPlan m3 = plan_sparse_decode(mtp_call(8, 4), h200, u).qm;
  EXPECT_EQ(m3.mtp_tokens, 4);
  EXPECT_EQ(m3.warps_m, 4);
  EXPECT_EQ(m3.row_tiles, 1);
  // 8 requests x 4 kv heads = 32 items at 2 CTAs per SM: ceil(264 / 32) = 9 -> 8 splits of 2.
  EXPECT_EQ(m3.splits, 8);
  EXPECT_EQ(m3.num_items, int64_t(32) * 8);
  // Per-token items: 128 items on auto's 8-warp split kernel at 2 CTAs per SM: 2 splits of 8 blocks
  // (256 CTAs, one wave of 264: auto's split_rule=waves; ceil: ceil(264 / 128) = 3), 3 on the 4-warp
  // kernel at 3 CTAs per SM (384 CTAs of 396; ceil: ceil(396 / 128) = 4).
  const QueryMajorPlan pt = plan_sparse_decode(mtp_call(8, 4), h200, per_token).qm;
  EXPECT_EQ(pt.mtp_tokens, 0);
  EXPECT_EQ(pt.warps_m, 1);
  EXPECT_TRUE(pt.wide);
  EXPECT_EQ(pt.splits, 2);
  per_token.split_warps = DecodeSplitWarps::k4;
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4), h200, per_token).qm.splits, 3);
  per_token.split_rule = DecodeSplitRule::kCeil;
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4), h200, per_token).qm.splits, 4);
  per_token.split_warps = DecodeSplitWarps::kAuto;
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4), h200, per_token).qm.splits, 3);
  per_token.split_rule = DecodeSplitRule::kAuto;
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4), h200, {}).qm.mtp_tokens, 4);  // auto: union
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 5), h200, {}).qm.mtp_tokens, 0);  // where it applies
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 2), h200, u).qm.mtp_tokens, 2);
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 1), h200, u).qm.mtp_tokens, 0);   // not MTP
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 5), h200, u).qm.mtp_tokens, 0);   // > 4 tokens
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4, 128), h200, u).qm.mtp_tokens, 0);  // 4 x G 32
  EXPECT_EQ(plan_sparse_decode(mtp_call(8, 4, 64, 32), h200, u).qm.mtp_tokens, 0);  // 4 x 32
  // kernel=regs with union items: fp8 K/V converted in registers in the union kernel's 64-row tiles
  // (same items and splits); auto takes it for fp8 (H200 at 441d02d). NVFP4 union items take the
  // smem union kernel, forced regs too (their register path was slower at 5b22cb3 and removed).
  SparseDecodeParams fp8 = mtp_call(8, 4);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions both = u;
  both.kernel = DecodeKernel::kRegs;
  const QueryMajorPlan r = plan_sparse_decode(fp8, h200, both).qm;
  EXPECT_TRUE(r.regs);
  EXPECT_EQ(r.mtp_tokens, 4);
  EXPECT_EQ(r.warps_m, 4);
  EXPECT_EQ(r.splits, m3.splits);
  EXPECT_EQ(r.num_items, m3.num_items);
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, u).qm.regs);   // auto kernel: fp8 union in registers
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, {}).qm.regs);  // auto, auto: the same
  SparseDecodeOptions smem_union = u;
  smem_union.kernel = DecodeKernel::kSmem;
  EXPECT_FALSE(plan_sparse_decode(fp8, h200, smem_union).qm.regs);
  EXPECT_EQ(plan_sparse_decode(fp8, h200, {}).qm.mtp_tokens, 0);  // auto: B8 fp8 per token
  SparseDecodeParams nvfp4 = mtp_call(8, 4);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  const QueryMajorPlan n = plan_sparse_decode(nvfp4, h200, both).qm;
  const QueryMajorPlan n_auto = plan_sparse_decode(nvfp4, h200, u).qm;
  EXPECT_FALSE(n.regs);  // forced regs: NVFP4 union items in smem
  EXPECT_EQ(n.mtp_tokens, 4);
  EXPECT_EQ(n.splits, n_auto.splits);
  EXPECT_EQ(n.num_items, n_auto.num_items);
  EXPECT_FALSE(n_auto.regs);  // auto: the same
  EXPECT_FALSE(plan_sparse_decode(mtp_call(8, 4), h200, both).qm.regs);  // bf16 K/V: smem union
  // Its 86 KB fit every SM80+ GPU: no need of the 16-row variant's 105 KB.
  SparseAttnDeviceFacts sm89 = ampere();
  sm89.decode_regs_ctas = 0;
  EXPECT_TRUE(plan_sparse_decode(fp8, sm89, both).qm.regs);
  EXPECT_FALSE(plan_sparse_decode(mtp_call(8, 1), sm89, both).qm.regs);  // one token: 105 KB
  // G = 8, 2 tokens (16 rows of the 64): still union items in registers.
  SparseDecodeParams g8 = mtp_call(8, 2, 32);
  g8.attn.k.dtype = g8.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(plan_sparse_decode(g8, h200, both).qm.regs);
  EXPECT_EQ(plan_sparse_decode(g8, h200, both).qm.mtp_tokens, 2);
  // Per-token items where union items do not apply: the 16-row register kernel.
  SparseDecodeParams fp8_5 = mtp_call(8, 5);
  fp8_5.attn.k.dtype = fp8_5.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_EQ(plan_sparse_decode(fp8_5, h200, both).qm.mtp_tokens, 0);
  EXPECT_TRUE(plan_sparse_decode(fp8_5, h200, both).qm.regs);
  EXPECT_EQ(plan_sparse_decode(fp8_5, h200, both).qm.warps_m, 1);
  expect_layout_sound(plan_sparse_decode(mtp_call(8, 4), h200, u));
  expect_layout_sound(plan_sparse_decode(fp8, h200, both));
}

// mtp=auto: union items only where they beat per-token items (heuristics.h mtp_union_pays, from
// the H200 runs at 4a4ffcb); mtp=union and kernel=wgmma force them where they apply.
TEST(PlanDecode, MtpAutoTakesUnionItemsWhereTheyPay) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  h200.decode_mtp_wgmma_ctas = 1;
  auto tokens = [&](int batch, int seqlen_q, DType kv, const SparseDecodeOptions& o = {},
                    const SparseAttnDeviceFacts* f = nullptr) {
    SparseDecodeParams dp = mtp_call(batch, seqlen_q);
    dp.attn.k.dtype = dp.attn.v.dtype = kv;
    return plan_sparse_decode(dp, f ? *f : h200, o).qm.mtp_tokens;
  };
  const DType bf16 = DType::kBF16, fp16 = DType::kFP16, fp8 = DType::kFP8E4M3, nvfp4 = DType::kNVFP4;
  // 16-bit K/V, 3-4 tokens: from one item per 8 SMs (132 / 8 = 16 items: B4).
  EXPECT_EQ(tokens(1, 4, bf16), 0);
  EXPECT_EQ(tokens(3, 4, bf16), 0);
  EXPECT_EQ(tokens(4, 4, bf16), 4);
  EXPECT_EQ(tokens(4, 3, bf16), 3);
  EXPECT_EQ(tokens(8, 4, bf16), 4);
  EXPECT_EQ(tokens(64, 4, bf16), 4);
  EXPECT_EQ(tokens(8, 3, fp16), 3);
  EXPECT_EQ(tokens(2, 3, fp16), 0);
  // 2 tokens: from more items than 3/4 of the SMs (B25: 100 items > 99).
  EXPECT_EQ(tokens(24, 2, bf16), 0);
  EXPECT_EQ(tokens(25, 2, bf16), 2);
  // NVFP4: 3-4 tokens from more items than half the SMs; 2 tokens never.
  EXPECT_EQ(tokens(16, 4, nvfp4), 0);
  EXPECT_EQ(tokens(17, 4, nvfp4), 4);
  EXPECT_EQ(tokens(32, 3, nvfp4), 3);
  EXPECT_EQ(tokens(64, 2, nvfp4), 0);
  // fp8, 4 tokens: on the sm_90a wgmma kernel (wgmma_fp8=auto) from more items than half the SMs
  // (B17: 68 items > 66); where it does not run (wgmma_fp8=off, kernel=regs, no sm_90a kernel) on
  // the union register kernel from more items than SMs (B34: 136 items); 2-3 tokens never.
  EXPECT_EQ(tokens(16, 4, fp8), 0);
  EXPECT_EQ(tokens(17, 4, fp8), 4);
  EXPECT_EQ(tokens(32, 4, fp8), 4);
  SparseDecodeOptions fp8_off, fp8_regs;
  fp8_off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  fp8_regs.kernel = DecodeKernel::kRegs;
  for (const SparseDecodeOptions& o : {fp8_off, fp8_regs}) {
    EXPECT_EQ(tokens(32, 4, fp8, o), 0);
    EXPECT_EQ(tokens(34, 4, fp8, o), 4);
  }
  SparseAttnDeviceFacts no_wgmma = h200;
  no_wgmma.decode_mtp_wgmma_ctas = 0;
  EXPECT_EQ(tokens(32, 4, fp8, {}, &no_wgmma), 0);
  EXPECT_EQ(tokens(34, 4, fp8, {}, &no_wgmma), 4);
  EXPECT_EQ(tokens(64, 3, fp8), 0);
  EXPECT_EQ(tokens(128, 2, fp8), 0);
  // Fewer SMs, the same rule: 108 SMs take 16-bit union items from 13 items (B4), 2 tokens from
  // 82 (B21).
  const SparseAttnDeviceFacts a100 = ampere();
  EXPECT_EQ(tokens(4, 4, bf16, {}, &a100), 4);
  EXPECT_EQ(tokens(3, 4, bf16, {}, &a100), 0);
  EXPECT_EQ(tokens(21, 2, bf16, {}, &a100), 2);
  EXPECT_EQ(tokens(20, 2, bf16, {}, &a100), 0);
  // Forced: mtp=union and kernel=wgmma take union items wherever they apply; per_token never.
  SparseDecodeOptions u, w, pt;
  u.mtp = DecodeMtp::kUnion;
  w.kernel = DecodeKernel::kWgmma;
  pt.mtp = DecodeMtp::kPerToken;
  EXPECT_EQ(tokens(1, 4, bf16, u), 4);
  EXPECT_EQ(tokens(1, 2, fp8, u), 2);
  EXPECT_EQ(tokens(1, 4, bf16, w), 4);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(1, 4), h200, w).qm.wgmma);
  EXPECT_EQ(tokens(64, 4, bf16, pt), 0);
  EXPECT_EQ(tokens(1, 5, bf16, u), 0);  // union items do not apply
}

SparseDecodeOptions regs_only() {
  SparseDecodeOptions o;
  o.kernel = DecodeKernel::kRegs;
  return o;
}

// MTP decode: batch requests of seqlen_q tokens each.
SparseDecodeParams mtp_decode(int batch, int seqlen_q, int hq = 64, int hkv = 4, int topk = 16) {
  SparseDecodeParams d{};
  d.attn = attn(batch * seqlen_q, hq, hkv, topk);
  d.attn.batch = batch;
  d.attn.qi.seqlen_q = seqlen_q;
  d.force_fused = -1;
  d.partial_dtype = PartialDType::kDefault;
  return d;
}

// An H200 whose MTP wgmma kernel runs (one CTA per SM) and whose register kernel takes 2 CTAs.
SparseAttnDeviceFacts mtp_wgmma_hopper() {
  SparseAttnDeviceFacts f = hopper();
  f.decode_regs_ctas = 2;
  f.decode_mtp_wgmma_ctas = 1;
  return f;
}

// The wgmma kernel's splits are priced with its ~10 us item start (kWgmmaSplitStartBlocks = 5
// blocks): auto's fp8 and 16-bit union items on it run fused, one item a persistent CTA, from 66
// items up (B17-B33 at M3; at one block's price B17-B24 split 3-4 ways into 2-3 rounds: H200 at
// 455afa9, fp8 B24 61.9 us against B28's fused 46.3); B16 (64 items) keeps 2 splits in one round.
// The other kernels keep one block's price (the same counts as before).
TEST(PlanDecode, WgmmaSplitsPriceTheItemStart) {
  const SparseAttnDeviceFacts h200 = mtp_wgmma_hopper();
  SparseDecodeOptions w;
  w.kernel = DecodeKernel::kWgmma;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3}) {
    for (int batch = 16; batch <= 40; ++batch) {
      SparseDecodeParams dp = mtp_call(batch, 4);
      dp.attn.k.dtype = dp.attn.v.dtype = kv;
      for (const SparseDecodeOptions& o : {SparseDecodeOptions{}, w}) {
        const QueryMajorPlan qm = plan_sparse_decode(dp, h200, o).qm;
        const std::string at = "batch " + std::to_string(batch) + " " + dtype_name(kv);
        if (batch == 16 && o.kernel == DecodeKernel::kAuto) {  // per-token items there
          EXPECT_FALSE(qm.wgmma) << at;
          continue;
        }
        ASSERT_TRUE(qm.wgmma) << at;
        EXPECT_EQ(qm.splits, batch == 16 ? 2 : 1) << at;
        EXPECT_EQ(qm.fused, batch > 16) << at;
      }
    }
  }
  // One block's price splits B24 4 ways (3 rounds of 132 CTAs); the register kernel keeps it.
  EXPECT_EQ(sparse_attn::query_major_splits(96, 16, 132, -1, 1, 64, true, 132, sparse_attn::kSplitStartBlocks), 4);
  EXPECT_EQ(sparse_attn::query_major_splits(96, 16, 132, -1, 1, 64, true, 132, sparse_attn::kWgmmaSplitStartBlocks), 1);
  SparseDecodeParams regs = mtp_call(64, 4);
  regs.attn.k.dtype = regs.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions union_regs;
  union_regs.kernel = DecodeKernel::kRegs;
  union_regs.mtp = DecodeMtp::kUnion;
  for (int batch : {8, 16, 24}) {
    regs = mtp_call(batch, 4);
    regs.attn.k.dtype = regs.attn.v.dtype = DType::kFP8E4M3;
    const QueryMajorPlan qm = plan_sparse_decode(regs, h200, union_regs).qm;
    EXPECT_TRUE(qm.regs && !qm.wgmma) << batch;
    EXPECT_EQ(qm.splits, sparse_attn::query_major_splits(int64_t(batch) * 4, 16, 132, -1, 2, 64, true)) << batch;
  }
}

// A wgmma variant's plan schedules what `base` does: items, splits, grid, workspace.
void expect_same_wgmma_schedule(const SparseAttnPlan& got, const SparseAttnPlan& base) {
  EXPECT_EQ(got.qm.splits, base.qm.splits);
  EXPECT_EQ(got.qm.fused, base.qm.fused);
  EXPECT_EQ(got.qm.num_items, base.qm.num_items);
  EXPECT_EQ(got.qm.grid, base.qm.grid);
  EXPECT_EQ(got.bytes, base.bytes);
  expect_layout_sound(got);
}

// kernel=wgmma: bf16 / fp16 MTP union items on the sm_90a TMA + wgmma kernel (one CTA per SM, a
// persistent grid of at most one CTA per SM and item); every other call planned as auto, with the
// reason kept for the plan text.
TEST(PlanDecode, MtpWgmmaWhereItRunsElseAuto) {
  const SparseAttnDeviceFacts h200 = mtp_wgmma_hopper();
  SparseDecodeOptions w;
  w.kernel = DecodeKernel::kWgmma;
  // B64, 4 tokens, M3: 256 items on 132 SMs, fused, 132 persistent CTAs.
  const QueryMajorPlan b64 = plan_sparse_decode(mtp_call(64, 4), h200, w).qm;
  EXPECT_TRUE(b64.wgmma);
  EXPECT_EQ(b64.wgmma_fallback, nullptr);
  EXPECT_FALSE(b64.regs);
  EXPECT_EQ(b64.mtp_tokens, 4);
  EXPECT_EQ(b64.splits, 1);
  EXPECT_TRUE(b64.fused);
  EXPECT_EQ(b64.num_items, 256);
  EXPECT_EQ(b64.grid, 132);
  // auto takes it for 16-bit union items with more items than half the SMs (B64: 256 items; B17:
  // 68 on 132 SMs; B16: 64 do not), with no fallback text; the smem union kernel otherwise.
  EXPECT_EQ(plan_sparse_decode(mtp_call(64, 4), h200, {}).qm.num_items, 256);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(64, 4), h200, {}).qm.wgmma);
  EXPECT_EQ(plan_sparse_decode(mtp_call(64, 4), h200, {}).qm.wgmma_fallback, nullptr);
  EXPECT_FALSE(plan_sparse_decode(mtp_call(16, 4), h200, {}).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(17, 4), h200, {}).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(32, 4), h200, {}).qm.wgmma);
  EXPECT_FALSE(plan_sparse_decode(mtp_call(64, 4), ampere(), {}).qm.wgmma);
  EXPECT_EQ(plan_sparse_decode(mtp_call(64, 4), ampere(), {}).qm.wgmma_fallback, nullptr);
  // B8: 32 items, split for one CTA per SM: ceil(132 / 32) = 5 -> 4 splits of 16 (no empty split).
  const QueryMajorPlan b8 = plan_sparse_decode(mtp_call(8, 4), h200, w).qm;
  EXPECT_TRUE(b8.wgmma);
  EXPECT_EQ(b8.splits, 4);
  EXPECT_FALSE(b8.fused);
  EXPECT_EQ(b8.num_items, 128);
  EXPECT_EQ(b8.grid, 128);
  expect_layout_sound(plan_sparse_decode(mtp_call(8, 4), h200, w));
  // Forced split-K / fused keep their meaning.
  SparseDecodeParams split = mtp_call(64, 4);
  split.force_fused = 0;
  EXPECT_TRUE(plan_sparse_decode(split, h200, w).qm.wgmma);
  EXPECT_FALSE(plan_sparse_decode(split, h200, w).qm.fused);
  // Fallbacks, each planned as auto would plan it.
  auto expect_auto = [&](const SparseDecodeParams& dp, const SparseAttnDeviceFacts& f, const char* why) {
    const QueryMajorPlan got = plan_sparse_decode(dp, f, w).qm;
    const QueryMajorPlan want = plan_sparse_decode(dp, f, {}).qm;
    EXPECT_FALSE(got.wgmma) << why;
    ASSERT_NE(got.wgmma_fallback, nullptr) << why;
    EXPECT_NE(std::string(got.wgmma_fallback).find(why), std::string::npos) << got.wgmma_fallback;
    EXPECT_EQ(got.regs, want.regs) << why;
    EXPECT_EQ(got.mtp_tokens, want.mtp_tokens) << why;
    EXPECT_EQ(got.splits, want.splits) << why;
    EXPECT_EQ(got.num_items, want.num_items) << why;
    EXPECT_EQ(got.grid, 0) << why;
  };
  expect_auto(mtp_call(64, 1), h200, "no MTP union items");  // decode, one token
  expect_auto(mtp_call(8, 5), h200, "no MTP union items");   // union items do not apply
  SparseDecodeOptions wp = w;
  wp.mtp = DecodeMtp::kPerToken;
  EXPECT_FALSE(plan_sparse_decode(mtp_call(8, 4), h200, wp).qm.wgmma);
  SparseDecodeParams fp8 = mtp_call(64, 4);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  // fp8 K/V: kernel=wgmma runs them (wgmma_fp8=auto converts them where the kernel is named).
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, w).qm.wgmma_fp8);
  SparseDecodeOptions w_off = w;
  w_off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  const QueryMajorPlan fp8_off = plan_sparse_decode(fp8, h200, w_off).qm;
  EXPECT_FALSE(fp8_off.wgmma);
  EXPECT_TRUE(fp8_off.regs);  // the fp8 union register kernel
  ASSERT_NE(fp8_off.wgmma_fallback, nullptr);
  EXPECT_NE(std::string(fp8_off.wgmma_fallback).find("fp8 K/V with wgmma_fp8=off"), std::string::npos);
  SparseDecodeParams nvfp4 = mtp_call(64, 4);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  expect_auto(nvfp4, h200, "NVFP4 K/V");
  SparseDecodeParams q8 = mtp_call(64, 4);
  q8.attn.q_dtype = DType::kFP8E4M3;
  expect_auto(q8, h200, "fp8 q");
  SparseDecodeParams fp16 = mtp_call(64, 4);
  fp16.attn.q_dtype = fp16.attn.out_dtype = fp16.attn.k.dtype = fp16.attn.v.dtype = DType::kFP16;
  EXPECT_TRUE(plan_sparse_decode(fp16, h200, w).qm.wgmma);
  expect_auto(mtp_call(64, 4), ampere(), "cannot run on this device");
  SparseDecodeParams far = mtp_call(64, 4);
  far.attn.kv.total_k = int64_t(1) << 31;
  expect_auto(far, h200, "32-bit coordinates");
  SparseDecodeParams no_pages = mtp_call(64, 4);
  no_pages.attn = paged(no_pages.attn, 64, 16);
  no_pages.attn.qi.seqlen_q = 4;
  no_pages.attn.kv.num_pages = 0;
  expect_auto(no_pages, h200, "no K/V rows");
  no_pages.attn.kv.num_pages = 1024;
  EXPECT_TRUE(plan_sparse_decode(no_pages, h200, w).qm.wgmma);
  // An empty flat K/V tensor (every sequence without keys): no TMA map of it (the fuzzer's
  // decode:6851 / 12895 / 18265 / 19437 on the H200 raised NotSupportedError from the launcher).
  SparseDecodeParams empty = mtp_call(64, 4);
  empty.attn.kv.total_k = 0;
  expect_auto(empty, h200, "no K/V rows");
}

// wgmma_pipe=ahead: the wgmma kernel's planner / loader warps wherever the wgmma kernel runs
// (forced or auto's), with the same items, splits, grid and workspace; ignored elsewhere; auto's
// choice since the H200 run at 42bbb91 (inline only when named).
TEST(PlanDecode, MtpWgmmaPipeAhead) {
  const SparseAttnDeviceFacts h200 = mtp_wgmma_hopper();
  SparseDecodeOptions w, wa, aa;
  w.kernel = wa.kernel = DecodeKernel::kWgmma;
  w.wgmma_pipe = DecodeWgmmaPipe::kInline;
  wa.wgmma_pipe = aa.wgmma_pipe = DecodeWgmmaPipe::kAhead;
  for (int batch : {64, 8}) {
    for (int fused : {-1, 0}) {
      SparseDecodeParams dp = mtp_call(batch, 4);
      dp.force_fused = fused;
      const SparseAttnPlan base = plan_sparse_decode(dp, h200, w), ahead = plan_sparse_decode(dp, h200, wa);
      EXPECT_FALSE(base.qm.wgmma_ahead);
      EXPECT_TRUE(ahead.qm.wgmma);
      EXPECT_TRUE(ahead.qm.wgmma_ahead);
      expect_same_wgmma_schedule(ahead, base);
    }
  }
  // auto's wgmma (B64) takes it too, and auto's pipe is ahead; inline only when named.
  EXPECT_TRUE(plan_sparse_decode(mtp_call(64, 4), h200, aa).qm.wgmma_ahead);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(64, 4), h200, {}).qm.wgmma_ahead);
  SparseDecodeOptions wk = w;
  wk.wgmma_pipe = DecodeWgmmaPipe::kAuto;
  EXPECT_TRUE(plan_sparse_decode(mtp_call(64, 4), h200, wk).qm.wgmma_ahead);
  SparseDecodeOptions wi = w;
  EXPECT_FALSE(plan_sparse_decode(mtp_call(64, 4), h200, wi).qm.wgmma_ahead);
  EXPECT_TRUE(plan_sparse_decode(mtp_call(64, 4), h200, wi).qm.wgmma);
  // Where the wgmma kernel does not run, the option changes nothing.
  SparseDecodeParams nvfp4 = mtp_call(64, 4);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  for (const SparseDecodeParams& dp : {nvfp4, mtp_call(16, 4), mtp_call(64, 1)}) {
    const QueryMajorPlan got = plan_sparse_decode(dp, h200, aa).qm, want = plan_sparse_decode(dp, h200, {}).qm;
    EXPECT_FALSE(got.wgmma_ahead);
    EXPECT_EQ(got.wgmma, want.wgmma);
    EXPECT_EQ(got.regs, want.regs);
    EXPECT_EQ(got.splits, want.splits);
  }
  EXPECT_FALSE(plan_sparse_decode(mtp_call(64, 4), ampere(), wa).qm.wgmma_ahead);
}

// wgmma_fp8=on: fp8 K/V on the wgmma kernel (forced, or auto's pick where it takes the wgmma
// kernel), on the ahead pipe, with the 16-bit kernel's items, splits, grid and workspace; auto: the
// same where kernel=wgmma is named or the union items outnumber half the SMs (since the H200 runs
// at 831d3e5 and 455afa9), else kernel=regs; off keeps kernel=regs; inline pipe, NVFP4 K/V, fp8 q and other
// devices fall back.
TEST(PlanDecode, MtpWgmmaFp8) {
  const SparseAttnDeviceFacts h200 = mtp_wgmma_hopper();
  SparseDecodeOptions w, on, auto_on;
  w.kernel = on.kernel = DecodeKernel::kWgmma;
  on.wgmma_fp8 = auto_on.wgmma_fp8 = DecodeWgmmaFp8::kOn;
  for (int batch : {64, 8}) {
    for (int fused : {-1, 0}) {
      SparseDecodeParams bf = mtp_call(batch, 4);
      bf.force_fused = fused;
      SparseDecodeParams dp = bf;
      dp.attn.k.dtype = dp.attn.v.dtype = DType::kFP8E4M3;
      const SparseAttnPlan base = plan_sparse_decode(bf, h200, w), got = plan_sparse_decode(dp, h200, on);
      EXPECT_TRUE(got.qm.wgmma);
      EXPECT_TRUE(got.qm.wgmma_ahead);
      EXPECT_TRUE(got.qm.wgmma_fp8);
      EXPECT_FALSE(got.qm.regs);
      EXPECT_EQ(got.qm.wgmma_fallback, nullptr);
      expect_same_wgmma_schedule(got, base);
      EXPECT_FALSE(plan_sparse_decode(bf, h200, on).qm.wgmma_fp8);  // 16-bit K/V: ignored
      EXPECT_TRUE(plan_sparse_decode(bf, h200, on).qm.wgmma);
    }
  }
  SparseDecodeParams fp8 = mtp_call(64, 4);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  // auto: B64 (256 union items, more than the SMs) and kernel=wgmma take it, as on does.
  for (const SparseDecodeOptions& o : {SparseDecodeOptions{}, w}) {
    const SparseAttnPlan got = plan_sparse_decode(fp8, h200, o);
    EXPECT_TRUE(got.qm.wgmma);
    EXPECT_TRUE(got.qm.wgmma_fp8);
    EXPECT_FALSE(got.qm.regs);
    expect_same_wgmma_schedule(got, plan_sparse_decode(fp8, h200, on));
  }
  SparseDecodeOptions off = on;
  off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  EXPECT_FALSE(plan_sparse_decode(fp8, h200, off).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, off).qm.regs);
  SparseDecodeOptions auto_off;
  auto_off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  EXPECT_FALSE(plan_sparse_decode(fp8, h200, auto_off).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, auto_off).qm.regs);
  // auto with forced union items at most one per two SMs (B16: 64 items for 132 SMs) keeps the
  // register kernel, wgmma_fp8=on too (auto takes the wgmma kernel from more items than half the
  // SMs, for 16-bit K/V alike); kernel=wgmma there takes it.
  SparseDecodeParams fp8_b16u = mtp_call(16, 4);
  fp8_b16u.attn.k.dtype = fp8_b16u.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions union_auto, union_on;
  union_auto.mtp = union_on.mtp = DecodeMtp::kUnion;
  union_on.wgmma_fp8 = DecodeWgmmaFp8::kOn;
  EXPECT_FALSE(plan_sparse_decode(fp8_b16u, h200, union_auto).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(fp8_b16u, h200, union_auto).qm.regs);
  EXPECT_FALSE(plan_sparse_decode(fp8_b16u, h200, union_on).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(fp8_b16u, h200, union_on).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(fp8_b16u, h200, w).qm.wgmma_fp8);
  SparseDecodeParams fp8_b17u = mtp_call(17, 4);
  fp8_b17u.attn.k.dtype = fp8_b17u.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(plan_sparse_decode(fp8_b17u, h200, union_auto).qm.wgmma_fp8);
  EXPECT_TRUE(plan_sparse_decode(fp8_b17u, h200, union_on).qm.wgmma_fp8);
  // auto with the option takes it where auto takes the wgmma kernel (an item per two SMs), and
  // B16 keeps per-token items on the register kernel.
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, auto_on).qm.wgmma_fp8);
  SparseDecodeParams fp8_b16 = mtp_call(16, 4);
  fp8_b16.attn.k.dtype = fp8_b16.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_FALSE(plan_sparse_decode(fp8_b16, h200, auto_on).qm.wgmma);
  EXPECT_TRUE(plan_sparse_decode(fp8_b16, h200, auto_on).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(fp8_b16, h200, on).qm.wgmma_fp8);
  // Fallbacks with the reason.
  auto expect_fallback = [&](const SparseDecodeParams& dp, const SparseAttnDeviceFacts& f,
                             const SparseDecodeOptions& o, const char* why) {
    const QueryMajorPlan got = plan_sparse_decode(dp, f, o).qm;
    EXPECT_FALSE(got.wgmma) << why;
    EXPECT_FALSE(got.wgmma_fp8) << why;
    ASSERT_NE(got.wgmma_fallback, nullptr) << why;
    EXPECT_NE(std::string(got.wgmma_fallback).find(why), std::string::npos) << got.wgmma_fallback;
  };
  SparseDecodeOptions w_off = w;
  w_off.wgmma_fp8 = DecodeWgmmaFp8::kOff;
  expect_fallback(fp8, h200, w_off, "fp8 K/V with wgmma_fp8=off");
  SparseDecodeOptions w_b16 = w;
  w_b16.kernel = DecodeKernel::kAuto;
  w_b16.mtp = DecodeMtp::kUnion;
  EXPECT_EQ(plan_sparse_decode(fp8_b16u, h200, w_b16).qm.wgmma_fallback, nullptr);  // only when named
  EXPECT_NE(std::string(mtp_wgmma_unsupported(fp8_b16u.attn, true, h200, w_b16)).find("at most one union item per two SMs"),
            std::string::npos);
  SparseDecodeOptions inl = on;
  inl.wgmma_pipe = DecodeWgmmaPipe::kInline;
  expect_fallback(fp8, h200, inl, "fp8 K/V with wgmma_pipe=inline");
  EXPECT_TRUE(plan_sparse_decode(fp8, h200, inl).qm.regs);
  SparseDecodeParams nvfp4 = mtp_call(64, 4);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  expect_fallback(nvfp4, h200, on, "NVFP4 K/V");
  SparseDecodeParams q8 = fp8;
  q8.attn.q_dtype = DType::kFP8E4M3;
  expect_fallback(q8, h200, on, "fp8 q");
  expect_fallback(fp8, ampere(), on, "cannot run on this device");
  SparseDecodeParams fp16 = fp8;
  fp16.attn.q_dtype = fp16.attn.out_dtype = DType::kFP16;
  EXPECT_TRUE(plan_sparse_decode(fp16, h200, on).qm.wgmma_fp8);
  SparseDecodeParams paged_fp8 = fp8;
  paged_fp8.attn = paged(paged_fp8.attn, 64, 16);
  paged_fp8.attn.qi.seqlen_q = 4;
  paged_fp8.attn.kv.num_pages = 1024;
  EXPECT_TRUE(plan_sparse_decode(paged_fp8, h200, on).qm.wgmma_fp8);
}

TEST(PlanDecode, StreamingKernelOption) {
  SparseAttnDeviceFacts f = hopper();
  f.decode_regs_ctas = 2;
  SparseDecodeOptions regs;
  regs.kernel = DecodeKernel::kRegs;
  // auto keeps the smem kernel for bf16 K/V.
  EXPECT_FALSE(plan_sparse_decode(decode(16, -1), f).qm.regs);
  // regs: split-K aims at 2 CTAs per SM. 16 requests x 4 kv heads = 64 items: ceil(264 / 64) = 5
  // splits -> 4 blocks each, 4 splits (the smem kernel's 3 per SM: ceil(396 / 64) = 7 -> 3 blocks
  // each, 6 splits; auto's 8-warp kernel at 2 per SM: 4 as for regs).
  const SparseAttnPlan r = plan_sparse_decode(decode(16, -1), f, regs);
  EXPECT_TRUE(r.qm.regs);
  EXPECT_EQ(r.qm.warps_m, 1);
  EXPECT_EQ(r.qm.splits, 4);
  SparseDecodeOptions four;
  four.split_warps = DecodeSplitWarps::k4;
  EXPECT_EQ(plan_sparse_decode(decode(16, -1), f, four).qm.splits, 6);
  EXPECT_EQ(plan_sparse_decode(decode(16, -1), f).qm.splits, 4);
  expect_layout_sound(r);
  // Where it cannot run: the device lacks the shared memory, G > 16. NVFP4 K/V run it under auto.
  EXPECT_FALSE(plan_sparse_decode(decode(16, -1), hopper(), regs).qm.regs);
  SparseDecodeParams nvfp4 = decode(16, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  EXPECT_TRUE(plan_sparse_decode(nvfp4, f, regs).qm.regs);
  EXPECT_TRUE(plan_sparse_decode(nvfp4, f, {}).qm.regs);
  EXPECT_FALSE(plan_sparse_decode(nvfp4, hopper(), {}).qm.regs);  // no room for its 99 KB
  SparseDecodeParams fp8 = decode(16, -1);
  fp8.attn.k.dtype = fp8.attn.v.dtype = DType::kFP8E4M3;
  EXPECT_TRUE(plan_sparse_decode(fp8, f, regs).qm.regs);
  SparseDecodeParams g64 = decode(16, -1);
  g64.attn.num_kv_heads = 1;
  EXPECT_FALSE(plan_sparse_decode(g64, f, regs).qm.regs);
}

TEST(PlanDecode, MtpUnionOption) {
  SparseAttnDeviceFacts f = hopper();
  f.decode_regs_ctas = 2;
  SparseDecodeOptions uni;
  uni.mtp = DecodeMtp::kUnion;
  // auto takes union items; per_token keeps an item per token.
  EXPECT_EQ(plan_sparse_decode(mtp_decode(64, 4), f).qm.mtp_tokens, 4);
  SparseDecodeOptions per_token;
  per_token.mtp = DecodeMtp::kPerToken;
  EXPECT_EQ(plan_sparse_decode(mtp_decode(64, 4), f, per_token).qm.mtp_tokens, 0);
  // M3 MTP-4 at batch 64: 256 union items of 64 rows (one per request and kv head), fused.
  const SparseAttnPlan u = plan_sparse_decode(mtp_decode(64, 4), f, uni);
  EXPECT_EQ(u.qm.mtp_tokens, 4);
  EXPECT_EQ(u.qm.warps_m, 4);
  EXPECT_EQ(u.qm.row_tiles, 1);
  EXPECT_TRUE(u.qm.fused);
  EXPECT_EQ(u.qm.num_items, 256);
  EXPECT_EQ(u.bytes, 0u);
  // Batch 8: 32 items, 2 CTAs per SM: ceil(264 / 32) = 9 -> 2 blocks each, 8 splits; partial slots
  // for every row and head.
  const SparseAttnPlan u8 = plan_sparse_decode(mtp_decode(8, 4), f, uni);
  EXPECT_EQ(u8.qm.splits, 8);
  EXPECT_EQ(u8.qm.num_items, int64_t(32) * 8);
  expect_layout_sound(u8);
  EXPECT_EQ(section(u8, "qm.part_o")->bytes, size_t(8 * 4) * 64 * 8 * 128 * 2);
  // Per-token items where union items do not apply: 4 x 32 entries > 64, 5 tokens, 4 x 32 rows
  // > 64, one token.
  EXPECT_EQ(plan_sparse_decode(mtp_decode(8, 4, 64, 4, 32), f, uni).qm.mtp_tokens, 0);
  EXPECT_EQ(plan_sparse_decode(mtp_decode(8, 5), f, uni).qm.mtp_tokens, 0);
  EXPECT_EQ(plan_sparse_decode(mtp_decode(8, 4, 64, 2), f, uni).qm.mtp_tokens, 0);
  EXPECT_EQ(plan_sparse_decode(mtp_decode(8, 1), f, uni).qm.mtp_tokens, 0);
  EXPECT_EQ(plan_sparse_decode(mtp_decode(8, 2, 64, 2), f, uni).qm.mtp_tokens, 2);  // 2 x 32 rows
  // bf16 union items take the smem kernel's 64-row tiles, whatever the kernel option.
  SparseDecodeOptions both = uni;
  both.kernel = DecodeKernel::kRegs;
  const SparseAttnPlan b = plan_sparse_decode(mtp_decode(8, 4), f, both);
  EXPECT_EQ(b.qm.mtp_tokens, 4);
  EXPECT_FALSE(b.qm.regs);
  // kernel=regs with mtp=auto: union items win where they apply; per-token items take regs.
  EXPECT_FALSE(plan_sparse_decode(mtp_decode(8, 4), f, regs_only()).qm.regs);
  SparseDecodeOptions regs_per_token = regs_only();
  regs_per_token.mtp = DecodeMtp::kPerToken;
  EXPECT_TRUE(plan_sparse_decode(mtp_decode(8, 4), f, regs_per_token).qm.regs);
}

TEST(PlanDecode, PrefillQueryMajorPartialsUseTheComputeDtype) {
  SparseAttnParams p = attn(8, 64, 4, 16);
  p.q_dtype = p.out_dtype = p.k.dtype = p.v.dtype = DType::kFP16;
  const SparseAttnPlan plan = plan_sparse_attention(p, {}, hopper());
  EXPECT_EQ(plan.schedule, PrefillSchedule::kQueryMajor);
  EXPECT_FALSE(plan.qm.fused);
  EXPECT_EQ(plan.qm.part_kind, StoreKind::kF16);
}

// ---- options text -------------------------------------------------------------------------------

TEST(PlanOptions, ParsesEveryOption) {
  EXPECT_EQ(parse_sparse_attention_options("").schedule, PrefillSchedule::kAuto);
  const SparseAttnOptions o = parse_sparse_attention_options(
      "schedule=hybrid,kv_major_kernel=mma_sync,chunk_rows=37,tile_max_waste=2.5");
  EXPECT_EQ(o.schedule, PrefillSchedule::kHybrid);
  EXPECT_EQ(o.kv_major_kernel, KvMajorKernel::kMmaSync);
  EXPECT_EQ(o.chunk_rows, 37);
  EXPECT_EQ(o.tile_max_waste_milli, 2500);
  for (PrefillSchedule s : {PrefillSchedule::kAuto, PrefillSchedule::kQueryMajor, PrefillSchedule::kKvMajor,
                            PrefillSchedule::kHybrid})
    EXPECT_EQ(parse_sparse_attention_options(std::string("schedule=") + option_name(s)).schedule, s);
  for (KvMajorKernel k : {KvMajorKernel::kAuto, KvMajorKernel::kMmaSync, KvMajorKernel::kWgmma, KvMajorKernel::kTma})
    EXPECT_EQ(parse_sparse_attention_options(std::string("kv_major_kernel=") + option_name(k)).kv_major_kernel, k);
  for (TileKernel k : {TileKernel::kAuto, TileKernel::kCpAsync, TileKernel::kTma})
    EXPECT_EQ(parse_sparse_attention_options(std::string("tile_kernel=") + option_name(k)).tile_kernel, k);
  for (KvMajorLists l : {KvMajorLists::kAuto, KvMajorLists::kPerGroup, KvMajorLists::kOnce})
    EXPECT_EQ(parse_sparse_attention_options(std::string("lists=") + option_name(l)).lists, l);
  EXPECT_EQ(parse_sparse_attention_options("").lists, KvMajorLists::kAuto);
  EXPECT_EQ(parse_sparse_attention_options("tile_max_waste=8").tile_max_waste_milli, 8000);
  EXPECT_EQ(parse_sparse_attention_options("tile_max_waste=1").tile_max_waste_milli, 1000);
  for (ProxyKernel k : {ProxyKernel::kAuto, ProxyKernel::kMmaSync, ProxyKernel::kSm90, ProxyKernel::kSm90Only,
                        ProxyKernel::kSm90Ss, ProxyKernel::kSm90SsOnly, ProxyKernel::kDecode,
                        ProxyKernel::kDecodeOnly, ProxyKernel::kDecodeF16, ProxyKernel::kDecodeF16Only})
    EXPECT_EQ(parse_proxy_score_options(std::string("kernel=") + option_name(k)).kernel, k);
  EXPECT_EQ(parse_proxy_score_options("decode_ctas=auto").decode_ctas, 0);
  for (int c : {2, 3, 4}) {
    const ProxyScoreOptions o = parse_proxy_score_options("kernel=decode,decode_ctas=" + std::to_string(c));
    EXPECT_EQ(o.decode_ctas, c);
    EXPECT_EQ(o.kernel, ProxyKernel::kDecode);
  }
  EXPECT_EQ(parse_proxy_score_options("").decode_ilp, 0);
  EXPECT_EQ(parse_proxy_score_options("decode_ilp=auto").decode_ilp, 0);
  for (int u : {1, 2}) {
    const ProxyScoreOptions o = parse_proxy_score_options("kernel=decode_only,decode_ctas=3,decode_ilp=" + std::to_string(u));
    EXPECT_EQ(o.decode_ilp, u);
    EXPECT_EQ(o.decode_ctas, 3);
    EXPECT_EQ(o.kernel, ProxyKernel::kDecodeOnly);
  }
  EXPECT_EQ(parse_proxy_score_options("").nvfp4_cvt, DecodeNvfp4Cvt::kAuto);
  for (DecodeNvfp4Cvt c : {DecodeNvfp4Cvt::kAuto, DecodeNvfp4Cvt::kByte, DecodeNvfp4Cvt::kWord}) {
    const ProxyScoreOptions o = parse_proxy_score_options(std::string("kernel=decode_only,nvfp4_cvt=") + option_name(c));
    EXPECT_EQ(o.nvfp4_cvt, c);
    EXPECT_EQ(o.kernel, ProxyKernel::kDecodeOnly);
  }
  EXPECT_EQ(parse_proxy_score_options("").decode_fp8, DecodeTma::kAuto);
  for (DecodeTma f : {DecodeTma::kAuto, DecodeTma::kCta, DecodeTma::kTma}) {
    const ProxyScoreOptions o = parse_proxy_score_options(std::string("kernel=decode_only,decode_fp8=") + option_name(f));
    EXPECT_EQ(o.decode_fp8, f);
    EXPECT_EQ(o.kernel, ProxyKernel::kDecodeOnly);
    const ProxyScoreOptions n = parse_proxy_score_options(std::string("decode_nvfp4=") + option_name(f));
    EXPECT_EQ(n.decode_nvfp4, f);
    EXPECT_EQ(n.decode_fp8, DecodeTma::kAuto);
  }
  EXPECT_EQ(parse_proxy_score_options("").decode_nvfp4, DecodeTma::kAuto);
  EXPECT_EQ(parse_proxy_score_options("").decode_tma_issue, DecodeTmaIssue::kAuto);
  for (DecodeTmaIssue i : {DecodeTmaIssue::kAuto, DecodeTmaIssue::kProducer, DecodeTmaIssue::kWarps})
    EXPECT_EQ(parse_proxy_score_options(std::string("decode_tma_issue=") + option_name(i)).decode_tma_issue, i);
  for (TopkKernel k : {TopkKernel::kAuto, TopkKernel::kWarpPerRow, TopkKernel::kWarpPerRow8,
                       TopkKernel::kRadix, TopkKernel::kBySize, TopkKernel::kRadix1Buf,
                       TopkKernel::kWarpSplit, TopkKernel::kRadixUniform, TopkKernel::kWarpDigits,
                       TopkKernel::kNet})
    EXPECT_EQ(parse_topk_select_options(std::string("kernel=") + option_name(k)).kernel, k);
  const SparseDecodeOptions d = parse_sparse_decode_options("kernel=regs,mtp=union");
  EXPECT_EQ(d.kernel, DecodeKernel::kRegs);
  EXPECT_EQ(d.mtp, DecodeMtp::kUnion);
  EXPECT_EQ(parse_sparse_decode_options("").kernel, DecodeKernel::kAuto);
  for (DecodeKernel k : {DecodeKernel::kAuto, DecodeKernel::kSmem, DecodeKernel::kRegs})
    EXPECT_EQ(parse_sparse_decode_options(std::string("kernel=") + option_name(k)).kernel, k);
  for (DecodeMtp m : {DecodeMtp::kAuto, DecodeMtp::kPerToken, DecodeMtp::kUnion})
    EXPECT_EQ(parse_sparse_decode_options(std::string("mtp=") + option_name(m)).mtp, m);
  EXPECT_EQ(parse_sparse_decode_options("").nvfp4_cvt, DecodeNvfp4Cvt::kAuto);
  for (DecodeNvfp4Cvt c : {DecodeNvfp4Cvt::kAuto, DecodeNvfp4Cvt::kByte, DecodeNvfp4Cvt::kWord})
    EXPECT_EQ(parse_sparse_decode_options(std::string("nvfp4_cvt=") + option_name(c)).nvfp4_cvt, c);
  EXPECT_EQ(parse_sparse_decode_options("kernel=regs,nvfp4_cvt=word").nvfp4_cvt, DecodeNvfp4Cvt::kWord);
  for (DecodeSplitWarps v : {DecodeSplitWarps::kAuto, DecodeSplitWarps::k4, DecodeSplitWarps::k8})
    EXPECT_EQ(parse_sparse_decode_options(std::string("split_warps=") + option_name(v)).split_warps, v);
  EXPECT_EQ(parse_sparse_decode_options("").split_warps, DecodeSplitWarps::kAuto);
  EXPECT_EQ(parse_sparse_decode_options("split=blocks,split_warps=8").split_warps, DecodeSplitWarps::k8);
  for (DecodeSplit v : {DecodeSplit::kAuto, DecodeSplit::kBlocks, DecodeSplit::kCluster})
    EXPECT_EQ(parse_sparse_decode_options(std::string("split=") + option_name(v)).split, v);
  EXPECT_EQ(parse_sparse_decode_options("").split, DecodeSplit::kAuto);
  EXPECT_EQ(parse_sparse_decode_options("kernel=regs,split=cluster").split, DecodeSplit::kCluster);
  EXPECT_EQ(parse_sparse_decode_options("kernel=wgmma").kernel, DecodeKernel::kWgmma);
  EXPECT_EQ(parse_sparse_decode_options("kernel=wgmma,mtp=union").mtp, DecodeMtp::kUnion);
  for (DecodeWgmmaFp8 v : {DecodeWgmmaFp8::kAuto, DecodeWgmmaFp8::kOff, DecodeWgmmaFp8::kOn})
    EXPECT_EQ(parse_sparse_decode_options(std::string("wgmma_fp8=") + option_name(v)).wgmma_fp8, v);
  EXPECT_EQ(parse_sparse_decode_options("").wgmma_fp8, DecodeWgmmaFp8::kAuto);
  for (DecodeWgmmaPipe v : {DecodeWgmmaPipe::kAuto, DecodeWgmmaPipe::kInline, DecodeWgmmaPipe::kAhead})
    EXPECT_EQ(parse_sparse_decode_options(std::string("wgmma_pipe=") + option_name(v)).wgmma_pipe, v);
  EXPECT_EQ(parse_sparse_decode_options("").wgmma_pipe, DecodeWgmmaPipe::kAuto);
  EXPECT_EQ(parse_sparse_decode_options("kernel=wgmma,wgmma_pipe=ahead").kernel, DecodeKernel::kWgmma);
  EXPECT_STREQ(option_name(ProxyKernel::kSm90SsOnly), "sm90_ss_only");
  EXPECT_STREQ(option_name(TopkKernel::kWarpPerRow8), "warp_per_row_8");
  EXPECT_STREQ(option_name(TopkKernel::kRadix1Buf), "radix_1buf");
  EXPECT_STREQ(option_name(TopkKernel::kWarpSplit), "warp_split");
  EXPECT_STREQ(option_name(TopkKernel::kRadixUniform), "radix_uniform");
  EXPECT_STREQ(option_name(TopkKernel::kWarpDigits), "warp_digits");
  EXPECT_EQ(parse_topk_select_options("kernel=warp_digits").kernel, TopkKernel::kWarpDigits);
}

TEST(PlanOptions, BadOptionsNameTheOption) {
  auto bad = [](const char* text, const std::string& needle) {
    expect_error([&] { parse_sparse_attention_options(text); }, ErrorKind::kValue, needle);
  };
  bad("schedule=fast", "schedule must be auto, query_major, kv_major or hybrid, got 'fast'");
  bad("kv_major_kernel=tensor", "kv_major_kernel must be auto, mma_sync, wgmma or tma, got 'tensor'");
  for (const char* v : {"0", "-3", "abc", "1.5", ""})
    bad((std::string("chunk_rows=") + v).c_str(), "chunk_rows must be a positive integer");
  for (const char* v : {"abc", "0.5", "9", "nan", "1.5x", ""})
    bad((std::string("tile_max_waste=") + v).c_str(), "tile_max_waste must be a number from 1 to 8");
  bad("speed=11",
      "unknown plan option 'speed' (options: schedule, kv_major_kernel, chunk_rows, tile_max_waste, tile_kernel, "
      "lists, tile_bound, kv_major_store, kv_major_math)");
  bad("tile_bound=wide", "tile_bound must be auto, fixed or adaptive, got 'wide'");
  bad("lists=all", "lists must be auto, per_group or once, got 'all'");
  bad("lists=", "lists must be auto, per_group or once, got ''");
  bad("tile_kernel=wgmma", "tile_kernel must be auto, cp_async or tma, got 'wgmma'");
  // tile_pingpong (the TMA tile kernel's consumer warpgroups taking turns issuing their MMAs) was
  // removed: bit-identical and no faster on the H200 (43c70d4 / fe6e5cc).
  bad("tile_pingpong=on",
      "unknown plan option 'tile_pingpong' (options: schedule, kv_major_kernel, chunk_rows, tile_max_waste, "
      "tile_kernel, lists, tile_bound, kv_major_store, kv_major_math)");
  // The KV-major combine variants (prefetch, overlap, overlap_staged; fused, measured at 57802f3; the
  // in-kernel combine=overlap with combine_ctas, measured at c21b988) were removed, and with them the
  // options: the combine is always the separate kernel.
  for (const char* v : {"auto", "separate", "prefetch", "overlap", "overlap_staged", "fused"})
    bad((std::string("combine=") + v).c_str(), "unknown plan option 'combine'");
  for (const char* v : {"8", "32"})
    bad((std::string("combine_ctas=") + v).c_str(),
        "unknown plan option 'combine_ctas' (options: schedule, kv_major_kernel, chunk_rows, tile_max_waste, "
        "tile_kernel, lists, tile_bound, kv_major_store, kv_major_math)");
  bad("schedule", "name=value");
  bad("schedule=hybrid,", "name=value");
  bad("schedule=hybrid,schedule=kv_major", "option schedule given twice");
  expect_error([] { parse_proxy_score_options("kernel=wgmma"); }, ErrorKind::kValue,
               "kernel must be auto, mma_sync, sm90, sm90_only, sm90_ss, sm90_ss_only, decode, "
               "decode_only, decode_f16, decode_f16_only, sm90_f16 or sm90_f16_only, got 'wgmma'");
  for (const char* v : {"1", "5", "0", "three", ""})
    expect_error([&] { parse_proxy_score_options(std::string("decode_ctas=") + v); }, ErrorKind::kValue,
                 std::string("decode_ctas must be auto, 2, 3 or 4, got '") + v + "'");
  for (const char* v : {"0", "3", "4", "two", ""})
    expect_error([&] { parse_proxy_score_options(std::string("decode_ilp=") + v); }, ErrorKind::kValue,
                 std::string("decode_ilp must be auto, 1 or 2, got '") + v + "'");
  expect_error([] { parse_proxy_score_options("decode_ilp=2,decode_ilp=1"); }, ErrorKind::kValue,
               "option decode_ilp given twice");
  expect_error([] { parse_proxy_score_options("stages=4"); }, ErrorKind::kValue,
               "unknown plan option 'stages' (options: kernel, decode_ctas, decode_ilp, nvfp4_cvt, decode_fp8, "
               "decode_nvfp4, decode_tma_issue)");
  expect_error([] { parse_proxy_score_options("decode_tma_issue=lane"); }, ErrorKind::kValue,
               "decode_tma_issue must be auto, producer or warps, got 'lane'");
  expect_error([] { parse_proxy_score_options("decode_nvfp4=wgmma"); }, ErrorKind::kValue,
               "decode_nvfp4 must be auto, cta or tma, got 'wgmma'");
  expect_error([] { parse_proxy_score_options("decode_nvfp4=tma,decode_nvfp4=tma"); }, ErrorKind::kValue,
               "option decode_nvfp4 given twice");
  expect_error([] { parse_proxy_score_options("decode_fp8=wgmma"); }, ErrorKind::kValue,
               "decode_fp8 must be auto, cta or tma, got 'wgmma'");
  expect_error([] { parse_proxy_score_options("decode_fp8=tma,decode_fp8=cta"); }, ErrorKind::kValue,
               "option decode_fp8 given twice");
  expect_error([] { parse_proxy_score_options("nvfp4_cvt=prmt"); }, ErrorKind::kValue,
               "nvfp4_cvt must be auto, byte or word, got 'prmt'");
  expect_error([] { parse_proxy_score_options("nvfp4_cvt=word,nvfp4_cvt=byte"); }, ErrorKind::kValue,
               "option nvfp4_cvt given twice");
  expect_error([] { parse_topk_select_options("kernel=heap"); }, ErrorKind::kValue,
               "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, "
               "warp_split, radix_uniform, warp_digits or net, got 'heap'");
  // radix_lean and radix_c32 (lean radix variants) were removed: slower than radix_1buf on the
  // H200 (at 5b22cb3); radix_coop (cooperative histograms) not faster than radix_uniform (at
  // 054c9ce).
  for (const char* v : {"radix_lean", "radix_c32", "radix_coop"})
    expect_error([&] { parse_topk_select_options(std::string("kernel=") + v); }, ErrorKind::kValue,
                 std::string("kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, "
                             "radix_1buf, warp_split, radix_uniform, warp_digits or net, got '") + v + "'");
  expect_error([] { parse_topk_select_options("kernel=warp_digits,kernel=warp_split"); },
               ErrorKind::kValue, "option kernel given twice");
  expect_error([] { parse_topk_select_options("kernel=digits"); }, ErrorKind::kValue,
               "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, "
               "warp_split, radix_uniform, warp_digits or net, got 'digits'");
  expect_error([] { parse_topk_select_options("k=1"); }, ErrorKind::kValue, "unknown plan option 'k'");
  expect_error([] { parse_topk_select_options("k=1"); }, ErrorKind::kValue,
               "(options: kernel, net_lanes, net_pivot, net_pivot_mode)");
  for (const char* bad : {"bitonic", "", "rank", "cta"})
    expect_error([bad] { parse_topk_select_options(std::string("net_pivot_mode=") + bad); },
                 ErrorKind::kValue, "net_pivot_mode must be auto, sort or rank_cta");
  for (const char* bad : {"yes", "1", "", "ON"})
    expect_error([bad] { parse_topk_select_options(std::string("net_pivot=") + bad); }, ErrorKind::kValue,
                 "net_pivot must be auto, off or on");
  for (const char* bad : {"3", "0", "64", "-1", "x"})
    expect_error([bad] { parse_topk_select_options(std::string("net_lanes=") + bad); }, ErrorKind::kValue,
                 "net_lanes must be auto, 1, 2, 4, 8, 16 or 32");
  expect_error([] { parse_topk_select_options("net_lanes=2,net_lanes=4"); }, ErrorKind::kValue,
               "given twice");
  expect_error([] { parse_sparse_decode_options("kernel=fastest"); }, ErrorKind::kValue,
               "kernel must be auto, smem, regs or wgmma, got 'fastest'");
  // kernel=regs8 (8 warps per CTA for fp8 K/V) and kernel=regs_pipe (the fp8 register kernel
  // pipelined across blocks) were removed: not faster than regs on the H200 (at 5b22cb3, 054c9ce).
  for (const char* v : {"regs8", "regs_pipe"})
    expect_error([&] { parse_sparse_decode_options(std::string("kernel=") + v); }, ErrorKind::kValue,
                 std::string("kernel must be auto, smem, regs or wgmma, got '") + v + "'");
  expect_error([] { parse_sparse_decode_options("mtp=shared"); }, ErrorKind::kValue,
               "mtp must be auto, per_token or union, got 'shared'");
  expect_error([] { parse_sparse_decode_options("splits=2"); }, ErrorKind::kValue,
               "unknown plan option 'splits' (options: kernel, mtp, nvfp4_cvt, split, wgmma_fp8, wgmma_pipe, split_warps, split_rule, combine_loads, regs_feed)");
  expect_error([] { parse_sparse_decode_options("split_warps=16"); }, ErrorKind::kValue,
               "split_warps must be auto, 4 or 8, got '16'");
  expect_error([] { parse_sparse_decode_options("split_warps=8,split_warps=4"); }, ErrorKind::kValue,
               "option split_warps given twice");
  expect_error([] { parse_sparse_decode_options("nvfp4_cvt=prmt"); }, ErrorKind::kValue,
               "nvfp4_cvt must be auto, byte or word, got 'prmt'");
  expect_error([] { parse_sparse_decode_options("split=tiles"); }, ErrorKind::kValue,
               "split must be auto, blocks or cluster, got 'tiles'");
  expect_error([] { parse_sparse_decode_options("wgmma_fp8=yes"); }, ErrorKind::kValue,
               "wgmma_fp8 must be auto, off or on, got 'yes'");
  expect_error([] { parse_sparse_decode_options("wgmma_fp8=on,wgmma_fp8=off"); }, ErrorKind::kValue,
               "option wgmma_fp8 given twice");
  expect_error([] { parse_sparse_decode_options("wgmma_pipe=deep"); }, ErrorKind::kValue,
               "wgmma_pipe must be auto, inline or ahead, got 'deep'");
  expect_error([] { parse_sparse_decode_options("wgmma_pipe=ahead,wgmma_pipe=inline"); }, ErrorKind::kValue,
               "option wgmma_pipe given twice");
  expect_error([] { parse_sparse_decode_options("split="); }, ErrorKind::kValue,
               "split must be auto, blocks or cluster, got ''");
  expect_error([] { parse_sparse_decode_options("split=cluster,split=blocks"); }, ErrorKind::kValue,
               "option split given twice");
  expect_error([] { parse_topk_select_options("kernel=new"); }, ErrorKind::kValue,
               "kernel must be auto, warp_per_row, warp_per_row_8, radix, by_size, radix_1buf, "
               "warp_split, radix_uniform, warp_digits or net, got 'new'");
  expect_error([] { parse_sparse_decode_options("schedule=kv_major"); }, ErrorKind::kValue,
               "unknown plan option 'schedule'");
}

// ---- proxy score and top-k ----------------------------------------------------------------------

ProxyScorePlan proxy_plan(ProxyKernel k) {
  ProxyScoreOptions o;
  o.kernel = k;
  return plan_proxy_score(ProxyScoreParams{}, o);
}

TEST(PlanProxy, AutoIsSm90AndTheSm90VariantsKeepOrForbidTheFallback) {
  // f16_mma (the decode kernel's fp16 MMAs): decode_f16 / decode_f16_only, and auto for fp8 K
  // (PlanProxy.AutoTakesSm90ForEveryKDtype; these params have bf16 K).
  // fp8_q (fp8 q and K on the sm_90a kernel's fp16 MMAs): sm90_f16 / sm90_f16_only, and auto's
  // only for fp8 q and K (below; these params have bf16 q and K).
  struct Case {
    ProxyKernel option, kernel;
    bool strict, f16_mma = false, fp8_q = false;
  } cases[] = {{ProxyKernel::kAuto, ProxyKernel::kSm90, false},  // no heads: not the decode kernel
               {ProxyKernel::kMmaSync, ProxyKernel::kMmaSync, false},
               {ProxyKernel::kSm90, ProxyKernel::kSm90, false},
               {ProxyKernel::kSm90Only, ProxyKernel::kSm90, true},
               {ProxyKernel::kSm90Ss, ProxyKernel::kSm90Ss, false},
               {ProxyKernel::kSm90SsOnly, ProxyKernel::kSm90Ss, true},
               // No heads: the decode kernel does not run the call, decode_only keeps it (strict).
               {ProxyKernel::kDecode, ProxyKernel::kMmaSync, false},
               {ProxyKernel::kDecodeOnly, ProxyKernel::kDecode, true},
               // decode_f16: as decode (the fallback keeps bf16 MMAs: f16_mma only on the decode
               // kernel); decode_f16_only keeps the kernel and its fp16 MMAs.
               {ProxyKernel::kDecodeF16, ProxyKernel::kMmaSync, false, false},
               {ProxyKernel::kDecodeF16Only, ProxyKernel::kDecode, true, true},
               // sm90_f16 / sm90_f16_only: the sm_90a kernel with its fp16 MMAs for fp8 K (the
               // launcher applies them to bf16 or fp8 q with fp8 K, and to NVFP4 q and K).
               {ProxyKernel::kSm90F16, ProxyKernel::kSm90, false, true, true},
               {ProxyKernel::kSm90F16Only, ProxyKernel::kSm90, true, true, true}};
  for (const Case& c : cases) {
    const ProxyScorePlan plan = proxy_plan(c.option);
    EXPECT_EQ(plan.kernel, c.kernel) << option_name(c.option);
    EXPECT_EQ(plan.strict, c.strict) << option_name(c.option);
    EXPECT_EQ(plan.f16_mma, c.f16_mma) << option_name(c.option);
    EXPECT_EQ(plan.fp8_q, c.fp8_q) << option_name(c.option);
  }
  // With fp8 q and K, auto takes the sm_90a kernel's fp8-q form (since the H200 run at 831d3e5);
  // sm90 and sm90_ss do not, and neither does auto for fp8 q over bf16 K.
  ProxyScoreParams fp8{};
  fp8.q_dtype = fp8.k.dtype = DType::kFP8E4M3;
  const ProxyScorePlan fp8_auto = plan_proxy_score(fp8, ProxyScoreOptions{});
  EXPECT_EQ(fp8_auto.kernel, ProxyKernel::kSm90);
  EXPECT_TRUE(fp8_auto.fp8_q);
  EXPECT_TRUE(fp8_auto.f16_mma);
  for (ProxyKernel k : {ProxyKernel::kSm90, ProxyKernel::kSm90Ss}) {
    ProxyScoreOptions o;
    o.kernel = k;
    EXPECT_FALSE(plan_proxy_score(fp8, o).fp8_q) << option_name(k);
  }
  ProxyScoreParams fp8_q_bf16_k = fp8;
  fp8_q_bf16_k.k.dtype = DType::kBF16;
  EXPECT_FALSE(plan_proxy_score(fp8_q_bf16_k, ProxyScoreOptions{}).fp8_q);
}

// An M3-like prefill call of the proxy (32K queries, 64 heads over 1 KV head) with K of dtype k
// (NVFP4: q too, else bf16 q).
ProxyScoreParams long_proxy_call(DType k) {
  ProxyScoreParams p{};
  p.num_heads = 64;
  p.num_kv_heads = 1;
  p.qi.max_seqlen_q = 32768;
  p.q_dtype = k == DType::kNVFP4 ? DType::kNVFP4 : DType::kBF16;
  p.k.dtype = k;
  return p;
}

// sm90_convert (per-task or closed-form fp8 converter addresses) was removed when the closed form
// became the only one (faster on the H200 at 73ba220).
TEST(PlanProxy, Sm90ConvertOptionIsGone) {
  expect_error([] { parse_proxy_score_options("sm90_convert=strided"); }, ErrorKind::kValue,
               "unknown plan option 'sm90_convert'");
}

// Prefill (long queries): auto takes the sm_90a kernel for 16-bit, fp8 and NVFP4 K alike (its
// launcher converts fp8 / NVFP4 K; H200 at c7709c9: faster than mma.sync for each).
TEST(PlanProxy, AutoTakesSm90ForEveryKDtype) {
  for (DType k : {DType::kBF16, DType::kFP8E4M3, DType::kNVFP4}) {
    const ProxyScoreParams p = long_proxy_call(k);
    EXPECT_EQ(plan_proxy_score(p, {}).kernel, ProxyKernel::kSm90) << dtype_name(k);
    // fp8 K and NVFP4: its fp16 MMAs (H200: bit-identical; 32K 874.8 vs 1067.6 us at b66f97b,
    // NVFP4 1352.0 vs 1805.0 us at 5cb9800).
    EXPECT_EQ(plan_proxy_score(p, {}).f16_mma, k != DType::kBF16) << dtype_name(k);
  }
}

TopkSelectParams topk_call(int heads, int tokens, int blocks = 256) {
  TopkSelectParams p{};
  p.num_heads = heads;
  p.num_tokens = tokens;
  p.num_blocks = blocks;
  p.topk = 16;
  return p;
}

// vLLM's M3 rows: 4 heads, the local block forced, 15 of `blocks` chosen.
TopkSelectParams m3_topk(int tokens, int blocks) {
  TopkSelectParams p = topk_call(4, tokens, blocks);
  p.force_end = 1;
  return p;
}

// auto: net wherever it runs (H200 at 3488394), by_size elsewhere.
TEST(PlanTopk, AutoIsNetWhereItRunsElseBySize) {
  const TopkSelectDeviceFacts h200{132};
  for (int tokens : {1, 64, 32768})
    for (int blocks : {1, 64, 256, 1024, kTopkNetMaxSpan})
      for (const TopkSelectDeviceFacts& f : {h200, TopkSelectDeviceFacts{}}) {
        const TopkSelectPlan plan = plan_topk_select(topk_call(4, tokens, blocks), {}, f);
        EXPECT_EQ(plan.kernel, TopkKernel::kNet) << tokens << " " << blocks;
        EXPECT_EQ(plan.net_lanes, topk_net_lanes(topk_call(4, tokens, blocks), f.num_sms));
        EXPECT_EQ(plan.net_words, 32);  // topk 16, no forced block
      }
  // Where net does not run, auto is by_size.
  TopkSelectParams wide = topk_call(4, 64);
  wide.topk = 40;
  TopkSelectParams long_rows = topk_call(4, 1, kTopkNetMaxSpan + 1);
  TopkSelectParams long_prefill = topk_call(4, 32768, kTopkNetMaxSpan + 1);
  for (const TopkSelectParams& p : {wide, long_rows, long_prefill}) {
    const TopkSelectPlan plan = plan_topk_select(p, {}, h200);
    EXPECT_EQ(plan.kernel, plan_topk_select(p, {TopkKernel::kBySize}, h200).kernel);
    EXPECT_NE(plan.kernel, TopkKernel::kNet);
    EXPECT_EQ(plan.net_fallback, nullptr);  // not forced: nothing falls back
  }
  EXPECT_EQ(plan_topk_select(wide, {}, h200).kernel, TopkKernel::kWarpDigits);
  EXPECT_EQ(plan_topk_select(long_rows, {}, h200).kernel, TopkKernel::kWarpSplit);
  EXPECT_EQ(plan_topk_select(long_prefill, {}, h200).kernel, TopkKernel::kRadixUniform);
}

TEST(PlanTopk, BySizeAndForcedKernelsAreKept) {
  const TopkSelectDeviceFacts h200{132};
  const TopkSelectOptions by_size{TopkKernel::kBySize};
  // The decode call of 64 tokens x 4 heads x 256 blocks: rows of one chunk, warp_digits (H200 at
  // 3cebf5e: 8.2 vs 9.1 us against warp_split).
  EXPECT_EQ(plan_topk_select(topk_call(4, 64), by_size, h200).kernel, TopkKernel::kWarpDigits);
  EXPECT_EQ(plan_topk_select(topk_call(4, 32768), by_size, h200).kernel, TopkKernel::kRadixUniform);
  // The B1 decode calls (1 token x 4 heads): warp_split for rows of several chunks (H200 at
  // 2f7070a), warp_digits for rows of one.
  for (int blocks : {257, 1024, 16384})
    EXPECT_EQ(plan_topk_select(topk_call(4, 1, blocks), by_size, h200).kernel, TopkKernel::kWarpSplit);
  for (int blocks : {1, 64, 256})
    EXPECT_EQ(plan_topk_select(topk_call(4, 1, blocks), by_size, h200).kernel, TopkKernel::kWarpDigits);
  // by_size takes warp_digits exactly where it would take warp_split and every row is one chunk;
  // forced, it is kept at any size.
  for (int tokens : {1, 64, 132, 133, 256, 4224, 32768})
    for (int blocks : {64, 256, 257, 1024}) {
      const TopkKernel got = plan_topk_select(topk_call(4, tokens, blocks), by_size, h200).kernel;
      const bool split_size = tokens * 4 <= kTopkSplitMaxRowsPerSm * 132 && tokens < 4224;
      EXPECT_EQ(got == TopkKernel::kWarpDigits, split_size && blocks <= kTopkDigitsChunk) << tokens << " " << blocks;
      EXPECT_EQ(got == TopkKernel::kWarpSplit, split_size && blocks > kTopkDigitsChunk) << tokens << " " << blocks;
      EXPECT_EQ(plan_topk_select(topk_call(4, tokens, blocks), {TopkKernel::kWarpDigits}, h200).kernel,
                TopkKernel::kWarpDigits);
    }
  for (TopkKernel k : {TopkKernel::kWarpPerRow, TopkKernel::kWarpPerRow8, TopkKernel::kRadix,
                       TopkKernel::kRadix1Buf, TopkKernel::kWarpSplit, TopkKernel::kRadixUniform,
                       TopkKernel::kWarpDigits, TopkKernel::kNet})
    for (int tokens : {1, 64, 32768})
      for (const TopkSelectDeviceFacts& f : {h200, TopkSelectDeviceFacts{}})
        EXPECT_EQ(plan_topk_select(topk_call(4, tokens), {k}, f).kernel, k) << option_name(k);
}

// kernel=net: 16 words per lane where a row chooses at most 15 blocks, else 32; lanes per row the
// fewest powers of two giving 48 warps per SM, at most one per 16 blocks; rows choosing more than
// 31 blocks or rows of more than 32768 blocks fall back to by_size's kernel, and the plan says why.
TEST(PlanTopk, NetLanesWordsAndFallback) {
  const TopkSelectDeviceFacts h200{132};
  // The lanes rule as planned without the pivot (which takes 32 lanes for decode-sized calls).
  TopkSelectOptions net{TopkKernel::kNet};
  net.net_pivot = TopkNetPivot::kOff;
  const auto m3 = m3_topk;  // vLLM's rows: the local block forced, 15 chosen
  struct Case {
    TopkSelectParams p;
    int lanes, words;
  };
  for (const Case& c : {Case{m3(32768, 256), 2, 16},    // 4096 warps at one lane: 31 per SM
                        Case{m3(131072, 1024), 1, 16},  // 16384 warps: 124 per SM
                        Case{m3(50688, 256), 1, 16},    // 6336 warps of 32 rows: 48 per SM
                        Case{m3(50656, 256), 2, 16},    // one group of 32 tokens fewer
                        Case{m3(8192, 64), 4, 16},      // 8K prefill: 64 blocks, 4 lanes at most
                        Case{m3(64, 256), 16, 16},      // decode: 16 blocks a lane at most
                        Case{m3(1, 1024), 32, 16},      // B1 / 128K
                        Case{m3(1, 64), 4, 16},         // 64 blocks: 4 lanes
                        Case{m3(1, 31), 1, 16},         // fewer blocks than a batch
                        Case{topk_call(4, 64), 16, 32},  // 16 chosen: 32 words
                        Case{m3(256, 32768), 32, 16}}) {
    const TopkSelectPlan plan = plan_topk_select(c.p, net, h200);
    EXPECT_EQ(plan.kernel, TopkKernel::kNet) << c.p.num_tokens << " " << c.p.num_blocks;
    EXPECT_EQ(plan.net_lanes, c.lanes) << c.p.num_tokens << " " << c.p.num_blocks;
    EXPECT_EQ(plan.net_words, c.words) << c.p.num_tokens << " " << c.p.num_blocks;
    EXPECT_EQ(plan.net_fallback, nullptr);
    EXPECT_EQ(topk_net_unsupported(c.p), nullptr);
    EXPECT_EQ(plan_topk_select(c.p, net, {}).net_lanes, 1);  // unknown device: a lane per row
  }
  TopkSelectParams wide = topk_call(4, 64);
  wide.topk = 32;  // 32 chosen: more than 32 words can cut
  TopkSelectParams widest = wide;
  widest.force_begin = 1;  // 31 chosen
  EXPECT_EQ(plan_topk_select(widest, net, h200).kernel, TopkKernel::kNet);
  EXPECT_EQ(plan_topk_select(widest, net, h200).net_words, 32);
  TopkSelectParams long_rows = m3(1, kTopkNetMaxSpan + 1);
  for (const TopkSelectParams& p : {wide, long_rows}) {
    const TopkSelectPlan plan = plan_topk_select(p, net, h200);
    EXPECT_NE(plan.net_fallback, nullptr);
    EXPECT_STREQ(plan.net_fallback, topk_net_unsupported(p));
    EXPECT_EQ(plan.kernel, plan_topk_select(p, {TopkKernel::kBySize}, h200).kernel);
    EXPECT_EQ(plan.net_lanes, 0);
  }
  // net_lanes forces the lanes (a tuning knob), under auto and kernel=net alike; other kernels
  // ignore it.
  for (int lanes : {1, 2, 4, 8, 16, 32})
    for (TopkKernel k : {TopkKernel::kAuto, TopkKernel::kNet}) {
      TopkSelectOptions o = parse_topk_select_options("net_lanes=" + std::to_string(lanes));
      o.kernel = k;
      const TopkSelectPlan plan = plan_topk_select(m3(32768, 256), o, h200);
      EXPECT_EQ(plan.kernel, TopkKernel::kNet);
      EXPECT_EQ(plan.net_lanes, lanes);
    }
  EXPECT_EQ(parse_topk_select_options("net_lanes=auto").net_lanes, 0);
  EXPECT_EQ(plan_topk_select(m3(32768, 256), parse_topk_select_options("kernel=radix_uniform,net_lanes=4"),
                             h200).net_lanes, 0);
  // auto takes it (H200 at 3488394).
  for (int tokens : {1, 64, 32768})
    EXPECT_EQ(plan_topk_select(m3(tokens, 256), {}, h200).kernel, TopkKernel::kNet);
}

// net_pivot=on: a warp per row (32 lanes) with 8, 16 or 32 scores a lane, where rows choose at
// most 15 of at most 1024 blocks; elsewhere the plan keeps the networks and says why. auto: off.
TEST(PlanTopk, NetPivotSlotsAndFallback) {
  const TopkSelectDeviceFacts h200{132};
  const auto m3 = m3_topk;
  const TopkSelectOptions on = parse_topk_select_options("net_pivot=on");
  EXPECT_EQ(on.net_pivot, TopkNetPivot::kOn);
  EXPECT_EQ(parse_topk_select_options("net_pivot=off").net_pivot, TopkNetPivot::kOff);
  EXPECT_EQ(parse_topk_select_options("").net_pivot, TopkNetPivot::kAuto);
  struct Case {
    int tokens, blocks, slots;
  };
  for (const Case& c : {Case{1, 1024, 32}, Case{1, 1000, 32}, Case{1, 513, 32}, Case{1, 512, 16},
                        Case{64, 256, 8}, Case{1, 257, 16}, Case{32768, 256, 8}, Case{3, 17, 8}}) {
    for (TopkKernel k : {TopkKernel::kAuto, TopkKernel::kNet}) {
      TopkSelectOptions o = on;
      o.kernel = k;
      const TopkSelectPlan plan = plan_topk_select(m3(c.tokens, c.blocks), o, h200);
      EXPECT_EQ(plan.kernel, TopkKernel::kNet);
      EXPECT_EQ(plan.net_pivot, c.slots) << c.tokens << " x " << c.blocks;
      EXPECT_EQ(plan.net_lanes, 32) << c.tokens << " x " << c.blocks;
      EXPECT_EQ(plan.net_words, 16);
      EXPECT_EQ(plan.net_pivot_fallback, nullptr);
    }
    // Off: the lanes rule's plan.
    const TopkSelectPlan off =
        plan_topk_select(m3(c.tokens, c.blocks), parse_topk_select_options("net_pivot=off"), h200);
    EXPECT_EQ(off.net_pivot, 0);
    EXPECT_EQ(off.net_lanes, topk_net_lanes(m3(c.tokens, c.blocks), h200.num_sms));
    // auto: where the lanes rule gives >= 16 lanes a row (decode-sized calls).
    const TopkSelectPlan dflt = plan_topk_select(m3(c.tokens, c.blocks), {}, h200);
    const bool decode_sized = off.net_lanes >= kTopkNetPivotMinLanes;
    EXPECT_EQ(dflt.net_pivot, decode_sized ? c.slots : 0) << c.tokens << " x " << c.blocks;
    EXPECT_EQ(dflt.net_lanes, decode_sized ? 32 : off.net_lanes) << c.tokens << " x " << c.blocks;
  }
  // net_lanes=32 may be given with it; any other count is a contradiction.
  TopkSelectOptions both = parse_topk_select_options("net_pivot=on,net_lanes=32");
  EXPECT_EQ(plan_topk_select(m3(64, 256), both, h200).net_pivot, 8);
  both = parse_topk_select_options("net_pivot=on,net_lanes=16");
  expect_error([&] { plan_topk_select(m3(64, 256), both, h200); }, ErrorKind::kValue,
               "net_pivot=on runs 32 lanes per row, got net_lanes=16");
  // Rows of more than 1024 blocks, or choosing more than 15: the networks alone, and why.
  TopkSelectParams sixteen = topk_call(4, 1, 256);  // topk 16, nothing forced: 16 chosen
  for (const TopkSelectParams& p : {m3(1, 1025), m3(4, 4096), sixteen}) {
    const TopkSelectPlan plan = plan_topk_select(p, on, h200);
    EXPECT_EQ(plan.kernel, TopkKernel::kNet);
    EXPECT_EQ(plan.net_pivot, 0);
    EXPECT_STREQ(plan.net_pivot_fallback, topk_net_pivot_unsupported(p));
    EXPECT_EQ(plan.net_lanes, topk_net_lanes(p, h200.num_sms));
  }
  EXPECT_STREQ(topk_net_pivot_unsupported(m3(1, 1025)), "more than 1024 blocks per row");
  EXPECT_STREQ(topk_net_pivot_unsupported(sixteen), "rows choose more than 15 blocks");
  EXPECT_EQ(topk_net_pivot_unsupported(m3(1, 1024)), nullptr);
  // Other kernels ignore it.
  TopkSelectOptions radix = parse_topk_select_options("kernel=radix_uniform,net_pivot=on");
  EXPECT_EQ(plan_topk_select(m3(64, 256), radix, h200).net_pivot, 0);
  // auto on the measured decode calls, not on prefill ones, nor where net_lanes is forced.
  EXPECT_EQ(plan_topk_select(m3(1, 1024), {}, h200).net_pivot, 32);
  EXPECT_EQ(plan_topk_select(m3(64, 256), {}, h200).net_pivot, 8);
  EXPECT_EQ(plan_topk_select(m3(8, 256), {}, h200).net_pivot, 8);
  EXPECT_EQ(plan_topk_select(m3(32768, 256), {}, h200).net_pivot, 0);
  EXPECT_EQ(plan_topk_select(m3(64, 256), parse_topk_select_options("net_lanes=16"), h200).net_pivot, 0);
  EXPECT_EQ(plan_topk_select(m3(1, 4096), {}, h200).net_pivot, 0);  // rows of > 1024 blocks
  EXPECT_EQ(plan_topk_select(m3(1, 4096), {}, h200).net_pivot_fallback, nullptr);  // not forced
}

// net_pivot_mode: where the pivot runs, auto takes rank_cta for rows of more than 256 blocks (16
// or 32 scores a lane) and sort for shorter ones; a forced mode is the plan's;
// elsewhere it is moot (the plan keeps kSort, unused); with net_pivot=off it is a contradiction.
TEST(PlanTopk, NetPivotModeWherePivotRuns) {
  const TopkSelectDeviceFacts h200{132};
  const auto m3 = m3_topk;
  EXPECT_EQ(parse_topk_select_options("").net_pivot_mode, TopkPivotMode::kAuto);
  EXPECT_EQ(parse_topk_select_options("net_pivot_mode=sort").net_pivot_mode, TopkPivotMode::kSort);
  EXPECT_EQ(parse_topk_select_options("net_pivot_mode=rank_cta").net_pivot_mode, TopkPivotMode::kRankCta);
  EXPECT_STREQ(option_name(TopkPivotMode::kRankCta), "rank_cta");
  for (int blocks : {1024, 512, 300, 256, 40}) {
    const TopkSelectParams p = m3(1, blocks);
    // auto's pivot from 256 blocks (16 lanes a row); net_pivot=on at any size.
    const bool auto_pivot = blocks >= 256;
    EXPECT_EQ(plan_topk_select(p, {}, h200).net_pivot > 0, auto_pivot) << blocks;
    if (auto_pivot)
      EXPECT_EQ(plan_topk_select(p, {}, h200).net_pivot_mode,
                blocks > 256 ? TopkPivotMode::kRankCta : TopkPivotMode::kSort) << blocks;
    // net_pivot=on alone: the same rule.
    EXPECT_EQ(plan_topk_select(p, parse_topk_select_options("net_pivot=on"), h200).net_pivot_mode,
              blocks > 256 ? TopkPivotMode::kRankCta : TopkPivotMode::kSort) << blocks;
    for (TopkPivotMode m : {TopkPivotMode::kSort, TopkPivotMode::kRankCta}) {
      for (const char* pivot : {"", "net_pivot=on,"}) {
        if (!auto_pivot && *pivot == '\0') continue;
        const TopkSelectOptions o = parse_topk_select_options(
            std::string(pivot) + "net_pivot_mode=" + option_name(m));
        const TopkSelectPlan plan = plan_topk_select(p, o, h200);
        EXPECT_EQ(plan.net_pivot, blocks <= 256 ? 8 : blocks <= 512 ? 16 : 32) << blocks;
        EXPECT_EQ(plan.net_pivot_mode, m) << blocks << " " << option_name(m);
      }
    }
  }
  // A prefill-sized call under auto takes no pivot: the mode changes nothing.
  const TopkSelectPlan prefill =
      plan_topk_select(m3(32768, 256), parse_topk_select_options("net_pivot_mode=rank_cta"), h200);
  EXPECT_EQ(prefill.net_pivot, 0);
  EXPECT_EQ(prefill.net_lanes, plan_topk_select(m3(32768, 256), {}, h200).net_lanes);
  for (const char* m : {"sort", "rank_cta"}) {
    const TopkSelectOptions o =
        parse_topk_select_options(std::string("net_pivot=off,net_pivot_mode=") + m);
    expect_error([&] { plan_topk_select(m3(1, 1024), o, h200); }, ErrorKind::kValue,
                 std::string("net_pivot_mode=") + m + " orders the pivot path, which net_pivot=off turns off");
  }
  EXPECT_EQ(plan_topk_select(m3(1, 1024), parse_topk_select_options("net_pivot=off,net_pivot_mode=auto"),
                             h200).net_pivot, 0);
}

TEST(PlanTopk, BySizeTakesRadixUniformFromFourGroupsPerSm) {
  const TopkSelectDeviceFacts h200{132};
  const TopkSelectOptions by_size{TopkKernel::kBySize};
  // 4 x 132 = 528 groups of 32 tokens: 4 heads x 132 groups = 4 x 4224 tokens.
  EXPECT_EQ(plan_topk_select(topk_call(4, 132 * 32), by_size, h200).kernel, TopkKernel::kRadixUniform);
  EXPECT_EQ(plan_topk_select(topk_call(4, 132 * 32 - 32), by_size, h200).kernel,
            TopkKernel::kWarpPerRow8);
  // Below it: warp_split up to 4 rows per SM (528 rows = 132 tokens x 4 heads), then
  // warp_per_row_8.
  EXPECT_EQ(plan_topk_select(topk_call(4, 132), by_size, h200).kernel, TopkKernel::kWarpDigits);
  EXPECT_EQ(plan_topk_select(topk_call(4, 132, 512), by_size, h200).kernel, TopkKernel::kWarpSplit);
  EXPECT_EQ(plan_topk_select(topk_call(4, 133), by_size, h200).kernel, TopkKernel::kWarpPerRow8);
  EXPECT_EQ(plan_topk_select(topk_call(1, 528, 4096), by_size, h200).kernel, TopkKernel::kWarpSplit);
  EXPECT_EQ(plan_topk_select(topk_call(4, 131 * 32 + 1), by_size, h200).kernel, TopkKernel::kRadixUniform);
  // The benchmark's shapes: decode (64 tokens x 4 heads) and the 32K / 128K prefills.
  EXPECT_EQ(plan_topk_select(topk_call(4, 64), by_size, h200).kernel, TopkKernel::kWarpDigits);
  EXPECT_EQ(plan_topk_select(topk_call(4, 32768), by_size, h200).kernel, TopkKernel::kRadixUniform);
  EXPECT_EQ(plan_topk_select(topk_call(4, 131072, 1024), by_size, h200).kernel, TopkKernel::kRadixUniform);
  // The thresholds scale with the SMs: the same call on 264 SMs stays warp_per_row_8.
  EXPECT_EQ(plan_topk_select(topk_call(4, 132 * 32), by_size, {264}).kernel, TopkKernel::kWarpPerRow8);
  EXPECT_EQ(plan_topk_select(topk_call(4, 133), by_size, {264}).kernel, TopkKernel::kWarpDigits);
  // Unknown device: radix_uniform.
  EXPECT_EQ(plan_topk_select(topk_call(4, 64), by_size, {}).kernel, TopkKernel::kRadixUniform);
  // radix_1buf is only ever forced since a1af6c4 (radix_uniform measured faster).
  for (int tokens : {1, 64, 132 * 32, 32768})
    for (const TopkSelectDeviceFacts& f : {h200, TopkSelectDeviceFacts{}}) {
      EXPECT_NE(plan_topk_select(topk_call(4, tokens), by_size, f).kernel, TopkKernel::kRadix1Buf);
      EXPECT_NE(plan_topk_select(topk_call(4, tokens), {}, f).kernel, TopkKernel::kRadix1Buf);
    }
}

// kernel=decode: the decode kernel where it runs (G <= 16 heads per KV head, reduce_heads only with
// one KV head), else mma_sync; auto takes it for short queries (G x max_seqlen_q <= 16), else sm90.
TEST(PlanOptions, ProxyDecodeWhereItRuns) {
  auto params = [](int hq, int hkv, bool reduce, DType q, DType k) {
    ProxyScoreParams p{};
    p.batch = 64;
    p.total_q = 64;
    p.num_heads = hq;
    p.num_kv_heads = hkv;
    p.max_k_tiles = 256;
    p.reduce_heads = reduce;
    p.q_dtype = q;
    p.k.dtype = k;
    return p;
  };
  ProxyScoreOptions decode;
  decode.kernel = ProxyKernel::kDecode;
  const DType bf16 = DType::kBF16, fp8 = DType::kFP8E4M3, fp4 = DType::kNVFP4;
  // M3's indexer: 4 index q heads over 1 index-K head, bf16 / fp8 / NVFP4 index-K.
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, bf16, bf16), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, bf16, fp8), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, fp8, fp8), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, fp4, fp4), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(4, 1, true, bf16, bf16), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(32, 2, false, bf16, bf16), decode).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(1, 1, false, bf16, bf16), decode).kernel, ProxyKernel::kDecode);
  // Falls back: G = 32 > 16, reduce_heads over two KV heads.
  EXPECT_EQ(plan_proxy_score(params(32, 1, false, bf16, bf16), decode).kernel, ProxyKernel::kMmaSync);
  EXPECT_EQ(plan_proxy_score(params(8, 2, true, bf16, bf16), decode).kernel, ProxyKernel::kMmaSync);
  // auto: decode while G x max_seqlen_q <= 16 (params: max_seqlen_q 0, taken as 1), else sm90.
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, bf16, bf16), {}).kernel, ProxyKernel::kDecode);
  EXPECT_EQ(plan_proxy_score(params(4, 1, false, fp4, fp4), {}).kernel, ProxyKernel::kDecode);
  ProxyScoreParams mtp4 = params(4, 1, false, bf16, bf16);
  mtp4.qi.max_seqlen_q = 4;
  EXPECT_EQ(plan_proxy_score(mtp4, {}).kernel, ProxyKernel::kDecode);
  mtp4.qi.max_seqlen_q = 5;
  EXPECT_EQ(plan_proxy_score(mtp4, {}).kernel, ProxyKernel::kSm90);
  EXPECT_EQ(plan_proxy_score(params(16, 1, false, bf16, bf16), {}).kernel, ProxyKernel::kDecode);
  // fp16 MMAs: auto for fp8 K on the decode kernel and on the sm_90a prefill kernel, for NVFP4 only
  // on the sm_90a kernel (the decode kernel runs NVFP4 on fp16 MMAs whatever the flag; never for
  // 16-bit K), decode_f16 for any K on the decode kernel, never decode.
  ProxyScoreOptions f16;
  f16.kernel = ProxyKernel::kDecodeF16;
  for (DType k : {bf16, fp8, fp4}) {
    EXPECT_EQ(plan_proxy_score(params(4, 1, false, k == fp4 ? fp4 : bf16, k), {}).f16_mma, k == fp8);
    EXPECT_FALSE(plan_proxy_score(params(4, 1, false, k == fp4 ? fp4 : bf16, k), decode).f16_mma);
    const ProxyScorePlan forced = plan_proxy_score(params(4, 1, false, k == fp4 ? fp4 : bf16, k), f16);
    EXPECT_EQ(forced.kernel, ProxyKernel::kDecode);
    EXPECT_TRUE(forced.f16_mma);
  }
  EXPECT_EQ(plan_proxy_score(params(32, 1, false, bf16, fp8), f16).kernel, ProxyKernel::kMmaSync);
  EXPECT_FALSE(plan_proxy_score(params(32, 1, false, bf16, fp8), f16).f16_mma);
  EXPECT_EQ(plan_proxy_score(params(32, 1, false, bf16, fp8), {}).kernel, ProxyKernel::kSm90);
  EXPECT_TRUE(plan_proxy_score(params(32, 1, false, bf16, fp8), {}).f16_mma);  // sm90 prefill (b66f97b)
  // decode_ctas: auto 3 for fp8 K, 4 for NVFP4, 2 for 16-bit K; the option sets it for fp8 /
  // NVFP4 K (16-bit K: always 2).
  for (DType k : {bf16, fp8, fp4}) {
    const ProxyScoreParams dp = params(4, 1, false, k == fp4 ? fp4 : bf16, k);
    EXPECT_EQ(plan_proxy_score(dp, {}).decode_ctas, k == fp8 ? 3 : (k == fp4 ? 4 : 2)) << dtype_name(k);
    for (int c : {2, 3, 4}) {
      ProxyScoreOptions o;
      o.decode_ctas = c;
      EXPECT_EQ(plan_proxy_score(dp, o).decode_ctas, k == bf16 ? 2 : c) << dtype_name(k);
    }
    // decode_ilp: auto 2 for fp8 K from kProxyDecodeIlpMinBatch requests on, else 1; the option
    // sets it for every K dtype and leaves the CTAs per SM alone.
    EXPECT_EQ(plan_proxy_score(dp, {}).decode_ilp, k == fp8 && dp.batch >= kProxyDecodeIlpMinBatch ? 2 : 1)
        << dtype_name(k);
    ProxyScoreParams big = dp, one = dp;
    big.batch = kProxyDecodeIlpMinBatch;
    one.batch = kProxyDecodeIlpMinBatch - 1;
    EXPECT_EQ(plan_proxy_score(big, {}).decode_ilp, k == fp8 ? 2 : 1) << dtype_name(k);
    EXPECT_EQ(plan_proxy_score(one, {}).decode_ilp, 1) << dtype_name(k);
    for (int u : {1, 2}) {
      ProxyScoreOptions o;
      o.decode_ilp = u;
      const ProxyScorePlan plan = plan_proxy_score(dp, o);
      EXPECT_EQ(plan.decode_ilp, u) << dtype_name(k);
      EXPECT_EQ(plan.decode_ctas, k == fp8 ? 3 : (k == fp4 ? 4 : 2)) << dtype_name(k);
      EXPECT_EQ(plan.kernel, ProxyKernel::kDecode) << dtype_name(k);
    }
    // nvfp4_cvt: word (auto's choice, or forced) only for NVFP4 K on the decode kernel; byte a
    // byte at a time; the other plan fields stay as auto sets them.
    EXPECT_EQ(plan_proxy_score(dp, {}).nvfp4_word, k == fp4) << dtype_name(k);
    for (DecodeNvfp4Cvt c : {DecodeNvfp4Cvt::kAuto, DecodeNvfp4Cvt::kByte, DecodeNvfp4Cvt::kWord}) {
      ProxyScoreOptions o;
      o.nvfp4_cvt = c;
      const ProxyScorePlan plan = plan_proxy_score(dp, o), dflt = plan_proxy_score(dp, {});
      EXPECT_EQ(plan.nvfp4_word, k == fp4 && c != DecodeNvfp4Cvt::kByte) << dtype_name(k);
      EXPECT_EQ(plan.kernel, dflt.kernel);
      EXPECT_EQ(plan.decode_ctas, dflt.decode_ctas);
      EXPECT_EQ(plan.decode_ilp, dflt.decode_ilp);
      o.kernel = ProxyKernel::kSm90;  // not the decode kernel: no word conversion
      EXPECT_FALSE(plan_proxy_score(dp, o).nvfp4_word) << dtype_name(k);
    }
    // (fp8_tma: the plan's TMA kernel is decode_fp8's, not decode_nvfp4's, which auto takes for NVFP4)
    auto fp8_tma = [](const ProxyScorePlan& plan) { return plan.tma && !plan.tma_nvfp4; };
    // decode_fp8: the TMA kernel only for fp8 K on the decode kernel, forced or auto's (cta: the
    // cp.async ring; auto: tma at any batch when G x max_seqlen_q fits one pass,
    // kProxyDecodeTmaMaxCols columns); the other plan fields stay as auto sets them. Its passes: 8
    // columns where G x max_seqlen_q fits them, else 16.
    EXPECT_EQ(fp8_tma(plan_proxy_score(dp, {})), k == fp8) << dtype_name(k);  // B64, 4 x 1 rows
    EXPECT_EQ(plan_proxy_score(dp, {}).tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
    {
      ProxyScoreParams few = dp, mtp2 = dp, mtp3 = dp, mtp4 = dp, mtp5 = dp, g8 = dp, g8mtp2 = dp, g16 = dp;
      few.batch = kProxyDecodeIlpMinBatch - 1;
      mtp2.qi.max_seqlen_q = 2;  // 8 columns: one 8-column pass
      mtp3.qi.max_seqlen_q = 3;  // 12 columns: one 16-column pass
      mtp4.qi.max_seqlen_q = 4;  // 16 columns: one 16-column pass
      mtp5.qi.max_seqlen_q = 5;  // 20 columns: two 16-column passes (forced only)
      g8.num_heads = 8;          // G 8 x 1 token: one 8-column pass
      g8mtp2.num_heads = 8;      // G 8 x 2 tokens: one 16-column pass
      g8mtp2.qi.max_seqlen_q = 2;
      g16.num_heads = 16;        // G 16 x 1 token: one 16-column pass
      EXPECT_EQ(fp8_tma(plan_proxy_score(few, {})), k == fp8) << dtype_name(k);
      ProxyScoreParams one = few, none = few;
      one.batch = 1;
      none.batch = 0;
      EXPECT_EQ(fp8_tma(plan_proxy_score(one, {})), k == fp8) << dtype_name(k);
      EXPECT_FALSE(fp8_tma(plan_proxy_score(none, {}))) << dtype_name(k);
      EXPECT_EQ(fp8_tma(plan_proxy_score(mtp2, {})), k == fp8) << dtype_name(k);
      EXPECT_EQ(fp8_tma(plan_proxy_score(g8, {})), k == fp8) << dtype_name(k);
      // auto: the 16-column pass where the rows fit one (H200 at 3cebf5e: B64 / 32K sq 4 78.2 vs
      // 85.5 us), never two passes.
      for (const ProxyScoreParams& one16 : {mtp3, mtp4, g8mtp2, g16}) {
        EXPECT_EQ(fp8_tma(plan_proxy_score(one16, {})), k == fp8) << dtype_name(k);
        EXPECT_EQ(plan_proxy_score(one16, {}).tma_cols, k == fp8 || k == fp4 ? kProxyDecodeTmaMaxCols : kProxyDecodeTmaCols)
            << dtype_name(k);
        ProxyScoreParams small = one16;
        small.batch = 1;
        EXPECT_EQ(fp8_tma(plan_proxy_score(small, {})), k == fp8) << dtype_name(k);
      }
      ProxyScoreOptions on_decode;
      on_decode.kernel = ProxyKernel::kDecode;  // auto takes sm90 above 16 rows
      EXPECT_FALSE(fp8_tma(plan_proxy_score(mtp5, on_decode))) << dtype_name(k);  // auto: never two passes
      EXPECT_EQ(plan_proxy_score(mtp5, on_decode).tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
      ProxyScoreOptions forced;
      forced.kernel = ProxyKernel::kDecode;  // auto takes sm90 above 16 rows (mtp5)
      forced.decode_fp8 = DecodeTma::kTma;
      forced.decode_nvfp4 = DecodeTma::kCta;  // NVFP4 on the cp.async ring: no TMA columns
      EXPECT_EQ(fp8_tma(plan_proxy_score(few, forced)), k == fp8) << dtype_name(k);
      EXPECT_EQ(plan_proxy_score(few, forced).tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
      for (const ProxyScoreParams& narrow : {mtp2, g8}) {
        const ProxyScorePlan plan = plan_proxy_score(narrow, forced);
        EXPECT_EQ(fp8_tma(plan), k == fp8) << dtype_name(k);
        EXPECT_EQ(plan.tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
      }
      for (const ProxyScoreParams& wide : {mtp3, mtp4, mtp5, g8mtp2, g16}) {
        const ProxyScorePlan plan = plan_proxy_score(wide, forced);
        EXPECT_EQ(fp8_tma(plan), k == fp8) << dtype_name(k);
        EXPECT_EQ(plan.tma_cols, k == fp8 ? kProxyDecodeTmaMaxCols : kProxyDecodeTmaCols) << dtype_name(k);
        ProxyScoreOptions cta = forced;
        cta.decode_fp8 = DecodeTma::kCta;
        EXPECT_EQ(plan_proxy_score(wide, cta).tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
      }
    }
    for (DecodeTma f : {DecodeTma::kAuto, DecodeTma::kCta, DecodeTma::kTma}) {
      ProxyScoreOptions o;
      o.decode_fp8 = f;
      const ProxyScorePlan plan = plan_proxy_score(dp, o), dflt = plan_proxy_score(dp, {});
      EXPECT_EQ(fp8_tma(plan), k == fp8 && f != DecodeTma::kCta) << dtype_name(k);
      EXPECT_EQ(plan.kernel, dflt.kernel);
      EXPECT_EQ(plan.decode_ctas, dflt.decode_ctas);
      EXPECT_EQ(plan.decode_ilp, dflt.decode_ilp);
      EXPECT_EQ(plan.f16_mma, dflt.f16_mma);
      o.kernel = ProxyKernel::kMmaSync;  // not the decode kernel
      EXPECT_FALSE(fp8_tma(plan_proxy_score(dp, o))) << dtype_name(k);
    }
    // decode_nvfp4: the TMA kernel for NVFP4 K on the decode kernel, forced or auto's (any batch,
    // one pass of at most kProxyDecodeTmaMaxCols columns); cta: the cp.async ring; its passes as
    // decode_fp8's; decode_fp8 does not take it for NVFP4.
    {
      ProxyScoreParams b1 = dp, mtp4 = dp, mtp5 = dp;
      b1.batch = 1;
      mtp4.qi.max_seqlen_q = 4;
      mtp5.qi.max_seqlen_q = 5;
      ProxyScoreOptions on_decode;
      on_decode.kernel = ProxyKernel::kDecode;  // auto takes sm90 above 16 rows (mtp5)
      EXPECT_EQ(plan_proxy_score(b1, {}).tma_nvfp4, k == fp4) << dtype_name(k);
      EXPECT_EQ(plan_proxy_score(mtp4, {}).tma_nvfp4, k == fp4) << dtype_name(k);
      EXPECT_EQ(plan_proxy_score(mtp4, {}).tma_cols, k == fp4 || k == fp8 ? kProxyDecodeTmaMaxCols : kProxyDecodeTmaCols)
          << dtype_name(k);
      EXPECT_FALSE(plan_proxy_score(mtp5, on_decode).tma_nvfp4) << dtype_name(k);  // auto: never two passes
      on_decode.decode_nvfp4 = DecodeTma::kTma;
      EXPECT_EQ(plan_proxy_score(mtp5, on_decode).tma_nvfp4, k == fp4) << dtype_name(k);
    }
    for (DecodeTma f : {DecodeTma::kAuto, DecodeTma::kCta, DecodeTma::kTma}) {
      ProxyScoreOptions o;
      o.decode_nvfp4 = f;
      const ProxyScorePlan plan = plan_proxy_score(dp, o), dflt = plan_proxy_score(dp, {});
      const bool want = k == fp4 && f != DecodeTma::kCta;
      EXPECT_EQ(plan.tma_nvfp4, want) << dtype_name(k);
      EXPECT_EQ(plan.tma, want || (k == fp8 && dflt.tma)) << dtype_name(k);
      EXPECT_EQ(plan.kernel, dflt.kernel);
      EXPECT_EQ(plan.decode_ctas, dflt.decode_ctas);
      EXPECT_EQ(plan.nvfp4_word, dflt.nvfp4_word);
      EXPECT_EQ(plan.tma_cols, kProxyDecodeTmaCols) << dtype_name(k);
      ProxyScoreParams mtp4 = dp;
      mtp4.qi.max_seqlen_q = 4;
      ProxyScoreOptions on_decode = o;
      on_decode.kernel = ProxyKernel::kDecode;
      if (want) EXPECT_EQ(plan_proxy_score(mtp4, on_decode).tma_cols, kProxyDecodeTmaMaxCols);
      o.kernel = ProxyKernel::kMmaSync;  // not the decode kernel
      EXPECT_FALSE(plan_proxy_score(dp, o).tma_nvfp4) << dtype_name(k);
      ProxyScoreOptions fp8_forced;
      fp8_forced.decode_fp8 = DecodeTma::kTma;
      EXPECT_EQ(fp8_tma(plan_proxy_score(dp, fp8_forced)), k == fp8) << dtype_name(k);
    }
    // decode_tma_issue: warps where forced, and auto's for NVFP4 K, only on the TMA kernel; nothing
    // else moves.
    for (DecodeTmaIssue i : {DecodeTmaIssue::kAuto, DecodeTmaIssue::kProducer, DecodeTmaIssue::kWarps}) {
      ProxyScoreOptions o;
      o.decode_tma_issue = i;
      const ProxyScorePlan plan = plan_proxy_score(dp, o), dflt = plan_proxy_score(dp, {});
      EXPECT_EQ(plan.tma_self_issue,
                dflt.tma && (i == DecodeTmaIssue::kWarps || (i == DecodeTmaIssue::kAuto && k == fp4)))
          << dtype_name(k);
      EXPECT_EQ(dflt.tma_self_issue, dflt.tma && k == fp4) << dtype_name(k);
      EXPECT_EQ(plan.tma, dflt.tma);
      EXPECT_EQ(plan.tma_cols, dflt.tma_cols);
      o.decode_nvfp4 = DecodeTma::kCta;
      o.decode_fp8 = DecodeTma::kCta;
      EXPECT_FALSE(plan_proxy_score(dp, o).tma_self_issue) << dtype_name(k);
    }
    // auto keeps the producer warp for NVFP4 K up to kProxyDecodeTmaProducerMaxUnits units
    // (requests x kv heads x blocks); a forced issue mode holds at any size.
    {
      ProxyScoreParams few = dp, more = dp;
      few.batch = int(kProxyDecodeTmaProducerMaxUnits / few.max_k_tiles);  // 8 x 256 = 2048
      more.batch = few.batch + 1;
      EXPECT_FALSE(plan_proxy_score(few, {}).tma_self_issue) << dtype_name(k);
      EXPECT_EQ(plan_proxy_score(more, {}).tma_self_issue, k == fp4 && plan_proxy_score(more, {}).tma)
          << dtype_name(k);
      ProxyScoreOptions warps;
      warps.decode_tma_issue = DecodeTmaIssue::kWarps;
      EXPECT_EQ(plan_proxy_score(few, warps).tma_self_issue, plan_proxy_score(few, {}).tma) << dtype_name(k);
    }
  }
  EXPECT_EQ(plan_proxy_score(params(32, 1, false, bf16, bf16), {}).kernel, ProxyKernel::kSm90);
  EXPECT_TRUE(proxy_auto_takes_decode(params(16, 1, false, bf16, bf16)));
  EXPECT_FALSE(proxy_auto_takes_decode(params(8, 2, true, bf16, bf16)));
  EXPECT_TRUE(proxy_decode_runs(params(16, 1, false, bf16, bf16)));
  EXPECT_FALSE(proxy_decode_runs(params(17, 1, false, bf16, bf16)));
}

// The combine's work units as launched: the shared-selection tiles where it skips rows they did,
// else runs of rows short enough for ~2 units per SM (decode: one row per unit), never longer than
// a tile.
TEST(PlanCombine, LaunchUnitRows) {
  using sparse_attn::CombineArgs;
  using sparse_attn::combine_launch_unit_heads;
  using sparse_attn::combine_launch_unit_rows;
  using sparse_attn::combine_unit_rows;
  CombineArgs a{};
  a.num_kv_heads = 4;
  a.group = 16;
  a.unit_rows = combine_unit_rows(16);
  ASSERT_EQ(a.unit_rows, 8);
  for (int rows : {1, 8, 32, 64, 131}) {  // decode batches: 66 units per kv head wanted on 132 SMs
    a.rows = rows;
    EXPECT_EQ(combine_launch_unit_rows(a, 132), std::max(1, rows / 66)) << rows;
  }
  a.rows = 400;
  EXPECT_EQ(combine_launch_unit_rows(a, 132), 6);
  a.rows = 32768;  // prefill: the tile
  EXPECT_EQ(combine_launch_unit_rows(a, 132), 8);
  uint8_t done = 0;
  a.union_done = &done;
  a.rows = 8;
  EXPECT_EQ(combine_launch_unit_rows(a, 132), 8);  // tiles to skip: the units are the tiles
  EXPECT_EQ(combine_launch_unit_heads(a, 8, 132, 8), 16);
  // Heads: halved while the units stay within the SMs and a unit keeps a pair per warp (8 warps).
  a.union_done = nullptr;
  const struct { int rows, heads; } want[] = {{1, 8}, {8, 8}, {32, 16}, {64, 16}};
  for (const auto& w : want) {
    a.rows = w.rows;
    EXPECT_EQ(combine_launch_unit_heads(a, combine_launch_unit_rows(a, 132), 132, 8), w.heads) << w.rows;
  }
  a.group = 4;  // G = 4: 4 pairs per row-unit already fewer than the warps
  a.rows = 1;
  EXPECT_EQ(combine_launch_unit_heads(a, 1, 132, 8), 4);
  a.group = 64;  // G = 64, one kv head: 64 -> 8 heads (8 units)
  a.num_kv_heads = 1;
  EXPECT_EQ(combine_launch_unit_heads(a, 1, 132, 8), 8);
}

// split_rule=waves (auto): the split count with the fewest waves x blocks per split (M3 on an
// H200, topk 16; the 8-warp kernel at 2 CTAs per SM: 264 slots): B32 (128 items) 2 splits instead
// of ceil's 3 (384 CTAs: a second, partial wave), B1 / B8 / B16 as ceil; forced splits at least 2;
// fused calls unchanged.
TEST(PlanDecode, SplitRuleWaves) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  SparseDecodeOptions waves, ceil;
  waves.split_rule = DecodeSplitRule::kWaves;
  ceil.split_rule = DecodeSplitRule::kCeil;
  const struct { int batch, ceil_splits, waves_splits; } want[] = {{1, 16, 16}, {8, 8, 8}, {16, 4, 4}, {32, 3, 2}};
  for (const auto& w : want) {
    EXPECT_EQ(plan_sparse_decode(decode(w.batch, -1), h200, ceil).qm.splits, w.ceil_splits) << w.batch;
    const SparseAttnPlan pl = plan_sparse_decode(decode(w.batch, -1), h200, waves);
    EXPECT_EQ(pl.qm.splits, w.waves_splits) << w.batch;
    EXPECT_EQ(plan_sparse_decode(decode(w.batch, -1), h200, {}).qm.splits, w.waves_splits) << w.batch;  // auto
    EXPECT_TRUE(pl.qm.wide) << w.batch;
  }
  EXPECT_EQ(plan_sparse_decode(decode(64, -1), h200, waves).qm.splits, 1);   // fused
  EXPECT_EQ(plan_sparse_decode(decode(64, 0), h200, waves).qm.splits, 2);    // forced split
  // A split's start costs a block (kSplitStartBlocks): between the batches above, one wave of a few
  // splits instead of waves of one-block splits (H200 at 831d3e5: B28 bf16 67.2 us on 16 splits,
  // B24 49.1 on 8, against B32's 48.3 on 2). 16-bit K/V here (the 8-warp kernel, 264 slots).
  const struct { int batch, splits; } between[] = {{12, 4}, {17, 3}, {20, 3}, {23, 2}, {24, 2}, {28, 2}};
  for (const auto& b : between) {
    const SparseAttnPlan pl = plan_sparse_decode(decode(b.batch, -1), h200, {});
    EXPECT_EQ(pl.qm.splits, b.splits) << b.batch;
    EXPECT_LE(int64_t(b.batch) * 4 * pl.qm.splits, 264) << b.batch;  // one wave
  }
  EXPECT_EQ(parse_sparse_decode_options("split_rule=waves").split_rule, DecodeSplitRule::kWaves);
  EXPECT_EQ(parse_sparse_decode_options("split_rule=ceil").split_rule, DecodeSplitRule::kCeil);
  expect_error([] { parse_sparse_decode_options("split_rule=floor"); }, ErrorKind::kValue, "split_rule");
}

// Every split-K decode plan of M3 shapes from B1 to B33, for 16-bit, fp8 and NVFP4 K/V on an H200-
// and an A100-like device, runs its CTAs in one wave of the kernel's resident slots (2 per SM for
// the register and 8-warp kernels, 3 for the 4-warp shared-memory one): a one-wave count always
// exists below one item per SM, and pricing a split's start makes the rule take it (the B24 / B28
// plans of 8 and 16 one-block splits were 2-3 waves). Fused plans have items from 70 % of the SMs
// (the fp8 register kernel) or from one item per SM (every other).
TEST(PlanDecode, SplitCallsRunInOneWave) {
  SparseAttnDeviceFacts h200 = hopper(), a100 = ampere();
  h200.decode_regs_ctas = a100.decode_regs_ctas = 2;
  for (const SparseAttnDeviceFacts& f : {h200, a100}) {
    for (DType kv : {DType::kBF16, DType::kFP8E4M3, DType::kNVFP4}) {
      for (int batch = 1; batch <= 33; ++batch) {
        SparseDecodeParams dp = decode(batch, -1);
        dp.attn.k.dtype = dp.attn.v.dtype = kv;
        const QueryMajorPlan qm = plan_sparse_decode(dp, f, {}).qm;
        const int64_t items = int64_t(batch) * 4;
        const std::string at = std::string("batch ") + std::to_string(batch) + " kv " + dtype_name(kv) +
                               " sms " + std::to_string(f.num_sms);
        if (qm.fused) {
          EXPECT_GE(items * 10, int64_t(f.num_sms) * (kv == DType::kFP8E4M3 ? 7 : 10)) << at;
          continue;
        }
        ASSERT_GE(qm.splits, 2) << at;
        EXPECT_LE(qm.splits, 16) << at;
        const int per_sm = qm.regs || qm.wide ? 2 : 3;
        EXPECT_LE(items * qm.splits, int64_t(per_sm) * f.num_sms) << at << ": " << qm.splits << " splits";
      }
    }
  }
}

// combine_loads=with: the combine of a split call loads the first slots' values with the LSEs;
// fused calls and split=cluster run no combine; auto is with (H200 at dda49c5).
TEST(PlanDecode, CombineLoadsWith) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  EXPECT_EQ(parse_sparse_decode_options("combine_loads=with").combine_loads, DecodeCombineLoads::kWith);
  EXPECT_EQ(parse_sparse_decode_options("combine_loads=after").combine_loads, DecodeCombineLoads::kAfter);
  EXPECT_EQ(parse_sparse_decode_options("").combine_loads, DecodeCombineLoads::kAuto);
  expect_error([] { parse_sparse_decode_options("combine_loads=before"); }, ErrorKind::kValue,
               "combine_loads must be auto, after or with, got 'before'");
  const SparseDecodeOptions with = parse_sparse_decode_options("combine_loads=with");
  const SparseDecodeOptions after = parse_sparse_decode_options("combine_loads=after");
  for (int batch : {1, 8, 32}) {
    const SparseAttnPlan w = plan_sparse_decode(decode(batch, -1), h200, with);
    EXPECT_FALSE(w.qm.fused) << batch;
    EXPECT_TRUE(w.qm.combine_with) << batch;
    // The same kernel and splits as without it.
    const SparseAttnPlan a = plan_sparse_decode(decode(batch, -1), h200, after);
    EXPECT_EQ(w.qm.splits, a.qm.splits) << batch;
    EXPECT_EQ(w.qm.wide, a.qm.wide) << batch;
    EXPECT_FALSE(a.qm.combine_with) << batch;
    EXPECT_TRUE(plan_sparse_decode(decode(batch, -1), h200, {}).qm.combine_with) << batch;  // auto
  }
  EXPECT_FALSE(plan_sparse_decode(decode(64, -1), h200, with).qm.combine_with);  // fused: no combine
  EXPECT_TRUE(plan_sparse_decode(decode(64, 0), h200, with).qm.combine_with);    // forced split
  SparseDecodeOptions cluster = with;
  cluster.split = DecodeSplit::kCluster;
  h200.decode_cluster_max = 16;
  const SparseAttnPlan c = plan_sparse_decode(decode(1, -1), h200, cluster);
  EXPECT_EQ(c.qm.cluster, c.qm.cluster_fallback == nullptr);
  EXPECT_EQ(c.qm.combine_with, !c.qm.cluster);
}

TEST(PlanDecode, RegsFeedTmaWhereItRuns) {
  SparseAttnDeviceFacts h200 = hopper();
  h200.decode_regs_ctas = 2;
  h200.decode_regs_tma_ctas = 2;
  h200.decode_cluster_max = 16;
  EXPECT_EQ(parse_sparse_decode_options("regs_feed=tma").regs_feed, DecodeRegsFeed::kTma);
  EXPECT_EQ(parse_sparse_decode_options("regs_feed=cp_async").regs_feed, DecodeRegsFeed::kCpAsync);
  EXPECT_EQ(parse_sparse_decode_options("").regs_feed, DecodeRegsFeed::kAuto);
  expect_error([] { parse_sparse_decode_options("regs_feed=bulk"); }, ErrorKind::kValue,
               "regs_feed must be auto, cp_async or tma, got 'bulk'");
  auto fp8 = [](int batch, int force_fused = -1) {
    SparseDecodeParams d = decode(batch, force_fused);
    d.attn.k.dtype = d.attn.v.dtype = DType::kFP8E4M3;
    return d;
  };
  const SparseDecodeOptions tma = parse_sparse_decode_options("regs_feed=tma");
  // The 16-row fp8 register kernel, fused (B64) and split (B8, forced splits at B64).
  for (const SparseDecodeParams& d : {fp8(64), fp8(8), fp8(64, 0)}) {
    const SparseAttnPlan plan = plan_sparse_decode(d, h200, tma);
    EXPECT_TRUE(plan.qm.regs && plan.qm.regs_tma) << d.attn.batch;
    EXPECT_EQ(plan.qm.regs_tma_fallback, nullptr) << d.attn.batch;
    // The same kernel, items and splits as the cp.async feed.
    const SparseAttnPlan cp = plan_sparse_decode(d, h200, parse_sparse_decode_options("regs_feed=cp_async"));
    EXPECT_FALSE(cp.qm.regs_tma);
    EXPECT_EQ(cp.qm.splits, plan.qm.splits);
    EXPECT_EQ(cp.qm.fused, plan.qm.fused);
    EXPECT_EQ(cp.qm.num_items, plan.qm.num_items);
    EXPECT_FALSE(plan_sparse_decode(d, h200, {}).qm.regs_tma);  // auto: cp_async
  }
  // Where it does not run, the cp.async feed with the reason.
  auto fallback = [&](const SparseDecodeParams& d, const SparseAttnDeviceFacts& f, const SparseDecodeOptions& o) {
    const SparseAttnPlan plan = plan_sparse_decode(d, f, o);
    EXPECT_FALSE(plan.qm.regs_tma);
    return std::string(plan.qm.regs_tma_fallback != nullptr ? plan.qm.regs_tma_fallback : "");
  };
  EXPECT_NE(fallback(decode(64, -1), h200, tma).find("16-bit or NVFP4 K/V"), std::string::npos);
  SparseDecodeParams nvfp4 = decode(64, -1);
  nvfp4.attn.k.dtype = nvfp4.attn.v.dtype = DType::kNVFP4;
  EXPECT_NE(fallback(nvfp4, h200, tma).find("16-bit or NVFP4 K/V"), std::string::npos);
  SparseDecodeOptions smem = tma;
  smem.kernel = DecodeKernel::kSmem;
  EXPECT_NE(fallback(fp8(64), h200, smem).find("not the 16-row register kernel"), std::string::npos);
  // B1: auto runs the 8-warp kernel (each split one block), which has no TMA feed.
  EXPECT_NE(fallback(fp8(1), h200, tma).find("not the 16-row register kernel"), std::string::npos);
  SparseDecodeParams mtp = mtp_decode(64, 4);
  mtp.attn.k.dtype = mtp.attn.v.dtype = DType::kFP8E4M3;
  SparseDecodeOptions mtp_union = tma;
  mtp_union.mtp = DecodeMtp::kUnion;
  EXPECT_NE(fallback(mtp, h200, mtp_union).find("not the 16-row register kernel"), std::string::npos);
  SparseDecodeOptions cluster = tma;
  cluster.split = DecodeSplit::kCluster;
  cluster.split_warps = DecodeSplitWarps::k4;
  EXPECT_NE(fallback(fp8(8), h200, cluster).find("split=cluster"), std::string::npos);
  EXPECT_NE(fallback(fp8(64), hopper_without_regs_tma(h200), tma).find("cannot run on this device"),
            std::string::npos);
}

}  // namespace
}  // namespace flashmsa

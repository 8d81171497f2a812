// CUDA entry points of msa_sparse_attention and msa_sparse_decode_attention (cuda_ops.h): host
// checks of what the kernels assume, the schedule choice, the workspace plan (the same function
// sizes it and carves it, so *_workspace_bytes and the run always agree), and the launches.
// Stream-ordered: no host synchronization, no allocation, static grids.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/cuda_utils.h"
#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "flashmsa/semantics.h"
#include "sparse_attn/heuristics.h"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr float kLog2eHost = 1.4426950408889634f;
constexpr size_t kSectionAlign = 256;

struct DeviceInfo {
  int num_sms;
};

DeviceInfo device_info() { return DeviceInfo{flashmsa::cuda::current_device_limits().num_sms}; }

// ---- what the kernels assume -----------------------------------------------------------------

bool compute_is_bf16(const SparseAttnParams& p) { return p.q_dtype != DType::kFP16; }

KvKind kv_kind(const SparseAttnParams& p) {
  switch (p.k.dtype) {
    case DType::kNVFP4: return KvKind::kNvfp4;
    case DType::kFP8E4M3: return KvKind::kFp8;
    default: {
      const DType compute = compute_is_bf16(p) ? DType::kBF16 : DType::kFP16;
      MSA_CHECK(p.k.dtype == compute, "k: dtype ", dtype_name(p.k.dtype),
                " must be the compute dtype ", dtype_name(compute), " (or fp8 e4m3 / NVFP4)");
      return KvKind::kNative;
    }
  }
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

void check_kv(const char* name, const KVTensor& t, int elem_bytes) {
  MSA_CHECK(aligned16(t.data), name, ": data must be 16-byte aligned");
  MSA_CHECK((t.stride_token * elem_bytes) % 16 == 0 && (t.stride_head * elem_bytes) % 16 == 0 &&
                (t.stride_page * elem_bytes) % 16 == 0,
            name, ": token/head/page strides must be multiples of 16 bytes (got ", t.stride_token,
            ", ", t.stride_head, ", ", t.stride_page, " elements)");
  if (t.dtype == DType::kNVFP4)
    MSA_CHECK((reinterpret_cast<uintptr_t>(t.scale) & 3u) == 0, name, "_scale must be 4-byte aligned");
}

// Checks the shapes and layouts the kernels rely on (validated Params satisfy them; a violation
// is a clear error rather than a misaligned access).
void check_params(const SparseAttnParams& p, const char* op) {
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0, op,
            ": num_qo_heads must be a multiple of num_kv_heads");
  MSA_CHECK(p.topk >= 1 && p.topk <= kMaxTopk, op, ": topk must be in [1, ", kMaxTopk, "], got ", p.topk);
  const DType compute = compute_is_bf16(p) ? DType::kBF16 : DType::kFP16;
  MSA_CHECK(p.out_dtype == compute, op, ": output dtype ", dtype_name(p.out_dtype), " must be ",
            dtype_name(compute));
  const int q_bytes = p.q_dtype == DType::kFP8E4M3 ? 1 : 2;
  MSA_CHECK(aligned16(p.q) && (p.q_stride_token * q_bytes) % 16 == 0 &&
                (p.q_stride_head * q_bytes) % 16 == 0,
            op, ": q must be 16-byte aligned with 16-byte multiple strides");
  MSA_CHECK(aligned16(p.out), op, ": output must be 16-byte aligned");
  const int kv_bytes = p.k.dtype == DType::kBF16 || p.k.dtype == DType::kFP16 ? 2 : 1;
  check_kv("k", p.k, kv_bytes);
  check_kv("v", p.v, kv_bytes);
  (void)kv_kind(p);
}

// Runs fn.template operator()<Elem, kKv>() for the params' compute dtype and KV kind.
template <typename Fn>
auto dispatch_types(const SparseAttnParams& p, Fn&& fn) {
  const KvKind kind = kv_kind(p);
  if (compute_is_bf16(p)) {
    switch (kind) {
      case KvKind::kNative: return fn.template operator()<__nv_bfloat16, KvKind::kNative>();
      case KvKind::kFp8: return fn.template operator()<__nv_bfloat16, KvKind::kFp8>();
      default: return fn.template operator()<__nv_bfloat16, KvKind::kNvfp4>();
    }
  }
  switch (kind) {
    case KvKind::kNative: return fn.template operator()<__half, KvKind::kNative>();
    case KvKind::kFp8: return fn.template operator()<__half, KvKind::kFp8>();
    default: return fn.template operator()<__half, KvKind::kNvfp4>();
  }
}

// ---- workspace carving -----------------------------------------------------------------------

struct Carver {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t off = bytes;
    bytes += (n + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
    return off;
  }
};

template <typename T>
T* at(const SparseAttnParams& p, size_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(p.workspace) + off);
}

void check_workspace(const SparseAttnParams& p, size_t needed, const char* op) {
  if (needed == 0) return;
  MSA_CHECK(p.workspace != nullptr && p.workspace_bytes >= needed, op, ": workspace needs ", needed,
            " bytes of device scratch, got ", p.workspace_bytes);
  MSA_CHECK((reinterpret_cast<uintptr_t>(p.workspace) % kSectionAlign) == 0, op,
            ": workspace must be ", kSectionAlign, "-byte aligned");
}

// ---- query-major plan ------------------------------------------------------------------------

// FLASHMSA_DECODE_KERNEL = auto (default) | smem | regs picks msa_sparse_decode_attention's kernel
// for 16-row tiles (G <= 16): smem is the query-major kernel as prefill uses it (fp8 K/V
// dequantized shared-to-shared, 2 stages of bf16 / fp16 K/V); regs is the streaming variant (2 CTAs
// per SM, 3 stages of 32 KB): fp8 K/V converted in registers on the way to fp16 MMAs
// (kv_regs.cuh), bf16 / fp16 K/V with a third stage. auto is smem until an H200 run shows regs
// faster. regs needs >= 105 KB of shared memory per CTA (not sm_86 / sm_89); elsewhere, and for
// NVFP4 K/V, G > 16 and MTP union items, the smem kernel runs whatever the setting. Read at every call (tests and
// benchmarks run both on the same data; the workspace query reads it too).
enum class DecodeKernel { kAuto, kSmem, kRegs };
DecodeKernel decode_kernel_override() {
  const char* env = std::getenv("FLASHMSA_DECODE_KERNEL");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return DecodeKernel::kAuto;
  if (std::strcmp(env, "smem") == 0) return DecodeKernel::kSmem;
  if (std::strcmp(env, "regs") == 0) return DecodeKernel::kRegs;
  MSA_FAIL("FLASHMSA_DECODE_KERNEL must be auto, smem or regs, got '", env, "'");
}

// FLASHMSA_DECODE_MTP = auto (default) | per_token | union picks how msa_sparse_decode_attention
// runs MTP (seqlen_q > 1): per_token items stream each token's blocks separately; union items (one
// per request and kv head, rows = tokens x G) read each distinct selected block of a request once
// for all its tokens. auto is per_token until an H200 run shows union faster. union applies when
// seqlen_q <= 4, seqlen_q x G <= 64 and seqlen_q x topk <= 64; elsewhere per_token items run.
enum class DecodeMtp { kAuto, kPerToken, kUnion };
DecodeMtp decode_mtp_override() {
  const char* env = std::getenv("FLASHMSA_DECODE_MTP");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return DecodeMtp::kAuto;
  if (std::strcmp(env, "per_token") == 0) return DecodeMtp::kPerToken;
  if (std::strcmp(env, "union") == 0) return DecodeMtp::kUnion;
  MSA_FAIL("FLASHMSA_DECODE_MTP must be auto, per_token or union, got '", env, "'");
}

// Whether MTP union items can run this decode call (kernel_traits.h QueryMajorArgs::mtp_tokens).
bool mtp_union_applies(const SparseAttnParams& p) {
  return sparse_attn::mtp_union_applies(p.qi.cu_seqlens_q != nullptr, p.qi.seqlen_q,
                                        p.num_heads / p.num_kv_heads, p.topk, p.batch, p.total_q);
}

struct QmPlan {
  int warps_m;
  bool regs;  // the streaming decode variant (fp8: kv_regs.cuh; native: 3 stages)
  int mtp_tokens;  // > 0: MTP union items of this many tokens
  int row_tiles;
  int splits;
  bool fused;
  StoreKind part_kind;
  int64_t num_items;
  size_t part_o_off, part_lse_off, part_lse_t_off;
  size_t bytes;
};

QmPlan plan_query_major(const SparseAttnParams& p, int num_sms, int force_fused, StoreKind part_kind,
                        DecodeKernel kernel = DecodeKernel::kAuto, DecodeMtp mtp = DecodeMtp::kAuto) {
  QmPlan plan{};
  const int group = p.num_heads / p.num_kv_heads;
  plan.mtp_tokens = mtp == DecodeMtp::kUnion && mtp_union_applies(p) ? p.qi.seqlen_q : 0;
  // G <= 16 fills one m16 tile per token (M3: G = 16 exactly); larger groups take 64-row tiles,
  // and so do MTP union items (tokens x G rows).
  plan.warps_m = group <= 16 && plan.mtp_tokens == 0 ? 1 : 4;
  plan.regs = kernel == DecodeKernel::kRegs && kv_kind(p) != KvKind::kNvfp4 && plan.warps_m == 1 &&
              flashmsa::cuda::current_device_limits().max_smem_per_block_optin >= kQmRegsSmemBytes;
  const int rows = 16 * plan.warps_m;
  plan.row_tiles = plan.mtp_tokens > 0 ? 1 : (group + rows - 1) / rows;
  const int64_t items = plan.mtp_tokens > 0
                            ? int64_t(p.batch) * p.num_kv_heads
                            : int64_t(p.total_q) * p.num_kv_heads * plan.row_tiles;
  plan.splits = query_major_splits(items, p.topk, num_sms, force_fused,
                                   query_major_target_ctas(plan.regs, plan.mtp_tokens > 0));
  plan.fused = plan.splits == 1 && force_fused != 0;
  plan.part_kind = part_kind;
  plan.num_items = items * plan.splits;
  if (!plan.fused) {
    const int64_t slots = int64_t(p.total_q) * p.num_heads * plan.splits;
    Carver c;
    plan.part_o_off = c.take(size_t(slots) * 128 * store_kind_bytes(part_kind));
    plan.part_lse_off = c.take(size_t(slots) * 4);
    plan.part_lse_t_off = p.lse_temperature_out != nullptr ? c.take(size_t(slots) * 4) : 0;
    plan.bytes = c.bytes;
  }
  return plan;
}

void run_query_major(const SparseAttnParams& p, const QmPlan& plan, cudaStream_t stream) {
  QueryMajorArgs a{};
  a.p = p;
  a.group = p.num_heads / p.num_kv_heads;
  a.row_tiles = plan.row_tiles;
  a.splits = plan.splits;
  a.write_final = plan.fused;
  a.q_fp8 = p.q_dtype == DType::kFP8E4M3;
  a.has_temp = p.lse_temperature_out != nullptr;
  a.scale_log2 = effective_softmax_scale(p) * kLog2eHost;
  a.num_items = plan.num_items;
  a.mtp_tokens = plan.mtp_tokens;
  a.part_kind = plan.part_kind;
  if (!plan.fused) {
    a.part_o = at<void>(p, plan.part_o_off);
    a.part_lse = at<float>(p, plan.part_lse_off);
    a.part_lse_t = a.has_temp ? at<float>(p, plan.part_lse_t_off) : nullptr;
  }
  dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
    if constexpr (kKv != KvKind::kNvfp4) {
      if (plan.regs) {
        launch_query_major<Elem, kKv, 1, true>(a, stream);
        return;
      }
    }
    if (plan.mtp_tokens > 0) {
      launch_query_major<Elem, kKv, 4, false, true>(a, stream);
    } else if (plan.warps_m == 1) {
      launch_query_major<Elem, kKv, 1>(a, stream);
    } else {
      launch_query_major<Elem, kKv, 4>(a, stream);
    }
  });
  if (!plan.fused) {
    CombineArgs c{};
    c.row_begin = 0;
    c.rows = p.total_q;
    c.row_stride = p.total_q;
    c.num_heads = p.num_heads;
    c.num_kv_heads = p.num_kv_heads;
    c.group = a.group;
    c.num_slots = plan.splits;
    c.part_o = a.part_o;
    c.part_kind = plan.part_kind;
    c.part_lse = a.part_lse;
    c.part_lse_t = a.part_lse_t;
    c.out = p.out;
    c.lse = p.lse;
    c.lse_t = p.lse_temperature_out;
    c.v_scale = p.v_global_scale;
    c.unit_rows = combine_unit_rows(c.group);
    launch_combine(c, p.out_dtype, stream);
  }
}

// ---- KV-major plan ---------------------------------------------------------------------------

struct KvmPlan {
  int chunk_rows;
  int nb_bound;
  int tokens_per_item;
  int max_items;
  int q_stages;
  bool sm90;  // the sm_90a warpgroup-MMA kernel, else the portable mma.sync one
  int grid;
  // Shared-selection tiles (sm_90a, bf16 / fp16 K and V, G in {16, 32, 64, 128}): planned for
  // every (kv head, tile), qualifying tiles computed before the KV-major groups, which skip them.
  bool uni;
  int uni_tile_tokens;
  int uni_num_tiles;
  int uni_max_entries;
  int uni_max_waste_milli;
  int uni_grid;
  size_t uni_done_off, uni_count_off, uni_block_off, uni_mask_off, uni_work_off, uni_control_off;
  size_t block_base_off, counts_off, cursors_off, control_off, items_off, list_off;
  size_t part_o_off, part_lse_off, part_lse_t_off;
  size_t bytes;
};

// Testing knob: FLASHMSA_KV_MAJOR_CHUNK_ROWS=<n> caps the query rows of one launch group, so small
// inputs exercise the multi-group path.
int64_t chunk_rows_override() {
  const char* env = std::getenv("FLASHMSA_KV_MAJOR_CHUNK_ROWS");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  MSA_CHECK(end != nullptr && *end == '\0' && v > 0, "FLASHMSA_KV_MAJOR_CHUNK_ROWS must be a positive "
            "integer, got '", env, "'");
  return v;
}

// Tuning knob: FLASHMSA_TILE_MAX_WASTE=<x>, 1 <= x <= 8, replaces the shared-selection tiles'
// qualifying bound (computed (token, block) products <= x pairs; default 1.5, kernel_traits.h).
int tile_max_waste_milli() {
  const char* env = std::getenv("FLASHMSA_TILE_MAX_WASTE");
  if (env == nullptr || *env == '\0') return kUnionMaxWasteMilli;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  MSA_CHECK(end != nullptr && *end == '\0' && v >= 1.0 && v <= 8.0,
            "FLASHMSA_TILE_MAX_WASTE must be a number from 1 to 8, got '", env, "'");
  return int(std::lround(v * 1000.0));
}

// FLASHMSA_KV_MAJOR_KERNEL = auto (default: wgmma where it can run) | mma_sync | wgmma picks the
// KV-major attention kernel (tests and benchmarks run both on an H100 / H200).
enum class KvmKernel { kAuto, kMmaSync, kWgmma };
KvmKernel kv_major_kernel_override() {
  const char* env = std::getenv("FLASHMSA_KV_MAJOR_KERNEL");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return KvmKernel::kAuto;
  if (std::strcmp(env, "mma_sync") == 0) return KvmKernel::kMmaSync;
  if (std::strcmp(env, "wgmma") == 0) return KvmKernel::kWgmma;
  MSA_FAIL("FLASHMSA_KV_MAJOR_KERNEL must be auto, mma_sync or wgmma, got '", env, "'");
}

// CTAs per SM of the shared-selection tile kernel for this call, 0 when it does not apply.
int union_ctas(const SparseAttnParams& p) {
  const int group = p.num_heads / p.num_kv_heads;
  if (kv_kind(p) == KvKind::kNvfp4 || group < kUnionRows / kUnionMaxTokens || kUnionRows % group != 0) return 0;
  return dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
    if constexpr (kKv == KvKind::kNvfp4) {
      return 0;  // NVFP4 K / V take the KV-major path
    } else {
      return union_sm90_ctas_per_sm<Elem, kKv>();
    }
  });
}

// False when the KV-major kernel does not fit this device's shared memory. with_union: also plan
// the shared-selection tiles where they apply.
bool plan_kv_major(const SparseAttnParams& p, const DeviceInfo& dev, KvmPlan& plan, bool with_union) {
  plan = KvmPlan{};
  int ctas = 0;
  const KvmKernel which = kv_major_kernel_override();
  if (which != KvmKernel::kMmaSync) {
    ctas = dispatch_types(p, [&]<typename Elem, KvKind kKv>() { return kv_major_sm90_ctas_per_sm<Elem, kKv>(); });
    MSA_CHECK_SUPPORTED(ctas > 0 || which != KvmKernel::kWgmma, "FLASHMSA_KV_MAJOR_KERNEL=wgmma: the "
                        "warpgroup-MMA kernel needs an sm_90 GPU and a library built for sm_90a");
    plan.sm90 = ctas > 0;
    plan.q_stages = 2;
  }
  for (int stages = 2; stages >= 1 && ctas == 0; --stages) {
    ctas = dispatch_types(p, [&]<typename Elem, KvKind kKv>() { return kv_major_ctas_per_sm<Elem, kKv>(stages); });
    plan.q_stages = stages;
  }
  if (ctas == 0) return false;

  const int group = p.num_heads / p.num_kv_heads;
  const bool has_temp = p.lse_temperature_out != nullptr;
  const int64_t per_row = kv_major_bytes_per_row(p.num_kv_heads, p.topk, group, has_temp);
  int64_t chunk = std::max<int64_t>(1, kKvMajorPartialBudget / per_row);
  if (const int64_t forced = chunk_rows_override(); forced > 0) chunk = forced;
  // (row << 6 | slot) list entries and int list offsets bound one group's pairs.
  chunk = std::min<int64_t>({chunk, p.total_q, (int64_t(1) << 28) / (int64_t(p.num_kv_heads) * p.topk)});
  chunk = std::max<int64_t>(chunk, 1);
  // Equal launch groups: each group's persistent kernel ends with a tail of unevenly finishing
  // CTAs, and a small last group (e.g. 536 of 32K rows at a 4029-row cap) pays a whole launch
  // sequence for little work.
  const int64_t groups = std::max<int64_t>(1, (int64_t(p.total_q) + chunk - 1) / chunk);
  chunk = std::max<int64_t>(1, (int64_t(p.total_q) + groups - 1) / groups);
  plan.chunk_rows = int(chunk);

  const int64_t nb_bound = p.kv.paged
                               ? int64_t(p.batch) * p.kv.max_pages
                               : p.kv.total_k / kBlockSize + p.batch + 1;
  MSA_CHECK(nb_bound * p.num_kv_heads < INT_MAX, "msa_sparse_attention: too many KV blocks (",
            nb_bound, " per kv head) for the KV-major schedule");
  plan.nb_bound = int(std::max<int64_t>(nb_bound, 1));
  plan.tokens_per_item = std::max(1, kKvmMaxRowsPerItem / group);
  if (plan.sm90) plan.tokens_per_item = std::min(plan.tokens_per_item, kKvm90MaxTokensPerItem);
  // Items: every list contributes ceil(count / tokens_per_item) <= count / tpi + 1, and at most
  // min(columns, pairs) lists are non-empty.
  const int64_t pairs = int64_t(p.num_kv_heads) * plan.chunk_rows * p.topk;
  const int64_t max_items =
      (pairs + plan.tokens_per_item - 1) / plan.tokens_per_item +
      std::min<int64_t>(int64_t(p.num_kv_heads) * plan.nb_bound, pairs);
  plan.max_items = int(max_items);
  plan.grid = int(std::max<int64_t>(1, std::min<int64_t>(max_items, int64_t(ctas) * dev.num_sms)));

  Carver c;
  plan.block_base_off = c.take(size_t(p.batch + 1) * 4);
  plan.counts_off = c.take(size_t(p.num_kv_heads) * plan.nb_bound * 4);
  plan.cursors_off = c.take(size_t(p.num_kv_heads) * plan.nb_bound * 4);
  plan.control_off = c.take(sizeof(KvMajorControl));
  plan.items_off = c.take(size_t(max_items) * sizeof(KvMajorItem));
  plan.list_off = c.take(size_t(pairs) * 4);
  plan.part_o_off = c.take(size_t(pairs) * group * 128 * 2);
  plan.part_lse_off = c.take(size_t(pairs) * group * 4);
  plan.part_lse_t_off = has_temp ? c.take(size_t(pairs) * group * 4) : 0;
  const int uctas = with_union ? union_ctas(p) : 0;
  if (uctas > 0) {
    plan.uni = true;
    plan.uni_tile_tokens = kUnionRows / group;
    plan.uni_num_tiles = int((int64_t(p.total_q) + plan.uni_tile_tokens - 1) / plan.uni_tile_tokens);
    plan.uni_max_entries = plan.uni_tile_tokens * p.topk;
    plan.uni_max_waste_milli = tile_max_waste_milli();
    const size_t tiles = size_t(p.num_kv_heads) * plan.uni_num_tiles;
    plan.uni_grid = uctas * dev.num_sms;
    plan.uni_done_off = c.take(tiles);
    plan.uni_count_off = c.take(tiles * 4);
    plan.uni_block_off = c.take(tiles * plan.uni_max_entries * 4);
    plan.uni_mask_off = c.take(tiles * plan.uni_max_entries);
    plan.uni_work_off = c.take(tiles * 4);
    plan.uni_control_off = c.take(2 * 4);
  }
  plan.bytes = c.bytes;
  return true;
}

void run_kv_major(const SparseAttnParams& p, const KvmPlan& plan, const DeviceInfo& dev,
                  cudaStream_t stream) {
  KvMajorArgs a{};
  a.p = p;
  a.group = p.num_heads / p.num_kv_heads;
  a.has_temp = p.lse_temperature_out != nullptr;
  a.scale_log2 = effective_softmax_scale(p) * kLog2eHost;
  a.chunk_rows = plan.chunk_rows;
  a.nb_bound = plan.nb_bound;
  a.tokens_per_item = plan.tokens_per_item;
  a.max_items = plan.max_items;
  a.num_warps = kKvmMaxThreads / 32;
  a.q_stages = plan.q_stages;
  a.block_base = at<int>(p, plan.block_base_off);
  a.counts = at<int>(p, plan.counts_off);
  a.cursors = at<int>(p, plan.cursors_off);
  a.control = at<KvMajorControl>(p, plan.control_off);
  a.items = at<KvMajorItem>(p, plan.items_off);
  a.list = at<uint32_t>(p, plan.list_off);
  a.part_o = at<void>(p, plan.part_o_off);
  a.part_lse = at<float>(p, plan.part_lse_off);
  a.part_lse_t = a.has_temp ? at<float>(p, plan.part_lse_t_off) : nullptr;

  if (plan.uni) {
    UnionArgs u{};
    u.p = p;
    u.group = a.group;
    u.tile_tokens = plan.uni_tile_tokens;
    u.num_tiles = plan.uni_num_tiles;
    u.max_entries = plan.uni_max_entries;
    u.max_waste_milli = plan.uni_max_waste_milli;
    u.has_temp = a.has_temp;
    u.scale_log2 = a.scale_log2;
    u.done = at<uint8_t>(p, plan.uni_done_off);
    u.plan_count = at<int>(p, plan.uni_count_off);
    u.plan_block = at<int>(p, plan.uni_block_off);
    u.plan_mask = at<uint8_t>(p, plan.uni_mask_off);
    u.work = at<int>(p, plan.uni_work_off);
    u.control = at<int>(p, plan.uni_control_off);
    launch_union_plan(u, stream);
    dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
      if constexpr (kKv != KvKind::kNvfp4) launch_union_sm90<Elem, kKv>(u, plan.uni_grid, stream);
    });
    a.union_done = u.done;
    a.union_tile_tokens = u.tile_tokens;
    a.union_num_tiles = u.num_tiles;
  }
  launch_kv_major_prepare(a, dev.num_sms, stream);
  for (int64_t r0 = 0; r0 < p.total_q; r0 += plan.chunk_rows) {
    a.row_begin = int(r0);
    a.rows = int(std::min<int64_t>(plan.chunk_rows, p.total_q - r0));
    launch_kv_major_lists(a, stream);
    dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
      if (plan.sm90) {
        launch_kv_major_sm90<Elem, kKv>(a, plan.grid, stream);
      } else {
        launch_kv_major<Elem, kKv>(a, plan.grid, stream);
      }
    });
    CombineArgs c{};
    c.row_begin = a.row_begin;
    c.rows = a.rows;
    c.row_stride = plan.chunk_rows;
    c.num_heads = p.num_heads;
    c.num_kv_heads = p.num_kv_heads;
    c.group = a.group;
    c.num_slots = p.topk;
    c.part_o = a.part_o;
    c.part_kind = compute_is_bf16(p) ? StoreKind::kBF16 : StoreKind::kF16;
    c.part_lse = a.part_lse;
    c.part_lse_t = a.part_lse_t;
    c.out = p.out;
    c.lse = p.lse;
    c.lse_t = p.lse_temperature_out;
    c.v_scale = p.v_global_scale;
    c.union_done = a.union_done;
    c.union_tile_tokens = a.union_tile_tokens;
    c.union_num_tiles = a.union_num_tiles;
    c.unit_rows = combine_unit_rows(c.group);
    launch_combine(c, p.out_dtype, stream);
  }
}

// ---- prefill schedule choice -----------------------------------------------------------------

enum class Schedule { kQueryMajor, kKvMajor, kHybrid };

// FLASHMSA_PREFILL_SCHEDULE = auto (default) | query_major | kv_major | hybrid forces a prefill
// schedule (tests run each on the same data; benchmarks compare them): kv_major is the KV-major
// schedule alone, hybrid the shared-selection tiles for the tiles that qualify and KV-major for
// the rest (what auto runs on large prefills). Where the tile kernel does not apply (not sm_90a,
// quantized K/V, G not in {16, 32, 64, 128}) hybrid is the KV-major schedule.
Schedule schedule_override(bool* forced) {
  const char* env = std::getenv("FLASHMSA_PREFILL_SCHEDULE");
  *forced = false;
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return Schedule::kQueryMajor;
  *forced = true;
  if (std::strcmp(env, "query_major") == 0) return Schedule::kQueryMajor;
  if (std::strcmp(env, "kv_major") == 0) return Schedule::kKvMajor;
  if (std::strcmp(env, "hybrid") == 0) return Schedule::kHybrid;
  MSA_FAIL("FLASHMSA_PREFILL_SCHEDULE must be auto, query_major, kv_major or hybrid, got '", env, "'");
}

struct PrefillPlan {
  Schedule schedule;
  QmPlan qm;
  KvmPlan kvm;
  size_t bytes;
};

PrefillPlan plan_prefill(const SparseAttnParams& p, const DeviceInfo& dev) {
  PrefillPlan plan{};
  bool forced = false;
  const Schedule wanted = schedule_override(&forced);
  const bool kv_major = forced ? wanted != Schedule::kQueryMajor : p.total_q >= kKvMajorMinRows;
  const bool with_union = !forced || wanted == Schedule::kHybrid;
  if (kv_major && plan_kv_major(p, dev, plan.kvm, with_union)) {
    plan.schedule = Schedule::kKvMajor;
    plan.bytes = plan.kvm.bytes;
    return plan;
  }
  MSA_CHECK_SUPPORTED(!(forced && kv_major), "FLASHMSA_PREFILL_SCHEDULE=kv_major: the KV-major kernel "
                      "does not fit this GPU's shared memory");
  plan.schedule = Schedule::kQueryMajor;
  plan.qm = plan_query_major(p, dev.num_sms, -1, compute_is_bf16(p) ? StoreKind::kBF16 : StoreKind::kF16);
  plan.bytes = plan.qm.bytes;
  return plan;
}

StoreKind partial_kind(const SparseDecodeParams& dp) {
  switch (dp.partial_dtype) {
    case PartialDType::kFloat32: return StoreKind::kF32;
    case PartialDType::kBF16: return StoreKind::kBF16;
    case PartialDType::kFP16: return StoreKind::kF16;
    case PartialDType::kFP8E4M3: return StoreKind::kFP8;
    default: return compute_is_bf16(dp.attn) ? StoreKind::kBF16 : StoreKind::kF16;
  }
}

}  // namespace

}  // namespace flashmsa::sparse_attn

namespace flashmsa::cuda {

using namespace flashmsa::sparse_attn;

size_t sparse_attention_workspace_bytes(const SparseAttnParams& p) {
  if (p.total_q == 0) return 0;
  check_params(p, "msa_sparse_attention");
  return plan_prefill(p, device_info()).bytes;
}

void sparse_attention(const SparseAttnParams& p, cudaStream_t stream) {
  if (p.total_q == 0) return;
  check_params(p, "msa_sparse_attention");
  MSA_CHECK(p.q_dtype != DType::kFP8E4M3, "msa_sparse_attention: q must be bf16 or fp16");
  const DeviceInfo dev = device_info();
  const PrefillPlan plan = plan_prefill(p, dev);
  check_workspace(p, plan.bytes, "msa_sparse_attention");
  if (plan.schedule == Schedule::kKvMajor) {
    run_kv_major(p, plan.kvm, dev, stream);
  } else {
    run_query_major(p, plan.qm, stream);
  }
}

size_t sparse_decode_workspace_bytes(const SparseDecodeParams& dp) {
  if (dp.attn.total_q == 0) return 0;
  check_params(dp.attn, "msa_sparse_decode_attention");
  return plan_query_major(dp.attn, device_info().num_sms, dp.force_fused, partial_kind(dp),
                          decode_kernel_override(), decode_mtp_override())
      .bytes;
}

void sparse_decode(const SparseDecodeParams& dp, cudaStream_t stream) {
  const SparseAttnParams& p = dp.attn;
  if (p.total_q == 0) return;
  check_params(p, "msa_sparse_decode_attention");
  const QmPlan plan = plan_query_major(p, device_info().num_sms, dp.force_fused, partial_kind(dp),
                                       decode_kernel_override(), decode_mtp_override());
  check_workspace(p, plan.bytes, "msa_sparse_decode_attention");
  run_query_major(p, plan, stream);
}

}  // namespace flashmsa::cuda

// CUDA entry points of msa_sparse_attention and msa_sparse_decode_attention (cuda_ops.h): the
// device facts the planner needs (sparse_attn/plan.cpp chooses schedule, kernel and workspace
// layout from them), host checks of what the kernels assume, and the launches of a plan: the run
// never re-plans, so the workspace the caller sized from plan.bytes is the one the launches carve.
// Stream-ordered: no host synchronization, no allocation, static grids.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_utils.h"
#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "flashmsa/semantics.h"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr float kLog2eHost = 1.4426950408889634f;

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
  MSA_CHECK(aligned16(p.out), op, ": out must be 16-byte aligned");
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

// ---- workspace ---------------------------------------------------------------------------------

template <typename T>
T* at(const SparseAttnParams& p, size_t off) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(p.workspace) + off);
}

void check_workspace(const SparseAttnParams& p, size_t needed, const char* op) {
  if (needed == 0) return;
  MSA_CHECK(p.workspace != nullptr && p.workspace_bytes >= needed, op, ": workspace needs ", needed,
            " bytes of device scratch, got ", p.workspace_bytes);
  MSA_CHECK((reinterpret_cast<uintptr_t>(p.workspace) % kWorkspaceAlign) == 0, op,
            ": workspace must be ", kWorkspaceAlign, "-byte aligned");
}

// ---- combine -----------------------------------------------------------------------------------

// The combine of a call's partials (num_slots per (row, head), row_stride rows per kv head) into
// its outputs; rows and the KV-major fields are the caller's.
CombineArgs combine_args(const SparseAttnParams& p, int num_slots, int row_stride, const void* part_o,
                         StoreKind part_kind, float* part_lse, float* part_lse_t) {
  CombineArgs c{};
  c.row_stride = row_stride;
  c.num_heads = p.num_heads;
  c.num_kv_heads = p.num_kv_heads;
  c.group = p.num_heads / p.num_kv_heads;
  c.num_slots = num_slots;
  c.part_o = part_o;
  c.part_kind = part_kind;
  c.part_lse = part_lse;
  c.part_lse_t = part_lse_t;
  c.out = p.out;
  c.lse = p.lse;
  c.lse_t = p.lse_temperature_out;
  c.v_scale = p.v_global_scale;
  c.unit_rows = combine_unit_rows(c.group);
  return c;
}

// ---- query-major -----------------------------------------------------------------------------

void run_query_major(const SparseAttnParams& p, const QueryMajorPlan& plan, cudaStream_t stream) {
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
  if (!plan.fused && !plan.cluster) {
    a.part_o = at<void>(p, plan.part_o_off);
    a.part_lse = at<float>(p, plan.part_lse_off);
    a.part_lse_t = a.has_temp ? at<float>(p, plan.part_lse_t_off) : nullptr;
  }
  dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
    if (plan.cluster) {  // split=cluster: per-token items (the planner keeps MTP union items off it)
      MSA_CHECK(plan.mtp_tokens == 0 && !plan.fused, "msa_sparse_decode_attention: split=cluster "
                "planned for MTP union items or a fused call (planner bug)");
    }
    if (plan.wide) {  // split_warps=8, as clusters under split=cluster
      MSA_CHECK(plan.mtp_tokens == 0 && !plan.regs && plan.warps_m == 1,
                "msa_sparse_decode_attention: split_warps=8 planned outside per-token items on 16-row "
                "tiles (planner bug)");
      if constexpr (kKv == KvKind::kNative || kKv == KvKind::kFp8) {
        if (plan.cluster)
          launch_query_major_wide<Elem, kKv, true>(a, stream);
        else
          launch_query_major_wide<Elem, kKv, false>(a, stream);
      } else {
        MSA_FAIL("msa_sparse_decode_attention: split_warps=8 needs 16-bit or fp8 K/V (planner bug)");
      }
      return;
    }
    if (plan.cluster) {  // the 4-warp cluster kernels
      if (plan.regs && plan.nvfp4_word) {  // nvfp4_cvt=word (auto)
        if constexpr (kKv == KvKind::kNvfp4) {
          launch_query_major<Elem, kKv, 1, true, false, true, true>(a, stream);
        } else {
          MSA_FAIL("msa_sparse_decode_attention: nvfp4_cvt=word needs NVFP4 K/V (planner bug)");
        }
      } else if (plan.regs) {
        launch_query_major<Elem, kKv, 1, true, false, false, true>(a, stream);
      } else if (plan.warps_m == 1) {
        launch_query_major<Elem, kKv, 1, false, false, false, true>(a, stream);
      } else {
        launch_query_major<Elem, kKv, 4, false, false, false, true>(a, stream);
      }
      return;
    }
    if (plan.wgmma) {  // kernel=wgmma: MTP union items on the sm_90a kernel
      MSA_CHECK(plan.mtp_tokens > 0 && !plan.cluster, "msa_sparse_decode_attention: kernel=wgmma planned "
                "without MTP union items (planner bug)");
      if constexpr (kKv == KvKind::kNative) {
        launch_mtp_wgmma_sm90<Elem>(a, plan.grid, plan.wgmma_ahead, stream);
      } else if constexpr (kKv == KvKind::kFp8) {  // wgmma_fp8=on
        MSA_CHECK(plan.wgmma_fp8 && plan.wgmma_ahead, "msa_sparse_decode_attention: kernel=wgmma with fp8 "
                  "K/V planned without wgmma_fp8=on's pipe (planner bug)");
        launch_mtp_wgmma_fp8_sm90<Elem>(a, plan.grid, stream);
      } else {
        MSA_FAIL("msa_sparse_decode_attention: kernel=wgmma needs 16-bit or fp8 K/V (planner bug)");
      }
      return;
    }
    if (plan.regs && plan.mtp_tokens > 0) {  // MTP union items, fp8 K/V converted in registers
      if constexpr (kKv == KvKind::kFp8) {
        launch_query_major<Elem, kKv, 4, true, true>(a, stream);
      } else {
        MSA_FAIL("msa_sparse_decode_attention: MTP union items in registers need fp8 K/V "
                 "(planner bug)");
      }
      return;
    }
    if (plan.regs && plan.nvfp4_word) {  // nvfp4_cvt=word
      if constexpr (kKv == KvKind::kNvfp4) {
        launch_query_major<Elem, kKv, 1, true, false, true>(a, stream);
      } else {
        MSA_FAIL("msa_sparse_decode_attention: nvfp4_cvt=word needs NVFP4 K/V (planner bug)");
      }
      return;
    }
    if (plan.regs && plan.regs_tma) {  // regs_feed=tma
      if constexpr (kKv == KvKind::kFp8) {
        launch_query_major<Elem, kKv, 1, true, false, false, false, true>(a, stream);
      } else {
        MSA_FAIL("msa_sparse_decode_attention: regs_feed=tma needs fp8 K/V (planner bug)");
      }
      return;
    }
    if (plan.regs) {
      launch_query_major<Elem, kKv, 1, true>(a, stream);
      return;
    }
    if (plan.mtp_tokens > 0) {
      launch_query_major<Elem, kKv, 4, false, true>(a, stream);
    } else if (plan.warps_m == 1) {
      launch_query_major<Elem, kKv, 1>(a, stream);
    } else {
      launch_query_major<Elem, kKv, 4>(a, stream);
    }
  });
  if (!plan.fused && !plan.cluster) {
    CombineArgs c = combine_args(p, plan.splits, p.total_q, a.part_o, plan.part_kind, a.part_lse, a.part_lse_t);
    c.all_slots_written = plan.combine_with;
    c.row_begin = 0;
    c.rows = p.total_q;
    launch_combine(c, p.out_dtype, stream);
  }
}

// ---- KV-major --------------------------------------------------------------------------------

void run_kv_major(const SparseAttnParams& p, const KvMajorPlan& plan, cudaStream_t stream) {
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
  const bool once = plan.lists == KvMajorLists::kOnce;
  a.lists_once = once;
  a.approx_row_math = plan.approx_math;
  a.list_groups = once ? plan.groups : 1;

  // The call's first kernel: block numbering, counters, and the tile plan's control words cleared.
  launch_kv_major_prepare(a, plan.num_sms, plan.tiles ? at<void>(p, plan.tile_control_off) : nullptr,
                          plan.tiles ? kUnionControlBytes : 0, stream);
  if (plan.tiles) {
    UnionArgs u{};
    u.p = p;
    u.group = a.group;
    u.tile_tokens = plan.tile_tokens;
    u.num_tiles = plan.num_tiles;
    u.max_entries = plan.tile_max_entries;
    u.max_waste_milli = plan.tile_max_waste_milli;
    u.wide_waste_milli = plan.tile_wide_waste_milli;
    u.has_temp = a.has_temp;
    u.scale_log2 = a.scale_log2;
    u.done = at<uint8_t>(p, plan.tile_done_off);
    u.plan_count = at<int>(p, plan.tile_count_off);
    u.plan_block = at<int>(p, plan.tile_block_off);
    u.plan_mask = at<uint8_t>(p, plan.tile_mask_off);
    u.work = at<int>(p, plan.tile_work_off);
    u.control = at<int>(p, plan.tile_control_off);
    launch_union_plan(u, stream);
    dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
      if constexpr (kKv == KvKind::kNative) {
        if (plan.tile_kernel == TileKernel::kTma) {
          launch_union_tma_sm90<Elem>(u, plan.tile_grid, stream);
          return;
        }
      }
      MSA_CHECK(plan.tile_kernel != TileKernel::kTma, "msa_sparse_attention: tile_kernel=tma planned for "
                "K/V it does not load (planner bug)");
      if constexpr (kKv != KvKind::kNvfp4) launch_union_sm90<Elem, kKv>(u, plan.tile_grid, stream);
    });
    a.union_done = u.done;
    a.union_tile_tokens = u.tile_tokens;
    a.union_num_tiles = u.num_tiles;
  }
  CombineArgs c = combine_args(p, p.topk, plan.chunk_rows, a.part_o,
                               compute_is_bf16(p) ? StoreKind::kBF16 : StoreKind::kF16, a.part_lse, a.part_lse_t);
  c.union_done = a.union_done;
  c.union_tile_tokens = a.union_tile_tokens;
  c.union_num_tiles = a.union_num_tiles;
  c.reset_lse = once;
  if (once) {  // the lists of every launch group: one count, one scan (a CTA per group), one scatter
    a.row_begin = 0;
    a.rows = int(p.total_q);
    launch_kv_major_lists(a, stream);
  }
  KvMajorControl* const control0 = a.control;
  KvMajorItem* const items0 = a.items;
  uint32_t* const list0 = a.list;
  for (int64_t r0 = 0, j = 0; r0 < p.total_q; r0 += plan.chunk_rows, ++j) {
    a.row_begin = int(r0);
    a.rows = int(std::min<int64_t>(plan.chunk_rows, p.total_q - r0));
    if (once) {  // group j's part of the lists built above
      a.control = control0 + j;
      a.items = items0 + j * plan.max_items;
      a.list = list0 + j * int64_t(p.num_kv_heads) * plan.chunk_rows * p.topk;
    } else {
      launch_kv_major_lists(a, stream);
    }
    dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
      if constexpr (kKv == KvKind::kNative) {
        if (plan.kernel == KvMajorKernel::kTma) {
          launch_kv_major_tma_sm90<Elem>(a, plan.grid, stream);
          return;
        }
      }
      MSA_CHECK(plan.kernel != KvMajorKernel::kTma, "msa_sparse_attention: kv_major_kernel=tma planned for "
                "K/V it does not load (planner bug)");
      if (plan.kernel == KvMajorKernel::kWgmma) {
        launch_kv_major_sm90<Elem, kKv>(a, plan.grid, plan.tma_store, stream);
      } else {
        launch_kv_major<Elem, kKv>(a, plan.grid, stream);
      }
    });
    c.row_begin = a.row_begin;
    c.rows = a.rows;
    launch_combine(c, p.out_dtype, stream);
  }
}

// ---- device facts ------------------------------------------------------------------------------

// CTAs per SM of every kernel variant the planner chooses from, for these params' compute dtype and
// KV kind on the current device (0 where a variant cannot run).
SparseAttnDeviceFacts device_facts(const SparseAttnParams& p, bool decode) {
  SparseAttnDeviceFacts f;
  const flashmsa::cuda::DeviceLimits& limits = flashmsa::cuda::current_device_limits();
  f.num_sms = limits.num_sms;
  // The streaming decode variant keeps 2 CTAs per SM where its 105 KB of shared memory fit.
  f.decode_regs_ctas = limits.max_smem_per_block_optin >= kQmRegsSmemBytes ? 2 : 0;
  if (decode) {  // decode is query-major only
    dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
      f.decode_cluster_max = query_major_cluster_max<Elem, kKv>(f.decode_regs_ctas > 0);
      if constexpr (kKv == KvKind::kNative || kKv == KvKind::kFp8)
        f.decode_wide_cluster_max = query_major_wide_cluster_max<Elem, kKv>();
      if constexpr (kKv == KvKind::kNative) f.decode_mtp_wgmma_ctas = mtp_wgmma_sm90_ctas_per_sm<Elem>();
      if constexpr (kKv == KvKind::kFp8) f.decode_mtp_wgmma_ctas = mtp_wgmma_fp8_sm90_ctas_per_sm<Elem>();
      if constexpr (kKv == KvKind::kFp8) f.decode_regs_tma_ctas = query_major_regs_tma_ctas_per_sm<Elem>();
    });
    return f;
  }
  dispatch_types(p, [&]<typename Elem, KvKind kKv>() {
    f.kv_major_wgmma_ctas = kv_major_sm90_ctas_per_sm<Elem, kKv>();
    for (int stages = 1; stages <= 2; ++stages) f.kv_major_mma_sync_ctas[stages - 1] = kv_major_ctas_per_sm<Elem, kKv>(stages);
    if constexpr (kKv != KvKind::kNvfp4) f.tile_ctas = union_sm90_ctas_per_sm<Elem, kKv>();
    if constexpr (kKv == KvKind::kNative) f.tile_tma_ctas = union_tma_sm90_ctas_per_sm<Elem>();
    if constexpr (kKv == KvKind::kNative) f.kv_major_tma_ctas = kv_major_tma_sm90_ctas_per_sm<Elem>();
  });
  return f;
}

}  // namespace

}  // namespace flashmsa::sparse_attn

namespace flashmsa::cuda {

using namespace flashmsa::sparse_attn;

SparseAttnDeviceFacts sparse_attention_facts(const SparseAttnParams& p) {
  check_params(p, "msa_sparse_attention");
  return device_facts(p, /*decode=*/false);
}

void sparse_attention(const SparseAttnParams& p, const SparseAttnPlan& plan, cudaStream_t stream) {
  if (p.total_q == 0) return;
  check_params(p, "msa_sparse_attention");
  MSA_CHECK(p.q_dtype != DType::kFP8E4M3, "msa_sparse_attention: q must be bf16 or fp16");
  check_workspace(p, plan.bytes, "msa_sparse_attention");
  if (plan.schedule == PrefillSchedule::kQueryMajor) {
    run_query_major(p, plan.qm, stream);
  } else {
    run_kv_major(p, plan.kvm, stream);
  }
}

SparseAttnDeviceFacts sparse_decode_facts(const SparseDecodeParams& dp) {
  check_params(dp.attn, "msa_sparse_decode_attention");
  return device_facts(dp.attn, /*decode=*/true);
}

void sparse_decode(const SparseDecodeParams& dp, const SparseAttnPlan& plan, cudaStream_t stream) {
  const SparseAttnParams& p = dp.attn;
  if (p.total_q == 0) return;
  check_params(p, "msa_sparse_decode_attention");
  MSA_CHECK(plan.schedule == PrefillSchedule::kQueryMajor, "msa_sparse_decode_attention: the plan "
            "must be a decode plan (query-major)");
  check_workspace(p, plan.bytes, "msa_sparse_decode_attention");
  run_query_major(p, plan.qm, stream);
}

}  // namespace flashmsa::cuda

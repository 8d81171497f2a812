// Host launchers of the sparse-attention kernels. The templated attention launchers are defined in
// query_major.cuh / kv_major.cuh / kv_major_sm90.cuh / union_sm90.cuh and explicitly instantiated
// once per (compute dtype, KV kind) in instantiations/*.cu, so the heavy kernels compile in
// parallel and only once. Those files and the extern declarations included at the end are
// generated from the KERNELS list of csrc/generate_instantiations.py: a new launcher is declared
// here and instantiated by one line there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "sparse_attn/kernel_traits.h"

namespace flashmsa::sparse_attn {

// Query-major attention: one CTA per item (grid-stride over args.num_items). kRegs: the streaming
// decode variant (fp8 / NVFP4 K/V converted in registers, kv_regs.cuh; native K/V with 3 stages;
// kWarpsM = 1, or 4 with kMtp for fp8 K/V). kMtp: MTP union items (one per request and kv
// head, rows = tokens x G, kWarpsM = 4 only). kWordCvt: NVFP4 K/V of the register variant converted
// a word at a time (decode plan option nvfp4_cvt=word; kv_regs.cuh qk_nvfp4_regs / pv_nvfp4_regs).
// kCluster (decode plan option split=cluster, sm_90): split calls only; the splits of one (row, kv
// head, row tile) run as a thread-block cluster that merges its partials through distributed shared
// memory (no workspace partials, no combine). kTma (decode plan option regs_feed=tma, sm_90a): the
// 16-row fp8 register variant with its stages filled by TMA (kv_regs_tma.cuh).
template <typename Elem, KvKind kKv, int kWarpsM, bool kRegs = false, bool kMtp = false,
          bool kWordCvt = false, bool kCluster = false, bool kTma = false>
void launch_query_major(const QueryMajorArgs& args, cudaStream_t stream);
// CTAs per SM of the kTma kernel on the current device (0 where it cannot run).
template <typename Elem>
int query_major_regs_tma_ctas_per_sm();
// The largest cluster every kCluster kernel of this compute dtype and KV kind gets on the current
// device (regs: the streaming variant's too); 0 where clusters cannot run.
template <typename Elem, KvKind kKv>
int query_major_cluster_max(bool regs);

// KV-major attention: a persistent grid of `grid` CTAs of 256 threads with
// kv_major_smem_bytes(q_stages) bytes of dynamic shared memory each.
template <typename Elem, KvKind kKv>
void launch_kv_major(const KvMajorArgs& args, int grid, cudaStream_t stream);
template <typename Elem, KvKind kKv>
int kv_major_smem_bytes(int q_stages);
// CTAs of the KV-major kernel resident per SM with that much shared memory (0: does not fit).
template <typename Elem, KvKind kKv>
int kv_major_ctas_per_sm(int q_stages);

// The same schedule on sm_90a with warpgroup MMAs (kv_major_sm90.cuh): persistent grid of 128-thread
// CTAs; ctas_per_sm is 0 where it cannot run (not sm_90, or no sm_90a image). tma_store: the
// partials written by TMA stores (plan option kv_major_store; G a multiple of 16).
template <typename Elem, KvKind kKv>
void launch_kv_major_sm90(const KvMajorArgs& args, int grid, bool tma_store, cudaStream_t stream);
template <typename Elem, KvKind kKv>
int kv_major_sm90_ctas_per_sm();
// The same in FlashAttention-3's structure (kv_major_tma_sm90.cuh; plan option kv_major_kernel=tma):
// a TMA producer warp and two consumer warpgroups, bf16 / fp16 K and V of the compute dtype.
template <typename Elem>
void launch_kv_major_tma_sm90(const KvMajorArgs& args, int grid, cudaStream_t stream);
template <typename Elem>
int kv_major_tma_sm90_ctas_per_sm();

// Shared-selection tiles (union_plan.cu, union_sm90.cuh): the plan of every (kv head, tile) and
// the persistent sm_90a attention kernel over the qualifying ones (bf16 / fp16 / fp8 K and V). The
// plan's control words (UnionArgs::control, kUnionControlBytes) must be zero when it starts: the
// KV-major preparation kernel launched before it clears them.
void launch_union_plan(const UnionArgs& args, cudaStream_t stream);
template <typename Elem, KvKind kKv>
void launch_union_sm90(const UnionArgs& args, int grid, cudaStream_t stream);
template <typename Elem, KvKind kKv>
int union_sm90_ctas_per_sm();
// The same tiles with TMA loads and intra-warpgroup overlap (union_tma_sm90.cuh; plan option
// tile_kernel=tma): bf16 / fp16 K and V of the compute dtype.
template <typename Elem>
void launch_union_tma_sm90(const UnionArgs& args, int grid, cudaStream_t stream);
template <typename Elem>
int union_tma_sm90_ctas_per_sm();

// Decode with 8 warps per CTA sharing each 128-key block (query_major_wide.cuh; decode plan option
// split_warps=8): per-token items of G <= 16 heads, split or (forced) fused, K/V of the compute
// dtype (kNative) or fp8 e4m3 (kFp8, converted in registers).
template <typename Elem, KvKind kKv, bool kCluster>
void launch_query_major_wide(const QueryMajorArgs& args, cudaStream_t stream);
// ... split=cluster on it: the largest cluster of one CTA per SM here (0: no clusters).
template <typename Elem, KvKind kKv>
int query_major_wide_cluster_max();

// MTP union items on sm_90a with TMA loads and warpgroup MMAs (mtp_wgmma_sm90.cuh; decode plan
// option kernel=wgmma): bf16 / fp16 q, K and V of the compute dtype; a persistent grid of `grid`
// CTAs (at most ctas_per_sm per SM, 0 where the device cannot run it); ahead: wgmma_pipe=ahead
// (a planner warp plans items ahead of the loader warp).
template <typename Elem>
void launch_mtp_wgmma_sm90(const QueryMajorArgs& args, int grid, bool ahead, cudaStream_t stream);
template <typename Elem>
int mtp_wgmma_sm90_ctas_per_sm();
// The same kernel with fp8 e4m3 K/V (decode plan option wgmma_fp8=on; wgmma_pipe=ahead's warps): raw
// K / V blocks copied by TMA, converted to the compute dtype's tiles by two producer warps.
template <typename Elem>
void launch_mtp_wgmma_fp8_sm90(const QueryMajorArgs& args, int grid, cudaStream_t stream);
template <typename Elem>
int mtp_wgmma_fp8_sm90_ctas_per_sm();

// KV-major list building (kv_major_lists.cu): once per call, then once per launch group. The
// preparation is the call's first kernel: it also clears `zero_bytes` (a multiple of 8, at most
// 8 KB) at `zero_words`, the shared-selection tiles' control words that launch_union_plan expects
// cleared.
void launch_kv_major_prepare(const KvMajorArgs& args, int num_sms, void* zero_words, int zero_bytes,
                             cudaStream_t stream);
void launch_kv_major_lists(const KvMajorArgs& args, cudaStream_t stream);

// Combine of partials into out (bf16 or fp16) and the LSEs (combine.cu).
void launch_combine(const CombineArgs& args, DType out_dtype, cudaStream_t stream);

}  // namespace flashmsa::sparse_attn

#include "sparse_attn/instantiations/declarations.h"

// Entry points of the core. Each op has:
//   *Args       the caller's arguments as torch-free tensor descriptions, named and defaulted like
//               FlashInfer's Python parameters (docs/semantics.md#d1);
//   make_*_params  every host-side check of docs/semantics.md#validation (and #d9), once:
//               throws flashmsa::Error naming the argument, expected and actual values; returns
//               validated Params;
//   make_*_plan how the call runs (plan.h: schedule, kernel, workspace bytes and layout), made once
//               from the validated Params, the caller's plan options and the device's facts;
//   run_*       executes validated Params with their plan: on host memory with the CPU reference
//               (which needs no plan), on device memory with the CUDA kernels (stream-ordered, no
//               host sync, no allocation, no re-planning).
// The bindings only convert their tensors to TensorRef, call make_*_params and make_*_plan, provide
// plan.bytes of device scratch, and run_*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "flashmsa/params.h"
#include "flashmsa/plan.h"
#include "flashmsa/types.h"

// cudaStream_t without including the CUDA runtime (the reference build needs no CUDA).
typedef struct CUstream_st* cudaStream_t;

namespace flashmsa {

// q_offset: None, a Python int, or an int32 tensor of shape (B,).
struct QOffsetArg {
  std::optional<int64_t> value;  // a Python int
  TensorRef tensor;              // or a tensor (undefined when not given)
};

struct ProxyScoreArgs {
  TensorRef q;             // (total_q, Hq, 128)
  TensorRef k;             // flat (total_k, Hkv, 128) | paged (P, Hkv, 128, 128)
  TensorRef cu_seqlens_q;  // (B+1,)
  TensorRef cu_seqlens_k;  // (B+1,) flat
  TensorRef page_table;    // (B, max_pages) paged
  TensorRef seqused_k;     // (B,) paged
  bool causal = true;
  std::optional<int64_t> max_seqlen_q;
  int64_t max_k_tiles = 0;  // resolved by the caller (output.shape[1] or derived); > 0
  TensorRef output;         // (Hq|1, max_k_tiles, total_q) float32, allocated by the caller
  bool reduce_heads = false;
  QOffsetArg q_offset;
  // msa_proxy_score_fp4 only (q and k packed NVFP4 uint8, last dim 64):
  TensorRef q_scale;                      // flat uint8 e4m3, 128x4-swizzled, row = token * Hq + head
  TensorRef k_scale;                      // same; paged rows (page * Hkv + head) * 128 + token
  std::optional<double> q_global_scale;   // dequant multipliers (1 / global scale)
  std::optional<double> k_global_scale;
};
ProxyScoreParams make_proxy_score_params(const ProxyScoreArgs& args);
ProxyScoreParams make_proxy_score_fp4_params(const ProxyScoreArgs& args);
ProxyScorePlan make_proxy_score_plan(const ProxyScoreParams& p, const ProxyScoreOptions& options,
                                     int device);
void run_proxy_score(const ProxyScoreParams& p, const ProxyScorePlan& plan, int device,
                     cudaStream_t stream);

struct TopkSelectArgs {
  TensorRef max_score;  // (H, P, S) float32 contiguous
  int64_t topk = 16;
  std::optional<int64_t> num_valid_pages_value;  // a Python int
  TensorRef num_valid_pages;                     // or an int32 (S,) tensor
  TensorRef output;                              // (S, H, topk) int32, allocated by the caller
  int64_t force_begin_blocks = 0;
  int64_t force_end_blocks = 0;
};
TopkSelectParams make_topk_select_params(const TopkSelectArgs& args);
TopkSelectPlan make_topk_select_plan(const TopkSelectParams& p, const TopkSelectOptions& options,
                                     int device);
void run_topk_select(const TopkSelectParams& p, const TopkSelectPlan& plan, int device,
                     cudaStream_t stream);

// Shared by prefill and decode: K/V with their NVFP4 scales and global scales.
struct KVArgs {
  TensorRef k;                          // flat (total_k, Hkv, W) | paged (P, Hkv, 128, W)
  TensorRef v;                          // same shape and dtype as k (packed K|V views allowed)
  TensorRef k_scale;                    // NVFP4 block scales (uint8)
  TensorRef v_scale;
  std::optional<double> k_global_scale;
  std::optional<double> v_global_scale;
};

struct SparseAttnArgs {
  TensorRef q;            // (total_q, Hq, 128) bf16/fp16
  KVArgs kv;
  TensorRef q2k_indices;  // (Hkv, total_q, topk) int32: contiguous or the transpose of a contiguous (total_q, Hkv, topk)
  TensorRef cu_seqlens_q; // (B+1,)
  TensorRef cu_seqlens_k; // (B+1,) flat; optional paged
  bool causal = false;
  std::optional<double> softmax_scale;
  TensorRef page_table;
  TensorRef seqused_k;
  std::optional<int64_t> max_seqlen_q;  // resolved by the caller when it can read cu_seqlens_q
  QOffsetArg q_offset;
  double lse_temperature_scale = 1.0;
  TensorRef output;       // (total_q, Hq, 128) q.dtype, allocated by the caller
  TensorRef lse;          // (total_q, Hq) float32 or undefined
  TensorRef lse_temperature;  // (total_q, Hq) float32 or undefined
  TensorRef workspace;    // caller-owned scratch (uint8), optional
};
SparseAttnParams make_sparse_attention_params(const SparseAttnArgs& args);
// The plan's bytes are the device scratch the call needs (0 on host memory and for schedules that
// need none): p.workspace must hold that many (a CUDA run with less throws). The torch binding takes
// it from the caller's MSASparseAttentionWorkspace, else from PyTorch's caching allocator (which
// CUDA-graph capture handles).
SparseAttnPlan make_sparse_attention_plan(const SparseAttnParams& p, const SparseAttnOptions& options,
                                          int device);
void run_sparse_attention(const SparseAttnParams& p, const SparseAttnPlan& plan, int device,
                          cudaStream_t stream);

struct SparseDecodeArgs {
  TensorRef q;            // (B * seqlen_q, Hq, 128) bf16/fp16/fp8
  KVArgs kv;
  TensorRef q2k_indices;  // (Hkv, total_q, topk) int32: contiguous or the transpose of a contiguous (total_q, Hkv, topk)
  TensorRef page_table;
  TensorRef seqused_k;
  TensorRef cu_seqlens_k;
  int64_t seqlen_q = 1;
  bool causal = true;
  std::optional<double> softmax_scale;
  QOffsetArg q_offset;
  PartialDType partial_dtype = PartialDType::kDefault;
  std::optional<bool> force_fused;
  TensorRef output;       // (total_q, Hq, 128): q.dtype, bf16 for fp8 q
  TensorRef lse;          // (total_q, Hq) float32 or undefined
  TensorRef workspace;
};
SparseDecodeParams make_sparse_decode_params(const SparseDecodeArgs& args);
SparseAttnPlan make_sparse_decode_plan(const SparseDecodeParams& p, const SparseDecodeOptions& options,
                                       int device);
void run_sparse_decode(const SparseDecodeParams& p, const SparseAttnPlan& plan, int device,
                       cudaStream_t stream);

// Output dtype of decode: q's, except bf16 for fp8 q.
DType decode_out_dtype(DType q_dtype);

// Checks of values only the host can read. make_* runs them itself on host tensors; the Python layer
// runs them on a host copy of CUDA tensors when it makes one anyway (never under graph capture).
//   cu_seqlens: host_values[0] == 0, non-decreasing, and host_values[count - 1] <= total when
//               total >= 0 (the rows it indexes: total_q, or total_k of a flat cache; rows past the
//               last sequence are padding); total < 0 skips that last check (paged cu_seqlens_k
//               indexes no tensor rows).
//   seqused_k:  every length >= 0 (lengths beyond the page table are clamped, not errors: D9).
void check_cu_seqlens(const int* host_values, int64_t count, int64_t total, const char* name);
void check_seqused_k(const int* host_values, int64_t count, const char* name);

// Whether k and v are the K and V halves of one paged cache that stores 2 * 128 values per token
// (docs/semantics.md#packed-kv, HND or NHD): same shape and strides, unit last stride, v starting
// 128 elements after k, and the sized dims of the (P, Hkv, 128, 2, 128) cache covering a compact
// buffer in some order. One of the two kinds of non-contiguous K/V the attention ops accept (paged,
// non-NVFP4); is_permuted_kv is the other.
bool is_packed_kv(const TensorRef& k, const TensorRef& v);

// Whether k and v are each a paged (P, Hkv, 128, 128) view of a compact buffer in another dim order
// (docs/semantics.md#packed-kv), e.g. NHD pages (P, 128, Hkv, 128).transpose(1, 2): same shape and
// strides, unit last stride, non-NVFP4. Read in place through their strides.
bool is_permuted_kv(const TensorRef& k, const TensorRef& v);

// One line naming the schedule / kernel the call's plan chose and why (plan_describe.h), for logs;
// host memory: the CPU reference, which has no kernel plan.
std::string describe_proxy_score_plan(const ProxyScoreParams& p, const ProxyScoreOptions& options,
                                      int device);
std::string describe_topk_select_plan(const TopkSelectParams& p, const TopkSelectOptions& options,
                                      int device);
std::string describe_sparse_attention_plan(const SparseAttnParams& p,
                                           const SparseAttnOptions& options, int device);
std::string describe_sparse_decode_plan(const SparseDecodeParams& p,
                                        const SparseDecodeOptions& options, int device);

// Whether this build has CUDA kernels (a CPU-only build runs the reference only).
bool built_with_cuda();

}  // namespace flashmsa

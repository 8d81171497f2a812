// Host side of msa_proxy_score: launch plan (heads per CTA, q-tiles, key-block splits), the
// kernel's alignment preconditions, and the launch itself.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "flashmsa/params.h"
#include "proxy_score/proxy_score_config.h"
#include "proxy_score/proxy_score_kernel.cuh"

namespace flashmsa::cuda::proxy {

inline bool aligned_to(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0;
}

template <typename Element>
void launch_proxy_score(const ProxyScoreParams& p, cudaStream_t stream) {
  // p comes from make_proxy_score(_fp4)_params, which checked the heads and dtype rules once; the
  // launcher checks the kernel's own preconditions: NVFP4 q and k together with their scales (the
  // kernel dereferences them), alignment and grid limits below.
  MSA_CHECK((p.q_dtype == DType::kNVFP4) == (p.k.dtype == DType::kNVFP4),
            "proxy_score: NVFP4 q and k go together (msa_proxy_score_fp4)");
  MSA_CHECK(p.q_dtype != DType::kNVFP4 || (p.q_scale != nullptr && p.k.scale != nullptr),
            "proxy_score: NVFP4 q / k need their block scales");
  if (p.total_q <= 0 || p.max_k_tiles <= 0) return;  // an empty output: nothing to write

  KernelParams kp{};
  kp.p = p;
  kp.group_size = p.num_heads / p.num_kv_heads;
  kp.subgroups = ceil_div_int(kp.group_size, kMaxHeadsPerCta);
  kp.heads_per_cta = ceil_div_int(kp.group_size, kp.subgroups);  // balanced: 20 -> 10 + 10
  kp.num_groups = p.num_kv_heads * kp.subgroups;
  const int grid_y = p.reduce_heads ? 1 : kp.num_groups;
  MSA_CHECK_SUPPORTED(grid_y <= 65535, "proxy_score: ", grid_y,
                      " head groups exceed the CUDA grid y limit (65535)");

  // q-tiles: max_seqlen_q is a hint; the kernel grid-strides over tiles beyond it. No sequence can
  // own more than total_q rows, which also bounds the grid for absurd hints.
  int64_t max_seqlen_q = p.qi.max_seqlen_q;
  if (max_seqlen_q <= 0 || max_seqlen_q > p.total_q) max_seqlen_q = p.total_q;
  const int tokens_per_large_tile = LargeTile::kRows / kp.heads_per_cta;
  kp.n_qt = int(std::max<int64_t>(1, ceil_div_int<int64_t>(max_seqlen_q, tokens_per_large_tile)));

  auto kernel = proxy_score_kernel<Element>;
  const size_t smem_bytes = sizeof(SharedStorage);
  const int resident = prepare_launch(kernel, kThreads, smem_bytes);
  const DeviceLimits& limits = current_device_limits();

  // Split the key blocks of each q-tile when q-tiles x head groups give fewer than ~4 waves of
  // resident CTAs (decode: one token per sequence). Four waves keep the last, partial wave's idle
  // share small for equal-sized (decode) items. Splits write disjoint columns: no reduction.
  const int64_t base = int64_t(kp.n_qt) * std::max(p.batch, 1) * grid_y;
  const int64_t target = 4LL * limits.num_sms * resident;
  int64_t n_split = base >= target ? 1 : ceil_div_int<int64_t>(target, base);
  n_split = std::min<int64_t>(n_split, ceil_div_int<int64_t>(p.max_k_tiles, kMinBlocksPerSplit));
  n_split = std::max<int64_t>(n_split, 1);
  kp.blocks_per_split = int(ceil_div_int<int64_t>(p.max_k_tiles, n_split));
  kp.n_split = int(ceil_div_int<int64_t>(p.max_k_tiles, kp.blocks_per_split));
  kp.n_work = int64_t(kp.n_qt) * p.batch * kp.n_split;
  kp.n_fill = limits.num_sms;

  // Q rows are read 16 bytes (fp8: 8, NVFP4: 4) at a time and K rows by 16-byte cp.async. make_*
  // validation guarantees it (contiguous q and k, 16-byte aligned); checked here as the kernel's
  // precondition rather than assumed.
  kp.q_fp8 = p.q_dtype == DType::kFP8E4M3;
  kp.k_fp8 = p.k.dtype == DType::kFP8E4M3;
  kp.q_fp4 = p.q_dtype == DType::kNVFP4;
  kp.k_fp4 = p.k.dtype == DType::kNVFP4;
  // Strides are in elements, bytes for fp8 and NVFP4.
  const int64_t q_elt = kp.q_fp8 || kp.q_fp4 ? 1 : 2;
  const int64_t k_elt = kp.k_fp8 || kp.k_fp4 ? 1 : 2;
  MSA_CHECK(aligned_to(p.q, 16) && (p.q_stride_token * q_elt) % 16 == 0 &&
                (p.q_stride_head * q_elt) % 16 == 0,
            "proxy_score: q must be 16-byte aligned with 16-byte multiple strides");
  MSA_CHECK(aligned_to(p.k.data, 16) && (p.k.stride_token * k_elt) % 16 == 0 &&
                (p.k.stride_head * k_elt) % 16 == 0 && (p.k.stride_page * k_elt) % 16 == 0,
            "proxy_score: k must be 16-byte aligned with 16-byte multiple strides");

  const int64_t items = kp.n_work + kp.n_fill;
  const dim3 grid(unsigned(std::min<int64_t>(items, INT_MAX)), unsigned(grid_y));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(kp);
  MSA_CHECK_LAUNCH();
}

}  // namespace flashmsa::cuda::proxy

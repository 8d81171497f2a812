// flashmsa::cuda::topk_select: launch plan and launch of the top-k selection kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/cuda_utils.h"
#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "topk_select/topk_select_kernel.cuh"

namespace flashmsa::cuda {

void topk_select(const TopkSelectParams& p, cudaStream_t stream) {
  // p comes from make_topk_select_params: 1 <= topk <= 64 and force_begin + force_end <= topk are
  // its invariants (checked there, once); this launcher checks only what the launch itself needs.
  if (p.num_tokens <= 0 || p.num_heads <= 0) return;  // an empty output

  topk::KernelParams kp{};
  kp.p = p;
  kp.token_groups = ceil_div_int(p.num_tokens, topk::kTokens);
  const int64_t items = int64_t(kp.token_groups) * p.num_heads;
  MSA_CHECK_SUPPORTED(items <= INT_MAX, "topk_select: ", p.num_heads, " heads x ", p.num_tokens,
                      " tokens exceed the kernel's work-item range");
  kp.items = int(items);
  // Rows longer than one chunk double-buffer the chunks (the next one loads while this one is
  // chosen from).
  kp.num_buffers = p.num_blocks > topk::kChunk ? 2 : 1;
  const size_t smem = topk::smem_bytes(kp.num_buffers);
  prepare_launch(topk::topk_select_kernel, topk::kThreads, smem);

  const dim3 grid(unsigned(kp.items));
  topk::topk_select_kernel<<<grid, topk::kThreads, smem, stream>>>(kp);
  MSA_CHECK_LAUNCH();
}

}  // namespace flashmsa::cuda

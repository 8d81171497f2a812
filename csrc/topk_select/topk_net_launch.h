// Launchers of the top-k `net` kernels (topk_net_kernel.cuh), each group instantiated in a
// translation unit of its own (topk_net_words16.cu, topk_net_words32.cu, topk_net_pivot.cu): their
// sorting networks are most of the top-k's compile time, which one unit made the longest step of
// the build. topk_select_api.cu dispatches to them from the plan.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "flashmsa/error.h"
#include "flashmsa/params.h"
#include "flashmsa/plan.h"
#include "topk_select/topk_net.h"

namespace flashmsa::cuda::topk {

// The grid of a kernel with a CTA per (token, head) row: the row count, which must fit an int.
inline int row_grid(const TopkSelectParams& p) {
  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  MSA_CHECK_SUPPORTED(rows <= INT_MAX, "topk_select: ", p.num_heads, " heads x ", p.num_tokens,
                      " tokens exceed the kernel's work-item range");
  return int(rows);
}

// net with K = 16 or 32 words a lane and `lanes` (a power of two <= 32) lanes a row.
void launch_net_words16(const TopkSelectParams& p, int lanes, cudaStream_t stream);
void launch_net_words32(const TopkSelectParams& p, int lanes, cudaStream_t stream);
// net with the pivot first (net_pivot = n scores a lane: 8, 16 or 32) in the plan's pivot mode.
void launch_net_pivot(const TopkSelectParams& p, int n, TopkPivotMode mode, cudaStream_t stream);

}  // namespace flashmsa::cuda::topk

// The `net` launchers' shared templates (topk_net_launch.h): included by the units that
// instantiate them, not by topk_select_api.cu.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "topk_select/topk_net_kernel.cuh"
#include "topk_select/topk_net_launch.h"

namespace flashmsa::cuda::topk {

// net: a warp per 32 / L rows (32 / L consecutive tokens of one head), 4 warps a CTA.
template <int K, int L, int N = 0>
void launch_net_rows(const TopkSelectParams& p, cudaStream_t stream) {
  net::Params np{};
  np.p = p;
  np.token_groups = ceil_div_int(p.num_tokens, 32 / L);
  const int64_t groups = int64_t(np.token_groups) * p.num_heads;
  MSA_CHECK_SUPPORTED(groups <= INT_MAX, "topk_select: ", p.num_heads, " heads x ", p.num_tokens,
                      " tokens exceed the kernel's work-item range");
  np.groups = int(groups);
  constexpr int kThreads = net::kWarpsPerCta * 32;
  cuda::prepare_launch(net::topk_net_kernel<K, L, N>, kThreads, 0);
  const int64_t ctas = ceil_div_int<int64_t>(groups, net::kWarpsPerCta);
  net::topk_net_kernel<K, L, N><<<dim3(unsigned(ctas)), kThreads, 0, stream>>>(np);
  MSA_CHECK_LAUNCH();
}

// net_pivot_mode=rank_cta: a CTA of 4 warps per (token, head) row.
template <int N>
void launch_pivot_cta(const TopkSelectParams& p, cudaStream_t stream) {
  net::Params np{};
  np.p = p;
  np.token_groups = p.num_tokens;
  const int rows = row_grid(p);
  np.groups = rows;
  constexpr int kThreads = net::kWarpsPerCta * 32;
  cuda::prepare_launch(net::topk_pivot_cta_kernel<N>, kThreads, 0);
  net::topk_pivot_cta_kernel<N><<<dim3(unsigned(rows)), kThreads, 0, stream>>>(np);
  MSA_CHECK_LAUNCH();
}

template <int K>
void launch_net_words(const TopkSelectParams& p, int lanes, cudaStream_t stream) {
  switch (lanes) {
    case 1: return launch_net_rows<K, 1>(p, stream);
    case 2: return launch_net_rows<K, 2>(p, stream);
    case 4: return launch_net_rows<K, 4>(p, stream);
    case 8: return launch_net_rows<K, 8>(p, stream);
    case 16: return launch_net_rows<K, 16>(p, stream);
    case 32: return launch_net_rows<K, 32>(p, stream);
    default: MSA_FAIL("topk_select: the plan's net_lanes ", lanes, " is not a power of two <= 32");
  }
}

}  // namespace flashmsa::cuda::topk

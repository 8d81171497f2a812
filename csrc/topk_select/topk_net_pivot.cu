// topk_net_launch.h: net with the pivot first, a translation unit of its own.
#include "topk_select/topk_net_launch.cuh"

namespace flashmsa::cuda::topk {

namespace {

// The pivot path's kernel for N scores a lane (plan.net_pivot) in the plan's mode.
template <int N>
void launch_pivot(const TopkSelectParams& p, TopkPivotMode mode, cudaStream_t stream) {
  switch (mode) {
    case TopkPivotMode::kSort: return launch_net_rows<16, 32, N>(p, stream);
    case TopkPivotMode::kRankCta: return launch_pivot_cta<N>(p, stream);
    default: MSA_FAIL("topk_select: the plan's pivot mode ", int(mode), " is not resolved");
  }
}

}  // namespace

void launch_net_pivot(const TopkSelectParams& p, int n, TopkPivotMode mode, cudaStream_t stream) {
  switch (n) {
    case 8: return launch_pivot<8>(p, mode, stream);
    case 16: return launch_pivot<16>(p, mode, stream);
    case 32: return launch_pivot<32>(p, mode, stream);
    default: MSA_FAIL("topk_select: the plan's net_pivot ", n, " is not 8, 16 or 32");
  }
}

}  // namespace flashmsa::cuda::topk

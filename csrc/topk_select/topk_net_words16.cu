// topk_net_launch.h: net with 16 words a lane, a translation unit of its own.
#include "topk_select/topk_net_launch.cuh"

namespace flashmsa::cuda::topk {

void launch_net_words16(const TopkSelectParams& p, int lanes, cudaStream_t stream) {
  launch_net_words<16>(p, lanes, stream);
}

}  // namespace flashmsa::cuda::topk

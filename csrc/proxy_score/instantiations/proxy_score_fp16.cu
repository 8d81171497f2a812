// The fp16 MMA instantiation of msa_proxy_score (one per file so that they compile in parallel).
#include "proxy_score/proxy_score_launch.cuh"

namespace flashmsa::cuda::proxy {
template void launch_proxy_score<__half>(const ProxyScoreParams& p, cudaStream_t stream);
}  // namespace flashmsa::cuda::proxy

// The fp16 instantiation of the sm_90a msa_proxy_score kernel (one per file: they compile in parallel).
#include "proxy_score/proxy_score_sm90.cuh"

namespace flashmsa::cuda::proxy::sm90 {
template bool launch<__half>(const ProxyScoreParams& p, QSource q_source, cudaStream_t stream);
}  // namespace flashmsa::cuda::proxy::sm90

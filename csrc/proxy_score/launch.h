// Host launchers of the msa_proxy_score kernels. Each launcher template is defined in a header of
// this directory (proxy_score_launch.cuh: the SM80+ kernel; proxy_score_sm90.cuh: the sm_90a TMA +
// wgmma prefill kernel, declared in proxy_score_sm90.h) and explicitly instantiated per MMA
// element type in instantiations/*.cu, generated from the KERNELS list of
// csrc/generate_instantiations.py together with the extern declarations included below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "flashmsa/params.h"
#include "proxy_score/proxy_score_sm90.h"

namespace flashmsa::cuda::proxy {

// The SM80+ proxy-score kernel over Element (bf16 or fp16) MMAs; checks its preconditions.
template <typename Element>
void launch_proxy_score(const ProxyScoreParams& p, cudaStream_t stream);

}  // namespace flashmsa::cuda::proxy

#include "proxy_score/instantiations/declarations.h"

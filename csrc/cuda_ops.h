// Launchers of the CUDA kernels, one per op. Called by api.cpp with validated Params whose
// pointers are on `device`; stream-ordered, no host sync, no allocation.
#pragma once

#include "flashmsa/api.h"
#include "flashmsa/params.h"

namespace flashmsa::cuda {

void proxy_score(const ProxyScoreParams& p, cudaStream_t stream);
void topk_select(const TopkSelectParams& p, cudaStream_t stream);
void sparse_attention(const SparseAttnParams& p, cudaStream_t stream);
void sparse_decode(const SparseDecodeParams& p, cudaStream_t stream);

size_t sparse_attention_workspace_bytes(const SparseAttnParams& p);
size_t sparse_decode_workspace_bytes(const SparseDecodeParams& p);

}  // namespace flashmsa::cuda

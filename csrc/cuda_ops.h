// Launchers of the CUDA kernels, one per op. Called by api.cpp with validated Params whose
// pointers are on `device`; stream-ordered, no host sync, no allocation.
#pragma once

#include "flashmsa/api.h"
#include "flashmsa/params.h"
#include "flashmsa/plan.h"

namespace flashmsa::cuda {

void proxy_score(const ProxyScoreParams& p, const ProxyScorePlan& plan, cudaStream_t stream);
void topk_select(const TopkSelectParams& p, const TopkSelectPlan& plan, cudaStream_t stream);
void sparse_attention(const SparseAttnParams& p, const SparseAttnPlan& plan, cudaStream_t stream);
void sparse_decode(const SparseDecodeParams& p, const SparseAttnPlan& plan, cudaStream_t stream);

// What the planners need to know about the current device (for these params).
TopkSelectDeviceFacts topk_select_facts();
SparseAttnDeviceFacts sparse_attention_facts(const SparseAttnParams& p);
SparseAttnDeviceFacts sparse_decode_facts(const SparseDecodeParams& p);

}  // namespace flashmsa::cuda

// Dispatch of validated Params: host memory -> CPU reference, device memory -> CUDA kernels.
#include "flashmsa/api.h"

#include "flashmsa/error.h"
#include "flashmsa/reference/reference.h"

#if defined(FLASHMSA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "cuda_ops.h"
#endif

namespace flashmsa {

namespace {

#if defined(FLASHMSA_WITH_CUDA)
// Kernels run on the caller's current device; the bindings set it (device guard) before calling.
void check_current_device(int device) {
  int current = -1;
  MSA_CUDA_CHECK(cudaGetDevice(&current));
  MSA_CHECK(current == device, "tensors are on cuda:", device, " but the current CUDA device is cuda:",
            current);
}
#endif

template <typename Params, typename HostFn, typename CudaFn>
void dispatch(const char* op, const Params& p, int device, cudaStream_t stream, HostFn host,
              CudaFn cuda_fn) {
  if (device < 0) {
    host(p);
    return;
  }
#if defined(FLASHMSA_WITH_CUDA)
  (void)op;
  check_current_device(device);
  cuda_fn(p, stream);
#else
  (void)stream;
  (void)cuda_fn;
  MSA_CHECK_SUPPORTED(false, op, ": this flashmsa build has no CUDA kernels (built without nvcc); "
                      "pass CPU tensors or rebuild with CUDA");
#endif
}

}  // namespace

bool built_with_cuda() {
#if defined(FLASHMSA_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

DType decode_out_dtype(DType q_dtype) {
  return q_dtype == DType::kFP8E4M3 ? DType::kBF16 : q_dtype;
}

#if defined(FLASHMSA_WITH_CUDA)
#define MSA_CUDA_FN(name) [](const auto& p, cudaStream_t s) { cuda::name(p, s); }
#else
#define MSA_CUDA_FN(name) [](const auto&, cudaStream_t) {}
#endif

void run_proxy_score(const ProxyScoreParams& p, int device, cudaStream_t stream) {
  dispatch(p.q_dtype == DType::kNVFP4 ? "msa_proxy_score_fp4" : "msa_proxy_score", p, device, stream,
           reference::proxy_score, MSA_CUDA_FN(proxy_score));
}

void run_topk_select(const TopkSelectParams& p, int device, cudaStream_t stream) {
  dispatch("msa_topk_select", p, device, stream, reference::topk_select, MSA_CUDA_FN(topk_select));
}

void run_sparse_attention(const SparseAttnParams& p, int device, cudaStream_t stream) {
  dispatch("msa_sparse_attention", p, device, stream, reference::sparse_attention,
           MSA_CUDA_FN(sparse_attention));
}

void run_sparse_decode(const SparseDecodeParams& p, int device, cudaStream_t stream) {
  dispatch("msa_sparse_decode_attention", p, device, stream, reference::sparse_decode,
           MSA_CUDA_FN(sparse_decode));
}

size_t sparse_attention_workspace_bytes(const SparseAttnParams& p) {
#if defined(FLASHMSA_WITH_CUDA)
  return cuda::sparse_attention_workspace_bytes(p);
#else
  (void)p;
  return 0;
#endif
}

size_t sparse_decode_workspace_bytes(const SparseDecodeParams& p) {
#if defined(FLASHMSA_WITH_CUDA)
  return cuda::sparse_decode_workspace_bytes(p);
#else
  (void)p;
  return 0;
#endif
}

}  // namespace flashmsa

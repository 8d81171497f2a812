// Dispatch of validated Params: host memory -> CPU reference, device memory -> CUDA kernels.
#include "flashmsa/api.h"

#include "flashmsa/error.h"
#include "flashmsa/plan_describe.h"
#include "flashmsa/reference/reference.h"

#if defined(FLASHMSA_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "cuda_ops.h"
#endif

namespace flashmsa {

namespace {

#if !defined(FLASHMSA_WITH_CUDA)
[[noreturn]] void no_cuda(const char* op) {
  detail::throw_error(ErrorKind::kNotSupported, op, ": this flashmsa build has no CUDA kernels (built "
                      "without nvcc); pass CPU tensors or rebuild with CUDA");
}
#endif

#if defined(FLASHMSA_WITH_CUDA)
// Kernels run on the caller's current device; the bindings set it (device guard) before calling.
void check_current_device(int device) {
  int current = -1;
  MSA_CUDA_CHECK(cudaGetDevice(&current));
  MSA_CHECK(current == device, "tensors are on cuda:", device, " but the current CUDA device is cuda:",
            current);
}
#endif

template <typename Params, typename Plan, typename HostFn, typename CudaFn>
void dispatch(const char* op, const Params& p, const Plan& plan, int device, cudaStream_t stream,
              HostFn host, CudaFn cuda_fn) {
  if (device < 0) {
    host(p);
    return;
  }
#if defined(FLASHMSA_WITH_CUDA)
  (void)op;
  check_current_device(device);
  cuda_fn(p, plan, stream);
#else
  (void)plan;
  (void)stream;
  (void)cuda_fn;
  no_cuda(op);
#endif
}

}  // namespace

// ---- plan descriptions (FLASHMSA_LOG=info) -------------------------------------------------------

namespace {
constexpr const char* kHostPlan = "CPU tensors: the exact C++ reference runs (no kernel plan)";
}  // namespace

std::string describe_proxy_score_plan(const ProxyScoreParams& p, const ProxyScoreOptions& options,
                                      int device) {
  if (device < 0) return kHostPlan;
  return describe(make_proxy_score_plan(p, options, device), options);
}

std::string describe_topk_select_plan(const TopkSelectParams& p, const TopkSelectOptions& options,
                                      int device) {
  if (device < 0) return kHostPlan;
  TopkSelectDeviceFacts facts;
#if defined(FLASHMSA_WITH_CUDA)
  check_current_device(device);
  facts = cuda::topk_select_facts();
#endif
  return describe(plan_topk_select(p, options, facts), p, options, facts);
}

std::string describe_sparse_attention_plan(const SparseAttnParams& p,
                                           const SparseAttnOptions& options, int device) {
  if (device < 0) return kHostPlan;
  return describe(make_sparse_attention_plan(p, options, device), p, options);
}

std::string describe_sparse_decode_plan(const SparseDecodeParams& p,
                                        const SparseDecodeOptions& options, int device) {
  if (device < 0) return kHostPlan;
  return describe_decode(make_sparse_decode_plan(p, options, device), p.attn);
}

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
#define MSA_CUDA_FN(name) [](const auto& p, const auto& plan, cudaStream_t s) { cuda::name(p, plan, s); }
#else
#define MSA_CUDA_FN(name) [](const auto&, const auto&, cudaStream_t) {}
#endif

const char* proxy_op_name(const ProxyScoreParams& p) {
  return p.q_dtype == DType::kNVFP4 ? "msa_proxy_score_fp4" : "msa_proxy_score";
}

ProxyScorePlan make_proxy_score_plan(const ProxyScoreParams& p, const ProxyScoreOptions& options, int) {
  return plan_proxy_score(p, options);
}

void run_proxy_score(const ProxyScoreParams& p, const ProxyScorePlan& plan, int device,
                     cudaStream_t stream) {
  dispatch(proxy_op_name(p), p, plan, device, stream, reference::proxy_score, MSA_CUDA_FN(proxy_score));
}

TopkSelectPlan make_topk_select_plan(const TopkSelectParams& p, const TopkSelectOptions& options,
                                     int device) {
  TopkSelectDeviceFacts facts;  // host memory: the reference has one algorithm, facts do not matter
#if defined(FLASHMSA_WITH_CUDA)
  if (device >= 0) {
    check_current_device(device);
    facts = cuda::topk_select_facts();
  }
#else
  (void)device;
#endif
  return plan_topk_select(p, options, facts);
}

void run_topk_select(const TopkSelectParams& p, const TopkSelectPlan& plan, int device,
                     cudaStream_t stream) {
  dispatch("msa_topk_select", p, plan, device, stream, reference::topk_select, MSA_CUDA_FN(topk_select));
}

// Host memory: the reference needs no plan (and no scratch). Device memory: the planner over the
// facts of the current device (the bindings make q's device current before planning).
SparseAttnPlan make_sparse_attention_plan(const SparseAttnParams& p, const SparseAttnOptions& options,
                                          int device) {
  if (device < 0) return SparseAttnPlan{};
#if defined(FLASHMSA_WITH_CUDA)
  check_current_device(device);
  if (p.total_q == 0) return SparseAttnPlan{};
  return plan_sparse_attention(p, options, cuda::sparse_attention_facts(p));
#else
  (void)p;
  (void)options;
  no_cuda("msa_sparse_attention");
#endif
}

void run_sparse_attention(const SparseAttnParams& p, const SparseAttnPlan& plan, int device,
                          cudaStream_t stream) {
  dispatch("msa_sparse_attention", p, plan, device, stream, reference::sparse_attention,
           MSA_CUDA_FN(sparse_attention));
}

SparseAttnPlan make_sparse_decode_plan(const SparseDecodeParams& p, const SparseDecodeOptions& options,
                                       int device) {
  if (device < 0) return SparseAttnPlan{};
#if defined(FLASHMSA_WITH_CUDA)
  check_current_device(device);
  if (p.attn.total_q == 0) return SparseAttnPlan{};
  return plan_sparse_decode(p, cuda::sparse_decode_facts(p), options);
#else
  (void)p;
  (void)options;
  no_cuda("msa_sparse_decode_attention");
#endif
}

void run_sparse_decode(const SparseDecodeParams& p, const SparseAttnPlan& plan, int device,
                       cudaStream_t stream) {
  dispatch("msa_sparse_decode_attention", p, plan, device, stream, reference::sparse_decode,
           MSA_CUDA_FN(sparse_decode));
}

}  // namespace flashmsa

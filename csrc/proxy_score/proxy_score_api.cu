// flashmsa::cuda::proxy_score: picks the kernel and the MMA element type from the operand dtypes.
//   bf16 q (any k), fp8 q (fp8 k: e4m3 is exact in bf16), NVFP4 q and k (e2m1 x e4m3 is exact in
//   bf16) -> bf16 MMAs; fp16 q -> fp16 MMAs.
// Kernels: the portable mma.sync kernel (SM80+, every layout and dtype), the sm_90a TMA + wgmma
// prefill kernel (proxy_score_sm90.cuh: 16-bit K of q's dtype, fp8 K, NVFP4 q / K; flat or paged,
// per-head output) and
// the decode streaming kernel (proxy_decode.cuh: short queries, G <= 16). The plan (plan.h
// ProxyKernel) says which: auto is mma.sync until the other kernels' H200 runs show them correct
// and faster; sm90 / sm90_ss / decode take theirs where it applies (else mma.sync), strict plans
// (the _only options) raise NotImplementedError where it does not.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "proxy_score/launch.h"

namespace flashmsa::cuda {

namespace proxy {

template <typename Elem>
void run(const ProxyScoreParams& p, const ProxyScorePlan& plan, cudaStream_t stream) {
  switch (plan.kernel) {
    case ProxyKernel::kDecode:
      if (launch_proxy_decode<Elem>(p, plan, stream)) return;
      MSA_CHECK_SUPPORTED(!plan.strict,
                          "msa_proxy_score: the decode kernel does not run this call (it needs at "
                          "most 16 query heads per KV head, and one KV head with reduce_heads); "
                          "kernel=decode_only forbids the fallback");
      break;
    case ProxyKernel::kSm90:
    case ProxyKernel::kSm90Ss: {
      const auto q_source = plan.kernel == ProxyKernel::kSm90 ? sm90::QSource::kRegs : sm90::QSource::kSmem;
      if (sm90::launch<Elem>(p, q_source, plan.f16_mma, plan.fp8_q, stream)) return;
      MSA_CHECK_SUPPORTED(!plan.strict,
                          "msa_proxy_score: the sm_90a kernel does not run this call (it needs an "
                          "sm_90 device and bf16 / fp16 q with k of q's dtype or fp8 k, fp8 q and k "
                          "with kernel=sm90_f16_only, or NVFP4 q and k with positive global scales, "
                          "flat or paged, without reduce_heads); "
                          "kernel=", option_name(plan.kernel), "_only forbids the fallback");
      break;
    }
    case ProxyKernel::kMmaSync: break;
    default: MSA_FAIL("proxy_score: the plan's kernel ", option_name(plan.kernel), " has no launcher");
  }
  launch_proxy_score<Elem>(p, stream);
}
}  // namespace proxy

void proxy_score(const ProxyScoreParams& p, const ProxyScorePlan& plan, cudaStream_t stream) {
  switch (p.q_dtype) {
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kNVFP4:  // NVFP4 q and k: dequantized exactly into bf16
      proxy::run<__nv_bfloat16>(p, plan, stream);
      return;
    case DType::kFP16:
      proxy::run<__half>(p, plan, stream);
      return;
    default:
      MSA_FAIL("proxy_score: q dtype ", dtype_name(p.q_dtype), " has no CUDA kernel");
  }
}

}  // namespace flashmsa::cuda

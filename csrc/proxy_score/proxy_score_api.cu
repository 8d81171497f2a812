// flashmsa::cuda::proxy_score: picks the MMA element type from the operand dtypes.
//   bf16 q (any k), fp8 q (fp8 k: e4m3 is exact in bf16), NVFP4 q and k (e2m1 x e4m3 is exact in
//   bf16) -> bf16 MMAs; fp16 q -> fp16 MMAs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "proxy_score/launch.h"

namespace flashmsa::cuda {

void proxy_score(const ProxyScoreParams& p, cudaStream_t stream) {
  switch (p.q_dtype) {
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kNVFP4:  // NVFP4 q and k: dequantized exactly into bf16
      proxy::launch_proxy_score<__nv_bfloat16>(p, stream);
      return;
    case DType::kFP16:
      proxy::launch_proxy_score<__half>(p, stream);
      return;
    default:
      MSA_FAIL("proxy_score: q dtype ", dtype_name(p.q_dtype), " has no CUDA kernel");
  }
}

}  // namespace flashmsa::cuda

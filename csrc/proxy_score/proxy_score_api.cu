// flashmsa::cuda::proxy_score: picks the kernel and the MMA element type from the operand dtypes.
//   bf16 q (any k), fp8 q (fp8 k: e4m3 is exact in bf16), NVFP4 q and k (e2m1 x e4m3 is exact in
//   bf16) -> bf16 MMAs; fp16 q -> fp16 MMAs.
// Kernels: the portable mma.sync kernel (SM80+, every layout and dtype) and the sm_90a TMA + wgmma
// prefill kernel (proxy_score_sm90.cuh: 16-bit K of q's dtype, flat or paged, per-head output).
// The sm_90a kernel is off by default until its H200 run shows it correct and faster;
// FLASHMSA_PROXY_KERNEL selects it (calls it does not cover, or devices it cannot run on, take the
// mma.sync kernel).
// The decode streaming kernel (proxy_decode.cuh: short queries, G <= 16) is off by default until
// its H200 run shows it correct and faster; FLASHMSA_PROXY_KERNEL=decode selects it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>

#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "proxy_score/launch.h"

namespace flashmsa::cuda {

namespace proxy {

// Which proxy-score kernel runs. kAuto: the mma.sync kernel (until the sm_90a kernel is measured
// on the H200); kSm90: the sm_90a kernel with Q in registers (wgmma RS), kSm90Ss: with Q in shared
// memory (wgmma SS), kDecode: the decode streaming kernel, each where it applies and else the
// mma.sync kernel; `strict`: the chosen kernel or NotImplementedError (tests and benchmarks: never
// a silent fallback).
enum class ProxyKernel { kAuto, kMmaSync, kSm90, kSm90Ss, kDecode };
struct ProxyKernelChoice {
  ProxyKernel kernel;
  bool strict;
};

// FLASHMSA_PROXY_KERNEL = auto (default) | mma_sync | sm90 | sm90_ss | decode, the last three
// optionally with the suffix _only (strict).
ProxyKernelChoice proxy_kernel_override() {
  const char* env = std::getenv("FLASHMSA_PROXY_KERNEL");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return {ProxyKernel::kAuto, false};
  if (std::strcmp(env, "mma_sync") == 0) return {ProxyKernel::kMmaSync, false};
  if (std::strcmp(env, "sm90") == 0) return {ProxyKernel::kSm90, false};
  if (std::strcmp(env, "sm90_only") == 0) return {ProxyKernel::kSm90, true};
  if (std::strcmp(env, "sm90_ss") == 0) return {ProxyKernel::kSm90Ss, false};
  if (std::strcmp(env, "sm90_ss_only") == 0) return {ProxyKernel::kSm90Ss, true};
  if (std::strcmp(env, "decode") == 0) return {ProxyKernel::kDecode, false};
  if (std::strcmp(env, "decode_only") == 0) return {ProxyKernel::kDecode, true};
  MSA_FAIL("FLASHMSA_PROXY_KERNEL must be auto, mma_sync, sm90, sm90_only, sm90_ss, sm90_ss_only, "
           "decode or decode_only, got '", env, "'");
}

template <typename Elem>
void run(const ProxyScoreParams& p, ProxyKernelChoice choice, cudaStream_t stream) {
  if (choice.kernel == ProxyKernel::kDecode) {
    if (launch_proxy_decode<Elem>(p, stream)) return;
    MSA_CHECK_SUPPORTED(!choice.strict,
                        "msa_proxy_score: the decode kernel does not run this call (it needs at most "
                        "16 query heads per KV head, and one KV head with reduce_heads); "
                        "FLASHMSA_PROXY_KERNEL=decode_only forbids the fallback");
  }
  if (choice.kernel == ProxyKernel::kSm90 || choice.kernel == ProxyKernel::kSm90Ss) {
    const auto q_source = choice.kernel == ProxyKernel::kSm90 ? sm90::QSource::kRegs : sm90::QSource::kSmem;
    if (sm90::launch<Elem>(p, q_source, stream)) return;
    MSA_CHECK_SUPPORTED(!choice.strict,
                        "msa_proxy_score: the sm_90a kernel does not run this call (it needs an sm_90 "
                        "device and bf16 / fp16 k of q's dtype, flat or paged, without reduce_heads); "
                        "FLASHMSA_PROXY_KERNEL=",
                        std::getenv("FLASHMSA_PROXY_KERNEL"), " forbids the fallback");
  }
  launch_proxy_score<Elem>(p, stream);
}
}  // namespace proxy

void proxy_score(const ProxyScoreParams& p, cudaStream_t stream) {
  const proxy::ProxyKernelChoice kernel = proxy::proxy_kernel_override();
  switch (p.q_dtype) {
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kNVFP4:  // NVFP4 q and k: dequantized exactly into bf16
      proxy::run<__nv_bfloat16>(p, kernel, stream);
      return;
    case DType::kFP16:
      proxy::run<__half>(p, kernel, stream);
      return;
    default:
      MSA_FAIL("proxy_score: q dtype ", dtype_name(p.q_dtype), " has no CUDA kernel");
  }
}

}  // namespace flashmsa::cuda

// Host launchers of the msa_proxy_score kernels. Each launcher template is defined in a header of
// this directory (proxy_score_launch.cuh: the SM80+ kernel; proxy_score_sm90.cuh: the sm_90a TMA +
// wgmma prefill kernel; proxy_decode.cuh: the SM80+ decode streaming kernel) and explicitly instantiated per MMA
// element type in instantiations/*.cu, generated from the KERNELS list of
// csrc/generate_instantiations.py together with the extern declarations included below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "flashmsa/params.h"
#include "flashmsa/plan.h"

namespace flashmsa::cuda::proxy {

// The SM80+ proxy-score kernel over Element (bf16 or fp16) MMAs; checks its preconditions.
template <typename Element>
void launch_proxy_score(const ProxyScoreParams& p, cudaStream_t stream);

// The decode kernel (proxy_decode.cuh: a memory-streaming kernel over (request, KV head, key
// block) units, for calls whose G heads fit 16 MMA rows); false (nothing launched) when it does
// not run the call (G > 16, reduce_heads over several KV heads): the caller then launches the
// mma.sync kernel. From the plan: f16_mma (fp16 MMAs for fp8 K with bf16 / fp8 q), decode_ctas and
// decode_ilp (key blocks per loop iteration).
template <typename Element>
bool launch_proxy_decode(const ProxyScoreParams& p, const ProxyScorePlan& plan, cudaStream_t stream);

namespace decode {
struct Params;  // proxy_decode.cuh
// launch_proxy_decode's paths with many kernel variants, each instantiated in a translation unit
// of its own (they dominate the build otherwise): the cp.async ring over fp8 K (every decode_ctas,
// decode_ilp and MMA type) and over NVFP4 q and K (bf16 only: every decode_ctas, decode_ilp and
// nvfp4_cvt).
template <typename Element>
void launch_ring_fp8(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream);
template <typename Element>
void launch_ring_fp4(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream);
namespace tma {
// The TMA-fed warp-per-block kernel (proxy_decode_tma.cuh) over fp8 K, and over NVFP4 q and K
// (bf16 only); false when it does not run the call (not sm_90a, reduce_heads).
template <typename Element>
bool launch_fp8(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream);
template <typename Element>
bool launch_fp4(const Params& dp, const ProxyScorePlan& plan, cudaStream_t stream);
}  // namespace tma
}  // namespace decode

namespace sm90 {
// Where the sm_90a kernel's wgmma A operand (Q) comes from:
//   kSmem (SS): Q and K from shared memory. Two Q slots (the next tile's Q lands while this one is
//               multiplied) and a 3-stage K ring: 224 KB. Shared-memory reads per m64n128k16:
//               2 KB of Q + 4 KB of K.
//   kRegs (RS): each consumer thread loads its sub-tiles' A fragments (2 x 32 registers) once per
//               tile and releases the Q slot at once, so one slot suffices and the K ring gets 4
//               stages: 192 KB. Shared-memory reads per m64n128k16: the 4 KB of K only.
enum class QSource { kSmem, kRegs };

// The sm_90a prefill kernel; false (nothing launched) when the call or the device is not one it
// runs (reduce_heads, fp8 q without fp8_q, not an sm_90 device, ...): the caller then launches the
// mma.sync kernel. fp8 K and NVFP4 q / K are converted exactly into 16-bit by its producer
// warpgroup. f16_mma (ProxyScorePlan::f16_mma): fp8 K with bf16 q on fp16 MMAs (KFormat::kFp8F16,
// Q in registers whatever q_source says), NVFP4 q and K too (KFormat::kNvfp4F16). fp8_q
// (ProxyScorePlan::fp8_q): fp8 q and K on fp16 MMAs (KFormat::kFp8Q, Q in registers).
template <typename Elem>
bool launch(const ProxyScoreParams& p, QSource q_source, bool f16_mma, bool fp8_q, cudaStream_t stream);
}  // namespace sm90

}  // namespace flashmsa::cuda::proxy

#include "proxy_score/instantiations/declarations.h"

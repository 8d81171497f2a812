// Host interface of the sm_90a msa_proxy_score prefill kernel (proxy_score_sm90.cuh), for the
// dispatcher: which A-operand variant to run, and the launch that reports whether it ran the call.
#pragma once

#include <cuda_runtime_api.h>

#include "flashmsa/params.h"

namespace flashmsa::cuda::proxy::sm90 {

// Where the wgmma A operand (Q) comes from:
//   kSmem (SS): Q and K from shared memory. Two Q slots (the next tile's Q lands while this one is
//               multiplied) and a 3-stage K ring: 224 KB. Shared-memory reads per m64n128k16:
//               2 KB of Q + 4 KB of K.
//   kRegs (RS): each consumer thread loads its sub-tiles' A fragments (2 x 32 registers) once per
//               tile and releases the Q slot at once, so one slot suffices and the K ring gets 4
//               stages: 192 KB. Shared-memory reads per m64n128k16: the 4 KB of K only.
enum class QSource { kSmem, kRegs };

// Launches the sm_90a kernel; false (nothing launched) when the call or the device is not one it
// runs (paged or non-16-bit K, reduce_heads, not an sm_90 device, ...): the caller then launches
// the mma.sync kernel. One instantiation per MMA type (instantiations/proxy_score_sm90_*.cu).
template <typename Elem>
bool launch(const ProxyScoreParams& p, QSource q_source, cudaStream_t stream);

}  // namespace flashmsa::cuda::proxy::sm90

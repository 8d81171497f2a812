// Host-side CUDA helpers shared by every kernel launcher: integer ceil, device limits cached per
// device, the cached launch preparation (shared-memory opt-in + occupancy), and the launch-error
// check. Torch-free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "flashmsa/error.h"

namespace flashmsa::cuda {

template <typename T>
constexpr T ceil_div_int(T a, T b) {
  return (a + b - 1) / b;
}

// Limits of the current device, queried once per device and cached: attribute queries are host
// calls (no stream sync), but they cost a driver round trip that a launch should not pay each time.
struct DeviceLimits {
  int num_sms;
  int max_smem_per_block_optin;  // bytes a kernel may opt into
                                 // (cudaFuncAttributeMaxDynamicSharedMemorySize)
  int max_smem_per_sm;
  int cc_major;  // compute capability
  int cc_minor;
};
const DeviceLimits& current_device_limits();

// Prepares a launch of `kernel` with `threads` per block and `smem_bytes` of dynamic shared
// memory on the current device: opts the kernel into that much shared memory (above the 48 KB
// default), checks the device can give it, and returns how many CTAs fit on one SM (>= 1, else a
// clear error). Results are cached per (kernel, device, threads, smem), so a launch pays the
// driver queries once; safe during CUDA-graph capture (no stream work).
int prepare_launch(const void* kernel, int threads, size_t smem_bytes);

template <typename Kernel>
int prepare_launch(Kernel* kernel, int threads, size_t smem_bytes) {
  return prepare_launch(reinterpret_cast<const void*>(kernel), threads, smem_bytes);
}

// prepare_launch for a kernel written for sm_90a (wgmma): 0 instead of an error when the current
// device cannot run it, i.e. it is not a 9.0 device, lacks the shared memory, or the library's
// image of the kernel for it is not the sm_90a one (an sm_90a kernel body is a trap elsewhere).
// Cached per (kernel, device, threads, shared memory), as prepare_launch is.
int prepare_sm90a_launch(const void* kernel, int threads, size_t smem_bytes);

template <typename Kernel>
int prepare_sm90a_launch(Kernel* kernel, int threads, size_t smem_bytes) {
  return prepare_sm90a_launch(reinterpret_cast<const void*>(kernel), threads, smem_bytes);
}

// prepare_launch for a kernel launched in thread-block clusters of 1-D CTAs (sm_90 and up): the
// largest cluster size of 16 (non-portable, allowed on H100 / H200), 8, 4 or 2 CTAs of which at
// least one can be resident at once, or 0 where prepare_sm90a_launch gives 0 (the cluster kernels
// are traps below sm_90, and a newer GPU would JIT their sm_80 PTX). Cached per (kernel, device);
// opts the kernel into its shared memory and into clusters above 8.
int prepare_cluster_launch(const void* kernel, int threads, size_t smem_bytes);

template <typename Kernel>
int prepare_cluster_launch(Kernel* kernel, int threads, size_t smem_bytes) {
  return prepare_cluster_launch(reinterpret_cast<const void*>(kernel), threads, smem_bytes);
}

}  // namespace flashmsa::cuda

// Checks the launch that just happened (configuration errors surface here; asynchronous faults
// surface at the caller's next synchronising call, as for any stream-ordered op).
#define MSA_CHECK_LAUNCH() MSA_CUDA_CHECK(cudaGetLastError())

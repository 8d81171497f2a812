#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "common/cuda_utils.h"

namespace flashmsa::cuda {

const DeviceLimits& current_device_limits() {
  // Entries are never erased, so references stay valid after the lock is released.
  static std::mutex mutex;
  static std::unordered_map<int, DeviceLimits> cache;
  int device = -1;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  DeviceLimits limits{};
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&limits.num_sms, cudaDevAttrMultiProcessorCount, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&limits.max_smem_per_block_optin,
                                        cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&limits.max_smem_per_sm,
                                        cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&limits.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&limits.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  return cache.emplace(device, limits).first->second;
}

namespace {

// compute() for (kernel, current device, threads, smem_bytes), computed once: every call of one
// Compute type shares one cache and one lock, held while computing.
template <typename Compute>
int once_per_launch(const void* kernel, int threads, size_t smem_bytes, Compute&& compute) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, size_t>, int> cache;
  int device = -1;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(kernel, device, threads, smem_bytes);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int n = compute(device);
  cache.emplace(key, n);
  return n;
}

}  // namespace

int prepare_launch(const void* kernel, int threads, size_t smem_bytes) {
  // The shared-memory opt-in is a property of the kernel, not of a launch: it only ever grows, to
  // the largest size any launch asked for (setting it per size would shrink it under a cached larger
  // launch: "invalid argument" at the next launch of that size).
  return once_per_launch(kernel, threads, smem_bytes, [&](int device) {
    static std::map<std::pair<const void*, int>, size_t> opted_in;  // under once_per_launch's lock
    const DeviceLimits& limits = current_device_limits();
    MSA_CHECK_SUPPORTED(smem_bytes <= size_t(limits.max_smem_per_block_optin), "kernel needs ",
                        smem_bytes, " bytes of shared memory per block but this GPU allows ",
                        limits.max_smem_per_block_optin);
    size_t& opted = opted_in[std::make_pair(kernel, device)];
    if (smem_bytes > 48 * 1024 && smem_bytes > opted) {
      MSA_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
      opted = smem_bytes;
    }
    int n = 0;
    MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes));
    MSA_CHECK_SUPPORTED(n > 0, "kernel cannot be resident on this GPU (", threads, " threads, ",
                        smem_bytes, " bytes of shared memory)");
    return n;
  });
}

int prepare_sm90a_launch(const void* kernel, int threads, size_t smem_bytes) {
  // Cached as prepare_launch is: the sparse attention's planner asks this for every sm_90a kernel
  // variant on every call (its device facts), and cudaFuncGetAttributes is not a cheap call.
  return once_per_launch(kernel, threads, smem_bytes, [&](int) {
    const DeviceLimits& lim = current_device_limits();
    if (lim.cc_major != 9 || lim.cc_minor != 0 || smem_bytes > size_t(lim.max_smem_per_block_optin)) return 0;
    cudaFuncAttributes attr{};
    MSA_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    if (attr.binaryVersion != 90) return 0;
    return prepare_launch(kernel, threads, smem_bytes);
  });
}

int prepare_cluster_launch(const void* kernel, int threads, size_t smem_bytes) {
  return once_per_launch(kernel, threads, smem_bytes, [&](int) {
    if (prepare_sm90a_launch(kernel, threads, smem_bytes) == 0) return 0;
    // Clusters above 8 CTAs need the opt-in; a device without them refuses it (then 8 at most).
    const bool non_portable =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    if (!non_portable) (void)cudaGetLastError();
    for (int c = non_portable ? 16 : 8; c >= 2; c /= 2) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(c));
      cfg.blockDim = dim3(unsigned(threads));
      cfg.dynamicSmemBytes = smem_bytes;
      cudaLaunchAttribute a[1];
      a[0].id = cudaLaunchAttributeClusterDimension;
      a[0].val.clusterDim.x = unsigned(c);
      a[0].val.clusterDim.y = 1;
      a[0].val.clusterDim.z = 1;
      cfg.attrs = a;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
      }
      if (n > 0) return c;
    }
    return 0;
  });
}

}  // namespace flashmsa::cuda

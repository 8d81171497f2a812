// Where does the hardware place the CTAs of a thread-block cluster, and what does a cluster that
// shares SMs cost its CTAs? The split-K decode at batch 1 runs 4 (kv heads) x 16 splits: as a plain
// grid its 64 CTAs get an SM each; as clusters of 16 (decode plan option split=cluster) each
// cluster lives inside one GPC, and where a CTA's resources let several CTAs share an SM (the
// 4-warp kernel: ~60 KB of shared memory, 3 per SM) the cluster may be packed onto fewer SMs, each
// then running several CTAs' dependent chains at once. The 4-warp cluster kernel measured slower
// than the plain kernel and its combine together (docs/design/sparse_attention.md#decode-cluster);
// the 8-warp cluster kernel asks for 116 KB of shared memory so that an SM holds one CTA
// (#b1-cluster8). This tool checks that premise.
//
// Each CTA records its SM (%smid) and its cluster rank, then runs a fixed dependent chain of FMAs
// per thread (latency-bound, as a batch-1 decode CTA's is: co-resident CTAs slow each other down
// only by sharing the SM's issue slots), and stamps %globaltimer. Per case: the kernel's time
// (CUDA events, median of 20 launches), the distinct SMs per cluster (min / mean / max) and the
// largest number of CTAs found on one SM.
// Cases: 4 and 32 clusters (B1 and B8 of M3), clusters of 16 / 8 / 4 CTAs, 128 and 256 threads, 60
// and 116 KB of dynamic shared memory, and the plain grid of the same CTAs for comparison.
// Usage: cluster_placement
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "cuda_check.h"

namespace {

__device__ uint32_t smid() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

__device__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// A dependent FMA chain of `iters` steps per thread (4 independent chains, as a decode warp's
// accumulators give a little ILP), then the record: [cta] = smid << 8 | cluster rank.
__global__ void chain_kernel(uint32_t* where, int iters, float* sink) {
  extern __shared__ float smem[];
  smem[threadIdx.x] = float(threadIdx.x);
  __syncthreads();
  float a = smem[threadIdx.x], b = a + 1.0f, c = a + 2.0f, d = a + 3.0f;
  for (int i = 0; i < iters; ++i) {
    a = fmaf(a, 0.9999f, 0.5f);
    b = fmaf(b, 0.9999f, 0.5f);
    c = fmaf(c, 0.9999f, 0.5f);
    d = fmaf(d, 0.9999f, 0.5f);
  }
  if (a + b + c + d == 12345.0f) *sink = a;
  if (threadIdx.x == 0) where[blockIdx.x] = smid() << 8 | cluster_rank();
}

struct Case {
  int clusters;   // clusters in the grid (0: a plain grid of `cluster` x ... CTAs, see ctas)
  int cluster;    // CTAs per cluster (1: plain launch)
  int threads;
  int smem;       // dynamic shared memory per CTA, bytes
};

float run(const Case& c, int ctas, int iters, uint32_t* d_where, float* d_sink, std::vector<uint32_t>& where) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(ctas));
  cfg.blockDim = dim3(unsigned(c.threads));
  cfg.dynamicSmemBytes = size_t(c.smem);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(c.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = c.cluster > 1 ? 1 : 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int rep = 0; rep < 23; ++rep) {
    CK(cudaEventRecord(e0));
    CK(cudaLaunchKernelEx(&cfg, chain_kernel, d_where, iters, d_sink));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 3) times.push_back(ms * 1000.0f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  where.resize(size_t(ctas));
  CK(cudaMemcpy(where.data(), d_where, sizeof(uint32_t) * size_t(ctas), cudaMemcpyDeviceToHost));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 116 * 1024));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  uint32_t* d_where = nullptr;
  float* d_sink = nullptr;
  CK(cudaMalloc(&d_where, sizeof(uint32_t) * 4096));
  CK(cudaMalloc(&d_sink, sizeof(float)));
  // ~10 us of dependent FMAs per thread at one CTA per SM (4 chains of 4-cycle FMAs).
  const int iters = 4000;
  std::printf("cluster placement, %s, %d SMs; chain of %d FMA steps per thread\n", prop.name,
              prop.multiProcessorCount, iters);
  std::printf("%-44s %9s %18s %12s\n", "case", "us", "SMs per cluster", "CTAs per SM");
  for (int smem : {60 * 1024, 116 * 1024}) {
    for (int threads : {128, 256}) {
      for (int clusters : {4, 32}) {
        for (int cluster : {1, 16, 8, 4}) {
          // B1: 4 rows x 16 splits; B8: 32 rows x 4 splits (the 8-warp cluster's plan) or 16.
          const int per_row = clusters == 4 ? 16 : 4;
          if (cluster > per_row) continue;
          const int ctas = clusters * per_row;
          const Case c{clusters, cluster, threads, smem};
          cudaLaunchConfig_t probe{};
          probe.gridDim = dim3(unsigned(cluster));
          probe.blockDim = dim3(unsigned(threads));
          probe.dynamicSmemBytes = size_t(smem);
          cudaLaunchAttribute a[1];
          a[0].id = cudaLaunchAttributeClusterDimension;
          a[0].val.clusterDim.x = unsigned(cluster);
          a[0].val.clusterDim.y = a[0].val.clusterDim.z = 1;
          probe.attrs = a;
          probe.numAttrs = 1;
          int max_clusters = 0;
          if (cluster > 1) CK(cudaOccupancyMaxActiveClusters(&max_clusters, chain_kernel, &probe));
          std::vector<uint32_t> where;
          const float us = run(c, ctas, iters, d_where, d_sink, where);
          // Distinct SMs per cluster (consecutive CTAs), and the most CTAs on one SM.
          int lo = 1 << 30, hi = 0, sum = 0, groups = 0;
          std::vector<int> per_sm(4096, 0);
          for (int g = 0; g < ctas / cluster; ++g) {
            std::set<uint32_t> sms;
            for (int i = 0; i < cluster; ++i) sms.insert(where[size_t(g * cluster + i)] >> 8);
            lo = std::min(lo, int(sms.size()));
            hi = std::max(hi, int(sms.size()));
            sum += int(sms.size());
            ++groups;
          }
          for (uint32_t w : where) ++per_sm[w >> 8];
          const int most = *std::max_element(per_sm.begin(), per_sm.end());
          char name[96];
          std::snprintf(name, sizeof(name), "%s %d CTAs of %d thr, %d KB%s", cluster > 1 ? "clusters" : "plain",
                        ctas, threads, smem / 1024, "");
          char shape[48];
          if (cluster > 1)
            std::snprintf(shape, sizeof(shape), "x%d: %d / %.1f / %d", cluster, lo, double(sum) / groups, hi);
          else
            std::snprintf(shape, sizeof(shape), "-");
          std::printf("%-44s %9.2f %18s %12d", name, double(us), shape, most);
          if (cluster > 1) std::printf("   (max active clusters %d)", max_clusters);
          std::printf("\n");
        }
      }
    }
  }
  CK(cudaFree(d_where));
  CK(cudaFree(d_sink));
  return 0;
}

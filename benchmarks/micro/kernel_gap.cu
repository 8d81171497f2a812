// What does the hand-off between two dependent kernels of a CUDA graph cost, and does it depend on
// their shared-memory configurations? The captured decode step runs four kernels back to back
// (proxy decode with ~200 KB of dynamic shared memory, top-k with under 1 KB, the decode kernel
// with ~100-200 KB, the combine with none); inside the graph the gaps between them measured
// 0.13-0.8 us, the largest after the proxy (docs/design/sparse_attention.md#b1-budget). A kernel
// whose shared-memory carveout differs from the one before it makes each SM reconfigure its L1 /
// shared split before the new CTAs start; whether that is what the larger gaps are is what this
// measures.
//
// Kernels: `big` (dynamic shared memory, one CTA per SM: the proxy's shape) and `tiny` (no shared
// memory, a few CTAs: the top-k's shape), each spinning ~1 us after touching its memory. Each case
// is a graph of 64 pairs "first -> second" (every launch depends on the one before), replayed 20
// times, timed by CUDA events; the per-pair time minus the two kernels' own spins is the two
// hand-offs. Cases:
//   big->tiny          the decode step's proxy -> top-k
//   big->tiny(shared)  the same, the tiny kernel's preferred carveout set to the maximum shared
//                      memory (cudaFuncAttributePreferredSharedMemoryCarveout = 100), as big's is
//   tiny->tiny         both at the default configuration (no reconfiguration)
//   big->big           both at the large configuration
//   big->tiny pdl      the tiny kernel launched with programmatic stream serialization (PDL),
//                      waiting for big at its top (griddepcontrol.wait), big triggering its
//                      dependents at its start (griddepcontrol.launch_dependents): the hand-off
//                      with the launch overlapped
//   big->tiny pdl-end  the same without the trigger (the dependents launch as big's CTAs exit)
// Every kernel also stamps %globaltimer at its first CTA's start and its last CTA's end, so the
// median gap of each hand-off is printed too.
// Usage: kernel_gap [big_smem_bytes (default 200 KB; at least 1 KB)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

namespace {

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// stamps[2 k] = the earliest CTA start of launch k, stamps[2 k + 1] = the latest CTA end.
__device__ void spin_and_stamp(unsigned long long* stamps, int k, int spin_ns, float* sink, float v) {
  const uint64_t t0 = now_ns();
  if (threadIdx.x == 0) atomicMin(stamps + 2 * k, (unsigned long long)t0);
  while (now_ns() - t0 < uint64_t(spin_ns)) {
  }
  if (v == 12345.0f) *sink = v;  // keeps the memory touch alive
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(stamps + 2 * k + 1, (unsigned long long)now_ns());
}

__global__ void big_kernel(unsigned long long* stamps, int k, int spin_ns, float* sink, int trigger) {
  if (trigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  extern __shared__ float smem[];
  smem[threadIdx.x] = float(threadIdx.x);
  __syncthreads();
  spin_and_stamp(stamps, k, spin_ns, sink, smem[(threadIdx.x + 1) % blockDim.x]);
}

__global__ void tiny_kernel(unsigned long long* stamps, int k, int spin_ns, float* sink) {
  spin_and_stamp(stamps, k, spin_ns, sink, float(threadIdx.x));
}

__global__ void tiny_shared_kernel(unsigned long long* stamps, int k, int spin_ns, float* sink) {
  spin_and_stamp(stamps, k, spin_ns, sink, float(threadIdx.x));
}

// The dependent of a PDL launch: waits for the previous kernel's completion (or trigger) first.
__global__ void tiny_pdl_kernel(unsigned long long* stamps, int k, int spin_ns, float* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  spin_and_stamp(stamps, k, spin_ns, sink, float(threadIdx.x));
}

enum Kind { kBig, kBigTrigger, kTiny, kTinyShared, kTinyPdl };

struct Case {
  const char* name;
  Kind first, second;
};

constexpr int kPairs = 64;
constexpr int kReplays = 20;
constexpr int kSpinNs = 1000;

void launch(Kind kind, cudaStream_t s, unsigned long long* stamps, int k, float* sink, int sms, int big_smem) {
  switch (kind) {
    case kBig: big_kernel<<<sms, 128, big_smem, s>>>(stamps, k, kSpinNs, sink, 0); break;
    case kBigTrigger: big_kernel<<<sms, 128, big_smem, s>>>(stamps, k, kSpinNs, sink, 1); break;
    case kTiny: tiny_kernel<<<4, 128, 0, s>>>(stamps, k, kSpinNs, sink); break;
    case kTinyShared: tiny_shared_kernel<<<4, 128, 0, s>>>(stamps, k, kSpinNs, sink); break;
    case kTinyPdl: {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(4);
      cfg.blockDim = dim3(128);
      cfg.stream = s;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, tiny_pdl_kernel, stamps, k, kSpinNs, sink));
      break;
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int big_smem = std::max(argc > 1 ? std::atoi(argv[1]) : 200 * 1024, 1024);  // >= 128 floats
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaFuncSetAttribute(big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, big_smem));
  CK(cudaFuncSetAttribute(tiny_shared_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned long long* stamps = nullptr;
  float* sink = nullptr;
  CK(cudaMalloc(&stamps, sizeof(unsigned long long) * 4 * kPairs));
  CK(cudaMalloc(&sink, sizeof(float)));
  std::vector<unsigned long long> init(4 * kPairs);
  for (int i = 0; i < 4 * kPairs; ++i) init[i] = i % 2 == 0 ? ~0ull : 0ull;

  const Case cases[] = {{"big->tiny", kBig, kTiny},
                        {"big->tiny(shared)", kBig, kTinyShared},
                        {"tiny->tiny", kTiny, kTiny},
                        {"big->big", kBig, kBig},
                        {"tiny(shared)->big", kTinyShared, kBig},
                        {"tiny->big", kTiny, kBig},
                        {"big->tiny pdl", kBigTrigger, kTinyPdl},
                        {"big->tiny pdl-end", kBig, kTinyPdl}};
  std::printf("kernel_gap: %d SMs, big kernel %d bytes of dynamic shared memory, %d pairs a graph, "
              "%d replays, spin %d ns a kernel\n", sms, big_smem, kPairs, kReplays, kSpinNs);
  std::printf("%-20s %12s %14s %14s\n", "case", "us / pair", "gap 1->2 (us)", "gap 2->1 (us)");
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Case& c : cases) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kPairs; ++i) {
      launch(c.first, s, stamps, 2 * i, sink, sms, big_smem);
      launch(c.second, s, stamps, 2 * i + 1, sink, sms, big_smem);
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<double> per_pair, gap12, gap21;
    for (int r = 0; r < kReplays + 2; ++r) {
      CK(cudaMemcpyAsync(stamps, init.data(), sizeof(unsigned long long) * init.size(),
                         cudaMemcpyHostToDevice, s));
      CK(cudaEventRecord(e0, s));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      if (r < 2) continue;  // warm-up
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      per_pair.push_back(1e3 * ms / kPairs);
      std::vector<unsigned long long> st(4 * kPairs);
      CK(cudaMemcpy(st.data(), stamps, sizeof(unsigned long long) * st.size(), cudaMemcpyDeviceToHost));
      for (int k = 0; k + 1 < 2 * kPairs; ++k) {
        const double gap = (double(st[2 * (k + 1)]) - double(st[2 * k + 1])) * 1e-3;
        (k % 2 == 0 ? gap12 : gap21).push_back(gap);
      }
    }
    std::printf("%-20s %12.2f %14.2f %14.2f\n", c.name, median(per_pair), median(gap12), median(gap21));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}

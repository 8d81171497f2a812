// Producer / consumer mbarrier patterns under compute-sanitizer's synccheck.
//
// synccheck (CUDA 13.0) reports "Barrier error detected. Missing wait." at the producer's
// mbarrier.arrive on the Q "full" barrier of the shared-selection tile kernel
// (csrc/sparse_attn/union_sm90.cuh), whose producer threads each pair cp.async.mbarrier.arrive
// (without .noinc) with an mbarrier.arrive, and re-arrive on a barrier they never wait on (the
// consumers' release of the paired "empty" barrier orders them). The pattern is valid PTX: every
// phase completes before its barrier is armed again. Mode 0 below reproduces the report on the
// H200 in a kernel of a few lines; the other modes are the alternatives, so that one run under
// synccheck shows which form the tool accepts:
//
//   0  cp.async.mbarrier.arrive + mbarrier.arrive, 128 arrivals a phase (union_sm90 today)
//   1  cp.async.mbarrier.arrive.noinc + mbarrier.arrive, 256 arrivals a phase
//   2  cp.async.wait_all, then mbarrier.arrive
//   3  as 0, and the producer waits for the previous phase of "full" before it arrives again
//   4  as 0 with two consumer warpgroups (256 consumers), as union_sm90
//   5  1 and 3 together
//   6  a plain shared-memory store, then mbarrier.arrive (proxy_score_sm90's converting threads,
//      which synccheck accepts)
//   7  cp.async.mbarrier.arrive.noinc alone, 128 arrivals a phase (CUTLASS's
//      cpasync_barrier_arrive_noinc producer commit)
//   8  as 7 for the copies, plus one plain mbarrier.arrive by one producer thread after a named
//      barrier of the producers (publishing their plain stores: union_sm90's tile plan), 129
//      arrivals a phase
//
//   nvcc -std=c++17 -arch=sm_90a -lineinfo -o mbarrier_patterns mbarrier_patterns.cu
//   compute-sanitizer --tool synccheck ./mbarrier_patterns MODE
// (tests/sanitizer/run_mbarrier_patterns.sh runs every mode; scripts/gpu_check.sh runs it with
// synccheck.) Each mode also checks its result and exits 1 when it is wrong. The kernels live in
// namespace flashmsa, as the library's do, so that mode 0 under the kernel filter gpu_check gives
// compute-sanitizer (--kernel-name kns=flashmsa) shows that the filter selects such kernels.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace flashmsa::sanitizer_patterns {
namespace {

__device__ __forceinline__ uint32_t smem(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ void init(uint32_t b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
__device__ void arrive(uint32_t b) {
  asm volatile("{.reg .b64 s; mbarrier.arrive.shared::cta.b64 s, [%0];}" ::"r"(b) : "memory");
}
__device__ void arrive_cp_async(uint32_t b) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(b) : "memory");
}
__device__ void arrive_cp_async_noinc(uint32_t b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(b) : "memory");
}
__device__ void wait(uint32_t b, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{.reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p;}"
                 : "=r"(done)
                 : "r"(b), "r"(parity)
                 : "memory");
  }
}
__device__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

constexpr int kProducers = 128;

// Two buffers of 128 x 16 bytes; iteration it fills buffer it & 1 from src rows it * 128...; each
// consumer sums the first word of its element over the iterations.
template <int kMode>
__global__ void pipeline(const int4* src, int* out, int iters) {
  constexpr int kConsumers = kMode == 4 ? 256 : 128;
  constexpr bool kNoinc = kMode == 1 || kMode == 5 || kMode == 7 || kMode == 8;
  constexpr int kFullCount = kMode == 1 || kMode == 5 ? 2 * kProducers : (kMode == 8 ? kProducers + 1 : kProducers);
  __shared__ alignas(16) int4 buf[2][kProducers];
  __shared__ alignas(8) uint64_t full[2], empty[2];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      init(smem(&full[i]), kFullCount);
      init(smem(&empty[i]), kConsumers);
    }
  }
  __syncthreads();
  if (tid >= kConsumers) {
    const int p = tid - kConsumers;
    for (int it = 0; it < iters; ++it) {
      const int b = it & 1;
      const uint32_t prev = ((it >> 1) & 1) ^ 1;  // the phase before this use (passes at once at first)
      wait(smem(&empty[b]), prev);
      if (kMode == 3 || kMode == 5) wait(smem(&full[b]), prev);
      if (kMode == 6) {
        buf[b][p] = src[it * kProducers + p];
        arrive(smem(&full[b]));
        continue;
      }
      cp_async_16(smem(&buf[b][p]), src + it * kProducers + p);
      if (kMode == 2) {
        asm volatile("cp.async.wait_all;" ::: "memory");
      } else if (kNoinc) {
        arrive_cp_async_noinc(smem(&full[b]));
      } else {
        arrive_cp_async(smem(&full[b]));
      }
      if (kMode == 7) continue;
      if (kMode == 8) {
        asm volatile("bar.sync 1, %0;" ::"n"(kProducers) : "memory");  // the producers only
        if (p == 0) arrive(smem(&full[b]));
        continue;
      }
      arrive(smem(&full[b]));
    }
  } else {
    int sum = 0;
    for (int it = 0; it < iters; ++it) {
      const int b = it & 1;
      wait(smem(&full[b]), (it >> 1) & 1);
      sum += buf[b][tid % kProducers].x;
      arrive(smem(&empty[b]));
    }
    out[blockIdx.x * kConsumers + tid] = sum;
  }
}

template <int kMode>
int run(const int4* src, int* out, int iters, int blocks) {
  constexpr int kConsumers = kMode == 4 ? 256 : 128;
  pipeline<kMode><<<blocks, kConsumers + kProducers>>>(src, out, iters);
  const cudaError_t e = cudaDeviceSynchronize();
  int* h = new int[blocks * kConsumers];
  cudaMemcpy(h, out, sizeof(int) * blocks * kConsumers, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < blocks * kConsumers; ++i) {
    long want = 0;  // src word 4 * (it * 128 + p) holds that index
    for (int it = 0; it < iters; ++it) want += 4 * (it * kProducers + (i % kConsumers) % kProducers);
    bad += h[i] != int(want);
  }
  delete[] h;
  printf("mode %d: %s, %d of %d sums wrong\n", kMode, cudaGetErrorString(e), bad, blocks * kConsumers);
  return e == cudaSuccess && bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace flashmsa::sanitizer_patterns

int main(int argc, char** argv) {
  using namespace flashmsa::sanitizer_patterns;
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  const int iters = 16, blocks = 4;
  int4* src = nullptr;
  int* out = nullptr;
  cudaMalloc(&src, sizeof(int4) * iters * kProducers);
  cudaMalloc(&out, sizeof(int) * blocks * 256);
  int* h = new int[iters * kProducers * 4];
  for (int i = 0; i < iters * kProducers * 4; ++i) h[i] = i;
  cudaMemcpy(src, h, sizeof(int4) * iters * kProducers, cudaMemcpyHostToDevice);
  delete[] h;
  switch (mode) {
    case 0: return run<0>(src, out, iters, blocks);
    case 1: return run<1>(src, out, iters, blocks);
    case 2: return run<2>(src, out, iters, blocks);
    case 3: return run<3>(src, out, iters, blocks);
    case 4: return run<4>(src, out, iters, blocks);
    case 5: return run<5>(src, out, iters, blocks);
    case 6: return run<6>(src, out, iters, blocks);
    case 7: return run<7>(src, out, iters, blocks);
    case 8: return run<8>(src, out, iters, blocks);
    default: fprintf(stderr, "mode must be 0..8, got %d\n", mode); return 2;
  }
}

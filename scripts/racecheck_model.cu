// Model of kv_major_sm90_kernel's item loop for compute-sanitizer racecheck (not part of the build).
// Thread 0 writes an item record, __syncthreads, every thread reads it; then each warpgroup runs
// rounds of its own named barrier (bar.sync id, 128), as many as it has tiles, and a closing
// __syncthreads. Every access to the record is ordered by the CTA barriers, yet racecheck reports
// hazards between the write and the reads whenever the warpgroups run unequal numbers of rounds
// (variants 0, 1), and none once every warpgroup runs the same number (2, 3: idle rounds pass the
// barriers only). Variant 4 drops the named barriers, a real race on buf, and must be reported.
// H200, CUDA 13.0, 2026-11-29: 0 and 1 reported (360 / 352 hazards), 2 and 3 clean, 4 reported.
//   nvcc -arch=sm_90a -lineinfo -o rr scripts/racecheck_model.cu
//   for v in 0 1 2 3 4; do compute-sanitizer --tool racecheck ./rr $v; done
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

struct Rec { int kh, rows, pad[6]; };

template <bool kDouble, int kMode>  // kMode 0: unequal named-barrier rounds, 1: padded to equal, 2: none
__global__ void __launch_bounds__(512, 1) loop_kernel(int* counter, const int* rows_of, int n_items, int* sink) {
  __shared__ Rec rec[2];
  __shared__ int buf[4][64];
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127;
  int acc = 0;
  for (int parity = 0;; parity ^= 1) {
    Rec& r = rec[kDouble ? parity : 0];
    if (tid == 0) {
      const int i = atomicAdd(counter, 1);
      Rec v{};
      v.kh = i < n_items ? i : -1;
      v.rows = i < n_items ? rows_of[i] : 0;
      r = v;
    }
    __syncthreads();
    if (r.kh < 0) break;
    const int tiles = (r.rows + 63) / 64;
    const int mine = tiles > wg ? (tiles - wg + 3) / 4 : 0;
    const int rounds = kMode == 1 ? (tiles + 3) / 4 : mine;
    if (kMode != 2) asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");  // the prefetch's barrier
    for (int t = 0; t < rounds; ++t) {
      if (wtid < 64 && t < mine) buf[wg][wtid] = r.kh + t;
      if (kMode != 2) asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
      if (t < mine) acc += buf[wg][(wtid + 1) & 63];
      if (kMode != 2) asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
    }
    __syncthreads();
  }
  if (acc == 123456789) *sink = acc;
}

int main(int argc, char** argv) {
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  const int n_items = 64;
  int h_rows[n_items];
  for (int i = 0; i < n_items; ++i) h_rows[i] = (i % 5 == 0) ? 640 : 16 * (1 + i % 3);  // few tiles: idle warpgroups
  int *counter, *rows, *sink;
  cudaMalloc(&counter, 4); cudaMalloc(&rows, sizeof(h_rows)); cudaMalloc(&sink, 4);
  cudaMemcpy(rows, h_rows, sizeof(h_rows), cudaMemcpyHostToDevice);
  const char* names[] = {"single/unequal", "double/unequal", "single/padded", "double/padded", "single/none"};
  for (int variant = 0; variant < 5; ++variant) {
    if (only >= 0 && variant != only) continue;
    cudaMemset(counter, 0, 4);
    switch (variant) {
      case 0: loop_kernel<false, 0><<<4, 512>>>(counter, rows, n_items, sink); break;
      case 1: loop_kernel<true, 0><<<4, 512>>>(counter, rows, n_items, sink); break;
      case 2: loop_kernel<false, 1><<<4, 512>>>(counter, rows, n_items, sink); break;
      case 3: loop_kernel<true, 1><<<4, 512>>>(counter, rows, n_items, sink); break;
      default: loop_kernel<false, 2><<<4, 512>>>(counter, rows, n_items, sink); break;
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("=== variant %s: %s\n", names[variant], cudaGetErrorString(e));
    fflush(stdout);
  }
  return 0;
}

// Does compute-sanitizer initcheck see global memory written by a TMA store?
//
// The KV-major sm_90a kernel writes its partials with `cp.async.bulk.tensor.2d.global.shared::cta`
// (kv_major_store=tma) and the combine reads them with ordinary loads. If initcheck does not count
// a TMA store as a write, every such read is reported as uninitialized although the bytes were
// written. This program writes a fresh cudaMalloc'd buffer (never memset) in one of three ways and
// then reads all of it with ordinary 16-byte loads:
//   mode 0: ordinary st.global (the control: initcheck must report nothing)
//   mode 1: a 2-D TMA tensor store of the same bytes (the form the KV-major kernel uses)
//   mode 2: a 1-D bulk store (cp.async.bulk.global.shared::cta) of the same bytes
//   mode 3: nothing written (the positive control: initcheck must report the reads)
// Each mode checks its own result (the reader's sum against the host's), then prints one line;
// run_initcheck_tma_store.sh runs every mode under initcheck and counts the reports.
// Needs an sm_90 GPU; build: nvcc -std=c++17 -arch=sm_90a -lineinfo initcheck_tma_store.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kRows = 16, kCols = 128;                // one box: 16 rows x 128 bf16-sized values
constexpr int kBytes = kRows * kCols * 2;             // 4 KB
constexpr int kBoxes = 8;                             // the buffer: 8 boxes stacked by rows
constexpr int kThreads = 128;

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

__device__ uint16_t value_of(int box, int i) { return uint16_t((box * 7919 + i * 31) & 0x7fff); }

__global__ void write_kernel(int mode, uint16_t* dst, const __grid_constant__ CUtensorMap map) {
  __shared__ alignas(128) uint16_t tile[kRows * kCols];
  const int box = blockIdx.x;
  for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) tile[i] = value_of(box, i);
  if (mode == 0) {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) dst[box * kRows * kCols + i] = tile[i];
    return;
  }
  // The tile's generic writes made visible to the async proxy, then one thread stores it.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t src = uint32_t(__cvta_generic_to_shared(tile));
  if (mode == 1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(&map)),
                 "r"(src), "r"(0), "r"(box * kRows)
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst + box * kRows * kCols),
                 "r"(src), "r"(kBytes)
                 : "memory");
  }
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__global__ void read_kernel(const uint4* src, unsigned long long* sum) {
  const int n = kBoxes * kBytes / 16;
  unsigned long long s = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint4 v = src[i];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (uint32_t x : w) s += (x & 0xffffu) + (x >> 16);
  }
  atomicAdd(sum, s);
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  if (mode < 0 || mode > 3) {
    std::fprintf(stderr, "usage: %s MODE (0 st.global, 1 TMA tensor store, 2 bulk store, 3 none)\n", argv[0]);
    return 2;
  }
  uint16_t* buf = nullptr;
  unsigned long long* sum = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, size_t(kBoxes) * kBytes));
  CHECK_CUDA(cudaMalloc(&sum, sizeof(*sum)));
  CHECK_CUDA(cudaMemset(sum, 0, sizeof(*sum)));

  CUtensorMap map{};
  const cuuint64_t dims[2] = {kCols, cuuint64_t(kRows) * kBoxes};
  const cuuint64_t strides[1] = {kCols * 2};
  const cuuint32_t box[2] = {kCols, kRows}, elem[2] = {1, 1};
  // 128 values of 2 bytes = 256 bytes a row: past the 128-byte swizzle span, so no swizzle (the
  // tile is stored row-major as written).
  if (cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, buf, dims, strides, box, elem,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                             CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    return 2;
  }
  if (mode != 3) write_kernel<<<kBoxes, kThreads>>>(mode, buf, map);
  CHECK_CUDA(cudaGetLastError());
  read_kernel<<<8, 128>>>(reinterpret_cast<const uint4*>(buf), sum);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long got = 0;
  CHECK_CUDA(cudaMemcpy(&got, sum, sizeof(got), cudaMemcpyDeviceToHost));
  unsigned long long want = 0;
  for (int b = 0; b < kBoxes; ++b)
    for (int i = 0; i < kRows * kCols; ++i) want += (b * 7919 + i * 31) & 0x7fff;
  const char* names[] = {"st.global", "TMA tensor store", "bulk store", "nothing written"};
  if (mode == 3) {
    std::printf("mode 3 (%s): read %d bytes nothing wrote\n", names[mode], kBoxes * kBytes);
    return 0;
  }
  std::printf("mode %d (%s): %s (sum %llu, expected %llu)\n", mode, names[mode],
              got == want ? "bytes as written" : "WRONG BYTES", got, want);
  return got == want ? 0 : 1;
}

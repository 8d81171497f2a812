// How fast can one SM's load path stream the 128-token K / V blocks of a paged cache? The decode
// and MTP kernels read exactly this: per unit a K page and a V page of one kv head, 128 rows x 256
// bytes (bf16, 128 dims) each, 32 KB contiguous, at random pages of a cache much larger than L2.
// Each variant streams the same units through a ring of `stages` 64 KB slots per CTA with nothing
// to compute, so the rate it reaches is the ceiling of that load form at that depth:
//   tma_half   two 2-D TMA boxes per page, 64 dims x 128 rows each (128-byte swizzle): the form the
//              sm_90a MTP / KV-major / tile kernels use (encode_kv_block_map, box0 64), each box
//              reading 128 of every 256 bytes
//   tma_quart  four boxes per page, 64 dims x 64 rows: the two halves of 64 rows back to back
//   tma_row    one box per page over the page viewed as 256 rows of 128 bytes (contiguous 32 KB)
//   tma_paged  the library's paged map (rank 4: dims, rows, 4 heads, pages of 128 KB), two boxes
//   bulk       one cp.async.bulk of 32 KB per page (no tensor map)
//   cp_async   128 threads, 16-byte cp.async each, commit groups (the query-major kernels' form)
// Each TMA form runs with the tensor map's three L2 promotion modes (none, 128 B, 256 B; the
// library's maps use 128 B since this tool measured 256 B 5-7 % slower).
// Usage: kv_stream [units [random|heads [sms]]] (default 4096 units = 268 MB, the MTP benchmark's
// B64 / 32K bytes; pages at random, or one head's quarter of random 4-head pages, as the decode
// benchmark's caches; sms: the grid of that many SMs' CTAs instead of the device's, to see what a
// few SMs pull while the rest are idle: the per-SM rate a combine running beside the KV-major
// attention kernel on ~10 % of the SMs could reach, docs/design/sparse_attention.md#combine-lse-ahead).
// Prints one line per (variant, CTAs per SM, stages) with the median time and GB/s over 9 runs,
// each run on pages no earlier run read (the pool is 4 GB) and timed by CUDA events behind a GPU
// spin that covers the host's enqueue; a device-to-device copy's rate; and the time of the same grid
// with nothing to load (launch, start and exit).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.h"

#include "common/mbarrier.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"

namespace {

using namespace flashmsa;

constexpr int kPageBytes = 128 * 256;     // 128 tokens x 128 bf16 dims
constexpr int kUnitBytes = 2 * kPageBytes;  // K page + V page
constexpr int kThreads = 128;

enum Variant : int { kTmaHalf, kTmaQuart, kTmaRow, kTmaPaged, kBulk, kCpAsync, kNumVariants };
const char* const kNames[kNumVariants] = {"tma_half", "tma_quart", "tma_row", "tma_paged", "bulk", "cp_async"};

struct Args {
  CUtensorMap map_half;   // rows of 256 bytes: dims {128, pages * 128}, box {64, 128}
  CUtensorMap map_quart;  // the same, box {64, 64}
  CUtensorMap map_row;    // rows of 128 bytes: dims {64, pages * 256}, box {64, 256}
  CUtensorMap map_paged;  // the library's paged K / V map: dims {128, 128, 4 heads, pages / 4}, box {64, 128, 1, 1}
  const uint8_t* pool;
  const int* pages;  // 2 per unit
  int units;
  int stages;
  unsigned* sink;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
#endif

// One page into shared memory at dst by the variant's form (one thread).
template <int kV>
__device__ void load_page(const Args& a, int page, uint32_t dst, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kV == kTmaHalf) {
    tma_load_2d(dst, &a.map_half, bar, 0, page * 128);
    tma_load_2d(dst + kPageBytes / 2, &a.map_half, bar, 64, page * 128);
  } else if constexpr (kV == kTmaQuart) {
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h)
        tma_load_2d(dst + uint32_t((2 * r + h) * kPageBytes / 4), &a.map_quart, bar, 64 * h, page * 128 + 64 * r);
  } else if constexpr (kV == kTmaRow) {
    tma_load_2d(dst, &a.map_row, bar, 0, page * 256);
  } else if constexpr (kV == kTmaPaged) {  // page p = head p % 4 of 128 KB page p / 4
    tma_load_4d(dst, &a.map_paged, bar, 0, 0, page & 3, page >> 2);
    tma_load_4d(dst + kPageBytes / 2, &a.map_paged, bar, 64, 0, page & 3, page >> 2);
  } else {
    bulk_load(dst, a.pool + int64_t(page) * kPageBytes, kPageBytes, bar);
  }
#endif
}

// The mbarrier ring: thread 0 produces, thread 32 consumes (waits full, touches one word, frees).
template <int kV>
__global__ void __launch_bounds__(kThreads) stream_tma(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[8], empty[8];
  const int S = a.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(smem_addr(&full[s]), 1);
      mbar_init(smem_addr(&empty[s]), 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const int n = a.units > int(blockIdx.x) ? (a.units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < n; ++i) {
      const int s = i % S, u = int(blockIdx.x) + i * int(gridDim.x);
      mbar_wait(smem_addr(&empty[s]), ((i / S) & 1) ^ 1);
      const uint32_t bar = smem_addr(&full[s]), dst = smem_addr(smem) + uint32_t(s * kUnitBytes);
      mbar_expect_tx(bar, kUnitBytes);
      load_page<kV>(a, a.pages[2 * u], dst, bar);
      load_page<kV>(a, a.pages[2 * u + 1], dst + kPageBytes, bar);
    }
  } else if (threadIdx.x == 32) {
    unsigned acc = 0;
    for (int i = 0; i < n; ++i) {
      const int s = i % S;
      mbar_wait(smem_addr(&full[s]), (i / S) & 1);
      acc += *reinterpret_cast<const unsigned*>(smem + s * kUnitBytes + (i & 255) * 4);
      mbar_arrive(smem_addr(&empty[s]));
    }
    if (acc == 0x12345678u) *a.sink = acc;  // keeps the reads
  }
#endif
}

// The cp.async ring: every thread copies 16 bytes at a time, S - 1 units in flight while one waits.
template <int S>
__global__ void __launch_bounds__(kThreads) stream_cp_async(const __grid_constant__ Args a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int n = a.units > int(blockIdx.x) ? (a.units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  auto issue = [&](int i) {
    if (i < n) {
      const int u = int(blockIdx.x) + i * int(gridDim.x);
      const uint32_t dst = smem_addr(smem) + uint32_t((i % S) * kUnitBytes);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* src = a.pool + int64_t(a.pages[2 * u + h]) * kPageBytes;
        for (int c = threadIdx.x; c < kPageBytes / 16; c += kThreads)
          cp_async_16(dst + uint32_t(h * kPageBytes + c * 16), src + c * 16);
      }
    }
    cp_async_commit();
  };
  for (int i = 0; i < S - 1; ++i) issue(i);
  unsigned acc = 0;
  for (int i = 0; i < n; ++i) {
    issue(i + S - 1);
    cp_async_wait<S - 1>();
    __syncthreads();
    acc += *reinterpret_cast<const unsigned*>(smem + (i % S) * kUnitBytes + threadIdx.x * 4);
    __syncthreads();
  }
  if (acc == 0x12345678u) *a.sink = acc;
}

// Keeps the GPU busy for `ns` nanoseconds: queued before the first event of a timed launch, it
// covers the host's enqueue of that launch, so the events bracket GPU work only (the method of
// benchmarks/bench_msa.py; without it the host's launch time, ~5-8 us here, lands inside).
__global__ void spin(int64_t ns) {
  int64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// Launches one variant over `units` units whose pages start at pages + offset (a fresh stretch
// of the shuffled pool per run: no page of an earlier run, so nothing is an L2 hit).
void launch(int v, int ctas, int stages, const Args& base, int sms, cudaStream_t st) {
  Args a = base;
  a.stages = stages;
  const int smem = stages * kUnitBytes;
  const int grid = sms * ctas;
  auto go = [&](auto kernel) { kernel<<<grid, kThreads, smem, st>>>(a); };
  switch (v) {
    case kTmaHalf: go(stream_tma<kTmaHalf>); break;
    case kTmaQuart: go(stream_tma<kTmaQuart>); break;
    case kTmaRow: go(stream_tma<kTmaRow>); break;
    case kTmaPaged: go(stream_tma<kTmaPaged>); break;
    case kBulk: go(stream_tma<kBulk>); break;
    default:
      if (stages == 1) go(stream_cp_async<1>);
      else if (stages == 2) go(stream_cp_async<2>);
      else go(stream_cp_async<3>);
  }
  CK(cudaGetLastError());
}

// The shared-memory opt-in of every kernel, once (3 stages of 64 KB at most).
void opt_in() {
  const int smem = 3 * kUnitBytes;
  auto set = [&](auto kernel) { CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)); };
  set(stream_tma<kTmaHalf>);
  set(stream_tma<kTmaQuart>);
  set(stream_tma<kTmaRow>);
  set(stream_tma<kTmaPaged>);
  set(stream_tma<kBulk>);
  set(stream_cp_async<1>);
  set(stream_cp_async<2>);
  set(stream_cp_async<3>);
}

}  // namespace

int main(int argc, char** argv) {
  const int units = argc > 1 ? std::atoi(argv[1]) : 4096;
  if (units <= 0 || (argc > 2 && std::string(argv[2]) != "random" && std::string(argv[2]) != "heads")) {
    std::fprintf(stderr, "usage: kv_stream [units > 0 [random|heads [sms > 0]]]\n");
    return 2;
  }
  constexpr int64_t kPoolPages = 131072;  // 4 GB
  constexpr int kRuns = 9;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (argc > 3) {
    const int want = std::atoi(argv[3]);
    if (want <= 0 || want > sms) {
      std::fprintf(stderr, "sms must be in 1..%d\n", sms);
      return 2;
    }
    sms = want;
  }
  uint8_t* pool = nullptr;
  CK(cudaMalloc(&pool, kPoolPages * kPageBytes));
  CK(cudaMemset(pool, 0x3c, kPoolPages * kPageBytes));
  // A shuffled pool, cut into stretches of 2 * units pages: run r reads stretch r.
  const int64_t stretches = kPoolPages / (2 * int64_t(units));
  if (stretches < 2) {
    std::fprintf(stderr, "units too large for the pool\n");
    return 1;
  }
  // Pages: "random" (default) anywhere in the pool; "heads": one kv head's 32 KB of a random
  // 128 KB page of 4 heads, the head cycling from unit to unit (the decode benchmark's caches,
  // (pages, 4, 128, 128), where a selected block reads its head's quarter of a page).
  const bool heads = argc > 2 && std::string(argv[2]) == "heads";
  std::vector<int> perm(kPoolPages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(1234);
  if (heads) {
    std::vector<int> big(kPoolPages / 4);
    std::iota(big.begin(), big.end(), 0);
    std::shuffle(big.begin(), big.end(), rng);
    for (int64_t i = 0; i < kPoolPages; ++i) perm[i] = 4 * big[i % (kPoolPages / 4)] + int((i / 2) % 4);
  } else {
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  int* pages = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc(&pages, perm.size() * sizeof(int)));
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  CK(cudaMemcpy(pages, perm.data(), perm.size() * sizeof(int), cudaMemcpyHostToDevice));

  Args base{};
  base.pool = pool;
  base.units = units;
  base.sink = sink;
  // The tensor maps of one L2 promotion mode.
  auto encode_maps = [&](Args& a, CUtensorMapL2promotion promo) {
    auto enc = [&](CUtensorMap& m, const cuuint64_t* dims, cuuint64_t stride, const cuuint32_t* box) {
      const cuuint32_t es[2] = {1, 1};
      const cuuint64_t st[1] = {stride};
      return cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, st, box, es,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promo,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    };
    const cuuint64_t dims_half[2] = {128, cuuint64_t(kPoolPages) * 128};
    const cuuint64_t dims_row[2] = {64, cuuint64_t(kPoolPages) * 256};
    const cuuint32_t box_half[2] = {64, 128}, box_quart[2] = {64, 64}, box_row[2] = {64, 256};
    const cuuint64_t dims_paged[4] = {128, 128, 4, cuuint64_t(kPoolPages) / 4};
    const cuuint64_t strides_paged[3] = {256, kPageBytes, 4 * kPageBytes};
    const cuuint32_t box_paged[4] = {64, 128, 1, 1}, es4[4] = {1, 1, 1, 1};
    const bool paged_ok =
        cuTensorMapEncodeTiled(&a.map_paged, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, pool, dims_paged, strides_paged,
                               box_paged, es4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promo,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    if (!paged_ok || !enc(a.map_half, dims_half, 256, box_half) || !enc(a.map_quart, dims_half, 256, box_quart) ||
        !enc(a.map_row, dims_row, 128, box_row)) {
      std::fprintf(stderr, "tensor map encoding failed\n");
      std::exit(1);
    }
  };
  opt_in();
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double bytes = double(units) * kUnitBytes;
  // The median time in ms of kRuns calls of enqueue(r) (r = 1 .. kRuns; call 0 warms up), each
  // behind a GPU spin that covers the host's enqueue.
  auto time_median = [&](auto enqueue) {
    std::vector<float> t;
    for (int r = 0; r < kRuns + 1; ++r) {
      spin<<<1, 1, 0, st>>>(100000);
      CK(cudaEventRecord(e0, st));
      enqueue(r);
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r > 0) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };

  // Device-to-device copy of 1 GB (read + write counted), the benchmarks' "copy" ceiling.
  {
    const int64_t n = int64_t(1) << 30;
    const float ms = time_median([&](int r) {
      CK(cudaMemcpyAsync(pool + n * (2 * (r % 2)), pool + n, n, cudaMemcpyDeviceToDevice, st));
    });
    std::printf("copy 1 GiB d2d: %.1f GB/s (read + write)\n", 2.0 * double(n) / (ms * 1e-3) / 1e9);
  }
  std::printf("units %d (%.1f MB), pages of %d bytes (%s), %d SMs\n", units, bytes / 1e6, kPageBytes,
              heads ? "heads" : "random", sms);
  {  // The same grid with no unit to load: launch, start and exit alone.
    encode_maps(base, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
    Args a = base;
    a.units = 0;
    a.pages = pages;
    const float ms = time_median([&](int) { launch(kTmaHalf, 1, 3, a, sms, st); });
    std::printf("empty grid (no units): %.1f us\n", ms * 1e3);
  }
  std::printf("%-10s %-9s %5s %7s %10s %9s\n", "variant", "l2_promo", "ctas", "stages", "median_us", "GB/s");
  const int configs[][2] = {{1, 3}, {2, 2}};
  const CUtensorMapL2promotion promos[] = {CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
  const char* const promo_names[] = {"none", "128B", "256B"};
  for (int v = 0; v < kNumVariants; ++v) {
    const bool tensor = v == kTmaHalf || v == kTmaQuart || v == kTmaRow || v == kTmaPaged;
    for (int pr = tensor ? 0 : 2; pr < 3; ++pr) {
      encode_maps(base, promos[pr]);
      for (const auto& c : configs) {
        const int ctas = c[0], stages = c[1];
        const float ms = time_median([&](int r) {
          Args a = base;
          a.pages = pages + (int64_t(r) % stretches) * 2 * units;  // pages no earlier run read
          launch(v, ctas, stages, a, sms, st);
        });
        std::printf("%-10s %-9s %5d %7d %10.1f %9.1f\n", kNames[v], tensor ? promo_names[pr] : "-", ctas, stages,
                    ms * 1e3, bytes / (ms * 1e-3) / 1e9);
      }
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}

// Can a KV-major prefill keep its partials in L2? The 32K random prefill spends ~4 of its ~8 ms
// moving partials through HBM: the KV-major kernel writes ~8.6 GB of them and the combine reads
// them back (docs/design/sparse_attention.md, "What would beat the KV-major floor on random
// selections"). The schedule that design names takes one kv head and ~256 query tokens at a
// time, so that a group's partials (~16.8 MB), its Q rows and the kv head's K/V (16 MB at 32K)
// all fit in the 60 MB L2, and the group's combine reads its partials back from there. Its
// premise, measured here without any attention arithmetic: the memory traffic of such groups,
// one after another.
//
// A group is two phases over the whole GPU:
//   A  (the attention) reads `reads` MB from a 16 MB buffer that every group reads again (the
//      kv head's K/V once and its Q rows gathered once per selection: 32 MB of reads a group in
//      the design) and writes `part` MB of partials;
//   B  (the combine) reads the group's partials back, 16 slots per output value, and writes
//      part / 16 MB of output.
// Partials go either to one range every group reuses (`l2`: the design) or to the next range of
// a 2 GiB region each group (`hbm`: today's launch groups, whose partials leave L2). The phases
// are separated either by kernel boundaries (`graph`: the groups' 2 launches each captured in one
// CUDA graph) or by grid-wide barriers inside one cooperative kernel (`coop`: the persistent
// kernel the design needs, since ~512 groups at 32K would otherwise be ~1000 launches). Printed
// per case: microseconds a group (median of 5 runs of `groups` groups) and the rate of all of a
// group's bytes (reads + partials written and read + output).
// Usage: l2_partials [groups (default 64)]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

namespace {

namespace cg = cooperative_groups;

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kReadBuffer = 16 * kMiB;  // a power of two: reads wrap by a mask
constexpr size_t kRegion = 2048 * kMiB;    // the hbm mode's partial region
constexpr int kSlots = 16;                 // partials a combined value reads (top-16)
constexpr int kThreads = 256;

struct Group {
  const uint4* rd;  // the resident read buffer (kReadBuffer bytes)
  size_t reads;     // 16-byte reads a group
  uint4* part;      // this group's partials
  size_t part_n;    // 16-byte partial chunks a group (a multiple of kSlots)
  uint4* out;       // part_n / kSlots chunks
};

__device__ __forceinline__ uint4 xor4(uint4 a, uint4 b) {
  return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

// Phase A: the reads (through L2, not L1) and the partial writes, interleaved as the attention
// kernel interleaves its gathers and its partial stores. The written values do not wait for the
// reads (no dependent chain); what was read goes to `sink` so that the loads stay.
__device__ void phase_a(const Group& g, size_t tid, size_t nthreads, uint4* sink) {
  const size_t mask = kReadBuffer / sizeof(uint4) - 1;
  const size_t n = g.reads > g.part_n ? g.reads : g.part_n;
  uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll 4
  for (size_t i = tid; i < n; i += nthreads) {
    if (i < g.reads) acc = xor4(acc, __ldcg(g.rd + (i & mask)));
    if (i < g.part_n) g.part[i] = make_uint4(uint32_t(i), uint32_t(i >> 32), 1u, 2u);
  }
  if (acc.x == 0x12345678u && acc.y == 0x9abcdef0u) *sink = acc;
}

// Phase B: value o is the xor of its kSlots partial chunks (slot-major: slot s of value o at
// s * (part_n / kSlots) + o, coalesced across the threads), all of a thread's loads in flight.
__device__ void phase_b(const Group& g, size_t tid, size_t nthreads) {
  const size_t out_n = g.part_n / kSlots;
  for (size_t o = tid; o < out_n; o += nthreads) {
    uint4 v[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) v[s] = __ldcg(g.part + s * out_n + o);
    uint4 acc = v[0];
#pragma unroll
    for (int s = 1; s < kSlots; ++s) acc = xor4(acc, v[s]);
    g.out[o] = acc;
  }
}

__global__ void __launch_bounds__(kThreads) phase_a_kernel(Group g, uint4* sink) {
  phase_a(g, size_t(blockIdx.x) * kThreads + threadIdx.x, size_t(gridDim.x) * kThreads, sink);
}

__global__ void __launch_bounds__(kThreads) phase_b_kernel(Group g) {
  phase_b(g, size_t(blockIdx.x) * kThreads + threadIdx.x, size_t(gridDim.x) * kThreads);
}

// All groups in one cooperative launch: the group's partials at part0 + (k * stride) % region.
__global__ void __launch_bounds__(kThreads) coop_kernel(Group g, int groups, size_t stride_n,
                                                        size_t region_n, uint4* sink) {
  cg::grid_group grid = cg::this_grid();
  const size_t tid = size_t(blockIdx.x) * kThreads + threadIdx.x;
  const size_t nthreads = size_t(gridDim.x) * kThreads;
  uint4* const part0 = g.part;
  for (int k = 0; k < groups; ++k) {
    g.part = part0 + (size_t(k) * stride_n) % region_n;
    phase_a(g, tid, nthreads, sink);
    grid.sync();
    phase_b(g, tid, nthreads);
    grid.sync();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  bool l2;        // partials reused in place (else a new range of the region each group)
  bool coop;      // one cooperative kernel (else two launches a group in a graph)
  size_t reads;   // MiB read a group
  size_t part;    // MiB of partials a group
};

}  // namespace

int main(int argc, char** argv) {
  const int groups = std::max(argc > 1 ? std::atoi(argv[1]) : 64, 1);
  int dev = 0, sms = 0, l2_bytes = 0, coop_ok = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, dev));
  CK(cudaDeviceGetAttribute(&coop_ok, cudaDevAttrCooperativeLaunch, dev));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_kernel, kThreads, 0));
  const int grid = sms * std::max(per_sm, 1);
  uint4 *rd = nullptr, *part = nullptr, *out = nullptr, *sink = nullptr;
  CK(cudaMalloc(&rd, kReadBuffer));
  CK(cudaMalloc(&part, kRegion));
  CK(cudaMalloc(&out, kRegion / kSlots));
  CK(cudaMalloc(&sink, sizeof(uint4)));
  CK(cudaMemset(rd, 1, kReadBuffer));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::printf("l2_partials: %d SMs, L2 %d MiB, %d CTAs of %d threads, %d groups a run, median of 5 runs\n",
              sms, l2_bytes >> 20, grid, kThreads, groups);
  std::printf("%-4s %-6s %9s %9s %12s %12s\n", "mode", "phases", "reads MiB", "part MiB", "us / group",
              "GB/s");
  // The reads alone first (part 0: no partials): the rate of L2-resident reads.
  const std::vector<Case> cases = {
      {true, false, 32, 0},  {true, false, 0, 16},  {false, false, 0, 16}, {true, true, 0, 16},   {false, true, 0, 16},
      {true, false, 32, 8},  {false, false, 32, 8}, {true, true, 32, 8},   {false, true, 32, 8},
      {true, false, 32, 16}, {false, false, 32, 16}, {true, true, 32, 16}, {false, true, 32, 16},
      {true, false, 32, 24}, {false, false, 32, 24}, {true, true, 32, 24}, {false, true, 32, 24},
      {true, true, 32, 32},  {false, true, 32, 32}};
  for (const Case& c : cases) {
    if (c.coop && !coop_ok) continue;
    Group g{rd, c.reads * kMiB / sizeof(uint4), part, c.part * kMiB / sizeof(uint4), out};
    // Whole groups of the region only (a 24 MiB group does not divide 2 GiB).
    const size_t region_n = g.part_n ? kRegion / sizeof(uint4) / g.part_n * g.part_n : 1;
    const size_t stride_n = c.l2 ? 0 : g.part_n;
    cudaGraphExec_t ge = nullptr;
    if (!c.coop) {
      cudaGraph_t graph;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int k = 0; k < groups; ++k) {
        Group gk = g;
        gk.part = part + (size_t(k) * stride_n) % region_n;
        phase_a_kernel<<<grid, kThreads, 0, s>>>(gk, sink);
        phase_b_kernel<<<grid, kThreads, 0, s>>>(gk);
      }
      CK(cudaStreamEndCapture(s, &graph));
      CK(cudaGraphInstantiate(&ge, graph, 0));
      CK(cudaGraphDestroy(graph));
    }
    std::vector<double> us;
    for (int r = 0; r < 6; ++r) {
      CK(cudaEventRecord(e0, s));
      if (c.coop) {
        int n = groups;
        size_t sn = stride_n, rn = region_n;
        void* args[] = {&g, &n, &sn, &rn, &sink};
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(coop_kernel), grid, kThreads, args, 0, s));
      } else {
        CK(cudaGraphLaunch(ge, s));
      }
      CK(cudaEventRecord(e1, s));
      CK(cudaStreamSynchronize(s));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r > 0) us.push_back(1e3 * ms / groups);  // run 0 warms up
    }
    if (ge != nullptr) CK(cudaGraphExecDestroy(ge));
    const double t = median(us);
    const double bytes = double(c.reads + 2 * c.part) * kMiB + double(c.part * kMiB / kSlots);
    std::printf("%-4s %-6s %9zu %9zu %12.2f %12.0f\n", c.l2 ? "l2" : "hbm", c.coop ? "coop" : "graph", c.reads,
                c.part, t, bytes / (t * 1e3));
  }
  return 0;
}

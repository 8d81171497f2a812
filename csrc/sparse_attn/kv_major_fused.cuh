// combine=fused (kernel_traits.h#KvMajorFused): the task counts of a unit and the dependency
// counters, shared by the queue's prepare kernel (kv_major_lists.cu) and the persistent kernel
// (kv_major_sm90.cuh). docs/design/sparse_attention.md#fused-combine has the schedule and the
// deadlock-freedom argument.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "sparse_attn/kernel_traits.h"

namespace flashmsa::sparse_attn {

// Unit u = kh * groups + c: kv head kh of launch group c.
MSA_DEVICE int fused_unit_head(const KvMajorFused& f, int u) { return u / f.groups; }
MSA_DEVICE int fused_unit_group(const KvMajorFused& f, int u) { return u % f.groups; }

// Attention items of unit u (the scan's per-kv-head ranges of its group's items).
MSA_DEVICE int fused_unit_items(const KvMajorFused& f, int num_kv_heads, int u) {
  const int* ui = f.unit_items + int64_t(fused_unit_group(f, u)) * (num_kv_heads + 1);
  const int h = fused_unit_head(f, u);
  return ui[h + 1] - ui[h];
}

// Rows [r0, r0 + rows) of unit u's launch group.
MSA_DEVICE int fused_group_row0(const KvMajorArgs& a, int u) { return fused_unit_group(a.fused, u) * a.chunk_rows; }
MSA_DEVICE int fused_group_rows(const KvMajorArgs& a, int u) {
  return min(a.chunk_rows, a.p.total_q - fused_group_row0(a, u));
}

// Combine tasks of unit u: one per combine work tile (unit_rows rows, the standalone combine's
// units, aligned to the shared-selection tiles) that the group's rows touch.
MSA_DEVICE int fused_combine_tasks(const KvMajorArgs& a, int u) {
  const int t = a.fused.combine.unit_rows;
  const int r0 = fused_group_row0(a, u);
  return (r0 + fused_group_rows(a, u) - 1) / t - r0 / t + 1;
}

// Counters: [0, units) attention items done, [units, 2 units) combine tasks done, [2 units] the
// task queue.
MSA_DEVICE int* fused_attn_done(const KvMajorFused& f, int u) { return f.counters + u; }
MSA_DEVICE int* fused_combine_done(const KvMajorFused& f, int u) { return f.counters + f.units + u; }
MSA_DEVICE int* fused_next_task(const KvMajorFused& f) { return f.counters + 2 * f.units; }

MSA_DEVICE int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One thread: returns once *counter >= target (acquire: what the counted tasks wrote before their
// release is visible to this thread, and to its CTA after a __syncthreads).
MSA_DEVICE void fused_wait(const int* counter, int target) {
  int ns = 32;
  while (ld_acquire_gpu(counter) < target) {
    __nanosleep(ns);
    ns = min(2 * ns, 1024);
  }
}

// One thread, after a __syncthreads that follows every thread's stores of the task: publishes them
// at gpu scope and counts the task (the grid-barrier pattern of cooperative groups).
MSA_DEVICE void fused_release(int* counter) {
  __threadfence();
  atomicAdd(counter, 1);
}

}  // namespace flashmsa::sparse_attn

// Hopper bulk tensor copies (TMA, cp.async.bulk.tensor) completing on shared-memory mbarriers, the
// device half of the tensor-map path; common/tensor_map.h encodes the maps on the host.
//   tma_prefetch_map     pulls a tensor map (a __grid_constant__ kernel parameter) into the cache
//   mbar_expect_tx       one arrival on the barrier that also makes its current phase wait for
//                        `bytes` more bytes of asynchronous copies
//   tma_load_3d / _4d    one box of a rank-3 / rank-4 tensor map -> shared memory; the copy's bytes
//                        complete on `bar` (out-of-bounds elements are written as zero and still
//                        counted)
//   tma_load_*_hint      the same with an L2 cache policy (l2_policy_evict_last)
//   bulk_load            `bytes` contiguous bytes of global memory -> shared memory (cp.async.bulk,
//                        no tensor map; both addresses and `bytes` multiples of 16), completing on
//                        `bar` like the tensor copies
//   fence_mbarrier_init  makes mbarrier.init visible to the async proxy (before a __syncthreads)
//   tma_store_2d         one box of shared memory -> a rank-2 tensor map (cp.async.bulk.tensor,
//                        bulk-group completion); the writers of the box fence their generic writes
//                        (fence_proxy_async_smem) and pass a barrier before the one thread issues it
//   bulk_commit / bulk_wait_read<N> / bulk_wait<N>   the issuing thread's bulk groups: commit, wait
//                        until at most N groups still read their shared memory (the source may be
//                        overwritten), wait until at most N are incomplete (global writes done)
// Valid on sm_90 and up; callers guard with __CUDA_ARCH__ >= 900.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace flashmsa {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
MSA_DEVICE void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
MSA_DEVICE void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
MSA_DEVICE void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
      "%5}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// mbar_wait as one asm statement with the retry loop inside: to the compiler the wait is straight-line
// code, not a loop whose exit depends on a per-thread value (a divergent path in front of wgmma
// makes ptxas serialize the wgmmas, warning C7518).
MSA_DEVICE void mbar_wait_loop(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
MSA_DEVICE void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// An L2 policy that keeps the lines a copy brings in ahead of normal ones (createpolicy
// evict_last, all of them): for operands that many CTAs re-read while other data streams through.
MSA_DEVICE uint64_t l2_policy_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// tma_load_3d / _4d with an L2 cache policy (l2_policy_*).
MSA_DEVICE void tma_load_3d_hint(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                 uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}
MSA_DEVICE void tma_load_4d_hint(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                 int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
      "[%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}
MSA_DEVICE void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
MSA_DEVICE void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
MSA_DEVICE void tma_store_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}
MSA_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
MSA_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
MSA_DEVICE void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

}  // namespace flashmsa

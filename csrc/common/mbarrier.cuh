// Shared-memory mbarriers for the warp-specialized sm_90a kernels: a producer warp fills a buffer
// with cp.async and signals "full" when its copies have landed; consumer warpgroups wait for
// "full", compute, and signal "empty" so that the producer may refill it. A barrier's phase
// completes when its expected number of arrivals has arrived; waits name the phase by parity.
//   mbar_init           expected arrivals per phase (one thread, before a __syncthreads)
//   mbar_arrive         one arrival, release semantics (orders this thread's prior writes)
//   mbar_arrive_count   n arrivals at once by one thread (a phase one thread completes alone)
//   mbar_arrive_cp_async_noinc  one arrival, made when all of this thread's earlier cp.async
//                       copies have landed (counted in the expected arrivals: the form
//                       compute-sanitizer's synccheck accepts; pairing the counting form with a
//                       plain arrive, valid PTX too, is reported as "Missing wait":
//                       tests/sanitizer/mbarrier_patterns.cu). It orders only the copies: a
//                       thread's plain shared-memory stores need a plain arrive after them.
//   mbar_wait           until the phase of the given parity has completed (acquire)
//   mbar_test_wait      whether it has, without blocking
// A buffer used for the n-th time waits "full" with parity n & 1; its producer waits "empty" with
// parity (n & 1) ^ 1, which passes at once for n = 0 (the phase before the first never blocks).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

namespace flashmsa {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
MSA_DEVICE void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MSA_DEVICE void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
MSA_DEVICE void mbar_arrive_count(uint32_t bar, uint32_t n) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar), "r"(n)
               : "memory");
}
MSA_DEVICE void mbar_arrive_cp_async_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
MSA_DEVICE bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// Whether the phase of the given parity has completed, without blocking (acquire when it has).
MSA_DEVICE bool mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
MSA_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
#endif

}  // namespace flashmsa

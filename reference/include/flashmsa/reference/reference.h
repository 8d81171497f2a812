// Exact CPU reference of the four MSA ops. Takes the same validated Params as the kernels, with
// host pointers, and follows semantics.h rule for rule. Accumulates in fp32 except where a file
// says otherwise; multithreaded over independent output rows (bit-identical for any thread count).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>

#include "flashmsa/params.h"

namespace flashmsa::reference {

void proxy_score(const ProxyScoreParams& p);
void topk_select(const TopkSelectParams& p);
void sparse_attention(const SparseAttnParams& p);
void sparse_decode(const SparseDecodeParams& p);

// Runs fn(begin, end) over [0, n) split into contiguous chunks on up to num_threads() threads.
// Chunks are disjoint, so results never depend on the thread count.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
// Threads used by parallel_for: FLASHMSA_NUM_THREADS if set, else std::thread::hardware_concurrency.
// A worker thread that cannot be started makes parallel_for throw a kRuntime flashmsa::Error (after
// joining the threads it did start) instead of ending the process.
int num_threads();

// How parallel_for starts its worker threads: nullptr (the default) is std::thread(fn). For tests,
// which make a start fail; returns the previous starter. Not thread-safe: set it before calling.
using ThreadStarter = std::thread (*)(const std::function<void()>& fn);
ThreadStarter set_thread_starter(ThreadStarter starter);

}  // namespace flashmsa::reference

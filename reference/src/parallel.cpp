#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

#include "flashmsa/reference/reference.h"

namespace flashmsa::reference {

int num_threads() {
  if (const char* env = std::getenv("FLASHMSA_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(num_threads(), n);
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  // More chunks than threads so uneven rows (causal) balance; chunks are claimed in order.
  const int64_t chunks = std::min<int64_t>(n, threads * 8);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (int64_t c = next++; c < chunks; c = next++) {
      const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
      try {
        fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashmsa::reference

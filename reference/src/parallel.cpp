#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/reference/reference.h"

namespace flashmsa::reference {

namespace {

// How worker threads are started (tests replace it to make a start fail).
ThreadStarter g_thread_starter = nullptr;

std::thread start_thread(const std::function<void()>& fn) {
  if (g_thread_starter != nullptr) return g_thread_starter(fn);
  return std::thread(fn);
}

}  // namespace

ThreadStarter set_thread_starter(ThreadStarter starter) {
  const ThreadStarter previous = g_thread_starter;
  g_thread_starter = starter;
  return previous;
}

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
  pool.reserve(size_t(threads - 1));
  std::string start_error;
  for (int64_t t = 1; t < threads; ++t) {
    try {
      pool.push_back(start_thread(worker));
    } catch (const std::system_error& e) {
      // Threads already started are joined below (a joinable std::thread destroyed during
      // unwinding would terminate the process); they stop claiming chunks now.
      start_error = e.what();
      next = chunks;
      break;
    }
  }
  if (start_error.empty()) worker();
  for (auto& t : pool) t.join();
  if (!start_error.empty())
    detail::throw_error(ErrorKind::kRuntime, "CPU reference: could not start a worker thread (",
                        start_error, "); set FLASHMSA_NUM_THREADS lower");
  if (error) std::rethrow_exception(error);
}

}  // namespace flashmsa::reference

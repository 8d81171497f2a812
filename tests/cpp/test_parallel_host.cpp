// parallel_for of the CPU reference: a worker thread that cannot be started is an error the caller
// sees (flashmsa::Error, kRuntime), never std::terminate from a joinable thread being destroyed.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <system_error>
#include <thread>

#include "flashmsa/error.h"
#include "flashmsa/reference/reference.h"

namespace flashmsa::testing {
namespace {

std::atomic<int> g_started{0};

// Starts two threads, then fails as std::thread does when the system refuses a thread.
std::thread start_two_then_fail(const std::function<void()>& fn) {
  if (g_started.fetch_add(1) >= 2)
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                            "thread start refused");
  return std::thread(fn);
}

struct ThreadsEnv {
  explicit ThreadsEnv(const char* n) {
    const char* old = std::getenv("FLASHMSA_NUM_THREADS");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("FLASHMSA_NUM_THREADS", n, 1);
  }
  ~ThreadsEnv() {
    if (had_) {
      setenv("FLASHMSA_NUM_THREADS", old_.c_str(), 1);
    } else {
      unsetenv("FLASHMSA_NUM_THREADS");
    }
  }
  bool had_;
  std::string old_;
};

TEST(ParallelFor, ThreadStartFailureIsAnError) {
  ThreadsEnv env("8");
  g_started = 0;
  const reference::ThreadStarter previous = reference::set_thread_starter(start_two_then_fail);
  std::atomic<int64_t> rows{0};
  try {
    reference::parallel_for(1000, [&](int64_t b, int64_t e) { rows += e - b; });
    ADD_FAILURE() << "parallel_for returned although a thread could not start";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("could not start a worker thread"), std::string::npos)
        << e.what();
  }
  reference::set_thread_starter(previous);
  // The same call with threads that start does every row once.
  rows = 0;
  reference::parallel_for(1000, [&](int64_t b, int64_t e) { rows += e - b; });
  EXPECT_EQ(rows.load(), 1000);
}

}  // namespace
}  // namespace flashmsa::testing

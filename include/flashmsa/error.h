// Errors of the core: thrown, never exit(). The kind tells the bindings which Python exception to
// raise (SPEC D9: ValueError / TypeError naming the argument; NotImplementedError for a declared but
// unsupported combination; RuntimeError for CUDA failures).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace flashmsa {

enum class ErrorKind : int { kValue = 0, kType = 1, kNotSupported = 2, kRuntime = 3 };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(kind, os.str());
}
}  // namespace detail

}  // namespace flashmsa

// MSA_CHECK(cond, "q must be 3-D, got ", q.ndim, "-D"): ValueError-kind error when cond is false.
#define MSA_CHECK(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond)) ::flashmsa::detail::throw_error(::flashmsa::ErrorKind::kValue, __VA_ARGS__); \
  } while (0)
#define MSA_CHECK_TYPE(cond, ...)                                                   \
  do {                                                                              \
    if (!(cond)) ::flashmsa::detail::throw_error(::flashmsa::ErrorKind::kType, __VA_ARGS__); \
  } while (0)
#define MSA_CHECK_SUPPORTED(cond, ...)                                              \
  do {                                                                              \
    if (!(cond))                                                                    \
      ::flashmsa::detail::throw_error(::flashmsa::ErrorKind::kNotSupported, __VA_ARGS__); \
  } while (0)
#define MSA_FAIL(...) ::flashmsa::detail::throw_error(::flashmsa::ErrorKind::kValue, __VA_ARGS__)

// Wraps a CUDA runtime call; only usable in translation units that include cuda_runtime_api.h.
#define MSA_CUDA_CHECK(call)                                                            \
  do {                                                                                  \
    cudaError_t msa_err_ = (call);                                                      \
    if (msa_err_ != cudaSuccess)                                                        \
      ::flashmsa::detail::throw_error(::flashmsa::ErrorKind::kRuntime, "CUDA error ",   \
                                      cudaGetErrorString(msa_err_), " at ", __FILE__, \
                                      ":", __LINE__, " in ", #call);                   \
  } while (0)

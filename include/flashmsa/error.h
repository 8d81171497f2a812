// Errors of the core: thrown, never exit(). The kind tells the bindings which Python exception to
// raise (docs/semantics.md#d9: ValueError / TypeError naming the argument; NotImplementedError for
// a declared but unsupported combination; RuntimeError for CUDA failures).
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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
// Message pieces are appended without iostreams. With std::ostringstream in host code compiled by
// nvcc, the torch extension built on the H200 machine carried its own instantiations of the iostream
// templates (thousands of exported std:: symbols, no libstdc++.so.6 dependency) and the first error
// message holding a number segfaulted inside num_put instead of raising. Numbers now go through
// std::to_string / snprintf; the text is what operator<< would print (integers in decimal, floating
// point as %g, bool as 1 / 0).
inline void append_piece(std::string& s, std::string_view v) { s.append(v.data(), v.size()); }
inline void append_piece(std::string& s, const char* v) { s += v != nullptr ? v : "(null)"; }
inline void append_piece(std::string& s, char v) { s += v; }
inline void append_piece(std::string& s, bool v) { s += v ? '1' : '0'; }
template <typename T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>)
void append_piece(std::string& s, T v) {
  s += std::to_string(v);
}
template <typename T>
  requires std::is_floating_point_v<T>
void append_piece(std::string& s, T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  s += buf;
}

template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const Args&... args) {
  std::string msg;
  (append_piece(msg, args), ...);
  throw Error(kind, msg);
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

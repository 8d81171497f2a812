// Host checks shared by the ops' make_*_params (see tensor_checks.h).
#include "common/tensor_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "flashmsa/api.h"

namespace flashmsa::checks {

namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kIntMin = std::numeric_limits<int>::min();

std::string dims_str(const int64_t* v, int n) {
  std::string s = "(";
  for (int d = 0; d < n; ++d) {
    if (d) s += ", ";
    s += std::to_string(v[d]);
  }
  s += n == 1 ? ",)" : ")";
  return s;
}

}  // namespace

// ---- formatting --------------------------------------------------------------------------------

std::string shape_str(const TensorRef& t) {
  if (!t.defined()) return "None";
  return dims_str(t.sizes, std::min(t.ndim, kMaxDims));
}

std::string strides_str(const TensorRef& t) { return dims_str(t.strides, std::min(t.ndim, kMaxDims)); }

std::string device_str(int device) {
  return device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device);
}

const char* dtype_str(const TensorRef& t) { return scalar_type_name(t.dtype); }

int64_t byte_distance(const void* a, const void* b) {
  return int64_t(reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a));
}

int64_t elt_size(ScalarType t) {
  switch (t) {
    case ScalarType::kBF16:
    case ScalarType::kFP16: return 2;
    case ScalarType::kFP8E4M3:
    case ScalarType::kUInt8: return 1;
    case ScalarType::kFloat32:
    case ScalarType::kInt32: return 4;
    case ScalarType::kInt64: return 8;
    default: return 0;
  }
}

// ---- one tensor --------------------------------------------------------------------------------

std::array<int64_t, kMaxDims> contiguous_strides(const TensorRef& t) {
  std::array<int64_t, kMaxDims> s{};
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    s[d] = expected;
    expected *= t.sizes[d];
  }
  return s;
}

bool has_unit_rows_3d(const TensorRef& t) {
  if (t.ndim != 3) return false;
  if (t.numel() == 0) return true;
  for (int d = 0; d < 2; ++d)
    if (used_stride(t, d) < 0) return false;
  return used_stride(t, 2) == (t.size(2) == 1 ? 0 : 1);
}

bool has_disjoint_unit_rows_3d(const TensorRef& t) {
  if (!has_unit_rows_3d(t)) return false;
  if (t.numel() == 0) return true;
  const bool dim0_first = used_stride(t, 0) <= used_stride(t, 1);
  int64_t span = t.size(2);  // elements covered by the rows of the dims taken so far
  for (const int d : {dim0_first ? 0 : 1, dim0_first ? 1 : 0}) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) < span) return false;
    span += (t.size(d) - 1) * t.stride(d);
  }
  return true;
}

int64_t used_stride(const TensorRef& t, int d) { return t.size(d) == 1 ? 0 : t.stride(d); }

void check_tensor(const Ctx& c, const TensorRef& t, const char* name, int64_t align) {
  MSA_OP_CHECK(c, t.defined(), name, " must be given");
  MSA_OP_CHECK(c, t.ndim <= kMaxDims, name, " must have at most ", kMaxDims, " dims, got ", t.ndim,
               "-D");
  for (int d = 0; d < t.ndim; ++d)
    MSA_OP_CHECK(c, t.sizes[d] >= 0, name, " has a negative size: ", shape_str(t));
  MSA_OP_CHECK(c, t.numel() == 0 || t.data != nullptr, name, " has elements ", shape_str(t),
               " but no data pointer");
  MSA_OP_CHECK(c, t.device == c.device, name, " must be on the same device as ", c.anchor, " (",
               device_str(c.device), "), got ", device_str(t.device));
  if (align == 0) align = std::max<int64_t>(elt_size(t.dtype), 1);
  MSA_OP_CHECK(c, t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data) % uintptr_t(align) == 0,
               name, " must be ", align, "-byte aligned, got address ", t.data);
}

void check_contiguous(const Ctx& c, const TensorRef& t, const char* name) {
  MSA_OP_CHECK(c, t.is_contiguous(), name, " must be contiguous, got shape ", shape_str(t),
               " with strides ", strides_str(t));
}

namespace {

// Bytes [lo, hi) spanned by t's elements; empty (lo == hi) when it has none.
struct ByteSpan {
  uintptr_t lo = 0, hi = 0;
};
ByteSpan byte_span(const TensorRef& t) {
  ByteSpan s;
  if (!t.defined() || t.numel() == 0 || t.data == nullptr) return s;
  const int64_t elt = std::max<int64_t>(elt_size(t.dtype), 1);
  int64_t lo = 0, hi = 0;  // element offsets of the first and last element
  for (int d = 0; d < t.ndim; ++d) {
    const int64_t reach = (t.sizes[d] - 1) * t.strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  s.lo = base + uintptr_t(lo * elt);
  s.hi = base + uintptr_t((hi + 1) * elt);
  return s;
}

}  // namespace

void check_no_overlap(const Ctx& c, const TensorRef& out, const char* name,
                      std::initializer_list<NamedRef> others) {
  const ByteSpan o = byte_span(out);
  if (o.lo == o.hi) return;
  for (const NamedRef& other : others) {
    if (other.t == &out || !other.t->defined() || other.t->device != out.device) continue;
    const ByteSpan s = byte_span(*other.t);
    MSA_OP_CHECK(c, s.lo == s.hi || s.hi <= o.lo || o.hi <= s.lo, name,
                 " must not share memory with ", other.name,
                 " (an output cannot be written over an argument); pass a separate tensor");
  }
}

int to_int(const Ctx& c, int64_t v, const char* what) {
  MSA_OP_CHECK(c, v >= kIntMin && v <= kIntMax, what, " (", v, ") does not fit in int32");
  return int(v);
}

void check_int32_vector(const Ctx& c, const TensorRef& t, const char* name, int64_t expected,
                        const std::string& what) {
  check_tensor(c, t, name);
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 1, name, " must be 1-D int32, got ",
               dtype_str(t), " of shape ", shape_str(t));
  MSA_OP_CHECK(c, t.size(0) == expected, name, " must have ", what, " = ", expected,
               " entries, got ", t.size(0));
  check_contiguous(c, t, name);
}

int check_cu_seqlens_ref(const Ctx& c, const TensorRef& t, const char* name) {
  check_tensor(c, t, name);
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 1, name,
               " must be 1-D int32 (batch_size + 1,), got ", dtype_str(t), " of shape ",
               shape_str(t));
  MSA_OP_CHECK(c, t.size(0) >= 2, name, " must have batch_size + 1 >= 2 entries, got ", t.size(0));
  check_contiguous(c, t, name);
  return to_int(c, t.size(0) - 1, "batch_size");
}

void check_float_scalar(const Ctx& c, double v, const char* name) {
  MSA_OP_CHECK(c, std::isfinite(v) && std::isfinite(float(v)), name,
               " must be a finite float32 value, got ", v);
}

// ---- contents the host can read ----------------------------------------------------------------

void check_cu_seqlens_values(const char* prefix, const int* v, int64_t count, int64_t total,
                             const char* name, const char* total_what) {
  MSA_CHECK(count >= 2, prefix, name, " must have batch_size + 1 >= 2 entries, got ", count);
  MSA_CHECK(v[0] == 0, prefix, name, "[0] must be 0, got ", v[0]);
  for (int64_t i = 1; i < count; ++i)
    MSA_CHECK(v[i] >= v[i - 1], prefix, name, " must be non-decreasing, got ", name, "[", i,
              "] = ", v[i], " < ", name, "[", i - 1, "] = ", v[i - 1]);
  // Rows past the last sequence are padding (FlashInfer and padded CUDA-graph batches allow them);
  // they belong to no sequence and read 0 / -inf. Only a sequence reaching past `total` is an error.
  MSA_CHECK(total < 0 || v[count - 1] <= total, prefix, name, "[-1] must be <= ", total_what, " (",
            total, "), got ", v[count - 1]);
}

void check_seqused_values(const char* prefix, const int* v, int64_t count, const char* name) {
  for (int64_t i = 0; i < count; ++i)
    MSA_CHECK(v[i] >= 0, prefix, name, "[", i, "] must be >= 0, got ", v[i]);
}

void check_host_cu_seqlens(const Ctx& c, const TensorRef& t, int64_t total, const char* name,
                           const char* total_what) {
  if (t.device >= 0) return;
  check_cu_seqlens_values((std::string(c.op) + ": ").c_str(), static_cast<const int*>(t.data),
                          t.size(0), total, name, total_what);
}

int max_seqlen(const int* cu, int64_t count) {
  int m = 0;
  for (int64_t i = 1; i < count; ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

}  // namespace flashmsa::checks

namespace flashmsa {

// ---- public checks of host copies (api.h) ------------------------------------------------------

void check_cu_seqlens(const int* host_values, int64_t count, int64_t total, const char* name) {
  checks::check_cu_seqlens_values("", host_values, count, total, name,
                                  "the number of rows it indexes");
}

void check_seqused_k(const int* host_values, int64_t count, const char* name) {
  checks::check_seqused_values("", host_values, count, name);
}

}  // namespace flashmsa

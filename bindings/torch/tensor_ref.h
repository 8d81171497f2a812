// at::Tensor -> flashmsa::TensorRef: a torch-free description of a caller tensor (dtype, device,
// sizes and strides in elements). The binding checks nothing else here: every rule about shapes,
// dtypes and devices lives in the core's make_*_params (api.h), so Python and C++ callers get the
// same errors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

#include "flashmsa/types.h"

namespace flashmsa::torch_binding {

inline ScalarType to_scalar_type(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16:
      return ScalarType::kBF16;
    case c10::ScalarType::Half:
      return ScalarType::kFP16;
    case c10::ScalarType::Float8_e4m3fn:
      return ScalarType::kFP8E4M3;
    case c10::ScalarType::Byte:
      return ScalarType::kUInt8;
    case c10::ScalarType::Float:
      return ScalarType::kFloat32;
    case c10::ScalarType::Int:
      return ScalarType::kInt32;
    case c10::ScalarType::Long:
      return ScalarType::kInt64;
    default:
      return ScalarType::kOther;  // the core rejects it, naming the argument
  }
}

// Describes the tensors of one op call; `op` (the Python function name) and the argument name
// prefix the only errors raised here, for tensors that cannot be described at all.
class Describe {
 public:
  explicit Describe(const char* op) : op_(op) {}

  TensorRef operator()(const at::Tensor& t, const char* name) const {
    TensorRef ref;
    if (!t.defined()) return ref;  // ndim -1: not given
    // TensorRef holds at most kMaxDims sizes; no MSA argument has more, so the core would reject
    // a larger rank anyway, but it cannot be described to it.
    TORCH_CHECK_VALUE(t.dim() <= kMaxDims, op_, ": ", name, " must have at most ", kMaxDims,
                      " dims, got ", t.dim(), "-D");
    TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), op_, ": ", name,
                      " must be a CPU or CUDA tensor, got device ", t.device().str());
    ref.data = t.data_ptr();
    ref.dtype = to_scalar_type(t.scalar_type());
    ref.ndim = static_cast<int>(t.dim());
    for (int d = 0; d < ref.ndim; ++d) {
      ref.sizes[d] = t.size(d);
      ref.strides[d] = t.stride(d);
    }
    ref.device = t.device().is_cuda() ? t.device().index() : -1;
    return ref;
  }

  TensorRef operator()(const std::optional<at::Tensor>& t, const char* name) const {
    return t.has_value() ? (*this)(*t, name) : TensorRef{};
  }

  const char* op() const { return op_; }

 private:
  const char* op_;
};

}  // namespace flashmsa::torch_binding

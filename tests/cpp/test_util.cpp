#include "test_util.h"

#include <cstring>
#include <stdexcept>

namespace flashmsa::testing {

size_t scalar_size(ScalarType t) {
  switch (t) {
    case ScalarType::kBF16:
    case ScalarType::kFP16: return 2;
    case ScalarType::kFP8E4M3:
    case ScalarType::kUInt8: return 1;
    case ScalarType::kFloat32:
    case ScalarType::kInt32: return 4;
    case ScalarType::kInt64: return 8;
    default: throw std::invalid_argument("scalar_size: unsupported dtype");
  }
}

HostTensor::HostTensor(ScalarType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
  bytes.assign(size_t(numel()) * scalar_size(t), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float HostTensor::get(int64_t i) const {
  switch (dtype) {
    case ScalarType::kBF16: return bf16_bits_to_float(as<uint16_t>()[i]);
    case ScalarType::kFP16: return fp16_bits_to_float(as<uint16_t>()[i]);
    case ScalarType::kFP8E4M3: return e4m3_bits_to_float(as<uint8_t>()[i]);
    case ScalarType::kUInt8: return float(as<uint8_t>()[i]);
    case ScalarType::kFloat32: return as<float>()[i];
    case ScalarType::kInt32: return float(as<int32_t>()[i]);
    default: throw std::invalid_argument("HostTensor::get: unsupported dtype");
  }
}

void HostTensor::set(int64_t i, float v) {
  switch (dtype) {
    case ScalarType::kBF16: as<uint16_t>()[i] = float_to_bf16_bits(v); break;
    case ScalarType::kFP16: as<uint16_t>()[i] = float_to_fp16_bits(v); break;
    case ScalarType::kFloat32: as<float>()[i] = v; break;
    case ScalarType::kInt32: as<int32_t>()[i] = int32_t(v); break;
    default: throw std::invalid_argument("HostTensor::set: unsupported dtype");
  }
}

TensorRef HostTensor::ref() {
  TensorRef r;
  r.data = bytes.data();
  r.dtype = dtype;
  r.ndim = int(shape.size());
  int64_t stride = 1;
  for (int d = r.ndim - 1; d >= 0; --d) {
    r.sizes[d] = shape[d];
    r.strides[d] = stride;
    stride *= shape[d];
  }
  r.device = -1;
  return r;
}

HostTensor random_tensor(ScalarType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                         float scale) {
  HostTensor t(dtype, std::move(shape));
  const int64_t n = t.numel();
  if (dtype == ScalarType::kFP8E4M3 || dtype == ScalarType::kUInt8) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t i = 0; i < n; ++i) {
      uint8_t b = uint8_t(byte(rng));
      if (dtype == ScalarType::kFP8E4M3 && (b & 0x7F) == 0x7F) b ^= 0x01;  // no NaN codes
      t.as<uint8_t>()[i] = b;
    }
    return t;
  }
  std::uniform_real_distribution<float> u(-scale, scale);
  for (int64_t i = 0; i < n; ++i) t.set(i, u(rng));
  return t;
}

HostTensor int_tensor(const std::vector<int>& values, std::vector<int64_t> shape) {
  if (shape.empty()) shape = {int64_t(values.size())};
  HostTensor t(ScalarType::kInt32, shape);
  if (t.numel() != int64_t(values.size())) throw std::invalid_argument("int_tensor: shape mismatch");
  std::memcpy(t.bytes.data(), values.data(), values.size() * 4);
  return t;
}

HostTensor cu_seqlens(const std::vector<int>& lengths) {
  std::vector<int> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return int_tensor(cu);
}

TensorRef strided_ref(void* data, ScalarType dtype, std::initializer_list<int64_t> sizes,
                      std::initializer_list<int64_t> strides) {
  TensorRef r;
  r.data = data;
  r.dtype = dtype;
  r.ndim = int(sizes.size());
  int d = 0;
  for (int64_t s : sizes) r.sizes[d++] = s;
  d = 0;
  for (int64_t s : strides) r.strides[d++] = s;
  r.device = -1;
  return r;
}

}  // namespace flashmsa::testing

// Test helpers: owning host tensors that hand out TensorRefs, seeded random fills, dtype rounding.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "flashmsa/numeric.h"
#include "flashmsa/types.h"

namespace flashmsa::testing {

size_t scalar_size(ScalarType t);

// A contiguous host tensor of any ScalarType, bytes owned by a std::vector.
struct HostTensor {
  ScalarType dtype = ScalarType::kOther;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(ScalarType t, std::vector<int64_t> s);
  int64_t numel() const;
  template <typename T>
  T* as() { return reinterpret_cast<T*>(bytes.data()); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
  // Value of element i converted to float (bf16/fp16/fp8/float32/int32).
  float get(int64_t i) const;
  // Stores v rounded to the tensor's dtype (bf16/fp16: RNE; fp8 not supported here).
  void set(int64_t i, float v);
  TensorRef ref();  // contiguous description (device -1)
};

// Allocates a tensor of `dtype` and fills it with uniform random values in [-scale, scale) (rounded
// to the dtype). For kFP8E4M3 / kUInt8 it draws random bytes (fp8 NaN codes excluded).
HostTensor random_tensor(ScalarType dtype, std::vector<int64_t> shape, std::mt19937_64& rng,
                         float scale = 1.0f);

// int32 tensor from values.
HostTensor int_tensor(const std::vector<int>& values, std::vector<int64_t> shape = {});

// Prefix sums [0, l0, l0+l1, ...] as int32 (B+1,).
HostTensor cu_seqlens(const std::vector<int>& lengths);

// A TensorRef with explicit sizes/strides over existing memory (for strided-view tests).
TensorRef strided_ref(void* data, ScalarType dtype, std::initializer_list<int64_t> sizes,
                      std::initializer_list<int64_t> strides);

}  // namespace flashmsa::testing

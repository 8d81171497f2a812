// Element types, tensor descriptions and the fixed constants of MSA.
// Torch-free and CUDA-free, header-only like all of include/flashmsa (CMake target msa_headers):
// included by the core, the reference, the kernels and the bindings.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MSA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MSA_HOST_DEVICE inline
#endif

namespace flashmsa {

// MSA's fixed geometry (docs/semantics.md#geometry). Not template parameters: ops reject others.
inline constexpr int kBlockSize = 128;   // tokens per KV block == tokens per page
inline constexpr int kHeadDim = 128;     // head_dim of every op
inline constexpr int kNvfp4Width = 64;   // bytes per 128-value NVFP4 row (two e2m1 per byte)
inline constexpr int kNvfp4ScaleCols = 8;  // one e4m3 scale per 16 values of a 128-value row
inline constexpr int kMaxTopk = 64;      // D4: 1 <= topk <= 64
// Key positions are int32, so a sequence has at most ceil((2^31 - 1) / 128) = 2^24 blocks: the
// most proxy score columns (max_k_tiles) that can hold a key.
inline constexpr int kMaxKTiles = 1 << 24;

// Element type of a tensor as the caller holds it (the binding maps torch dtypes onto this).
enum class ScalarType : int32_t {
  kBF16 = 0,
  kFP16 = 1,
  kFP8E4M3 = 2,  // float8_e4m3fn
  kUInt8 = 3,    // packed NVFP4 data (two e2m1 per byte) or e4m3 block scales
  kFloat32 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kOther = 7,    // anything else: always rejected with the argument's name
};

// Element type of the data an op computes on. kNVFP4 is stored as uint8, 64 bytes per 128 values.
enum class DType : int32_t { kBF16 = 0, kFP16 = 1, kFP8E4M3 = 2, kNVFP4 = 3 };

inline const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::kBF16: return "bfloat16";
    case ScalarType::kFP16: return "float16";
    case ScalarType::kFP8E4M3: return "float8_e4m3fn";
    case ScalarType::kUInt8: return "uint8";
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kInt32: return "int32";
    case ScalarType::kInt64: return "int64";
    default: return "unsupported dtype";
  }
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kFP16: return "float16";
    case DType::kFP8E4M3: return "float8_e4m3fn";
    case DType::kNVFP4: return "nvfp4 (uint8)";
  }
  return "unknown";
}

// A strided view of caller memory, described without torch (DLPack-like). Sizes and strides are in
// elements of `dtype`. `device` is -1 for host memory, else the CUDA device ordinal.
inline constexpr int kMaxDims = 4;
struct TensorRef {
  void* data = nullptr;
  ScalarType dtype = ScalarType::kOther;
  int ndim = -1;  // -1: the argument was not given (None)
  int64_t sizes[kMaxDims] = {0, 0, 0, 0};
  int64_t strides[kMaxDims] = {0, 0, 0, 0};
  int device = -1;

  bool defined() const { return ndim >= 0; }
  int64_t size(int d) const { return sizes[d]; }
  int64_t stride(int d) const { return strides[d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }
  // Row-major contiguous, by torch's rule: size-1 dims may have any stride, and a tensor with no
  // elements is contiguous whatever its strides.
  bool is_contiguous() const {
    for (int d = 0; d < ndim; ++d)
      if (sizes[d] == 0) return true;
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }
};

}  // namespace flashmsa

#include "flashmsa/types.h"

namespace flashmsa {

const char* scalar_type_name(ScalarType t) {
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

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kFP16: return "float16";
    case DType::kFP8E4M3: return "float8_e4m3fn";
    case DType::kNVFP4: return "nvfp4 (uint8)";
  }
  return "unknown";
}

}  // namespace flashmsa

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "common/tensor_map.h"

namespace flashmsa::cuda {

namespace {
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) ==
            cudaSuccess &&
        status == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
    } else {
      (void)cudaGetLastError();  // not sticky: clear it so the next launch check does not see it
    }
  });
  return fn;
}
}  // namespace

bool encode_tensor_map_sw128(CUtensorMap& map, CUtensorMapDataType dtype, const void* base, int rank,
                             const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box) {
  return encode_tensor_map(map, dtype, base, rank, dims, strides_bytes, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool encode_tensor_map(CUtensorMap& map, CUtensorMapDataType dtype, const void* base, int rank,
                       const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                       CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  // Ranks 2..5 (the KV-major TMA kernel stores its partial rows through a rank-2 map; rank 1 would
  // have no strides to pass). Until the commit after 054c9ce this rejected rank 2, so every call
  // of kv_major_kernel=tma raised NotSupportedError on the H200 before its kernel ever ran.
  if (encode == nullptr || rank < 2 || rank > 5) return false;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    elem_strides[i] = 1;
    if (i > 0) st[i - 1] = strides_bytes[i - 1];
  }
  // L2 promotion 128 B (the L2 line), not 256 B: on the H200, TMA streams of 32 KB K / V pages at
  // random places run 5-7 % slower with 256 B from 134 MB up (268 MB: 67.3 vs 63.7 us), while 128 B
  // or none match cp.async and 1-D bulk copies (benchmarks/micro/kv_stream.cu,
  // docs/benchmarks.md#stream-ceiling).
  CUtensorMap m;
  const CUresult r = encode(&m, dtype, cuuint32_t(rank), const_cast<void*>(base), d, st, b, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  map = m;
  return true;
}

bool encode_kv_block_map(CUtensorMap& map, CUtensorMapDataType dtype, const KVTensor& t, const KVIndex& kv,
                         int num_kv_heads, uint32_t row_elems, uint32_t box0, int elem_bytes,
                         CUtensorMapSwizzle swizzle) {
  const auto bytes = [&](int64_t stride) { return uint64_t(stride * elem_bytes); };
  if (kv.paged) {
    if (kv.num_pages <= 0) return false;
    const uint64_t dims[4] = {row_elems, kBlockSize, uint64_t(num_kv_heads), uint64_t(kv.num_pages)};
    const uint64_t strides[3] = {bytes(t.stride_token), bytes(t.stride_head), bytes(t.stride_page)};
    const uint32_t box[4] = {box0, kBlockSize, 1, 1};
    return encode_tensor_map(map, dtype, t.data, 4, dims, strides, box, swizzle);
  }
  if (kv.total_k <= 0 || kv.total_k >= (int64_t(1) << 31) - kBlockSize) return false;
  const uint64_t dims[3] = {row_elems, uint64_t(num_kv_heads), uint64_t(kv.total_k)};
  const uint64_t strides[2] = {bytes(t.stride_head), bytes(t.stride_token)};
  const uint32_t box[3] = {box0, 1, kBlockSize};
  return encode_tensor_map(map, dtype, t.data, 3, dims, strides, box, swizzle);
}

}  // namespace flashmsa::cuda

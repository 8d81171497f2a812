// Host side of the TMA path: encodes CUtensorMap descriptors through the driver's
// cuTensorMapEncodeTiled, fetched once through the runtime's driver entry point (the library links
// only the CUDA runtime). common/tma.cuh is the device half.
#pragma once

#include <cuda.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "flashmsa/params.h"

namespace flashmsa::cuda {

// A map of rank 2 to 5 over 16-bit elements: dims[0] contiguous, strides_bytes[i - 1] between
// consecutive indices of dims[i], read in boxes `box` into 128-byte-swizzled shared memory
// (box[0] * 2 must be 128 bytes or less). Out-of-bounds elements read as zero.
// Returns false (map untouched) where the driver offers no encoder or rejects the arguments, so
// the caller can take another kernel.
bool encode_tensor_map_sw128(CUtensorMap& map, CUtensorMapDataType dtype, const void* base, int rank,
                             const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box);

// The same with any swizzle mode (box[0] bytes at most the swizzle span: 32, 64 or 128 bytes;
// any multiple of 16 up to 256 elements without swizzle), e.g. the raw 64-byte NVFP4 rows the
// sm_90a proxy kernel stages with CU_TENSOR_MAP_SWIZZLE_64B.
bool encode_tensor_map(CUtensorMap& map, CUtensorMapDataType dtype, const void* base, int rank,
                       const uint64_t* dims, const uint64_t* strides_bytes, const uint32_t* box,
                       CUtensorMapSwizzle swizzle);

// The 128-key blocks of a K or V cache (elements of elem_bytes bytes, rows of row_elems): flat
// (row_elems, Hkv, total_k) in boxes (box0, 1, 128), a block at coordinates (c, kh, first row);
// paged (row_elems, 128, Hkv, num_pages) in boxes (box0, 128, 1, 1), a page at (c, 0, kh, page).
// False as above, or where the coordinates would not fit TMA's 32-bit ones (flat: total_k + 128,
// paged: no pages).
bool encode_kv_block_map(CUtensorMap& map, CUtensorMapDataType dtype, const KVTensor& t, const KVIndex& kv,
                         int num_kv_heads, uint32_t row_elems, uint32_t box0, int elem_bytes,
                         CUtensorMapSwizzle swizzle);

// The maps of an attention call's 16-bit K and V blocks as the sm_90a TMA kernels read them
// (encode_kv_block_map: 128-dim rows, 64-element boxes, 128-byte swizzle); false as above.
inline bool encode_kv_maps_sw128(CUtensorMap& k_map, CUtensorMap& v_map, CUtensorMapDataType dtype,
                                 const SparseAttnParams& p) {
  return encode_kv_block_map(k_map, dtype, p.k, p.kv, p.num_kv_heads, 128, 64, 2, CU_TENSOR_MAP_SWIZZLE_128B) &&
         encode_kv_block_map(v_map, dtype, p.v, p.kv, p.num_kv_heads, 128, 64, 2, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The maps of an attention call's raw fp8 K and V blocks (encode_kv_block_map: uint8, 128-byte rows
// as one 128-byte box, 128-byte swizzle: the raw tile's chunk swizzle); false as above.
inline bool encode_kv_maps_raw8(CUtensorMap& k_map, CUtensorMap& v_map, const SparseAttnParams& p) {
  return encode_kv_block_map(k_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.k, p.kv, p.num_kv_heads, 128, 128, 1,
                             CU_TENSOR_MAP_SWIZZLE_128B) &&
         encode_kv_block_map(v_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.v, p.kv, p.num_kv_heads, 128, 128, 1,
                             CU_TENSOR_MAP_SWIZZLE_128B);
}

// The map of an attention call's q, (total_q, Hq, 128) 16-bit rows at its strides, as the sm_90a
// TMA kernels read it: boxes of 64 dims x box_heads heads x box_tokens tokens, 128-byte swizzle;
// false as above.
inline bool encode_q_map_sw128(CUtensorMap& map, CUtensorMapDataType dtype, const SparseAttnParams& p,
                               uint32_t box_heads, uint32_t box_tokens) {
  const uint64_t dims[3] = {128, uint64_t(p.num_heads), uint64_t(p.total_q)};
  const uint64_t strides[2] = {uint64_t(p.q_stride_head) * 2, uint64_t(p.q_stride_token) * 2};
  const uint32_t box[3] = {64, box_heads, box_tokens};
  return encode_tensor_map_sw128(map, dtype, p.q, 3, dims, strides, box);
}

// The tensor-map element type of a 16-bit compute type: fp16 for __half, else bf16.
template <typename Elem>
constexpr CUtensorMapDataType tma_dtype_16() {
  return std::is_same_v<Elem, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

}  // namespace flashmsa::cuda

// Host side of the TMA path: encodes CUtensorMap descriptors through the driver's
// cuTensorMapEncodeTiled, fetched once through the runtime's driver entry point (the library links
// only the CUDA runtime). common/tma.cuh is the device half.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashmsa::cuda {

// A rank-3 map of 16-bit elements over dims (d0 contiguous, d1, d2) with byte strides s1, s2
// between consecutive d1 / d2 indices, read in boxes (b0, b1, b2) into 128-byte-swizzled shared
// memory (b0 * 2 must be 128 bytes or less). Out-of-bounds elements read as zero.
// Returns false (map untouched) where the driver offers no encoder or rejects the arguments, so
// the caller can take another kernel.
bool encode_tensor_map_3d_sw128(CUtensorMap& map, CUtensorMapDataType dtype, const void* base, uint64_t d0,
                                uint64_t d1, uint64_t d2, uint64_t s1_bytes, uint64_t s2_bytes, uint32_t b0,
                                uint32_t b1, uint32_t b2);

}  // namespace flashmsa::cuda

// The 1 KB NVFP4 scale area of a staged 128-key block, shared by the TMA-fed proxy kernels (the
// decode kernel's NVFP4 stages, proxy_decode_tma.cuh, and the sm_90a prefill kernel's raw K
// stages, proxy_score_sm90.cuh): the block's e4m3 block scales in the 128x4 layout of the scale
// tensor, key i, column c at (c / 4) * 512 + (i % 32) * 16 + (i / 32) * 4 + c % 4. A paged block's
// scale rows are one aligned 128-row tile of that tensor, copied whole by one bulk copy; a flat
// block's rows are strided (row = token x Hkv + kh) and need not start on a tile, so they are
// gathered 4 columns (4 bytes) at a time by a warp's cp.async (gather_flat_scales).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "flashmsa/numeric.h"
#include "flashmsa/params.h"

namespace flashmsa::cuda::proxy {

inline constexpr int kNvfp4ScaleAreaBytes = kBlockSize * 8;

// Byte offset of the scale pair (columns 2c, 2c + 1; c in 0..3, the 32 values of dims
// [32c, 32c + 32)) of key `key` in the area: two adjacent bytes, the first 2-byte aligned.
__host__ __device__ constexpr int nvfp4_area_pair_offset(int key, int c) {
  return (c >> 1) * 512 + (key & 31) * 16 + (key >> 5) * 4 + 2 * (c & 1);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The scales of a flat block's first n_keys keys (scale rows srow0 + i x Hkv) into the area at
// `dst`, by the 32 lanes of a warp (lane: keys lane, lane + 32, ...); the rest of the area keeps
// stale bytes, which the readers must not use (their keys are masked or taken as scale 0).
__device__ __forceinline__ void gather_flat_scales(const ProxyScoreParams& p, uint32_t dst, int64_t srow0,
                                                   int n_keys, int lane) {
  for (int i = lane; i < n_keys; i += 32) {
    const int64_t row = srow0 + int64_t(i) * p.num_kv_heads;
    const uint32_t d = dst + (i % 32) * 16 + (i / 32) * 4;
    cp_async_4(d, p.k.scale + nvfp4_scale_offset(row, 0));
    cp_async_4(d + 512, p.k.scale + nvfp4_scale_offset(row, 4));
  }
}
#endif

}  // namespace flashmsa::cuda::proxy

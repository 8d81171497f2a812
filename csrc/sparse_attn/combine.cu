// Combine of the split schedules (query-major split-K and KV-major): one warp per (row, head)
// reads the row's partial LSEs (lanes = slots), weights w_s = 2^(lse_s - max) and sums the partial
// outputs in slot order, so the result is deterministic. Slots with LSE -inf (empty, or never
// written by the attention kernel and set to -inf by the list builder) get weight 0 and their
// output is not read; other partial values are clamped to +-FLT_MAX so garbage can never turn a
// zero weight into NaN (0 * inf). A row with no finite slot gets output 0 and LSE -inf.
#include <cuda_runtime_api.h>

#include <climits>

#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr int kCombineWarps = 8;

MSA_DEVICE float sanitize_lse(float v) { return v == v ? fminf(v, FLT_MAX) : neg_inf(); }
MSA_DEVICE float clamp_finite(float v) { return fminf(fmaxf(v, -FLT_MAX), FLT_MAX); }

// Four consecutive partial values starting at element `elem` of the partial buffer.
MSA_DEVICE float4 load4(const void* base, StoreKind kind, int64_t elem) {
  switch (kind) {
    case StoreKind::kF32:
      return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + elem);
    case StoreKind::kBF16: {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + elem);
      const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
      const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      return make_float4(a.x, a.y, b.x, b.y);
    }
    case StoreKind::kF16: {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __half*>(base) + elem);
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
      return make_float4(a.x, a.y, b.x, b.y);
    }
    default: {
      const uint32_t u = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(base) + elem);
      return make_float4(e4m3_to_float(uint8_t(u)), e4m3_to_float(uint8_t(u >> 8)),
                         e4m3_to_float(uint8_t(u >> 16)), e4m3_to_float(uint8_t(u >> 24)));
    }
  }
}

MSA_DEVICE float warp_max(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}
MSA_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// ln of sum_s 2^(v_s) over the lane's two slot values; -inf when every value is -inf.
MSA_DEVICE float combined_lse(float v0, float v1) {
  const float m = warp_max(fmaxf(v0, v1));
  if (m == neg_inf()) return neg_inf();
  const float w = warp_sum(exp2_approx(v0 - m) + exp2_approx(v1 - m));
  return (m + log2f(w)) * kLn2;
}

template <typename OutElem>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(const __grid_constant__ CombineArgs a) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(a.rows) * a.num_heads) return;  // warp-uniform
  const int rel = int(w / a.num_heads), hq = int(w % a.num_heads);
  const int kh = hq / a.group, g = hq - kh * a.group;
  const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
  const int64_t out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + hq;

  const float v0 = lane < a.num_slots ? sanitize_lse(a.part_lse[base + int64_t(lane) * a.group]) : neg_inf();
  const float v1 = lane + 32 < a.num_slots ? sanitize_lse(a.part_lse[base + int64_t(lane + 32) * a.group]) : neg_inf();
  const float m = warp_max(fmaxf(v0, v1));
  OutElem* out = static_cast<OutElem*>(a.out) + out_idx * 128 + 4 * lane;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float lse = neg_inf();
  if (m != neg_inf()) {
    const float w0 = exp2_approx(v0 - m), w1 = exp2_approx(v1 - m);
    const float wsum = warp_sum(w0 + w1);
    for (int s = 0; s < a.num_slots; ++s) {
      const float ws = __shfl_sync(0xffffffffu, s < 32 ? w0 : w1, s & 31);
      if (ws == 0.0f) continue;  // warp-uniform
      const float4 v = load4(a.part_o, a.part_kind, (base + int64_t(s) * a.group) * 128 + 4 * lane);
      acc[0] += ws * clamp_finite(v.x);
      acc[1] += ws * clamp_finite(v.y);
      acc[2] += ws * clamp_finite(v.z);
      acc[3] += ws * clamp_finite(v.w);
    }
    const float mul = a.v_scale / wsum;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] *= mul;
    lse = (m + log2f(wsum)) * kLn2;
  }
  uint2 packed;
  packed.x = pack2<OutElem>(acc[0], acc[1]);
  packed.y = pack2<OutElem>(acc[2], acc[3]);
  *reinterpret_cast<uint2*>(out) = packed;
  if (a.lse != nullptr && lane == 0) a.lse[out_idx] = lse;
  if (a.lse_t != nullptr) {
    const float t0 = lane < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane) * a.group]) : neg_inf();
    const float t1 = lane + 32 < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane + 32) * a.group]) : neg_inf();
    const float lse_t = combined_lse(t0, t1);
    if (lane == 0) a.lse_t[out_idx] = lse_t;
  }
}

}  // namespace

void launch_combine(const CombineArgs& a, DType out_dtype, cudaStream_t stream) {
  const int64_t warps = int64_t(a.rows) * a.num_heads;
  if (warps == 0) return;
  const int64_t grid = (warps + kCombineWarps - 1) / kCombineWarps;
  MSA_CHECK(grid <= INT_MAX, "combine: too many (row, head) pairs in one launch (", warps, ")");
  if (out_dtype == DType::kBF16) {
    combine_kernel<__nv_bfloat16><<<unsigned(grid), kCombineWarps * 32, 0, stream>>>(a);
  } else {
    combine_kernel<__half><<<unsigned(grid), kCombineWarps * 32, 0, stream>>>(a);
  }
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn

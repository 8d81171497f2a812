// Device code of the combine (combine.cu's kernel; the split=cluster decode kernel's merge through
// distributed shared memory, query_major.cuh): the merge of one (row, head)'s partial slots, see
// combine.cu for the method.
// One function (merge_row) over a source of slots, so that every path gives the same bits for the
// same partials.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "sparse_attn/attention_core.cuh"

namespace flashmsa::sparse_attn {

MSA_DEVICE float sanitize_lse(float v) { return v == v ? fminf(v, FLT_MAX) : neg_inf(); }
MSA_DEVICE float clamp_finite(float v) { return fminf(fmaxf(v, -FLT_MAX), FLT_MAX); }

// One slot's partial LSE, sanitized; with reset_lse (KV-major lists=once) the slot is set back to
// -inf once read, unless it is -inf already (the slot belongs to this lane alone).
MSA_DEVICE float read_lse(const CombineArgs& a, float* lse, int64_t idx) {
  const float v = lse[idx];
  if (a.reset_lse && v != neg_inf()) lse[idx] = neg_inf();
  return sanitize_lse(v);
}

// Eight consecutive values of the partial buffer starting at element `elem` (a multiple of 8), as
// raw bits: 16 bytes for 2-byte kinds, 8 for fp8, 32 for f32 (two loads). Kept raw so that a batch
// of loads can be issued before any conversion.
struct Raw8 {
  uint4 a;
  uint4 b;  // f32 only: values 4..7
};

template <StoreKind kKind>
MSA_DEVICE Raw8 load8(const void* base, int64_t elem) {
  Raw8 r{};
  switch (kKind) {
    case StoreKind::kF32: {
      const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + elem);
      r.a = p[0];
      r.b = p[1];
      break;
    }
    case StoreKind::kBF16:
    case StoreKind::kF16:
      r.a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + elem);
      break;
    default: {
      const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(base) + elem);
      r.a = make_uint4(u.x, u.y, 0u, 0u);
      break;
    }
  }
  return r;
}

// The same from distributed shared memory: `addr` is the shared::cluster address of the values.
template <StoreKind kKind>
MSA_DEVICE Raw8 load8_cluster(uint32_t addr) {
  Raw8 r{};
  switch (kKind) {
    case StoreKind::kF32:
      r.a = ld_cluster_v4(addr);
      r.b = ld_cluster_v4(addr + 16);
      break;
    case StoreKind::kBF16:
    case StoreKind::kF16: r.a = ld_cluster_v4(addr); break;
    default: {
      const uint2 u = ld_cluster_v2(addr);
      r.a = make_uint4(u.x, u.y, 0u, 0u);
      break;
    }
  }
  return r;
}

template <StoreKind kKind>
MSA_DEVICE void unpack8(const Raw8& r, float (&v)[8]) {
  const uint32_t w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
  switch (kKind) {
    case StoreKind::kF32: {
      const uint32_t w2[4] = {r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = __uint_as_float(w[i]);
        v[4 + i] = __uint_as_float(w2[i]);
      }
      break;
    }
    case StoreKind::kBF16:
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      }
      break;
    case StoreKind::kF16:
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      }
      break;
    default:
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = e4m3_to_float(uint8_t(w[i >> 2] >> (8 * (i & 3))));
      break;
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

// Slots per batch of loads: all of a lane's loads of a batch are in flight together. 16 is a
// multiple of 2 (the half-warp split) and divides 32, so a batch's weights come from one lane
// register (w0 for slots < 32, w1 above).
inline constexpr int kCombineBatch = 16;

// The merge of one (row, head) over num_slots slots (<= 64) into row out_idx of out (128 values of
// OutElem), lse[out_idx] and lse_t[out_idx] (each skipped when null). Slots: the partials' source,
//   float lse(int s), float lse_t(int s)   slot s's log2 LSEs, sanitized (sanitize_lse)
//   Raw8 load(int s, int hl)                  values 8 hl .. 8 hl + 7 of slot s's row
// A slot whose LSE is -inf has weight 0 and its values are not used. kSpec (every slot's values
// were written, whatever its LSE: the query-major split-K kernels): the first batch of values is
// loaded together with the LSEs instead of after them (one memory round trip instead of two at
// decode sizes); else a weight-0 slot's values are not read. The same arithmetic either way.
template <typename OutElem, StoreKind kKind, typename Slots, bool kSpec = false>
MSA_DEVICE void merge_row(const Slots& slots, int num_slots, float v_scale, void* out, float* lse_out,
                          float* lse_t_out, int64_t out_idx, int lane) {
  const int half = lane >> 4, hl = lane & 15;  // slot parity, 8-value chunk of the row
  [[maybe_unused]] Raw8 spec[kCombineBatch / 2];
  if constexpr (kSpec) {
#pragma unroll
    for (int i = 0; i < kCombineBatch / 2; ++i) {
      const int s = 2 * i + half;
      spec[i] = Raw8{};
      if (s < num_slots) spec[i] = slots.load(s, hl);
    }
  }
  const float v0 = lane < num_slots ? slots.lse(lane) : neg_inf();
  const float v1 = lane + 32 < num_slots ? slots.lse(lane + 32) : neg_inf();
  const float m = warp_max(fmaxf(v0, v1));
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  float lse = neg_inf();
  if (m != neg_inf()) {
    const float w0 = exp2_approx(v0 - m), w1 = exp2_approx(v1 - m);
    const float wsum = warp_sum(w0 + w1);
    for (int s0 = 0; s0 < num_slots; s0 += kCombineBatch) {
      const float wsrc = s0 < 32 ? w0 : w1;
      float ws[kCombineBatch / 2];
      Raw8 raw[kCombineBatch / 2];
#pragma unroll
      for (int i = 0; i < kCombineBatch / 2; ++i) {
        const int s = s0 + 2 * i + half;
        ws[i] = __shfl_sync(0xffffffffu, wsrc, s & 31);
        if (s >= num_slots) ws[i] = 0.0f;
        raw[i] = Raw8{};
        if constexpr (kSpec) {
          if (s0 == 0) {
            raw[i] = spec[i];
            continue;
          }
        }
        if (ws[i] != 0.0f) raw[i] = slots.load(s, hl);
      }
#pragma unroll
      for (int i = 0; i < kCombineBatch / 2; ++i) {
        if (ws[i] == 0.0f) continue;
        float v[8];
        unpack8<kKind>(raw[i], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += ws[i] * clamp_finite(v[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
    const float mul = v_scale / wsum;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= mul;
    lse = (m + log2f(wsum)) * kLn2;
  }
  if (half == 0) {
    uint4 packed;
    packed.x = pack2<OutElem>(acc[0], acc[1]);
    packed.y = pack2<OutElem>(acc[2], acc[3]);
    packed.z = pack2<OutElem>(acc[4], acc[5]);
    packed.w = pack2<OutElem>(acc[6], acc[7]);
    *reinterpret_cast<uint4*>(static_cast<OutElem*>(out) + out_idx * 128 + 8 * hl) = packed;
  }
  if (lse_out != nullptr && lane == 0) lse_out[out_idx] = lse;
  if (lse_t_out != nullptr) {
    const float t0 = lane < num_slots ? slots.lse_t(lane) : neg_inf();
    const float t1 = lane + 32 < num_slots ? slots.lse_t(lane + 32) : neg_inf();
    const float lse_t = combined_lse(t0, t1);
    if (lane == 0) lse_t_out[out_idx] = lse_t;
  }
}

// The slots of one (row, head) in the workspace (merge_row's source): slot s at base + s * G of the
// LSE arrays, its values from (base + s * G) * 128 of part_o (elem0: the lane's 8-value chunk of
// slot 0).
template <StoreKind kKind>
struct WorkspaceSlots {
  const CombineArgs& a;
  int64_t base;
  int64_t elem0;
  int64_t slot_elems;
  MSA_DEVICE float lse(int s) const { return read_lse(a, a.part_lse, base + int64_t(s) * a.group); }
  MSA_DEVICE float lse_t(int s) const { return read_lse(a, a.part_lse_t, base + int64_t(s) * a.group); }
  MSA_DEVICE Raw8 load(int s, int /*hl: in elem0*/) const {
    return load8<kKind>(a.part_o, elem0 + int64_t(s) * slot_elems);
  }
};

// The combine of one (row, head) (one warp): its slots at part index base + s * G, its output and
// LSEs at out_idx (row * Hq + head). Used by combine_kernel (combine.cu); kSpec: a.all_slots_written.
template <typename OutElem, StoreKind kKind, bool kSpec>
MSA_DEVICE void combine_row(const CombineArgs& a, int64_t base, int64_t out_idx, int lane) {
  const WorkspaceSlots<kKind> slots{a, base, base * 128 + 8 * (lane & 15), int64_t(a.group) * 128};
  merge_row<OutElem, kKind, WorkspaceSlots<kKind>, kSpec>(slots, a.num_slots, a.v_scale, a.out, a.lse,
                                                         a.lse_t, out_idx, lane);
}

}  // namespace flashmsa::sparse_attn

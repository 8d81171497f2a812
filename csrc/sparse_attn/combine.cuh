// Device side of the combine (combine.cu): the LSE-weighted merge of one (row, head)'s partials
// and of one work unit, shared by the combine kernel and by the sm_90a KV-major kernel, which runs
// the previous launch group's combine units between its own items (kv_major_sm90.cuh).
//
// The merge is a pure stream of the partials (KV-major prefill: 8.6 GB of bf16 at 32K tokens), so
// it is shaped for bandwidth: a half-warp covers one slot's 128 values with 16-byte loads (8 values
// per lane), the two half-warps take the even and odd slots, and each lane issues the loads of a
// batch of 16 slots before using any of them (8 loads, 128 bytes in flight per lane, 4 KB per warp)
// so the memory system sees enough requests. The half-warp sums meet through one shuffle at the
// end: a fixed order, independent of the launch.
#pragma once

#include <cuda_runtime_api.h>

#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kernel_traits.h"

namespace flashmsa::sparse_attn {

MSA_DEVICE float sanitize_lse(float v) { return v == v ? fminf(v, FLT_MAX) : neg_inf(); }
MSA_DEVICE float clamp_finite(float v) { return fminf(fmaxf(v, -FLT_MAX), FLT_MAX); }

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
constexpr int kCombineBatch = 16;

// The combine of row row_begin + rel, head kh * G + g (one warp).
template <typename OutElem, StoreKind kKind>
MSA_DEVICE void combine_one(const CombineArgs& a, int rel, int kh, int g, int lane) {
  const int hq = kh * a.group + g;
  const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
  const int64_t out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + hq;
  const int half = lane >> 4, hl = lane & 15;  // slot parity, 8-value chunk of the row

  const float v0 = lane < a.num_slots ? sanitize_lse(a.part_lse[base + int64_t(lane) * a.group]) : neg_inf();
  const float v1 = lane + 32 < a.num_slots ? sanitize_lse(a.part_lse[base + int64_t(lane + 32) * a.group]) : neg_inf();
  const float m = warp_max(fmaxf(v0, v1));
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  float lse = neg_inf();
  if (m != neg_inf()) {
    const float w0 = exp2_approx(v0 - m), w1 = exp2_approx(v1 - m);
    const float wsum = warp_sum(w0 + w1);
    const int64_t elem0 = base * 128 + 8 * hl;
    const int64_t slot_elems = int64_t(a.group) * 128;
    for (int s0 = 0; s0 < a.num_slots; s0 += kCombineBatch) {
      const float wsrc = s0 < 32 ? w0 : w1;
      float ws[kCombineBatch / 2];
      Raw8 raw[kCombineBatch / 2];
#pragma unroll
      for (int i = 0; i < kCombineBatch / 2; ++i) {
        const int s = s0 + 2 * i + half;
        ws[i] = __shfl_sync(0xffffffffu, wsrc, s & 31);
        if (s >= a.num_slots) ws[i] = 0.0f;
        raw[i] = Raw8{};
        if (ws[i] != 0.0f) raw[i] = load8<kKind>(a.part_o, elem0 + int64_t(s) * slot_elems);
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
    const float mul = a.v_scale / wsum;
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
    *reinterpret_cast<uint4*>(static_cast<OutElem*>(a.out) + out_idx * 128 + 8 * hl) = packed;
  }
  if (a.lse != nullptr && lane == 0) a.lse[out_idx] = lse;
  if (a.lse_t != nullptr) {
    const float t0 = lane < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane) * a.group]) : neg_inf();
    const float t1 = lane + 32 < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane + 32) * a.group]) : neg_inf();
    const float lse_t = combined_lse(t0, t1);
    if (lane == 0) a.lse_t[out_idx] = lse_t;
  }
}

// ---- prefetching variant (CombineArgs::prefetch) ----------------------------------------------
// The batched combine above waits twice per (row, head): for the slot LSEs, then (their weights
// known) for the partial outputs. Here a warp issues every load of a (row, head) at once, the
// outputs of the first kCombineBatch slots included whatever their weight (every slot < num_slots
// has its place in the partial buffer; a value of weight 0 is loaded but never used), and issues
// the loads of its next (row, head) before it reduces the current one: two (row, head)s (8 KB) in
// flight per warp where the batched kernel has at most one (4 KB), and one round trip per
// (row, head) instead of two. The arithmetic is that of combine_one, in the same order, so results
// are bit-identical to it.
// 16-bit partial kinds only (KV-major's; the raw bits of 8 values are one uint4).
template <StoreKind kKind>
struct CombineLoads {
  static_assert(kKind == StoreKind::kBF16 || kKind == StoreKind::kF16, "16-bit partials");
  float v0;                        // raw slot LSE (lanes = slots; num_slots <= kCombineBatch)
  uint4 raw[kCombineBatch / 2];    // slots 2 i + half of the first batch
};

// Issues every load of row row_begin + rel, head kh * G + g that does not depend on the weights.
template <StoreKind kKind>
MSA_DEVICE void combine_issue(const CombineArgs& a, int rel, int kh, int g, int lane, CombineLoads<kKind>& L) {
  const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
  const int half = lane >> 4, hl = lane & 15;
  L.v0 = lane < a.num_slots ? a.part_lse[base + int64_t(lane) * a.group] : neg_inf();
  const int64_t elem0 = base * 128 + 8 * hl;
  const int64_t slot_elems = int64_t(a.group) * 128;
#pragma unroll
  for (int i = 0; i < kCombineBatch / 2; ++i) {
    const int s = 2 * i + half;
    L.raw[i] = make_uint4(0u, 0u, 0u, 0u);
    if (s < a.num_slots) L.raw[i] = load8<kKind>(a.part_o, elem0 + int64_t(s) * slot_elems).a;
  }
}

// The rest of combine_one for the loads in L (num_slots <= kCombineBatch: one batch, all in L).
template <typename OutElem, StoreKind kKind>
MSA_DEVICE void combine_finish(const CombineArgs& a, int rel, int kh, int g, int lane, const CombineLoads<kKind>& L) {
  const int hq = kh * a.group + g;
  const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
  const int64_t out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + hq;
  const int half = lane >> 4, hl = lane & 15;

  const float v0 = sanitize_lse(L.v0), v1 = neg_inf();
  const float m = warp_max(fmaxf(v0, v1));
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  float lse = neg_inf();
  if (m != neg_inf()) {
    const float w0 = exp2_approx(v0 - m), w1 = exp2_approx(v1 - m);
    const float wsum = warp_sum(w0 + w1);
#pragma unroll
    for (int i = 0; i < kCombineBatch / 2; ++i) {
      const int s = 2 * i + half;
      float w = __shfl_sync(0xffffffffu, w0, s);
      if (s >= a.num_slots) w = 0.0f;
      if (w == 0.0f) continue;
      float v[8];
      unpack8<kKind>(Raw8{L.raw[i], make_uint4(0u, 0u, 0u, 0u)}, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += w * clamp_finite(v[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
    const float mul = a.v_scale / wsum;
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
    *reinterpret_cast<uint4*>(static_cast<OutElem*>(a.out) + out_idx * 128 + 8 * hl) = packed;
  }
  if (a.lse != nullptr && lane == 0) a.lse[out_idx] = lse;
  if (a.lse_t != nullptr) {
    const float t0 = lane < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane) * a.group]) : neg_inf();
    const float t1 = lane + 32 < a.num_slots ? sanitize_lse(a.part_lse_t[base + int64_t(lane + 32) * a.group]) : neg_inf();
    const float lse_t = combined_lse(t0, t1);
    if (lane == 0) a.lse_t[out_idx] = lse_t;
  }
}

// Work unit u of the combine: (kv head, run of unit_rows = max(1, 128 / G) rows) x its G heads,
// about 128 (row, head) pairs, shared by the `num_warps` warps of the calling CTA in turn (warp
// `warp` takes pairs warp, warp + num_warps, ...). With shared-selection tiles a unit is one tile
// (launch.h: the tile kernel uses the same rows), so a tile done there costs one flag read.
// kPrefetch (16-bit partials, num_slots <= kCombineBatch): combine_issue / combine_finish with two
// load sets, the next pair's loads in flight while the current one is reduced; with kOneSet one
// load set (one round trip per pair instead of the batched merge's two, half the registers).
template <typename OutElem, StoreKind kKind, bool kPrefetch, bool kOneSet = false>
MSA_DEVICE void combine_unit(const CombineArgs& a, int u, int warp, int num_warps, int lane) {
  const int t = a.unit_rows;
  const int first = a.row_begin / t;
  const int per_head = (a.row_begin + a.rows - 1) / t - first + 1;
  const int kh = u / per_head, tile = first + u % per_head;
  if (a.union_done != nullptr && a.union_done[int64_t(kh) * a.union_num_tiles + tile]) return;
  const int r_begin = max(tile * t, a.row_begin);
  const int r_end = min((tile + 1) * t, a.row_begin + a.rows);
  const int n = (r_end - r_begin) * a.group;
  const int rel0 = r_begin - a.row_begin;
  if constexpr (kPrefetch) {
    // Ping-pong between two load sets (a register copy of loads in flight would wait for them):
    // the loads of pair i + num_warps are issued before pair i is reduced.
    CombineLoads<kKind> la, lb;
    auto issue = [&](int i, CombineLoads<kKind>& L) {
      const int e = i / a.group;
      combine_issue<kKind>(a, rel0 + e, kh, i - e * a.group, lane, L);
    };
    auto finish = [&](int i, const CombineLoads<kKind>& L) {
      const int e = i / a.group;
      combine_finish<OutElem, kKind>(a, rel0 + e, kh, i - e * a.group, lane, L);
    };
    if constexpr (kOneSet) {
      for (int i = warp; i < n; i += num_warps) {  // warp-uniform loop
        issue(i, la);
        finish(i, la);
      }
    } else {
      if (warp < n) issue(warp, la);
      for (int i = warp; i < n; i += 2 * num_warps) {  // warp-uniform loop
        if (i + num_warps < n) issue(i + num_warps, lb);
        finish(i, la);
        if (i + num_warps >= n) break;
        if (i + 2 * num_warps < n) issue(i + 2 * num_warps, la);
        finish(i + num_warps, lb);
      }
    }
  } else {
    for (int i = warp; i < n; i += num_warps) {  // warp-uniform loop
      const int e = i / a.group;
      combine_one<OutElem, kKind>(a, rel0 + e, kh, i - e * a.group, lane);
    }
  }
}

// Work units of a combine: (kv heads) x (unit-row runs touching the rows).
MSA_HOST_DEVICE int64_t combine_units(const CombineArgs& a) {
  if (a.rows <= 0) return 0;
  const int64_t per_head = (int64_t(a.row_begin) + a.rows - 1) / a.unit_rows - a.row_begin / a.unit_rows + 1;
  return int64_t(a.num_kv_heads) * per_head;
}

}  // namespace flashmsa::sparse_attn

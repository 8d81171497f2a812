// SM80+ device building blocks as thin inline-PTX wrappers: cp.async, ldmatrix, mma.sync
// m16n8k16 (bf16 / fp16 in, fp32 accumulate), exact fp8 e4m3 -> bf16 / fp16 conversion, and the
// 16-byte XOR swizzle used for [rows x 128] 16-bit tiles. Every wrapper is valid on sm_80 and up.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashmsa::cuda {

// ---- element types -------------------------------------------------------------------------
// The MMA operand type of a kernel instantiation. fp8 inputs are converted to one of these.
template <typename Element>
struct MmaType;
template <>
struct MmaType<__nv_bfloat16> {
  static constexpr bool kIsBF16 = true;
};
template <>
struct MmaType<__half> {
  static constexpr bool kIsBF16 = false;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async ------------------------------------------------------------------------------
// 16-byte global -> shared copy, bypassing L1 (.cg). `src` must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// 4-byte copy (.ca: the only cache mode allowed for sizes below 16). `src` 4-byte aligned.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix / mma --------------------------------------------------------------------------
// Four 8x8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A * B + D for one m16n8k16 tile (A row-major 16x16, B "col" 16x8, fp32 accumulators).
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  if constexpr (MmaType<Element>::kIsBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- swizzled [rows x 128] 16-bit tiles ------------------------------------------------------
// A row is 256 bytes = 16 chunks of 16 bytes. Chunk c of row r is stored at chunk (c ^ (r % 8)):
// the 8 rows an ldmatrix phase reads (same logical chunk, consecutive rows) land in 8 different
// bank groups, and cp.async writes of a whole row stay conflict-free.
__device__ __forceinline__ int swizzle_128x16b(int row, int chunk) {
  return row * 16 + (chunk ^ (row & 7));
}

// ---- fp8 e4m3 -> 16-bit, exact ---------------------------------------------------------------
// Two e4m3 bytes (low byte = element 0) to a packed pair of fp16 bit patterns. Every e4m3 value
// (subnormals included) is exact in fp16; S.1111.111 becomes a NaN.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_bits(uint16_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
#else
  // Place byte i in the high byte of half i, then move exponent|mantissa right by one: the fp16
  // pattern of the value divided by 2^8 (e4m3 bias 7 vs fp16 bias 15). Multiplying by 2^8 in fp16
  // is exact for normal and subnormal inputs (fp16 arithmetic keeps subnormals).
  uint32_t h;
  asm("prmt.b32 %0, %1, 0, 0x1404;\n" : "=r"(h) : "r"(uint32_t(x)));
  const uint32_t bits = (h & 0x80008000u) | ((h & 0x7F007F00u) >> 1);
  __half2 v = *reinterpret_cast<const __half2*>(&bits);
  v = __hmul2(v, __floats2half2_rn(256.0f, 256.0f));
  uint32_t r = *reinterpret_cast<const uint32_t*>(&v);
  if ((h & 0x7F00u) == 0x7F00u) r = (r & 0xFFFF0000u) | 0x7FFFu;
  if ((h & 0x7F000000u) == 0x7F000000u) r = (r & 0x0000FFFFu) | 0x7FFF0000u;
  return r;
#endif
}

// Two e4m3 bytes to the packed Element pair an MMA operand register holds.
template <typename Element>
__device__ __forceinline__ uint32_t e4m3x2_to_mma_bits(uint16_t x) {
  const uint32_t f16 = e4m3x2_to_f16x2_bits(x);
  if constexpr (MmaType<Element>::kIsBF16) {
    // fp16 -> fp32 -> bf16 is exact for every value with at most 4 significant bits (all e4m3).
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&f16));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t*>(&b);
  } else {
    return f16;
  }
}

// 16 e4m3 bytes (one uint4) to 16 Elements (two uint4), element order preserved.
template <typename Element>
__device__ __forceinline__ void e4m3x16_to_mma(const uint4& in, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = e4m3x2_to_mma_bits<Element>(uint16_t(w[i] & 0xFFFFu));
    o[2 * i + 1] = e4m3x2_to_mma_bits<Element>(uint16_t(w[i] >> 16));
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace flashmsa::cuda

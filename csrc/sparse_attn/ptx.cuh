// PTX building blocks of the portable (SM80+) sparse-attention kernels: cp.async with zero-fill,
// ldmatrix, mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ex2.approx, and the exact
// conversions of fp8 e4m3 and NVFP4 e2m1 values into the compute dtype.
//
// Fragment layouts of mma.m16n8k16 used throughout (PTX ISA "Matrix Fragments for mma.m16n8k16"),
// with gid = lane / 4 and tig = lane % 4:
//   A (16x16, row-major): a0 = (gid, 2tig..+1), a1 = (gid+8, 2tig..+1), a2 = (gid, 2tig+8..+9),
//                         a3 = (gid+8, 2tig+8..+9)
//   B (16x8, "col"):      b0 = (k 2tig..+1, n gid), b1 = (k 2tig+8..+9, n gid)
//   C (16x8, fp32):       c0,c1 = (gid, 2tig..+1), c2,c3 = (gid+8, 2tig..+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#define MSA_DEVICE __device__ __forceinline__

namespace flashmsa::sparse_attn {

// ---- shared memory addressing ------------------------------------------------------------------

MSA_DEVICE uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// Byte offset of 16-byte chunk `chunk` (0..15) of row `row` in a [rows][128] tile of 16-bit
// elements (256 bytes per row). The chunk index is XOR-ed with row % 8 so that the 8 rows an
// ldmatrix phase reads at the same logical chunk fall into 8 different bank groups (without it,
// every row starts at bank 0 and ldmatrix is 8-way conflicted).
MSA_DEVICE uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row) * 256u + (uint32_t(chunk ^ (row & 7)) << 4);
}

// ---- cp.async ----------------------------------------------------------------------------------

// Copies 16 bytes global -> shared; when !pred nothing is read and the 16 bytes are zero-filled
// (src-size 0). `src` must still be a valid address, so callers pass a safe pointer then.
MSA_DEVICE void cp_async_16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}

MSA_DEVICE void cp_async_4(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 4 : 0)
               : "memory");
}

MSA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
MSA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- ldmatrix / mma ----------------------------------------------------------------------------

MSA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

MSA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile; Elem is __nv_bfloat16 or __half.
template <typename Elem>
MSA_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Elem, __half>, "compute dtype is bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// 2^x; ex2.approx(-inf) = +0, which the masked softmax relies on.
MSA_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- conversions -------------------------------------------------------------------------------

// Two floats -> two packed compute-dtype values (lo in the low 16 bits), round to nearest even.
template <typename Elem>
MSA_DEVICE uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Two fp8 e4m3 values (low byte first) -> packed compute dtype. Exact: every e4m3 value is an
// fp16 value, and fp16 -> fp32 -> bf16 is exact for values with <= 4 significant bits.
template <typename Elem>
MSA_DEVICE uint32_t e4m3x2_to(uint16_t bits) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(bits), __NV_E4M3);
  if constexpr (std::is_same_v<Elem, __half>) {
    return uint32_t(h.x) | (uint32_t(h.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(h));
    return pack2<Elem>(f.x, f.y);
  }
}

MSA_DEVICE float e4m3_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(bits), __NV_E4M3);
  return __half2float(__half(h));
}

// Two e2m1 codes (low nibble of `byte` = even element) times a block scale -> packed compute
// dtype. An e2m1 code s.ee.m placed at fp16 bits 15 and 11..9 is the fp16 value code * 2^-14 (ee = 0
// lands on fp16 subnormals, which scale the same way), so the product with scale * 2^14 (exact in
// fp32) is the dequantized value; it has <= 6 significant bits, so it is exact in bf16 and fp16.
template <typename Elem>
MSA_DEVICE uint32_t e2m1x2_to(uint32_t byte, float scale_x2p14) {
  const uint32_t lo = ((byte & 0x8u) << 12) | ((byte & 0x7u) << 9);
  const uint32_t hi = ((byte & 0x80u) << 8) | ((byte & 0x70u) << 5);
  __half2_raw h;
  h.x = uint16_t(lo);
  h.y = uint16_t(hi);
  const float2 f = __half22float2(__half2(h));
  return pack2<Elem>(f.x * scale_x2p14, f.y * scale_x2p14);
}

}  // namespace flashmsa::sparse_attn

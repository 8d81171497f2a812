// The one set of SM80+ device building blocks shared by every CUDA kernel of the library (proxy
// score, top-k select, sparse attention): thin inline-PTX wrappers for cp.async, ldmatrix,
// mma.sync m16n8k16 (bf16 / fp16 in, fp32 accumulate) and ex2.approx, the 16-byte XOR swizzle of
// [rows x 128] 16-bit tiles, and the exact conversions of fp8 e4m3 and NVFP4 e2m1 values into the
// MMA dtype. Every wrapper is valid on sm_80 and up.
//
// The helpers live in namespace flashmsa (not flashmsa::cuda) so that the kernels of
// flashmsa::cuda::{proxy, topk} and flashmsa::sparse_attn find them by ordinary unqualified lookup.
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

namespace flashmsa {

// ---- shared memory addressing ------------------------------------------------------------------

// The 32-bit shared-window address of a generic pointer to shared memory (the operand form of
// cp.async / ldmatrix).
MSA_DEVICE uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// The 16-byte XOR swizzle of a [rows x 128] tile of 16-bit elements: a row is 256 bytes = 16
// chunks of 16 bytes, and chunk c of row r is stored at chunk (c ^ (r % 8)). The 8 rows an ldmatrix
// phase reads at the same logical chunk then fall into 8 different bank groups (without it every
// row starts at bank 0 and ldmatrix is 8-way conflicted), and cp.async writes of a whole row stay
// conflict-free. Two spellings of the same layout, kept separate because the kernels index the
// tile differently and each keeps its own integer arithmetic (hence its exact SASS):
//   swizzle_128x16b       -> index of the 16-byte chunk (for uint4* indexing; proxy score),
//   swizzle_128x16b_bytes -> byte offset (for 32-bit smem address arithmetic; sparse attention).
MSA_DEVICE int swizzle_128x16b(int row, int chunk) { return row * 16 + (chunk ^ (row & 7)); }
MSA_DEVICE uint32_t swizzle_128x16b_bytes(int row, int chunk) {
  return uint32_t(row) * 256u + (uint32_t(chunk ^ (row & 7)) << 4);
}

// ---- predicated global store ---------------------------------------------------------------------

// 16-byte global store done only when `pred` (a predicated instruction, not a branch: a run of them
// can follow a run of loads without a branch between each pair). `dst` 16-byte aligned; when !pred
// it is not accessed.
MSA_DEVICE void st_global_16_if(void* dst, uint4 v, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(int(pred))
      : "memory");
}

// ---- cp.async ----------------------------------------------------------------------------------

// 16-byte global -> shared copy, bypassing L1 (.cg). `src` must be 16-byte aligned.
MSA_DEVICE void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// 4-byte copy (.ca: the only cache mode allowed for sizes below 16). `src` 4-byte aligned.
MSA_DEVICE void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

// Zero-fill variants: when !pred nothing is read and the destination bytes are zero-filled
// (src-size 0), which handles ragged tiles without a branch. `src` must still be a valid address,
// so callers pass a safe pointer then. A separate name rather than a defaulted `pred`: the extra
// src-size operand is a different instruction form, and the copies without it stay exactly as
// they were.
MSA_DEVICE void cp_async_16_zfill(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
}
MSA_DEVICE void cp_async_4_zfill(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 4 : 0)
               : "memory");
}

// The "memory" clobber keeps the compiler from moving ordinary shared-memory accesses across the
// commit / wait (the hardware ordering alone does not constrain the compiler).
MSA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
MSA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- ldmatrix / mma ----------------------------------------------------------------------------

// Four 8x8 b16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8).
MSA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Same, each 8x8 matrix transposed on the way (B operands stored k-major).
MSA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile (A row-major 16x16, B "col" 16x8, fp32 accumulators);
// Elem is __nv_bfloat16 or __half.
template <typename Elem>
MSA_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Elem, __half>, "MMA dtype is bf16 or fp16");
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

// log2(x) and 1 / x by the special-function unit (MUFU.LG2 / MUFU.RCP): log2's absolute error at
// most ~2^-22 over [0.5, 2] and relative ~2^-22 elsewhere, the reciprocal's at most 1 ulp; for
// finite x > 0 (a row's softmax sum l >= 1).
MSA_DEVICE float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
MSA_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- conversions -------------------------------------------------------------------------------

// Two floats -> two packed MMA-dtype values (lo in the low 16 bits), round to nearest even.
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

// fp8 e4m3 -> 16-bit comes in two families, one per original kernel, kept under distinct names:
//   e4m3x2_to_f16x2_bits / e4m3x2_to_mma_bits / e4m3x16_to_mma (proxy score): own inline PTX;
//   e4m3x2_to / e4m3_to_float (sparse attention): the cuda_fp8.h intrinsics.
// On sm_89+ both lower to the same cvt.rn.f16x2.e4m3x2. On sm_80 each has its own software
// fallback (prmt + hmul2 here, the CUDA header's bit manipulation there); a host emulation of both
// fallbacks gives identical fp16 bits for all 65536 e4m3x2 inputs (NaN S.1111.111 -> 0x7FFF for
// both signs in both), so merging them is safe numerically, but it would change one kernel's
// instruction sequence (and register allocation), which needs its own device verification.

// Two e4m3 bytes (low byte = element 0) to a packed pair of fp16 bit patterns. Every e4m3 value
// (subnormals included) is exact in fp16; S.1111.111 becomes a NaN.
MSA_DEVICE uint32_t e4m3x2_to_f16x2_bits(uint16_t x) {
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

// Two e4m3 bytes to the packed Elem pair an MMA operand register holds.
template <typename Elem>
MSA_DEVICE uint32_t e4m3x2_to_mma_bits(uint16_t x) {
  const uint32_t f16 = e4m3x2_to_f16x2_bits(x);
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    // fp16 -> fp32 -> bf16 is exact for every value with at most 4 significant bits (all e4m3).
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&f16));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    return *reinterpret_cast<const uint32_t*>(&b);
  } else {
    static_assert(std::is_same_v<Elem, __half>, "MMA dtype is bf16 or fp16");
    return f16;
  }
}

// 16 e4m3 bytes (one uint4) to 16 converted values (two uint4: values 0-7, 8-15), element order
// preserved; cvt maps two e4m3 bytes (low byte first) to a packed pair.
template <typename Cvt>
MSA_DEVICE void e4m3x16_convert(const uint4& in, uint4& lo, uint4& hi, Cvt cvt) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = cvt(uint16_t(w[i] & 0xFFFFu));
    o[2 * i + 1] = cvt(uint16_t(w[i] >> 16));
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// 16 e4m3 bytes to 16 Elems through e4m3x2_to_mma_bits (the proxy kernel's conversion).
template <typename Elem>
MSA_DEVICE void e4m3x16_to_mma(const uint4& in, uint4& lo, uint4& hi) {
  e4m3x16_convert(in, lo, hi, [](uint16_t x) { return e4m3x2_to_mma_bits<Elem>(x); });
}

// Two fp8 e4m3 values (low byte first) -> packed MMA dtype. Exact: every e4m3 value is an fp16
// value, and fp16 -> fp32 -> bf16 is exact for values with <= 4 significant bits.
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

// 16 e4m3 bytes to 16 Elems through e4m3x2_to (the attention kernels' conversion).
template <typename Elem>
MSA_DEVICE void e4m3x16_to(const uint4& in, uint4& lo, uint4& hi) {
  e4m3x16_convert(in, lo, hi, [](uint16_t x) { return e4m3x2_to<Elem>(x); });
}

MSA_DEVICE float e4m3_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(bits), __NV_E4M3);
  return __half2float(__half(h));
}

// Two e2m1 codes (low nibble of `byte` = even element) times a block scale -> packed MMA dtype.
// An e2m1 code s.ee.m placed at fp16 bits 15 and 11..9 is the fp16 value code * 2^-14 (ee = 0
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

// ---- NVFP4 into fp16 MMAs as value x 2^-7 (the register kernels: proxy_decode.cuh, kv_regs.cuh) --
// An e2m1 code placed at fp16 bits 15 and 11..9 is the fp16 number code x 2^-14 (subnormals
// included); times the block scale x 2^7 (<= 448 x 128, exact in fp16) it is value x 2^-7, exact
// (|value| <= 6 x 448 and its lowest bit is >= 2^-10). The kernels rescale by 2^7 in fp32.
// The codes at bits 0..3 (element 0) and 16..19 (element 1) of u as an fp16 pair, code x 2^-14.
MSA_DEVICE uint32_t e2m1_pair_code_bits(uint32_t u) {
  return ((u & 0x00070007u) << 9) | ((u & 0x00080008u) << 12);
}
// The two codes of one byte (low nibble = even element) as an fp16 pair, code x 2^-14.
MSA_DEVICE uint32_t e2m1x2_code_bits(uint32_t byte) {
  return e2m1_pair_code_bits(byte * 0x1001u);  // low nibble at bits 0..3, high nibble at 16..19
}
MSA_DEVICE uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// Two e4m3 block-scale bytes (bits 0..15) times 2^7 as an fp16 pair.
MSA_DEVICE uint32_t nvfp4_scale_pair_x128(uint32_t two_bytes) {
  return hmul2_bits(e4m3x2_to_f16x2_bits(uint16_t(two_bytes & 0xFFFFu)), 0x58005800u);  // 128 = 0x5800
}

// ---- bf16 q rows into fp16 MMAs (the register kernels: kv_regs.cuh, proxy_decode.cuh) ----------
// A bf16 row whose largest |q| is mx is multiplied by up = 2^(14 - E) into fp16 (its maximum in
// [2^14, 2^15), fp16 max 65504) and its logits by down = 2^(E - 14) back; E is the exponent of mx
// (0 and subnormal maxima count as -127, an inf maximum as 128) clamped to >= -100, so that up and
// down are normal floats. Exact for every element >= 2^-32 of the row maximum (fp16 keeps bf16's 8
// significant bits down to 2^-17); smaller ones keep the absolute precision 2^-24 of the scaled row.
struct F16RowScale {
  float up, down;
};
MSA_DEVICE F16RowScale f16_row_scale(float mx) {
  const int e = max(int((__float_as_uint(mx) >> 23) & 0xFFu) - 127, -100);
  return {__uint_as_float(uint32_t(14 - e + 127) << 23), __uint_as_float(uint32_t(e - 14 + 127) << 23)};
}
// The larger |value| of a packed bf16 pair.
MSA_DEVICE float bf16x2_abs_max(uint32_t w) {
  return fmaxf(fabsf(__uint_as_float(w << 16)), fabsf(__uint_as_float(w & 0xFFFF0000u)));
}
// A packed bf16 pair times up (f16_row_scale) as a packed fp16 pair.
MSA_DEVICE uint32_t bf16x2_scaled_to_f16x2(uint32_t w, float up) {
  return pack2<__half>(__uint_as_float(w << 16) * up, __uint_as_float(w & 0xFFFF0000u) * up);
}
// The maximum of v over the 4 lanes of a quad (the lanes sharing an MMA fragment row).
MSA_DEVICE float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// ---- thread-block clusters (sm_90) -------------------------------------------------------------
// Distributed shared memory between the CTAs of a cluster (the split-K decode with split=cluster,
// query_major.cuh): a CTA's rank in its cluster, the cluster barrier (arrive with release, wait
// with acquire: the shared-memory writes of every CTA before its arrive are visible to every CTA
// after its wait), and loads from another CTA's shared memory (mapa maps a shared-window address
// of this CTA to the same offset in CTA `rank`'s shared memory, addressed through
// ld.shared::cluster). On an architecture below sm_90 they trap: the planner only takes clusters
// where the kernel's image is sm_90 or newer.

MSA_DEVICE uint32_t cluster_ctarank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

// All threads of every CTA of the cluster (.aligned: every thread of a warp executes it together).
MSA_DEVICE void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// The shared::cluster address of shared-window address `addr` in the CTA of cluster rank `rank`.
MSA_DEVICE uint32_t cluster_map(uint32_t addr, uint32_t rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
#else
  __trap();
  return 0;
#endif
}

MSA_DEVICE float ld_cluster_f32(uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
#else
  __trap();
  return 0.0f;
#endif
}

MSA_DEVICE uint4 ld_cluster_v4(uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint4 v;
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
#else
  __trap();
  return make_uint4(0u, 0u, 0u, 0u);
#endif
}

MSA_DEVICE uint2 ld_cluster_v2(uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint2 v;
  asm volatile("ld.shared::cluster.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  return v;
#else
  __trap();
  return make_uint2(0u, 0u);
#endif
}

}  // namespace flashmsa

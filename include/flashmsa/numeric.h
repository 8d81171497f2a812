// Bit-exact scalar conversions shared by the CPU reference, the tests and (where no intrinsic is
// better) the kernels: bf16, fp16, fp8 e4m3fn, NVFP4 (e2m1 data + e4m3 block scales, 128x4 swizzle).
#pragma once

#include <cstdint>
#include <cstring>

#include "flashmsa/types.h"

namespace flashmsa {

MSA_HOST_DEVICE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MSA_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MSA_HOST_DEVICE float bf16_bits_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
MSA_HOST_DEVICE uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

MSA_HOST_DEVICE float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);  // +-0
  // Subnormal: value = mant * 2^-24.
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400u) == 0);
  return bits_to_float(sign | (uint32_t(112 - e) << 23) | ((mant & 0x3FFu) << 13));
}

// Round to nearest even, overflow to inf, NaN stays NaN.
MSA_HOST_DEVICE uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u);
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                  // normal fp16 (>= 2^-14)
    uint32_t r = a - 0x38000000u;                          // rebias exponent 127 -> 15
    r += 0xFFFu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 exactly ties to even 0)
  // Subnormal fp16: value / 2^-24 rounded to nearest even integer.
  const uint32_t exp = a >> 23;
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 13 + (113 - exp)
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);
}

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; S.1111.111 is NaN. Exact in
// bf16, fp16 and fp32.
MSA_HOST_DEVICE float e4m3_bits_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xFu;
  const uint32_t mant = b & 0x7u;
  if (exp == 0xFu && mant == 0x7u) return bits_to_float(sign | 0x7FC00000u);
  if (exp != 0) return bits_to_float(sign | ((exp + 120u) << 23) | (mant << 20));
  // Subnormal: mant * 2^-9.
  const float v = float(mant) * 0.001953125f;
  return sign ? -v : v;
}

// e2m1 (NVFP4 element) code -> value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
MSA_HOST_DEVICE float e2m1_to_float(uint32_t code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[code & 7u];
  return (code & 8u) ? -v : v;
}

// Element e (0..127) of an NVFP4 row: low nibble holds the even element, high nibble the odd one.
MSA_HOST_DEVICE uint32_t nvfp4_code(const uint8_t* row, int e) {
  const uint8_t byte = row[e >> 1];
  return (e & 1) ? (byte >> 4) : (byte & 0xFu);
}

// Byte offset of the scale of logical row r, scale column c (0..7), in the cuBLAS "128x4" layout:
// 128-row x 4-column tiles of 512 bytes; inside a tile, row r%128 = 32*q + p sits at p*16 + q*4.
MSA_HOST_DEVICE int64_t nvfp4_scale_offset(int64_t r, int c) {
  constexpr int64_t kColTiles = (kNvfp4ScaleCols + 3) / 4;  // 2
  return ((r / 128) * kColTiles + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// Bytes a scale buffer must hold for `rows` logical rows (rows padded to a multiple of 128).
MSA_HOST_DEVICE int64_t nvfp4_scale_bytes(int64_t rows) {
  return ((rows + 127) / 128) * 128 * kNvfp4ScaleCols;
}

// Logical scale rows: flat caches are ordered (token, head); paged ones (page, head, token_in_page).
MSA_HOST_DEVICE int64_t nvfp4_scale_row_flat(int64_t token, int head, int num_kv_heads) {
  return token * num_kv_heads + head;
}
MSA_HOST_DEVICE int64_t nvfp4_scale_row_paged(int64_t page, int head, int token_in_page,
                                              int num_kv_heads) {
  return (page * num_kv_heads + head) * kBlockSize + token_in_page;
}

// Dequantized element: e2m1 * e4m3 scale, in fp32 (exact for every code/scale pair).
MSA_HOST_DEVICE float nvfp4_value(const uint8_t* row, const uint8_t* scales, int64_t scale_row,
                                  int e) {
  return e2m1_to_float(nvfp4_code(row, e)) *
         e4m3_bits_to_float(scales[nvfp4_scale_offset(scale_row, e / 16)]);
}

}  // namespace flashmsa

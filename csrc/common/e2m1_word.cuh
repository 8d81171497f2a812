// NVFP4 (e2m1) codes into mma.sync B fragments a 32-bit word (8 codes) at a time, shared by the
// sparse decode register kernel (sparse_attn/kv_regs.cuh, decode plan option nvfp4_cvt=word) and
// the proxy-score decode kernel (proxy_score/proxy_decode.cuh, proxy plan option nvfp4_cvt=word).
// The same 2^-7 placement as common/ptx.cuh's byte conversion (e2m1x2_code_bits): a code placed
// as an fp16 number (code x 2^-14) times the block scale x 2^7 in one HMUL2, exact.
//   e2m1_hi_codes(x): byte i = the fp16 high byte of the high nibble of byte i of x (sign at bit 7,
//     e e m at bits 3..1: code x 2^-14 once at fp16 bits 8..15); 3 instructions (2 LOP3, LEA.HI);
//   e2m1_lo_codes(x): the same for the low nibbles; 4 instructions;
//   an fp16 pair is two of these bytes at bits 8..15 and 24..31 with zero low bytes: bytes 0 and 2
//     by one prmt with a zero operand (codes_02), bytes 1 and 3 by one AND (codes_13);
// 11 instructions per 4 fp16 pairs before their HMUL2, against ~6 per pair a byte at a time (the
// byte's extraction, the 0x1001 spread, masks and shifts). A word yields the nibble pairs (i, i + 4)
// (dims d, d + 4): a k-step of Q K^T then takes its dims in that order, and q_frags_word_order
// permutes the Q fragments to match (the same dot products, summed in another order by the MMA).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace flashmsa {

MSA_DEVICE uint32_t e2m1_hi_codes(uint32_t x) { return (x & 0x80808080u) | ((x & 0x70707070u) >> 3); }
MSA_DEVICE uint32_t e2m1_lo_codes(uint32_t x) { return ((x << 4) & 0x80808080u) | ((x & 0x07070707u) << 1); }
// Code bytes 0 and 2 (codes_02) or 1 and 3 (codes_13) of c as an fp16 pair (low bytes zero).
MSA_DEVICE uint32_t codes_02(uint32_t c) { return __byte_perm(c, 0u, 0x2404u); }
MSA_DEVICE uint32_t codes_13(uint32_t c) { return c & 0xFF00FF00u; }
// a times half i of s on both halves (HMUL2's half-select operand: no prmt to broadcast it).
MSA_DEVICE uint32_t hmul2_half_bits(uint32_t a, uint32_t s, int i) {
  const __half2 s2 = *reinterpret_cast<const __half2*>(&s);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), i == 0 ? __low2half2(s2) : __high2half2(s2));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A fragments whose k-step kk covers the dims D + 4 kk + e (+ 2) at k index 2 tig + e (+ 8) (D: the
// lane's 32 dims, as 4 chunks of 8; kv_regs.cuh load_q_frags_f16, proxy_decode.cuh load_q_frags)
// into the order of the word conversion: k-step 2 m + o, k index 2 tig + e (+ 8) = dim
// D + 8 m + 2 o + 4 e (+ 1).
MSA_DEVICE void q_frags_word_order(uint32_t (&qa)[8][4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t n[2][4];
#pragma unroll
    for (int o = 0; o < 2; ++o)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t lo = qa[2 * m][2 * o + h], hi = qa[2 * m + 1][2 * o + h];  // dims d, d + 1 | d + 4, d + 5
        n[o][h] = __byte_perm(lo, hi, 0x5410u);      // dims d, d + 4
        n[o][2 + h] = __byte_perm(lo, hi, 0x7632u);  // dims d + 1, d + 5
      }
#pragma unroll
    for (int o = 0; o < 2; ++o)
#pragma unroll
      for (int r = 0; r < 4; ++r) qa[2 * m + o][r] = n[o][r];
  }
}

}  // namespace flashmsa

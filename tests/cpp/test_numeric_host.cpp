// numeric.h against naive decoders and rounding written here from the format definitions (value =
// significand * 2^exponent computed in double, rounding by std::nearbyint, which is round-half-even
// in the default rounding mode): every bf16 / fp16 / e4m3 / e2m1 code, RNE ties, subnormals,
// overflow, and the NVFP4 128x4 scale layout.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "flashmsa/numeric.h"

namespace flashmsa {
namespace {

float f_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t u_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Same float, NaNs compared as "both NaN".
bool same_value(float a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return double(a) == b && std::signbit(a) == std::signbit(b);
}

// ---- naive formats ---------------------------------------------------------------------------

// A binary float with `ebits` exponent bits (bias 2^(ebits-1) - 1) and `mbits` mantissa bits.
double naive_decode(uint32_t code, int ebits, int mbits, bool has_inf) {
  const uint32_t sign = code >> (ebits + mbits);
  const uint32_t e = (code >> mbits) & ((1u << ebits) - 1u);
  const uint32_t m = code & ((1u << mbits) - 1u);
  const int bias = (1 << (ebits - 1)) - 1;
  double v;
  if (has_inf && e == (1u << ebits) - 1u) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(double((1u << mbits) + m), int(e) - bias - mbits);
  }
  return sign ? -v : v;
}

// x rounded to a format with `mbits` mantissa bits, minimum normal exponent emin and overflow
// threshold `overflow` (the first value that rounds to inf): round half to even, in double.
double naive_round(double x, int mbits, int emin, double overflow) {
  const double a = std::fabs(x);
  double r;
  if (a >= overflow) {
    r = std::numeric_limits<double>::infinity();
  } else if (a == 0.0) {
    r = 0.0;
  } else {
    int e;
    std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): exponent of the leading bit is e - 1
    const int lead = std::max(e - 1, emin);
    const double ulp = std::ldexp(1.0, lead - mbits);
    r = std::nearbyint(a / ulp) * ulp;
  }
  return std::signbit(x) ? -r : r;
}

double naive_bf16_round(float x) {
  // Overflow threshold: halfway between the largest bf16 (0x7F7F) and 2^128.
  return naive_round(x, 7, -126, std::ldexp(1.0, 128) - std::ldexp(1.0, 128 - 9));
}
double naive_fp16_round(float x) { return naive_round(x, 10, -14, 65520.0); }

// Floats whose exponents span [-emax_span, emax_span] around 1, plus raw random bit patterns.
std::vector<float> sample_floats(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<float> v;
  for (int i = 0; i < n; ++i) {
    uint32_t u = uint32_t(rng());
    if (i % 2 == 0) {
      // exponent field 96..158: magnitudes 2^-31 .. 2^31, the fp16 range and beyond.
      u = (u & 0x807FFFFFu) | (uint32_t(96 + rng() % 63) << 23);
    }
    if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;  // no inf / NaN here
    v.push_back(f_of(u));
  }
  return v;
}

// ---- bf16 ------------------------------------------------------------------------------------

TEST(NumericBF16, EveryCodeDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_bits_to_float(uint16_t(h));
    ASSERT_TRUE(same_value(f, naive_decode(h, 8, 7, true))) << std::hex << h;
    if (std::isnan(f)) {
      const uint16_t back = float_to_bf16_bits(f);
      EXPECT_EQ(back & 0x7F80u, 0x7F80u) << std::hex << h;
      EXPECT_NE(back & 0x007Fu, 0u) << std::hex << h;
      EXPECT_EQ(back & 0x8000u, h & 0x8000u) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_bf16_bits(f), h) << std::hex << h;
    }
  }
}

TEST(NumericBF16, RoundsToNearestEven) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (float x : sample_floats(1, 200000))
    ASSERT_TRUE(same_value(bf16_bits_to_float(float_to_bf16_bits(x)), naive_bf16_round(x)))
        << std::hex << u_of(x);
}

TEST(NumericBF16, ExactTiesAndOverflow) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 20000; ++i) {
    // Halfway between bf16 code c and c + 1 (same sign): ties to the even code.
    uint32_t c = uint32_t(rng() % 0x7F7Fu) | (rng() % 2 ? 0x8000u : 0u);
    const float mid = f_of((c << 16) | 0x8000u);
    const uint32_t want = (c & 1u) ? c + 1 : c;
    ASSERT_EQ(float_to_bf16_bits(mid), want) << std::hex << c;
    // Just off the tie goes to the nearer side.
    ASSERT_EQ(float_to_bf16_bits(f_of((c << 16) | 0x7FFFu)), c);
    ASSERT_EQ(float_to_bf16_bits(f_of((c << 16) | 0x8001u)), c + 1);
  }
  EXPECT_EQ(float_to_bf16_bits(f_of(0x7F7FFFFFu)), 0x7F80u);  // FLT_MAX rounds to +inf
  EXPECT_EQ(float_to_bf16_bits(f_of(0xFF7F7FFFu)), 0xFF7Fu);  // below the midpoint stays finite
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80u);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_bf16_bits(f_of(0x00008000u)), 0x0000u);  // subnormal tie to even 0
  EXPECT_EQ(float_to_bf16_bits(f_of(0x00018000u)), 0x0002u);  // subnormal tie to even 2
  // A NaN whose payload sits only in the low 16 bits stays a NaN (no rounding into inf).
  EXPECT_EQ(float_to_bf16_bits(f_of(0x7F800001u)) & 0x7FC0u, 0x7FC0u);
  EXPECT_EQ(float_to_bf16_bits(f_of(0xFF800001u)), 0xFFC0u);
}

// ---- fp16 ------------------------------------------------------------------------------------

TEST(NumericFP16, EveryCodeDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_bits_to_float(uint16_t(h));
    ASSERT_TRUE(same_value(f, naive_decode(h, 5, 10, true))) << std::hex << h;
    if (std::isnan(f)) {
      const uint16_t back = float_to_fp16_bits(f);
      EXPECT_EQ(back & 0x7C00u, 0x7C00u);
      EXPECT_NE(back & 0x03FFu, 0u);
      EXPECT_EQ(back & 0x8000u, h & 0x8000u);
    } else {
      ASSERT_EQ(float_to_fp16_bits(f), h) << std::hex << h;
    }
  }
}

TEST(NumericFP16, RoundsToNearestEven) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (float x : sample_floats(3, 200000))
    ASSERT_TRUE(same_value(fp16_bits_to_float(float_to_fp16_bits(x)), naive_fp16_round(x)))
        << x << " (" << std::hex << u_of(x) << ")";
}

TEST(NumericFP16, TiesBetweenEveryPairOfNeighbours) {
  // The midpoint of every two consecutive finite fp16 values (exact in fp32) rounds to the even code.
  for (uint32_t c = 0; c < 0x7BFFu; ++c)
    for (uint32_t sign : {0u, 0x8000u}) {
      const double lo = naive_decode(c, 5, 10, true), hi = naive_decode(c + 1, 5, 10, true);
      const float mid = float((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2);
      const float x = sign ? -mid : mid;
      ASSERT_EQ(float_to_fp16_bits(x), ((c & 1u) ? c + 1 : c) | sign) << std::hex << c;
    }
}

TEST(NumericFP16, SubnormalsAndOverflow) {
  const float tiny = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_fp16_bits(tiny), 0x0001u);
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000u);  // tie to even 0
  EXPECT_EQ(float_to_fp16_bits(-std::ldexp(1.0f, -25)), 0x8000u);
  EXPECT_EQ(float_to_fp16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002u);   // 1.5 ulp -> 2
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(5.0f, -25)), 0x0002u);   // 2.5 ulp -> 2
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1023.0f, -24)), 0x03FFu);  // largest subnormal
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(2047.0f, -25)), 0x0400u);  // tie -> smallest normal
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400u);
  EXPECT_EQ(float_to_fp16_bits(1e-30f), 0x0000u);
  EXPECT_EQ(fp16_bits_to_float(0x0001u), tiny);
  EXPECT_EQ(fp16_bits_to_float(0x83FFu), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7BFFu);
  EXPECT_EQ(float_to_fp16_bits(65519.996f), 0x7BFFu);
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7C00u);
  EXPECT_EQ(float_to_fp16_bits(-1e9f), 0xFC00u);
  EXPECT_EQ(float_to_fp16_bits(std::numeric_limits<float>::infinity()), 0x7C00u);
  EXPECT_EQ(float_to_fp16_bits(-0.0f), 0x8000u);
  const uint16_t nan = float_to_fp16_bits(f_of(0xFFC00001u));
  EXPECT_EQ(nan & 0xFC00u, 0xFC00u);
  EXPECT_NE(nan & 0x03FFu, 0u);
}

// ---- e4m3 ------------------------------------------------------------------------------------

TEST(NumericE4M3, EveryCodeMatchesNaiveDecoder) {
  int nans = 0;
  for (uint32_t code = 0; code < 256; ++code) {
    const float f = e4m3_bits_to_float(uint8_t(code));
    double want;
    if ((code & 0x7Fu) == 0x7Fu) {
      want = std::numeric_limits<double>::quiet_NaN();  // e4m3fn: only S.1111.111 is NaN, no inf
      ++nans;
    } else {
      want = naive_decode(code, 4, 3, false);
    }
    ASSERT_TRUE(same_value(f, want)) << "code " << code << " -> " << f << ", want " << want;
    if (!std::isnan(f)) {
      // Exact in bf16 and fp16: "fp8 == its dequantized bf16 copy" rests on this.
      EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(f)), f) << code;
      EXPECT_EQ(fp16_bits_to_float(float_to_fp16_bits(f)), f) << code;
    }
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_bits_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_bits_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_bits_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_bits_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::signbit(e4m3_bits_to_float(0x80)));
}

// ---- NVFP4 -----------------------------------------------------------------------------------

TEST(NumericNVFP4, E2M1TableAndNibbleOrder) {
  for (uint32_t code = 0; code < 16; ++code) {
    // e2m1: 1 sign, 2 exponent (bias 1), 1 mantissa, no inf/NaN.
    EXPECT_TRUE(same_value(e2m1_to_float(code), naive_decode(code, 2, 1, false))) << code;
  }
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_float(uint32_t(c)), mags[c]);
    EXPECT_EQ(e2m1_to_float(uint32_t(c + 8)), -mags[c]);
  }
  // Low nibble = even element.
  uint8_t row[64] = {};
  row[0] = 0x7A;  // element 0: code 0xA (-1), element 1: code 0x7 (6)
  row[63] = 0x1F;  // element 126: 0xF (-6), element 127: 0x1 (0.5)
  EXPECT_EQ(nvfp4_code(row, 0), 0xAu);
  EXPECT_EQ(nvfp4_code(row, 1), 0x7u);
  EXPECT_EQ(nvfp4_code(row, 126), 0xFu);
  EXPECT_EQ(nvfp4_code(row, 127), 0x1u);
  EXPECT_EQ(nvfp4_code(row, 2), 0x0u);
}

// The formula of docs/semantics.md#nvfp4, verbatim (Python // on non-negative ints).
int64_t spec_scale_offset(int64_t r, int64_t c) {
  return ((r / 128) * ((8 + 3) / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// The same layout described as the torch reshape/permute of the quantizers: the (R, 8) scale matrix
// viewed as (R/128, 4, 32, 2, 4) [rt, q, p, ct, c4] and stored in the order (rt, ct, p, q, c4).
int64_t permuted_scale_offset(int64_t r, int64_t c) {
  const int64_t rt = r / 128, q = (r % 128) / 32, p = r % 32, ct = c / 4, c4 = c % 4;
  return (((rt * 2 + ct) * 32 + p) * 4 + q) * 4 + c4;
}

TEST(NumericNVFP4, ScaleOffsetMatchesSpecAndIsABijectionPerTile) {
  for (int64_t r = 0; r < 128 * 5; ++r)
    for (int c = 0; c < 8; ++c) {
      ASSERT_EQ(nvfp4_scale_offset(r, c), spec_scale_offset(r, c)) << r << "," << c;
      ASSERT_EQ(nvfp4_scale_offset(r, c), permuted_scale_offset(r, c)) << r << "," << c;
    }
  for (int64_t tile = 0; tile < 4; ++tile) {
    std::vector<int> hits(1024, 0);
    for (int64_t r = tile * 128; r < (tile + 1) * 128; ++r)
      for (int c = 0; c < 8; ++c) {
        const int64_t off = nvfp4_scale_offset(r, c) - tile * 1024;
        ASSERT_GE(off, 0);
        ASSERT_LT(off, 1024);
        ++hits[size_t(off)];
      }
    for (int h : hits) ASSERT_EQ(h, 1);
  }
  // Every offset of the first `rows` rows fits in nvfp4_scale_bytes(rows).
  for (int64_t rows : {1, 127, 128, 129, 300}) {
    EXPECT_EQ(nvfp4_scale_bytes(rows), ((rows + 127) / 128) * 128 * 8);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < 8; ++c) ASSERT_LT(nvfp4_scale_offset(r, c), nvfp4_scale_bytes(rows));
  }
}

TEST(NumericNVFP4, ScaleRowsAndDequantizedValue) {
  EXPECT_EQ(nvfp4_scale_row_flat(10, 1, 4), 41);
  EXPECT_EQ(nvfp4_scale_row_paged(3, 1, 5, 2), (3 * 2 + 1) * 128 + 5);
  // Row 130, element 37 (scale column 2) with scale 0x40 (e4m3 2.0) and code 0xB (-1.5).
  std::vector<uint8_t> scales(size_t(nvfp4_scale_bytes(256)), 0);
  scales[size_t(spec_scale_offset(130, 2))] = 0x40;
  uint8_t row[64] = {};
  row[18] = 0xB0;  // element 37 (odd) in the high nibble
  EXPECT_EQ(e4m3_bits_to_float(0x40), 2.0f);
  EXPECT_EQ(nvfp4_value(row, scales.data(), 130, 37), -3.0f);
  EXPECT_EQ(nvfp4_value(row, scales.data(), 130, 36), 0.0f);
}

}  // namespace
}  // namespace flashmsa

// CPU reference of stage 3: sparse attention prefill (SPEC 4.2-4.6) and decode / MTP (SPEC 5),
// with D5 (q2k set semantics), D6 (any GQA group) and D8 (empty rows: exact 0, LSE -inf).
//
// This is the exact math the kernels are compared against, not a model of any kernel schedule:
// decode's partial_dtype / force_fused choose how a kernel splits and combines, and the kernels'
// split paths are checked against this reference with tolerances. Precision: inputs are upconverted
// exactly to fp32 (bf16, fp16, fp8 e4m3 and NVFP4 e2m1 * e4m3 values are all exact in fp32), every
// dot product, exponential, sum and weighted V sum is fp32, and only the final output is rounded
// (RNE) to out_dtype. Softmax is two-pass per row (max first, then sum and weighted V), so no
// rescaling error. Block order is canonical (ascending block id), so a q2k list gives bit-identical
// results whatever its order or duplicates, and flat, paged and packed K/V views agree bit for bit.
//
// Work is split over (query row, kv head): each item dequantizes each selected block's K (then V)
// once into float scratch and reuses it for the G query heads of that kv head. Items are
// independent and write disjoint outputs, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "flashmsa/semantics.h"

// Hot loops get an AVX2 clone next to the portable one (GCC function multi-versioning, picked at
// load time). The loops fix the order of every sum, and the avx2 target has no FMA to contract
// into, so both clones give the same bits (a build whose -march has FMA contracts in both).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MSA_REF_HOT __attribute__((target_clones("avx2", "default")))
#else
#define MSA_REF_HOT
#endif

namespace flashmsa::reference {
namespace {

constexpr int kD = kHeadDim;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// fp16 -> fp32 by table: fp16_bits_to_float is exact but branchy, and a prefill converts billions
// of K/V elements.
const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_bits_to_float(uint16_t(h));
    return t;
  }();
  return table.data();
}

const float* e4m3_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (uint32_t b = 0; b < 256; ++b) t[b] = e4m3_bits_to_float(uint8_t(b));
    return t;
  }();
  return table.data();
}

// One 128-value row of a 16-bit tensor (bf16 / fp16) or an fp8 tensor -> fp32.
MSA_REF_HOT void load_row_bf16(const uint16_t* src, float* dst) {
  for (int d = 0; d < kD; ++d) dst[d] = bits_to_float(uint32_t(src[d]) << 16);
}
void load_row_table16(const uint16_t* src, const float* table, float* dst) {
  for (int d = 0; d < kD; ++d) dst[d] = table[src[d]];
}
void load_row_table8(const uint8_t* src, const float* table, float* dst) {
  for (int d = 0; d < kD; ++d) dst[d] = table[src[d]];
}

// One NVFP4 row: 64 bytes of e2m1 pairs (low nibble = even element) and 8 e4m3 block scales.
void load_row_nvfp4(const uint8_t* src, const uint8_t* scales, int64_t scale_row, float* dst) {
  for (int c = 0; c < kNvfp4ScaleCols; ++c) {
    const float s = e4m3_bits_to_float(scales[nvfp4_scale_offset(scale_row, c)]);
    for (int e = c * 16; e < c * 16 + 16; ++e) dst[e] = e2m1_to_float(nvfp4_code(src, e)) * s;
  }
}

// Keys [j0, j0 + n) of sequence b, kv head kh (all inside one block with a valid page) -> fp32
// rows dst[n][128]. Offsets are in storage elements of t (bytes for fp8 / NVFP4).
void load_keys(const KVTensor& t, const KVIndex& kv, int num_kv_heads, int b, int kh, int j0,
               int n, float* dst) {
  for (int k = 0; k < n; ++k) {
    const int j = j0 + k;
    const int64_t off = kv_offset(t, kv, b, kh, j);
    float* row = dst + int64_t(k) * kD;
    switch (t.dtype) {
      case DType::kBF16: load_row_bf16(static_cast<const uint16_t*>(t.data) + off, row); break;
      case DType::kFP16:
        load_row_table16(static_cast<const uint16_t*>(t.data) + off, fp16_table(), row);
        break;
      case DType::kFP8E4M3:
        load_row_table8(static_cast<const uint8_t*>(t.data) + off, e4m3_table(), row);
        break;
      case DType::kNVFP4:
        load_row_nvfp4(static_cast<const uint8_t*>(t.data) + off, t.scale,
                       kv_scale_row(kv, num_kv_heads, b, kh, j), row);
        break;
    }
  }
}

// Query row of one head -> fp32 (fp8 q is exact in bf16, so "computed as bf16" is the same value).
void load_q(const SparseAttnParams& p, int r, int hq, float* dst) {
  const int64_t off = int64_t(r) * p.q_stride_token + int64_t(hq) * p.q_stride_head;
  switch (p.q_dtype) {
    case DType::kBF16: load_row_bf16(static_cast<const uint16_t*>(p.q) + off, dst); break;
    case DType::kFP16:
      load_row_table16(static_cast<const uint16_t*>(p.q) + off, fp16_table(), dst);
      break;
    case DType::kFP8E4M3:
      load_row_table8(static_cast<const uint8_t*>(p.q) + off, e4m3_table(), dst);
      break;
    case DType::kNVFP4: MSA_FAIL("sparse attention reference: q cannot be NVFP4");
  }
}

// Eight fp32 lanes: one AVX2 register, two SSE registers in the portable clone. Loads and stores go
// through memcpy (unaligned, no aliasing questions).
typedef float v8f __attribute__((vector_size(32)));
constexpr int kLanes = 8;

// Logits of 8 keys at a time with the G heads in the vector lanes:
//   lg[k * Gp + h] = scale * sum_{d = 0..127, in order} q[h][d] * keys[k][d]
// qt is q transposed, qt[d * Gp + h] (Gp = G rounded up to 8, padding heads zero); keys[n8][128]
// with n8 = n rounded up to 8 (padding rows zero). Heads in lanes avoid both a horizontal
// reduction per dot and a transpose of the K block.
MSA_REF_HOT void qk_logits(const float* qt, int Gp, const float* keys, int n8, float scale,
                           float* lg) {
  for (int hv = 0; hv < Gp; hv += kLanes) {
    for (int k0 = 0; k0 < n8; k0 += kLanes) {
      v8f acc[kLanes] = {};
      const float* kr = keys + int64_t(k0) * kD;
      for (int d = 0; d < kD; ++d) {
        v8f qv;
        __builtin_memcpy(&qv, qt + int64_t(d) * Gp + hv, sizeof(v8f));
        for (int kk = 0; kk < kLanes; ++kk) acc[kk] += qv * kr[kk * kD + d];
      }
      for (int kk = 0; kk < kLanes; ++kk) {
        const v8f v = scale * acc[kk];
        __builtin_memcpy(lg + int64_t(k0 + kk) * Gp + hv, &v, sizeof(v8f));
      }
    }
  }
}

// Per head h < G over n keys of lg[n][Gp], 8 head lanes at a time: m = max logit; when lse_t is
// given, the temperature LSE ln sum exp(T * l) (shifted by max(T * l)); then lg <- exp(l - m) in
// place, sum = their sum (keys in order), lse = m + ln(sum).
MSA_REF_HOT void softmax_weights(float* lg, int64_t n, int G, int Gp, float T, float* sum,
                                 float* lse, float* lse_t) {
  for (int hv = 0; hv < G; hv += kLanes) {
    const int lanes = std::min(kLanes, G - hv);
    v8f m = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
    for (int64_t k = 0; k < n; ++k) {
      v8f x;
      __builtin_memcpy(&x, lg + k * Gp + hv, sizeof(v8f));
      m = x > m ? x : m;
    }
    if (lse_t != nullptr) {
      v8f mt = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
      for (int64_t k = 0; k < n; ++k) {
        v8f x;
        __builtin_memcpy(&x, lg + k * Gp + hv, sizeof(v8f));
        x *= T;
        mt = x > mt ? x : mt;
      }
      float st[kLanes] = {};
      for (int64_t k = 0; k < n; ++k)
        for (int l = 0; l < lanes; ++l) st[l] += std::exp(T * lg[k * Gp + hv + l] - mt[l]);
      for (int l = 0; l < lanes; ++l) lse_t[hv + l] = mt[l] + std::log(st[l]);
    }
    float s[kLanes] = {};
    for (int64_t k = 0; k < n; ++k) {
      float* x = lg + k * Gp + hv;
      for (int l = 0; l < lanes; ++l) {
        x[l] = std::exp(x[l] - m[l]);
        s[l] += x[l];
      }
    }
    for (int l = 0; l < lanes; ++l) {
      sum[hv + l] = s[l];
      lse[hv + l] = m[l] + std::log(s[l]);
    }
  }
}

// acc[h] += sum_k w[k * Gp + h] * vals[k] for G heads and n keys (vals[k]: 128 values), keys in
// order. Keys go in groups of 32 (16 KB of V, which stays in L1 while every head reads it), and
// 64 output dims of one head live in registers per pass.
MSA_REF_HOT void pv_accumulate(const float* w, int Gp, int G, const float* vals, int n,
                               float* acc) {
  constexpr int kChunk = 64;
  constexpr int kKeyGroup = 32;
  for (int k0 = 0; k0 < n; k0 += kKeyGroup) {
    const int k1 = std::min(n, k0 + kKeyGroup);
    for (int h = 0; h < G; ++h) {
      for (int c0 = 0; c0 < kD; c0 += kChunk) {
        float* ar = acc + int64_t(h) * kD + c0;
        v8f a[kChunk / kLanes];
        __builtin_memcpy(a, ar, sizeof(a));
        for (int k = k0; k < k1; ++k) {
          const float wk = w[int64_t(k) * Gp + h];
          const float* vr = vals + int64_t(k) * kD + c0;
          for (int l = 0; l < kChunk / kLanes; ++l) {
            v8f vv;
            __builtin_memcpy(&vv, vr + l * kLanes, sizeof(v8f));
            a[l] += wk * vv;
          }
        }
        __builtin_memcpy(ar, a, sizeof(a));
      }
    }
  }
}

// A selected block that contributes keys to a row: keys [128 * t, 128 * t + n).
struct SelectedBlock {
  int t;
  int n;
};

struct Scratch {
  std::vector<float> q;       // [128]: one head's query row at a time
  std::vector<float> qt;      // [128, Gp]: the G query rows transposed, padding heads zero
  std::vector<float> kv;      // [128 keys, 128]: one block of K or V, rows past the keys zero
  std::vector<float> lg;      // [keys, Gp]: logits, then exp(logit - max)
  std::vector<float> acc;     // [G, 128]
  std::vector<float> sum, lse, lse_t;  // [Gp]
  std::vector<SelectedBlock> blocks;
};

void write_row(const SparseAttnParams& p, int r, int hq, const float* o, float lse, float lse_t) {
  const int64_t base = (int64_t(r) * p.num_heads + hq) * kD;
  uint16_t* out = static_cast<uint16_t*>(p.out) + base;
  if (p.out_dtype == DType::kBF16) {
    for (int d = 0; d < kD; ++d) out[d] = float_to_bf16_bits(o[d]);
  } else {
    for (int d = 0; d < kD; ++d) out[d] = float_to_fp16_bits(o[d]);
  }
  if (p.lse != nullptr) p.lse[int64_t(r) * p.num_heads + hq] = lse;
  if (p.lse_temperature_out != nullptr) p.lse_temperature_out[int64_t(r) * p.num_heads + hq] = lse_t;
}

void write_empty_rows(const SparseAttnParams& p, int r, int kh, int G) {
  static const float zeros[kD] = {};
  for (int h = 0; h < G; ++h) write_row(p, r, kh * G + h, zeros, kNegInf, kNegInf);
}

// Row r (of sequence b, or b < 0 when no sequence covers it), kv head kh: the G heads kh*G ...
void attend(const SparseAttnParams& p, const std::vector<int>& owner, int r, int kh,
            Scratch& s) {
  const int G = p.num_heads / p.num_kv_heads;
  const int b = owner[r];
  if (b < 0) return write_empty_rows(p, r, kh, G);

  const RowRange rows = q_rows(p.qi, p.total_q, b);
  const int i = r - rows.begin;
  const int seqlen_k = kv_seqlen(p.kv, b);
  const int nb = num_blocks(seqlen_k);
  const int64_t q_off = q_offset_of(p.q_offset, b, rows.len, seqlen_k);
  const int limit = col_limit(p.causal, q_off, i, seqlen_k);

  // Selected set (D5): used entries of the list, canonical ascending order, keys below the limit,
  // blocks whose page is outside the cache dropped.
  const int* list = p.q2k + (int64_t(kh) * p.total_q + r) * p.topk;
  const int len = q2k_length(list, p.topk);
  s.blocks.clear();
  for (int e = 0; e < len; ++e) {
    if (!q2k_entry_used(list, e, nb)) continue;
    const int t = list[e];
    const int n = std::min(kBlockSize, limit - t * kBlockSize);
    if (n <= 0) continue;
    if (p.kv.page_table != nullptr && kv_page(p.kv, b, t) < 0) continue;
    s.blocks.push_back({t, n});
  }
  if (s.blocks.empty()) return write_empty_rows(p, r, kh, G);
  std::sort(s.blocks.begin(), s.blocks.end(),
            [](const SelectedBlock& x, const SelectedBlock& y) { return x.t < y.t; });
  int64_t num_keys = 0;
  for (const SelectedBlock& blk : s.blocks) num_keys += blk.n;

  const int Gp = int(ceil_div(G, kLanes)) * kLanes;
  s.q.resize(kD);
  s.qt.assign(size_t(kD) * Gp, 0.f);
  for (int h = 0; h < G; ++h) {
    load_q(p, r, kh * G + h, s.q.data());
    for (int d = 0; d < kD; ++d) s.qt[size_t(d) * Gp + h] = s.q[d];
  }
  s.kv.assign(size_t(kBlockSize) * kD, 0.f);
  s.lg.resize(size_t(ceil_div(num_keys, kLanes) * kLanes + kBlockSize) * Gp);
  s.acc.assign(size_t(G) * kD, 0.f);
  s.sum.resize(Gp);
  s.lse.resize(Gp);
  s.lse_t.assign(Gp, kNegInf);

  // Pass 1: logits of every selected key for the G heads. A block's padding rows (zero) give
  // logits that the next block overwrites or that lie past num_keys.
  const float scale = effective_softmax_scale(p);
  int64_t col = 0;
  for (const SelectedBlock& blk : s.blocks) {
    load_keys(p.k, p.kv, p.num_kv_heads, b, kh, blk.t * kBlockSize, blk.n, s.kv.data());
    const int n8 = int(ceil_div(blk.n, kLanes)) * kLanes;
    std::fill(s.kv.begin() + int64_t(blk.n) * kD, s.kv.begin() + int64_t(n8) * kD, 0.f);
    qk_logits(s.qt.data(), Gp, s.kv.data(), n8, scale, s.lg.data() + col * Gp);
    col += blk.n;
  }

  softmax_weights(s.lg.data(), num_keys, G, Gp, p.lse_temperature, s.sum.data(), s.lse.data(),
                  p.lse_temperature_out != nullptr ? s.lse_t.data() : nullptr);

  // Pass 2: weighted V.
  col = 0;
  for (const SelectedBlock& blk : s.blocks) {
    load_keys(p.v, p.kv, p.num_kv_heads, b, kh, blk.t * kBlockSize, blk.n, s.kv.data());
    pv_accumulate(s.lg.data() + col * Gp, Gp, G, s.kv.data(), blk.n, s.acc.data());
    col += blk.n;
  }

  float o[kD];
  for (int h = 0; h < G; ++h) {
    const float* a = s.acc.data() + int64_t(h) * kD;
    for (int d = 0; d < kD; ++d) o[d] = a[d] / s.sum[h] * p.v_global_scale;
    write_row(p, r, kh * G + h, o, s.lse[h], s.lse_t[h]);
  }
}

void check_common(const SparseAttnParams& p, const char* op) {
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads > 0 && p.num_heads % p.num_kv_heads == 0, op,
            ": num_heads (", p.num_heads, ") must be a positive multiple of num_kv_heads (",
            p.num_kv_heads, ")");
  MSA_CHECK(p.total_q >= 0 && p.batch >= 0, op, ": total_q and batch must be >= 0");
  MSA_CHECK(p.topk >= 1 && p.topk <= kMaxTopk, op, ": topk must be in [1, ", kMaxTopk, "], got ",
            p.topk);
  MSA_CHECK(p.out_dtype == DType::kBF16 || p.out_dtype == DType::kFP16, op,
            ": output dtype must be bfloat16 or float16, got ", dtype_name(p.out_dtype));
  MSA_CHECK(p.k.dtype == p.v.dtype, op, ": k and v must have the same dtype, got ",
            dtype_name(p.k.dtype), " and ", dtype_name(p.v.dtype));
  MSA_CHECK(p.k.dtype != DType::kNVFP4 || (p.k.scale != nullptr && p.v.scale != nullptr), op,
            ": NVFP4 k and v need k_scale and v_scale");
  MSA_CHECK(p.kv.page_table != nullptr || p.kv.cu_seqlens_k != nullptr, op,
            ": the flat layout needs cu_seqlens_k");
  MSA_CHECK(p.kv.page_table == nullptr || p.kv.cu_seqlens_k != nullptr || p.kv.seqused_k != nullptr,
            op, ": the paged layout needs seqused_k or cu_seqlens_k");
}

void run(const SparseAttnParams& p) {
  // Owner of each query row; rows covered by no sequence stay -1 and get 0 / -inf (a row claimed
  // by two sequences of a malformed cu_seqlens_q goes to the first).
  std::vector<int> owner(size_t(p.total_q), -1);
  for (int b = 0; b < p.batch; ++b) {
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    for (int r = rows.begin; r < rows.begin + rows.len; ++r)
      if (owner[r] < 0) owner[r] = b;
  }
  const int64_t items = int64_t(p.total_q) * p.num_kv_heads;
  parallel_for(items, [&](int64_t begin, int64_t end) {
    Scratch s;
    for (int64_t w = begin; w < end; ++w)
      attend(p, owner, int(w / p.num_kv_heads), int(w % p.num_kv_heads), s);
  });
}

}  // namespace

void sparse_attention(const SparseAttnParams& p) {
  check_common(p, "sparse_attention");
  MSA_CHECK(p.q_dtype == DType::kBF16 || p.q_dtype == DType::kFP16,
            "sparse_attention: q must be bfloat16 or float16, got ", dtype_name(p.q_dtype));
  run(p);
}

void sparse_decode(const SparseDecodeParams& p) {
  const SparseAttnParams& a = p.attn;
  check_common(a, "sparse_decode");
  MSA_CHECK(a.q_dtype == DType::kBF16 || a.q_dtype == DType::kFP16 || a.q_dtype == DType::kFP8E4M3,
            "sparse_decode: q must be bfloat16, float16 or float8_e4m3fn, got ",
            dtype_name(a.q_dtype));
  MSA_CHECK(a.qi.cu_seqlens_q == nullptr && a.qi.seqlen_q > 0,
            "sparse_decode: queries must have a uniform seqlen_q > 0 (cu_seqlens_q unset), got "
            "seqlen_q ",
            a.qi.seqlen_q);
  // partial_dtype and force_fused only pick a kernel schedule; the math is run()'s.
  run(a);
}

}  // namespace flashmsa::reference

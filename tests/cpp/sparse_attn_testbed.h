// Test bed of the stage-3 reference tests (sparse attention prefill and decode):
//   * problems whose inputs are exact values of their storage dtype (bf16, fp16, fp8 e4m3, NVFP4
//     e2m1 x e4m3 block scale), plus the test's own fp8 / NVFP4 encoders (docs/semantics.md#nvfp4);
//   * storage builders for every K/V layout the reference reads: flat, flat K|V interleaved, paged
//     HND / NHD, packed K|V (HND / NHD), NVFP4 flat / paged, with permuted pages, a partial last
//     page, spare pages, and NaN poison wherever the reference must not read;
//   * Params built directly (make_* validation is tested elsewhere);
//   * a deliberately naive fp64 oracle written from docs/semantics.md (sections 3, 3.3, 4, D5, D8):
//     dense masked softmax over the keys of the selected blocks, without semantics.h or the
//     reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"

namespace flashmsa::testing::sattn {

inline constexpr int kD = 128;    // head_dim
inline constexpr int kBlk = 128;  // tokens per block / page
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- the test's own encoders ---------------------------------------------------------------

// Nearest e4m3fn code of x (finite codes only; positive codes 0x00..0x7E increase with the code).
inline uint8_t e4m3_nearest(float x) {
  static const std::vector<float> pos = [] {
    std::vector<float> t(0x7F);
    for (int c = 0; c < 0x7F; ++c) t[c] = e4m3_bits_to_float(uint8_t(c));
    return t;
  }();
  const float a = std::fabs(x);
  const auto it = std::lower_bound(pos.begin(), pos.end(), a);
  int c = int(it - pos.begin());
  if (c == 0x7F) c = 0x7E;
  if (c > 0 && a - pos[c - 1] <= pos[c] - a) --c;
  return uint8_t(c | (x < 0 ? 0x80 : 0));
}

// e2m1 values (docs/semantics.md#nvfp4): codes 0-7 = 0, .5, 1, 1.5, 2, 3, 4, 6; codes 8-15 their
// negatives.
inline float e2m1_value(int code) {
  static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
inline int e2m1_nearest(float x) {
  // Midpoints between consecutive magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (ties go up).
  static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f};
  const float a = std::fabs(x);
  int c = 0;
  while (c < 7 && a >= mid[c]) ++c;
  return c | (x < 0 && c != 0 ? 8 : 0);
}

// Fast uniform floats in [-1, 1) for bulk data (splitmix64; 24 random bits each).
struct FastRng {
  uint64_t state;
  explicit FastRng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) * 0x1p-23f; }
};

// Byte of the scale of logical row r, column c in the 128x4 swizzled layout
// (docs/semantics.md#nvfp4).
inline int64_t swizzled(int64_t r, int c) {
  return ((r / 128) * 2 + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// Value of dtype t nearest to x (bf16 / fp16 / fp8 exact values; not NVFP4).
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::kBF16: return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::kFP16: return fp16_bits_to_float(float_to_fp16_bits(x));
    case DType::kFP8E4M3: return e4m3_bits_to_float(e4m3_nearest(x));
    default: ADD_FAILURE() << "round_to: NVFP4 has no per-element rounding"; return 0.f;
  }
}

// Storage code of an exact value of dtype t; *exact is cleared when x is not one.
inline uint16_t encode_exact(DType t, float x, bool* exact) {
  uint16_t c = 0;
  float back = 0.f;
  switch (t) {
    case DType::kBF16: c = float_to_bf16_bits(x); back = bf16_bits_to_float(c); break;
    case DType::kFP16: c = float_to_fp16_bits(x); back = fp16_bits_to_float(c); break;
    case DType::kFP8E4M3: c = e4m3_nearest(x); back = e4m3_bits_to_float(uint8_t(c)); break;
    default: back = std::nanf(""); break;
  }
  if (!(back == x)) *exact = false;
  return c;
}

inline size_t storage_bytes(DType t) { return (t == DType::kBF16 || t == DType::kFP16) ? 2 : 1; }

// A NaN code of each dtype, written wherever the reference must not read.
inline uint16_t poison_code(DType t) {
  switch (t) {
    case DType::kBF16: return 0x7FC0;
    case DType::kFP16: return 0x7E00;
    default: return 0x7F;  // fp8 NaN; NVFP4 scales (data bytes have no NaN)
  }
}

// ---- problems ------------------------------------------------------------------------------

struct Problem {
  std::vector<int> seqlen_q, seqlen_k;
  int extra_rows = 0;  // q rows after the last sequence, covered by none
  int hq = 1, hkv = 1, topk = 16;
  bool causal = false;
  QOffsetMode offset_mode = QOffsetMode::kRightAligned;
  int offset_value = 0;
  std::vector<int> offset_per_seq;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16, out_dtype = DType::kBF16;
  float softmax_scale = 0.08838834764831845f;
  float k_global_scale = 1.f, v_global_scale = 1.f, temperature = 1.f;

  int batch() const { return int(seqlen_q.size()); }
  int total_q() const {
    return std::accumulate(seqlen_q.begin(), seqlen_q.end(), 0) + extra_rows;
  }
  int total_k() const { return std::accumulate(seqlen_k.begin(), seqlen_k.end(), 0); }
  int group() const { return hq / hkv; }
  std::string describe() const {
    std::ostringstream os;
    os << "B=" << batch() << " sq=[";
    for (int x : seqlen_q) os << x << ",";
    os << "] sk=[";
    for (int x : seqlen_k) os << x << ",";
    os << "] extra=" << extra_rows << " hq=" << hq << " hkv=" << hkv << " topk=" << topk
       << " causal=" << causal << " offset_mode=" << int(offset_mode) << " offset=" << offset_value
       << " q=" << dtype_name(q_dtype) << " kv=" << dtype_name(kv_dtype)
       << " out=" << dtype_name(out_dtype) << " scale=" << softmax_scale
       << " kgs=" << k_global_scale << " vgs=" << v_global_scale << " T=" << temperature;
    return os.str();
  }
};

// Inputs as exact values, flat order. NVFP4 K/V also keep their codes and block scales.
struct Data {
  Problem pb;
  std::vector<int> cu_q, cu_k;
  std::vector<float> q;        // [total_q, hq, 128]
  std::vector<float> k, v;     // [total_k, hkv, 128]
  std::vector<uint8_t> k_code, v_code;    // NVFP4 e2m1 codes, [total_k, hkv, 128]
  std::vector<uint8_t> k_scale, v_scale;  // NVFP4 e4m3 scales, [total_k, hkv, 8]
  std::vector<int> q2k;        // [hkv, total_q, topk]
};

// NVFP4 quantizer of one 128-value row: per 16 values an e4m3 scale nearest amax / 6, codes
// nearest x / scale; `deq` receives e2m1 * scale (exact in fp32 and bf16).
inline void nvfp4_quantize_row(const float* x, uint8_t* codes, uint8_t* scales, float* deq) {
  for (int c = 0; c < 8; ++c) {
    float amax = 0.f;
    for (int e = c * 16; e < c * 16 + 16; ++e) amax = std::max(amax, std::fabs(x[e]));
    uint8_t sc = e4m3_nearest(amax / 6.f);
    if (e4m3_bits_to_float(sc) == 0.f) sc = 0x08;  // smallest normal scale for an all-zero group
    scales[c] = sc;
    const float s = e4m3_bits_to_float(sc);
    for (int e = c * 16; e < c * 16 + 16; ++e) {
      codes[e] = uint8_t(e2m1_nearest(x[e] / s));
      deq[e] = e2m1_value(codes[e]) * s;
    }
  }
}

// Random values for q, k, v (exact in their dtypes); q2k left to the caller.
inline Data make_data(const Problem& pb, std::mt19937_64& rng) {
  Data d;
  d.pb = pb;
  d.cu_q.assign(1, 0);
  for (int x : pb.seqlen_q) d.cu_q.push_back(d.cu_q.back() + x);
  d.cu_k.assign(1, 0);
  for (int x : pb.seqlen_k) d.cu_k.push_back(d.cu_k.back() + x);
  FastRng u(rng());
  d.q.resize(size_t(pb.total_q()) * pb.hq * kD);
  const float q_range = pb.q_dtype == DType::kFP8E4M3 ? 2.f : 1.f;
  for (float& x : d.q) x = round_to(pb.q_dtype, q_range * u.uniform());
  const size_t nk = size_t(pb.total_k()) * pb.hkv * kD;
  d.k.resize(nk);
  d.v.resize(nk);
  if (pb.kv_dtype == DType::kNVFP4) {
    const size_t rows = nk / kD;
    d.k_code.resize(nk);
    d.v_code.resize(nk);
    d.k_scale.resize(rows * 8);
    d.v_scale.resize(rows * 8);
    std::vector<float> x(kD);
    for (size_t r = 0; r < rows; ++r) {
      for (int pass = 0; pass < 2; ++pass) {
        const float m = 1.125f + 0.875f * u.uniform();  // row magnitude in [0.25, 2)
        for (float& e : x) e = m * u.uniform();
        if (pass == 0)
          nvfp4_quantize_row(x.data(), &d.k_code[r * kD], &d.k_scale[r * 8], &d.k[r * kD]);
        else
          nvfp4_quantize_row(x.data(), &d.v_code[r * kD], &d.v_scale[r * 8], &d.v[r * kD]);
      }
    }
  } else {
    const float range = pb.kv_dtype == DType::kFP8E4M3 ? 1.5f : 1.f;
    for (float& x : d.k) x = round_to(pb.kv_dtype, range * u.uniform());
    for (float& x : d.v) x = round_to(pb.kv_dtype, range * u.uniform());
  }
  d.q2k.assign(size_t(pb.hkv) * pb.total_q() * pb.topk, -1);
  return d;
}

// The same values held in another K/V dtype (e.g. fp8 / NVFP4 values as bf16): exact by design.
inline Data with_kv_dtype(const Data& src, DType t) {
  Data d = src;
  d.pb.kv_dtype = t;
  d.k_code.clear();
  d.v_code.clear();
  d.k_scale.clear();
  d.v_scale.clear();
  bool exact = true;
  for (float x : d.k) encode_exact(t, x, &exact);
  for (float x : d.v) encode_exact(t, x, &exact);
  EXPECT_TRUE(exact) << "K/V values are not exact in " << dtype_name(t);
  return d;
}

// ---- q2k lists -----------------------------------------------------------------------------

// Sequence owning row r per cu_q, or -1.
inline int owner_of(const Data& d, int r) {
  for (int b = 0; b < d.pb.batch(); ++b)
    if (r >= d.cu_q[b] && r < d.cu_q[b + 1]) return b;
  return -1;
}
inline int num_blocks_of(int seqlen_k) { return (seqlen_k + kBlk - 1) / kBlk; }
inline int64_t offset_of(const Problem& pb, int b) {
  switch (pb.offset_mode) {
    case QOffsetMode::kScalar: return pb.offset_value;
    case QOffsetMode::kPerSequence: return pb.offset_per_seq[b];
    default: return int64_t(pb.seqlen_k[b]) - pb.seqlen_q[b];
  }
}

// How hostile the random lists are.
struct ListMix {
  double p_unsorted = 0.4;
  double p_duplicates = 0.3;
  double p_out_of_range = 0.3;  // ids >= nb, including huge ones
  double p_hole = 0.3;          // a negative entry followed by junk that must be ignored
  double p_visible = 0.8;       // draw valid ids from the causally visible blocks
};

// One list of `topk` entries for a row that may see blocks [0, nb) (visible ones [0, nvis)).
inline void random_list(int* out, int topk, int nb, int nvis, const ListMix& mix,
                        std::mt19937_64& rng) {
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<int> entries;
  if (nb > 0) {
    const int pool = (coin(rng) < mix.p_visible && nvis > 0) ? std::min(nvis, nb) : nb;
    const bool dups = coin(rng) < mix.p_duplicates;
    const int want = std::uniform_int_distribution<int>(0, std::min(topk, pool))(rng);
    if (dups) {
      for (int e = 0; e < want; ++e) entries.push_back(std::uniform_int_distribution<int>(0, pool - 1)(rng));
    } else {
      std::vector<int> ids(pool);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      entries.assign(ids.begin(), ids.begin() + want);
    }
  }
  if (coin(rng) < mix.p_out_of_range) {
    const int extra = std::uniform_int_distribution<int>(1, 3)(rng);
    const int huge[] = {nb, nb + 1, nb + 129, 1 << 20, std::numeric_limits<int>::max()};
    for (int e = 0; e < extra; ++e) entries.push_back(huge[std::uniform_int_distribution<int>(0, 4)(rng)]);
  }
  if (coin(rng) < mix.p_unsorted)
    std::shuffle(entries.begin(), entries.end(), rng);
  else
    std::sort(entries.begin(), entries.end());
  if (int(entries.size()) > topk) entries.resize(topk);
  int n = int(entries.size());
  for (int e = 0; e < n; ++e) out[e] = entries[e];
  if (n < topk && coin(rng) < mix.p_hole) {
    const int negs[] = {-1, -2, std::numeric_limits<int>::min()};
    out[n++] = negs[std::uniform_int_distribution<int>(0, 2)(rng)];
    for (; n < topk; ++n)  // junk after the hole: valid-looking ids, other negatives
      out[n] = std::uniform_int_distribution<int>(-3, std::max(nb, 1))(rng);
  }
  for (; n < topk; ++n) out[n] = -1;
}

// Random lists for every (kv head, row); rows covered by no sequence get junk too.
inline void random_q2k(Data& d, std::mt19937_64& rng, const ListMix& mix = {}) {
  const Problem& pb = d.pb;
  for (int kh = 0; kh < pb.hkv; ++kh) {
    for (int r = 0; r < pb.total_q(); ++r) {
      int* list = &d.q2k[(size_t(kh) * pb.total_q() + r) * pb.topk];
      const int b = owner_of(d, r);
      int nb = 3, nvis = 3;
      if (b >= 0) {
        nb = num_blocks_of(pb.seqlen_k[b]);
        nvis = nb;
        if (pb.causal) {
          const int64_t lim = offset_of(pb, b) + (r - d.cu_q[b]) + 1;
          nvis = int(std::clamp<int64_t>((lim + kBlk - 1) / kBlk, 0, nb));
        }
      }
      random_list(list, pb.topk, nb, nvis, mix, rng);
    }
  }
}

// ---- storage -------------------------------------------------------------------------------

enum class Layout {
  kFlat,        // separate k, v: (total_k, hkv, 128)
  kFlatPacked,  // one (total_k, hkv, 256) buffer, k = [..., :128], v = [..., 128:]
  kPagedHND,    // separate (P, hkv, 128, 128)
  kPagedNHD,    // separate (P, 128, hkv, 128) viewed as (P, hkv, 128, 128)
  kPackedHND,   // one (P, hkv, 128, 256) cache, K|V halves
  kPackedNHD,   // one (P, 128, hkv, 256) cache, K|V halves
};
inline bool is_paged(Layout l) { return l != Layout::kFlat && l != Layout::kFlatPacked; }
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kFlat: return "flat";
    case Layout::kFlatPacked: return "flat_packed";
    case Layout::kPagedHND: return "paged_hnd";
    case Layout::kPagedNHD: return "paged_nhd";
    case Layout::kPackedHND: return "packed_hnd";
    case Layout::kPackedNHD: return "packed_nhd";
  }
  return "?";
}

struct PagedOptions {
  int spare_pages = 2;               // poisoned pages nobody owns
  int extra_cols = 1;                // page_table columns past the longest sequence (junk ids)
  double invalid_page_prob = 0.0;    // a block's page id replaced by one outside [0, num_pages)
  bool lengths_from_cu_seqlens_k = false;  // paged lengths from cu_seqlens_k instead of seqused_k
};

struct Storage {
  Layout layout = Layout::kFlat;
  std::vector<uint8_t> kbuf, vbuf, kscale, vscale;
  std::vector<int> cu_k, seqused, page_table;
  std::vector<std::vector<char>> dropped;  // [b][t]: block t's page id is outside the cache
  KVTensor k{}, v{};
  KVIndex kv{};

  Storage() = default;
  Storage(const Storage&) = delete;  // k / v / kv point into the buffers
  Storage& operator=(const Storage&) = delete;
  Storage(Storage&&) = default;
  Storage& operator=(Storage&&) = default;
};

inline void put_code(std::vector<uint8_t>& buf, DType t, int64_t off, uint16_t code) {
  if (storage_bytes(t) == 2)
    std::memcpy(&buf[size_t(off) * 2], &code, 2);
  else
    buf[size_t(off)] = uint8_t(code);
}

inline Storage build_storage(const Data& d, Layout layout, std::mt19937_64& rng,
                             const PagedOptions& opt = {}) {
  const Problem& pb = d.pb;
  const DType t = pb.kv_dtype;
  const bool fp4 = t == DType::kNVFP4;
  const bool packed = layout == Layout::kFlatPacked || layout == Layout::kPackedHND ||
                      layout == Layout::kPackedNHD;
  EXPECT_TRUE(!fp4 || layout == Layout::kFlat || layout == Layout::kPagedHND)
      << "NVFP4 storage is flat or paged HND";
  const int H = pb.hkv;
  const int W = fp4 ? kNvfp4Width : kD;  // storage elements per row
  const int row = packed ? 2 * W : W;    // elements between a token's head rows
  Storage s;
  s.layout = layout;
  s.cu_k = d.cu_k;
  const int B = pb.batch();
  int64_t st_tok = 0, st_head = 0, st_page = 0, units = 0;
  int num_pages = 0;
  std::vector<std::vector<int>> page_of(B);  // physical page of (b, t)
  if (!is_paged(layout)) {
    st_tok = int64_t(H) * row;
    st_head = row;
    units = int64_t(pb.total_k()) * H * row;
  } else {
    int needed = 0, max_nb = 0;
    for (int b = 0; b < B; ++b) {
      needed += num_blocks_of(pb.seqlen_k[b]);
      max_nb = std::max(max_nb, num_blocks_of(pb.seqlen_k[b]));
    }
    num_pages = needed + opt.spare_pages;
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int next = 0;
    for (int b = 0; b < B; ++b)
      for (int tb = 0; tb < num_blocks_of(pb.seqlen_k[b]); ++tb) page_of[b].push_back(perm[next++]);
    const int max_pages = std::max(1, max_nb + opt.extra_cols);
    s.page_table.assign(size_t(B) * max_pages, 0);
    s.dropped.assign(B, std::vector<char>(max_pages, 0));
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    const int bad_ids[] = {-1, -7, num_pages, num_pages + 100, std::numeric_limits<int>::max()};
    for (int b = 0; b < B; ++b) {
      for (int tb = 0; tb < max_pages; ++tb) {
        int& e = s.page_table[size_t(b) * max_pages + tb];
        if (tb < int(page_of[b].size())) {
          e = page_of[b][tb];
          if (coin(rng) < opt.invalid_page_prob) {
            e = bad_ids[std::uniform_int_distribution<int>(0, 4)(rng)];
            s.dropped[b][tb] = 1;
          }
        } else {
          // Never read (ids >= nb are ignored): a spare (poisoned) page when there is one.
          e = opt.spare_pages > 0 ? perm[needed + tb % opt.spare_pages] : -1;
        }
      }
    }
    s.seqused = pb.seqlen_k;
    const bool nhd = layout == Layout::kPagedNHD || layout == Layout::kPackedNHD;
    st_tok = nhd ? int64_t(H) * row : row;
    st_head = nhd ? row : int64_t(kBlk) * row;
    st_page = int64_t(kBlk) * H * row;
    units = int64_t(num_pages) * st_page;
    s.kv.paged = true;
    s.kv.page_table = s.page_table.data();
    s.kv.page_table_stride = max_pages;
    s.kv.max_pages = max_pages;
    s.kv.num_pages = num_pages;
  }
  const size_t es = fp4 ? 1 : storage_bytes(t);
  const uint16_t poison = fp4 ? 0 : poison_code(t);
  auto fill_poison = [&](std::vector<uint8_t>& buf) {
    buf.resize(size_t(units) * es);
    for (int64_t i = 0; i < units; ++i) put_code(buf, fp4 ? DType::kFP8E4M3 : t, i, poison);
  };
  fill_poison(s.kbuf);
  if (!packed) fill_poison(s.vbuf);
  const int64_t v_base = packed ? W : 0;
  std::vector<uint8_t>& vb = packed ? s.kbuf : s.vbuf;

  // NVFP4 scales: logical rows flat (token * H + h) or paged ((page * H + h) * 128 + token).
  const int64_t scale_rows = is_paged(layout) ? int64_t(num_pages) * H * kBlk : int64_t(pb.total_k()) * H;
  if (fp4) {
    const size_t bytes = size_t((scale_rows + 127) / 128) * 128 * 8;
    s.kscale.assign(bytes, 0x7F);  // NaN scale: any read of an unused row poisons the output
    s.vscale.assign(bytes, 0x7F);
  }
  bool exact = true;
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < pb.seqlen_k[b]; ++j) {
      const int64_t tok = d.cu_k[b] + j;
      for (int h = 0; h < H; ++h) {
        int64_t base = 0, srow = 0;
        if (!is_paged(layout)) {
          base = tok * st_tok + h * st_head;
          srow = tok * H + h;
        } else {
          const int64_t page = page_of[b][j / kBlk];
          base = page * st_page + h * st_head + (j % kBlk) * st_tok;
          srow = (page * H + h) * kBlk + j % kBlk;
        }
        const size_t src = (size_t(tok) * H + h) * kD;
        if (fp4) {
          for (int e = 0; e < kD; e += 2) {
            s.kbuf[size_t(base + e / 2)] = uint8_t(d.k_code[src + e] | (d.k_code[src + e + 1] << 4));
            s.vbuf[size_t(base + e / 2)] = uint8_t(d.v_code[src + e] | (d.v_code[src + e + 1] << 4));
          }
          for (int c = 0; c < 8; ++c) {
            s.kscale[size_t(swizzled(srow, c))] = d.k_scale[(size_t(tok) * H + h) * 8 + c];
            s.vscale[size_t(swizzled(srow, c))] = d.v_scale[(size_t(tok) * H + h) * 8 + c];
          }
        } else {
          for (int e = 0; e < kD; ++e) {
            put_code(s.kbuf, t, base + e, encode_exact(t, d.k[src + e], &exact));
            put_code(vb, t, v_base + base + e, encode_exact(t, d.v[src + e], &exact));
          }
        }
      }
    }
  }
  EXPECT_TRUE(exact) << "K/V values are not exact in " << dtype_name(t);
  const void* kdata = s.kbuf.data();
  const void* vdata = packed ? static_cast<const void*>(s.kbuf.data() + v_base * es)
                             : static_cast<const void*>(s.vbuf.data());
  s.k = KVTensor{kdata, t, st_tok, st_head, st_page, fp4 ? s.kscale.data() : nullptr,
                 int64_t(s.kscale.size())};
  s.v = KVTensor{vdata, t, st_tok, st_head, st_page, fp4 ? s.vscale.data() : nullptr,
                 int64_t(s.vscale.size())};
  s.kv.batch = B;
  s.kv.total_k = pb.total_k();
  if (!is_paged(layout)) {
    s.kv.cu_seqlens_k = s.cu_k.data();
  } else if (opt.lengths_from_cu_seqlens_k) {
    s.kv.cu_seqlens_k = s.cu_k.data();
  } else {
    s.kv.seqused_k = s.seqused.data();
  }
  return s;
}

// ---- running the reference -----------------------------------------------------------------

struct Result {
  std::vector<uint16_t> out;  // [total_q, hq, 128] out_dtype bits
  std::vector<float> lse, lse_t;
};

inline float out_value(DType t, uint16_t bits) {
  return t == DType::kBF16 ? bf16_bits_to_float(bits) : fp16_bits_to_float(bits);
}

struct RunOptions {
  bool lse = true;
  bool lse_t = true;
  bool decode = false;  // run sparse_decode with uniform seqlen_q (cu_seqlens_q unset)
  PartialDType partial = PartialDType::kDefault;
  int force_fused = -1;
  int64_t q_token_pad = 0;  // extra elements between q tokens (a strided q view)
  double* seconds = nullptr;      // receives the wall time of the reference call alone
  double* cpu_seconds = nullptr;  // and its process CPU time (all threads)
};

// Params built field by field from the problem and a storage; outputs pre-filled with NaN so that a
// row the reference forgot shows up.
inline Result run_reference(const Data& d, const Storage& s, const std::vector<int>& q2k,
                            const RunOptions& o = {}) {
  const Problem& pb = d.pb;
  const int tq = pb.total_q();
  const int64_t q_tok = int64_t(pb.hq) * kD + o.q_token_pad;
  const size_t qes = storage_bytes(pb.q_dtype);
  std::vector<uint8_t> qbuf(size_t(std::max(tq, 1)) * q_tok * qes, 0xFF);
  bool exact = true;
  for (int r = 0; r < tq; ++r)
    for (int h = 0; h < pb.hq; ++h)
      for (int e = 0; e < kD; ++e)
        put_code(qbuf, pb.q_dtype, r * q_tok + h * kD + e,
                 encode_exact(pb.q_dtype, d.q[(size_t(r) * pb.hq + h) * kD + e], &exact));
  EXPECT_TRUE(exact) << "q values are not exact in " << dtype_name(pb.q_dtype);
  Result res;
  res.out.assign(size_t(tq) * pb.hq * kD, 0xFFFF);
  res.lse.assign(size_t(tq) * pb.hq, std::nanf(""));
  res.lse_t.assign(size_t(tq) * pb.hq, std::nanf(""));
  EXPECT_EQ(int(q2k.size()), pb.hkv * tq * pb.topk);

  SparseAttnParams p{};
  p.batch = pb.batch();
  p.total_q = tq;
  p.num_heads = pb.hq;
  p.num_kv_heads = pb.hkv;
  p.topk = pb.topk;
  p.causal = pb.causal;
  p.softmax_scale = pb.softmax_scale;
  p.k_global_scale = pb.k_global_scale;
  p.v_global_scale = pb.v_global_scale;
  p.lse_temperature = pb.temperature;
  p.q = qbuf.data();
  p.q_dtype = pb.q_dtype;
  p.q_stride_token = q_tok;
  p.q_stride_head = kD;
  p.k = s.k;
  p.v = s.v;
  p.kv = s.kv;
  int max_sq = 0;
  for (int x : pb.seqlen_q) max_sq = std::max(max_sq, x);
  if (o.decode)
    p.qi = QIndex{nullptr, pb.seqlen_q.empty() ? 1 : pb.seqlen_q[0], max_sq};
  else
    p.qi = QIndex{d.cu_q.data(), 0, max_sq};
  p.q_offset = QOffset{pb.offset_mode, pb.offset_value,
                       pb.offset_mode == QOffsetMode::kPerSequence ? pb.offset_per_seq.data() : nullptr};
  p.q2k = q2k.data();
  p.q2k_head_stride = int64_t(p.total_q) * p.topk;  // contiguous (Hkv, total_q, topk)
  p.q2k_row_stride = p.topk;
  p.out = res.out.data();
  p.out_dtype = pb.out_dtype;
  p.lse = o.lse ? res.lse.data() : nullptr;
  p.lse_temperature_out = o.lse_t ? res.lse_t.data() : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  if (o.decode)
    reference::sparse_decode(SparseDecodeParams{p, o.partial, o.force_fused});
  else
    reference::sparse_attention(p);
  if (o.seconds != nullptr)
    *o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.cpu_seconds != nullptr) *o.cpu_seconds = double(std::clock() - c0) / CLOCKS_PER_SEC;
  return res;
}

// ---- the fp64 oracle -----------------------------------------------------------------------

struct Oracle {
  std::vector<double> out;  // [total_q, hq, 128]
  std::vector<double> lse, lse_t;
  std::vector<char> empty;    // [total_q, hq]: no visible selected key
  std::vector<char> checked;  // [total_q]: rows the oracle evaluated
};

// docs/semantics.md#sparse-attention from scratch: row r of sequence b (local i) and head hq see
// the keys j of the blocks listed in q2k[hq / G, r] (entries before the first negative, ids in
// [0, nb), each once, pages inside the cache) with j < seqlen_k and, if causal, j <= q_offset + i.
// Rows with row % row_step != 0 are skipped (large problems).
inline Oracle oracle(const Data& d, const std::vector<int>& q2k,
                     const std::vector<std::vector<char>>* dropped = nullptr, int row_step = 1) {
  const Problem& pb = d.pb;
  const int tq = pb.total_q(), G = pb.group();
  Oracle o;
  o.out.assign(size_t(tq) * pb.hq * kD, 0.0);
  o.lse.assign(size_t(tq) * pb.hq, -kInf);
  o.lse_t.assign(size_t(tq) * pb.hq, -kInf);
  o.empty.assign(size_t(tq) * pb.hq, 1);
  o.checked.assign(tq, 0);
  const double scale =
      double(pb.softmax_scale) * (pb.kv_dtype == DType::kNVFP4 ? double(pb.k_global_scale) : 1.0);
  for (int r = 0; r < tq; r += row_step) {
    o.checked[r] = 1;
    const int b = owner_of(d, r);
    if (b < 0) continue;
    const int i = r - d.cu_q[b];
    const int sk = pb.seqlen_k[b];
    const int nb = (sk + kBlk - 1) / kBlk;
    const int64_t pos = offset_of(pb, b) + i;
    for (int kh = 0; kh < pb.hkv; ++kh) {
      const int* list = &q2k[(size_t(kh) * tq + r) * pb.topk];
      std::set<int> sel;
      for (int e = 0; e < pb.topk; ++e) {
        if (list[e] < 0) break;
        if (list[e] >= nb) continue;
        if (dropped != nullptr && (*dropped)[b][list[e]]) continue;
        sel.insert(list[e]);
      }
      std::vector<int> keys;
      for (int t : sel)
        for (int j = t * kBlk; j < std::min(t * kBlk + kBlk, sk); ++j)
          if (!pb.causal || j <= pos) keys.push_back(j);
      if (keys.empty()) continue;
      for (int hq = kh * G; hq < kh * G + G; ++hq) {
        const float* qr = &d.q[(size_t(r) * pb.hq + hq) * kD];
        std::vector<double> logit(keys.size());
        double m = -kInf;
        for (size_t n = 0; n < keys.size(); ++n) {
          const float* kr = &d.k[((size_t(d.cu_k[b]) + keys[n]) * pb.hkv + kh) * kD];
          double dot = 0.0;
          for (int e = 0; e < kD; ++e) dot += double(qr[e]) * double(kr[e]);
          logit[n] = scale * dot;
          m = std::max(m, logit[n]);
        }
        double sum = 0.0, sum_t = 0.0, mt = -kInf;
        for (double l : logit) mt = std::max(mt, double(pb.temperature) * l);
        double* out = &o.out[(size_t(r) * pb.hq + hq) * kD];
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(logit[n] - m);
          sum += w;
          sum_t += std::exp(double(pb.temperature) * logit[n] - mt);
          const float* vr = &d.v[((size_t(d.cu_k[b]) + keys[n]) * pb.hkv + kh) * kD];
          for (int e = 0; e < kD; ++e) out[e] += w * double(vr[e]);
        }
        for (int e = 0; e < kD; ++e) out[e] = out[e] / sum * double(pb.v_global_scale);
        o.lse[size_t(r) * pb.hq + hq] = m + std::log(sum);
        o.lse_t[size_t(r) * pb.hq + hq] = mt + std::log(sum_t);
        o.empty[size_t(r) * pb.hq + hq] = 0;
      }
    }
  }
  return o;
}

// ---- comparisons ---------------------------------------------------------------------------

// Bitwise equality of outputs and (where both have them) LSEs.
inline void expect_bit_equal(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.out.size(), b.out.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t e = 0; e < a.out.size(); ++e)
    if (a.out[e] != b.out[e] && bad++ == 0) first = e;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " output elements differ, first at flat index "
                     << first << " (row * Hq + head = " << first / kD << ")";
  auto same_f = [](float x, float y) { return std::memcmp(&x, &y, 4) == 0; };
  size_t bad_lse = 0, bad_lse_t = 0;
  for (size_t e = 0; e < a.lse.size(); ++e) {
    bad_lse += !same_f(a.lse[e], b.lse[e]);
    bad_lse_t += !same_f(a.lse_t[e], b.lse_t[e]);
  }
  EXPECT_EQ(bad_lse, 0u) << what << ": lse differs";
  EXPECT_EQ(bad_lse_t, 0u) << what << ": temperature lse differs";
}

// Output tolerance: the reference rounds its fp32 result o' once to the output dtype, so
// |out - o| <= half_ulp(o') + |o' - o| <= rel * |o| + abs, with rel = half an ulp relative (bf16
// keeps 8 significant bits: 2^-8; fp16 11: 2^-11) and abs covering the fp32 accumulation error
// |o' - o|, measured at most 2^-22 * max|V| * |v_global_scale| over the random suite (abs = 2^-19
// leaves an 8x margin).
struct Tolerance {
  double rel;  // of |oracle|
  double abs;  // of max|V| * |v_global_scale|
};
inline Tolerance tolerance_for(DType out) {
  return Tolerance{std::ldexp(1.0, out == DType::kBF16 ? -8 : -11), std::ldexp(1.0, -19)};
}

// Output within the tolerance of the oracle, LSEs within 1e-5 (relative beyond magnitude 1; fp32
// LSEs measured within 4e-7), empty
// rows exactly +0 output and -inf LSEs; nothing NaN. Returns the number of failures.
inline int expect_matches_oracle(const Result& res, const Oracle& o, const Data& d,
                                 const std::string& what, bool check_lse = true,
                                 bool check_lse_t = true) {
  const Problem& pb = d.pb;
  const Tolerance tol = tolerance_for(pb.out_dtype);
  double vmax = 0.0;
  for (float x : d.v) vmax = std::max(vmax, double(std::fabs(x)));
  const double abs_tol = tol.abs * vmax * std::fabs(double(pb.v_global_scale));
  int fails = 0;
  auto report = [&](const std::string& msg) {
    if (fails++ < 8) ADD_FAILURE() << what << ": " << msg;
  };
  for (int r = 0; r < pb.total_q(); ++r) {
    if (!o.checked[r]) continue;
    for (int h = 0; h < pb.hq; ++h) {
      const size_t rh = size_t(r) * pb.hq + h;
      const bool empty = o.empty[rh];
      for (int e = 0; e < kD; ++e) {
        const uint16_t bits = res.out[rh * kD + e];
        const double got = out_value(pb.out_dtype, bits);
        const double want = o.out[rh * kD + e];
        if (empty) {
          if (bits != 0) {
            std::ostringstream os;
            os << "row " << r << " head " << h << " dim " << e << ": empty row must be +0, got bits 0x"
               << std::hex << bits;
            report(os.str());
          }
        } else if (!(std::fabs(got - want) <= tol.rel * std::fabs(want) + abs_tol)) {
          std::ostringstream os;
          os.precision(9);
          os << "row " << r << " head " << h << " dim " << e << ": got " << got << " want " << want
             << " |d| " << std::fabs(got - want) << " tol " << tol.rel * std::fabs(want) + abs_tol;
          report(os.str());
        }
      }
      auto check_l = [&](float got, double want, const char* name) {
        const bool ok = empty ? (got == -std::numeric_limits<float>::infinity())
                              : std::fabs(double(got) - want) <= 1e-5 * std::max(1.0, std::fabs(want));
        if (!ok) {
          std::ostringstream os;
          os.precision(9);
          os << "row " << r << " head " << h << ": " << name << " got " << got << " want " << want;
          report(os.str());
        }
      };
      if (check_lse) check_l(res.lse[rh], o.lse[rh], "lse");
      if (check_lse_t) check_l(res.lse_t[rh], o.lse_t[rh], "temperature lse");
    }
  }
  if (fails > 0)
    ADD_FAILURE() << what << ": " << fails << " mismatches in all; problem: " << pb.describe();
  return fails;
}

// Number of (row, head) pairs with at least one visible selected key (to make sure a random case
// is not vacuous).
inline int count_nonempty(const Oracle& o) {
  int n = 0;
  for (char e : o.empty) n += !e;
  return n;
}

}  // namespace flashmsa::testing::sattn

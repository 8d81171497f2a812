// CPU reference of stage 1, msa_proxy_score (docs/semantics.md#proxy-score-math):
//   out[h, t, r] = max over visible keys j of block t of dot(q[r, h], k[j, h / G])   (unscaled fp32)
// and -inf wherever block t has no visible key. Every element of out is written.
//
// Numerics, fixed so that the reference gives the same bits on any host and thread count:
//   * q and k are upconverted to fp32 exactly (bf16, fp16 and e4m3 all embed in fp32), so an fp8
//     input gives the same bits as its dequantized bf16 copy, and paged == flat.
//   * dot = 8 partial sums, lane l accumulating dims d = l, l+8, ..., l+120 in increasing d with
//     separate multiply and add (no FMA), then ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).
//   * NVFP4 (msa_proxy_score_fp4): q and k dequantized exactly (e2m1 * e4m3 scale, in fp32), the
//     same dot, then each dot times logit_scale = q_global_scale * k_global_scale (one fp32
//     multiply) before the block max.
//   * The block max and the head max (reduce_heads) propagate NaN like torch.amax; a NaN result
//     is stored as the canonical CUDA NaN 0x7FFFFFFF (positive, so top-k ranks it first).
//     Accumulators start at +0, so a zero dot is +0 and the max needs no signed-zero rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "flashmsa/semantics.h"

namespace flashmsa::reference {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kRowsPerItem = 32;  // query rows per work item: K conversion is ~1/(32 G) of the dots
constexpr int kGroup = 4;         // query vectors sharing one pass over K (independent chains)

float canonical_nan() { return bits_to_float(0x7FFFFFFFu); }

// dst[0:128] = src[0:128] as fp32; exact for every supported dtype (NVFP4: offset in bytes, the
// row's block scales at `scale_row` of `scales`; e2m1 * e4m3 is exact in fp32).
void load_row(const void* base, DType dtype, int64_t offset, float* dst, const uint8_t* scales = nullptr,
              int64_t scale_row = 0) {
  switch (dtype) {
    case DType::kNVFP4: {
      const uint8_t* src = static_cast<const uint8_t*>(base) + offset;
      for (int d = 0; d < kHeadDim; ++d) dst[d] = nvfp4_value(src, scales, scale_row, d);
      return;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int d = 0; d < kHeadDim; ++d) dst[d] = bf16_bits_to_float(src[d]);
      return;
    }
    case DType::kFP16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int d = 0; d < kHeadDim; ++d) dst[d] = fp16_bits_to_float(src[d]);
      return;
    }
    case DType::kFP8E4M3: {
      const uint8_t* src = static_cast<const uint8_t*>(base) + offset;
      for (int d = 0; d < kHeadDim; ++d) dst[d] = e4m3_bits_to_float(src[d]);
      return;
    }
    default: MSA_FAIL("proxy_score: unsupported dtype ", dtype_name(dtype));
  }
}

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int v8i __attribute__((vector_size(32)));

// By reference: a by-value 32-byte vector would change the ABI between the two clones.
inline void load8(v8f& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }

// r[g] = ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7)) of accumulator g, for all four at once.
inline void reduce4x8(const v8f& a, const v8f& b, const v8f& c, const v8f& d, v4f& r) {
  const v8i kEven = {0, 2, 8, 10, 4, 6, 12, 14}, kOdd = {1, 3, 9, 11, 5, 7, 13, 15};
  // [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7]
  const v8f ab = __builtin_shuffle(a, b, kEven) + __builtin_shuffle(a, b, kOdd);
  const v8f cd = __builtin_shuffle(c, d, kEven) + __builtin_shuffle(c, d, kOdd);
  // [A_lo, B_lo, C_lo, D_lo, A_hi, B_hi, C_hi, D_hi], X_lo = (x0+x1)+(x2+x3)
  const v8f h = __builtin_shuffle(ab, cd, kEven) + __builtin_shuffle(ab, cd, kOdd);
  v4f lo, hi;
  const v8f h_lo = __builtin_shuffle(h, v8i{0, 1, 2, 3, 0, 1, 2, 3});
  const v8f h_hi = __builtin_shuffle(h, v8i{4, 5, 6, 7, 4, 5, 6, 7});
  std::memcpy(&lo, &h_lo, sizeof(lo));
  std::memcpy(&hi, &h_hi, sizeof(hi));
  r = lo + hi;
}

// s[g * kBlockSize + jj] = dot(q[g], kf[jj]) for g < kGroup, jj < n.
//   q:  [kGroup, 128]  kf: [n, 128]  s: [kGroup, kBlockSize]
// The only hot loop of the op. The clones compute identical bits: lanes are independent, the order
// of every addition is fixed, and neither target has FMA (every product of two supported inputs is
// exact in fp32 anyway, so FMA could only differ on products that over- or underflow fp32).
__attribute__((target_clones("avx2", "default"))) void dot_group(const float* __restrict q,
                                                                  const float* __restrict kf,
                                                                  int n, float* __restrict s) {
  for (int jj = 0; jj < n; ++jj) {
    const float* k = kf + int64_t(jj) * kHeadDim;
    v8f acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
    for (int d = 0; d < kHeadDim; d += 8) {
      v8f kv, q0, q1, q2, q3;
      load8(kv, k + d);
      load8(q0, q + 0 * kHeadDim + d);
      load8(q1, q + 1 * kHeadDim + d);
      load8(q2, q + 2 * kHeadDim + d);
      load8(q3, q + 3 * kHeadDim + d);
      acc0 += q0 * kv;
      acc1 += q1 * kv;
      acc2 += q2 * kv;
      acc3 += q3 * kv;
    }
    v4f r;
    reduce4x8(acc0, acc1, acc2, acc3, r);
    s[0 * kBlockSize + jj] = r[0];
    s[1 * kBlockSize + jj] = r[1];
    s[2 * kBlockSize + jj] = r[2];
    s[3 * kBlockSize + jj] = r[3];
  }
}
static_assert(kGroup == 4, "dot_group is written for 4 query vectors");

// Max of s[0:n], NaN-propagating (n >= 1).
float block_max(const float* s, int n) {
  float m = kNegInf;
  bool nan = false;
  for (int j = 0; j < n; ++j) {
    m = s[j] > m ? s[j] : m;
    nan |= s[j] != s[j];
  }
  return nan ? canonical_nan() : m;
}

float max_nan(float a, float b) {
  if (a != a || b != b) return canonical_nan();
  return a > b ? a : b;
}

// One query vector of a group: its row, head and visible-key count.
struct QueryVec {
  int row;
  int head;
  int limit;  // keys [0, limit) are visible (already capped at the scored blocks)
};

// Work item: rows [local_begin, local_end) of sequence b, all heads.
struct Item {
  int b;
  int local_begin;
  int local_end;
};

struct Scratch {
  std::vector<float> kf;         // [valid blocks, 128, 128] keys of one kv head, fp32
  std::vector<int> slot;         // [blocks] block t's keys in kf, or -1 (invalid page)
  std::vector<float> q;          // [kGroup, 128]
  std::vector<float> s;          // [kGroup, kBlockSize]
};

void run_item(const ProxyScoreParams& p, const std::vector<int>& owner, const Item& item,
              Scratch& sc) {
  const int b = item.b;
  const RowRange rows = q_rows(p.qi, p.total_q, b);
  const int seqlen_k = kv_seqlen(p.kv, b);
  const int64_t q_off = q_offset_of(p.q_offset, b, rows.len, seqlen_k);
  // Blocks >= max_k_tiles have no output column and are not scored. 64-bit: 2^24 blocks of 128
  // keys are 2^31 keys (a limit is never above seqlen_k, so the clamp changes nothing else).
  const int scored_keys = int(std::min<int64_t>(
      std::min<int64_t>(num_blocks(seqlen_k), p.max_k_tiles) * kBlockSize, seqlen_k));
  const int group_size = p.num_heads / p.num_kv_heads;
  const bool fp4 = p.q_dtype == DType::kNVFP4;
  const int64_t total_q = p.total_q;
  const int64_t out_head_stride = int64_t(p.max_k_tiles) * total_q;

  int limit_max = 0;
  for (int i = item.local_begin; i < item.local_end; ++i)
    limit_max = std::max(limit_max, std::min(col_limit(p.causal, q_off, i, seqlen_k), scored_keys));
  if (limit_max == 0) return;  // every column of these rows stays -inf
  const int item_blocks = int(ceil_div(limit_max, kBlockSize));

  sc.slot.resize(size_t(item_blocks));
  sc.q.assign(size_t(kGroup) * kHeadDim, 0.0f);
  sc.s.resize(size_t(kGroup) * kBlockSize);

  for (int kh = 0; kh < p.num_kv_heads; ++kh) {
    // Keys of this kv head's blocks with a valid page, fp32, once per item (blocks of invalid
    // pages take no memory: a 2^24-column page table of mostly invalid ids stays cheap).
    int n_valid = 0;
    for (int t = 0; t < item_blocks; ++t)
      sc.slot[t] = kv_offset(p.k, p.kv, b, kh, t * kBlockSize) >= 0 ? n_valid++ : -1;
    sc.kf.resize(size_t(n_valid) * kBlockSize * kHeadDim);
    for (int t = 0; t < item_blocks; ++t) {
      if (sc.slot[t] < 0) continue;
      const int j0 = t * kBlockSize;  // t < 2^24: fits
      const int n = int(std::min<int64_t>(kBlockSize, int64_t(limit_max) - j0));
      float* dst = sc.kf.data() + size_t(sc.slot[t]) * kBlockSize * kHeadDim;
      for (int jj = 0; jj < n; ++jj)
        load_row(p.k.data, p.k.dtype, kv_offset(p.k, p.kv, b, kh, j0 + jj),
                 dst + size_t(jj) * kHeadDim, p.k.scale,
                 p.k.dtype == DType::kNVFP4 ? kv_scale_row(p.kv, p.num_kv_heads, b, kh, j0 + jj)
                                            : 0);
    }

    QueryVec group[kGroup];
    int n_group = 0;
    auto flush = [&] {
      int group_limit = 0;
      for (int g = 0; g < n_group; ++g) group_limit = std::max(group_limit, group[g].limit);
      const int group_blocks = int(ceil_div(group_limit, kBlockSize));
      for (int t = 0; t < group_blocks; ++t) {
        if (sc.slot[t] < 0) continue;
        const int n = std::min(kBlockSize, group_limit - t * kBlockSize);
        dot_group(sc.q.data(), sc.kf.data() + size_t(sc.slot[t]) * kBlockSize * kHeadDim, n,
                  sc.s.data());
        if (fp4) {
          for (int g = 0; g < n_group; ++g)
            for (int jj = 0; jj < n; ++jj) sc.s[size_t(g) * kBlockSize + jj] *= p.logit_scale;
        }
        for (int g = 0; g < n_group; ++g) {
          const int visible = std::min(n, group[g].limit - t * kBlockSize);
          if (visible <= 0) continue;
          const float v = block_max(sc.s.data() + g * kBlockSize, visible);
          if (p.reduce_heads) {
            float& o = p.out[int64_t(t) * total_q + group[g].row];
            o = max_nan(o, v);
          } else {
            p.out[group[g].head * out_head_stride + int64_t(t) * total_q + group[g].row] = v;
          }
        }
      }
      n_group = 0;
    };

    for (int i = item.local_begin; i < item.local_end; ++i) {
      const int r = rows.begin + i;
      if (owner[r] != b) continue;
      const int limit = std::min(col_limit(p.causal, q_off, i, seqlen_k), scored_keys);
      if (limit == 0) continue;
      for (int h = kh * group_size; h < (kh + 1) * group_size; ++h) {
        load_row(p.q, p.q_dtype, int64_t(r) * p.q_stride_token + int64_t(h) * p.q_stride_head,
                 sc.q.data() + n_group * kHeadDim, p.q_scale, int64_t(r) * p.num_heads + h);
        group[n_group++] = {r, h, limit};
        if (n_group == kGroup) flush();
      }
    }
    if (n_group > 0) flush();
  }
}

}  // namespace

void proxy_score(const ProxyScoreParams& p) {
  MSA_CHECK(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0,
            "proxy_score: num_heads (", p.num_heads, ") must be a multiple of num_kv_heads (",
            p.num_kv_heads, ")");
  MSA_CHECK(p.max_k_tiles >= 0 && p.total_q >= 0 && p.batch >= 0,
            "proxy_score: negative max_k_tiles / total_q / batch");
  MSA_CHECK((p.q_dtype == DType::kNVFP4) == (p.k.dtype == DType::kNVFP4),
            "proxy_score: NVFP4 q and k go together (msa_proxy_score_fp4)");
  MSA_CHECK(p.q_dtype != DType::kNVFP4 || (p.q_scale != nullptr && p.k.scale != nullptr),
            "proxy_score: NVFP4 q / k need their block scales");

  // Padding columns, blocks without visible keys and rows of no sequence stay -inf.
  const int out_heads = p.reduce_heads ? 1 : p.num_heads;
  const int64_t out_numel = int64_t(out_heads) * p.max_k_tiles * p.total_q;
  parallel_for(out_numel, [&](int64_t begin, int64_t end) {
    std::fill(p.out + begin, p.out + end, kNegInf);
  });

  // A row claimed by two sequences (malformed cu_seqlens_q) belongs to the later one, so the
  // result never depends on the thread schedule.
  std::vector<int> owner(size_t(p.total_q), -1);
  std::vector<Item> items;
  for (int b = 0; b < p.batch; ++b) {
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    for (int i = 0; i < rows.len; ++i) owner[size_t(rows.begin + i)] = b;
    for (int i = 0; i < rows.len; i += kRowsPerItem)
      items.push_back({b, i, std::min(rows.len, i + kRowsPerItem)});
  }

  parallel_for(int64_t(items.size()), [&](int64_t begin, int64_t end) {
    Scratch sc;
    for (int64_t w = begin; w < end; ++w) run_item(p, owner, items[size_t(w)], sc);
  });
}

}  // namespace flashmsa::reference

// semantics.h rule by rule: block counts, causal limits, q_offset modes, sequence ranges (and the
// clamping of malformed, device-only values), K addressing flat and paged, q2k list semantics (D5),
// top-k ranges and order key (docs/semantics.md#topk-select). Expected values are written from the
// text of docs/semantics.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "flashmsa/semantics.h"

namespace flashmsa {
namespace {

float f_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Semantics, BlockCounts) {
  EXPECT_EQ(num_blocks(0), 0);
  EXPECT_EQ(num_blocks(1), 1);
  EXPECT_EQ(num_blocks(127), 1);
  EXPECT_EQ(num_blocks(128), 1);
  EXPECT_EQ(num_blocks(129), 2);
  EXPECT_EQ(num_blocks(INT_MAX), 16777216);
  EXPECT_EQ(ceil_div(int64_t(1) << 40, 3), ((int64_t(1) << 40) + 2) / 3);
}

TEST(Semantics, ColLimitAgainstTheVisibilityRule) {
  // Visible iff j < seqlen_k and (not causal or j <= q_offset + i): col_limit is the count of such j.
  for (int64_t off : {-300LL, -5LL, -1LL, 0LL, 3LL, 127LL, 128LL, 1000LL})
    for (int i : {0, 1, 2, 50, 200})
      for (int sk : {0, 1, 128, 129, 300})
        for (bool causal : {false, true}) {
          int visible = 0;
          for (int j = 0; j < sk; ++j) visible += (!causal || j <= off + i) ? 1 : 0;
          ASSERT_EQ(col_limit(causal, off, i, sk), visible)
              << "off " << off << " i " << i << " sk " << sk << " causal " << causal;
        }
  // No int overflow with extreme offsets.
  EXPECT_EQ(col_limit(true, INT_MAX, INT_MAX, 1000), 1000);
  EXPECT_EQ(col_limit(true, INT_MIN, 5, 1000), 0);
}

TEST(Semantics, QOffsetModes) {
  const int per_seq[3] = {7, -4, 100};
  QOffset qo{QOffsetMode::kRightAligned, 0, nullptr};
  EXPECT_EQ(q_offset_of(qo, 0, 10, 300), 290);
  EXPECT_EQ(q_offset_of(qo, 0, 300, 10), -290);  // seqlen_q > seqlen_k
  qo = {QOffsetMode::kScalar, -12, nullptr};
  EXPECT_EQ(q_offset_of(qo, 2, 10, 300), -12);
  qo = {QOffsetMode::kPerSequence, 0, per_seq};
  EXPECT_EQ(q_offset_of(qo, 1, 10, 300), -4);
  EXPECT_EQ(q_offset_of(qo, 2, 10, 300), 100);
}

TEST(Semantics, QRowsUniformAndVarlen) {
  QIndex uniform{nullptr, 3, 3};
  EXPECT_EQ(q_rows(uniform, 12, 0).begin, 0);
  EXPECT_EQ(q_rows(uniform, 12, 2).begin, 6);
  EXPECT_EQ(q_rows(uniform, 12, 2).len, 3);
  EXPECT_EQ(q_rows(uniform, 7, 2).len, 1);  // truncated at total_q
  EXPECT_EQ(q_rows(uniform, 7, 3).len, 0);
  EXPECT_EQ(q_rows(uniform, 7, 3).begin, 7);

  const int cu[5] = {0, 5, 5, 9, 12};
  QIndex varlen{cu, 0, 5};
  const int want_begin[4] = {0, 5, 5, 9}, want_len[4] = {5, 0, 4, 3};
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(q_rows(varlen, 12, b).begin, want_begin[b]);
    EXPECT_EQ(q_rows(varlen, 12, b).len, want_len[b]);
  }
}

TEST(Semantics, UncoveredRowsAreTheRowsNoSequenceHolds) {
  // Rows [0, 3) and [9, 12) lie outside cu_seqlens_q = [3, 5, 9]; row(u) enumerates them in order.
  const int cu[3] = {3, 5, 9};
  const UncoveredRows r = uncovered_q_rows(QIndex{cu, 0, 4}, 2, 12);
  EXPECT_EQ(r.lo, 3);
  EXPECT_EQ(r.hi, 9);
  ASSERT_EQ(r.count, 6);
  const int64_t want[6] = {0, 1, 2, 9, 10, 11};
  for (int u = 0; u < 6; ++u) EXPECT_EQ(r.row(u), want[u]) << u;
  // Uniform lengths: the rows past B * seqlen_q; no batch covers nothing; clamped prefix sums.
  EXPECT_EQ(uncovered_q_rows(QIndex{nullptr, 3, 3}, 2, 10).count, 4);
  EXPECT_EQ(uncovered_q_rows(QIndex{nullptr, 3, 3}, 2, 10).row(0), 6);
  EXPECT_EQ(uncovered_q_rows(QIndex{nullptr, 3, 3}, 0, 10).count, 10);
  const int bad[3] = {-5, 40, 2};
  const UncoveredRows c = uncovered_q_rows(QIndex{bad, 0, 0}, 2, 8);
  EXPECT_EQ(c.lo, 0);
  EXPECT_EQ(c.hi, 2);
  EXPECT_EQ(c.count, 6);
}

TEST(Semantics, QRowsClampMalformedPrefixSums) {
  // Decreasing, negative and past-the-end values: every range stays inside [0, total_q] and has
  // non-negative length.
  const int cu[6] = {-7, 4, 2, 50, INT_MAX, INT_MIN};
  QIndex qi{cu, 0, 0};
  const int total_q = 20;
  const int want_begin[5] = {0, 4, 2, 20, 20}, want_len[5] = {4, 0, 18, 0, 0};
  for (int b = 0; b < 5; ++b) {
    const RowRange r = q_rows(qi, total_q, b);
    EXPECT_EQ(r.begin, want_begin[b]) << b;
    EXPECT_EQ(r.len, want_len[b]) << b;
    EXPECT_GE(r.begin, 0);
    EXPECT_LE(r.begin + r.len, total_q);
  }
  // Random garbage: never out of range.
  std::mt19937_64 rng(1);
  std::vector<int> junk(65);
  for (int it = 0; it < 200; ++it) {
    for (int& v : junk) v = int(uint32_t(rng()));
    QIndex q{junk.data(), 0, 0};
    for (int b = 0; b < 64; ++b) {
      const RowRange r = q_rows(q, 1000, b);
      ASSERT_GE(r.begin, 0);
      ASSERT_GE(r.len, 0);
      ASSERT_LE(r.begin + r.len, 1000);
    }
  }
}

KVIndex flat_index(const int* cu, int batch, int64_t total_k) {
  KVIndex kv{};
  kv.batch = batch;
  kv.cu_seqlens_k = cu;
  kv.total_k = total_k;
  return kv;
}

KVIndex paged_index(const int* seqused, const int* cu, const int* table, int batch, int max_pages,
                    int num_pages) {
  KVIndex kv{};
  kv.batch = batch;
  kv.cu_seqlens_k = cu;
  kv.seqused_k = seqused;
  kv.paged = true;
  kv.page_table = table;
  kv.page_table_stride = max_pages;
  kv.max_pages = max_pages;
  kv.num_pages = num_pages;
  return kv;
}

TEST(Semantics, KvSeqlenFlatAndPaged) {
  const int cu[4] = {0, 300, 300, 1000};
  const KVIndex flat = flat_index(cu, 3, 1000);
  EXPECT_EQ(kv_seqlen(flat, 0), 300);
  EXPECT_EQ(kv_seqlen(flat, 1), 0);
  EXPECT_EQ(kv_seqlen(flat, 2), 700);
  EXPECT_EQ(kv_row_begin(flat, 2), 300);

  const int seqused[3] = {129, 0, 256};
  const int table[6] = {0, 1, 2, 3, 4, 5};
  const KVIndex paged = paged_index(seqused, nullptr, table, 3, 2, 6);
  EXPECT_EQ(kv_seqlen(paged, 0), 129);
  EXPECT_EQ(kv_seqlen(paged, 1), 0);
  EXPECT_EQ(kv_seqlen(paged, 2), 256);
  // Paged lengths taken from cu_seqlens_k when given (paged prefill).
  const int cu2[4] = {0, 10, 140, 140};
  const KVIndex paged_cu = paged_index(seqused, cu2, table, 3, 2, 6);
  EXPECT_EQ(kv_seqlen(paged_cu, 0), 10);
  EXPECT_EQ(kv_seqlen(paged_cu, 1), 130);
  EXPECT_EQ(kv_seqlen(paged_cu, 2), 0);
}

TEST(Semantics, KvSeqlenClampsMalformedLengths) {
  // Paged: to [0, max_pages * 128].
  const int seqused[4] = {257, -3, INT_MAX, INT_MIN};
  const int table[8] = {};
  const KVIndex paged = paged_index(seqused, nullptr, table, 4, 2, 10);
  EXPECT_EQ(kv_seqlen(paged, 0), 256);
  EXPECT_EQ(kv_seqlen(paged, 1), 0);
  EXPECT_EQ(kv_seqlen(paged, 2), 256);
  EXPECT_EQ(kv_seqlen(paged, 3), 0);
  // Flat: to the rows of the tensor, from a clamped start.
  const int cu[5] = {0, 500, 400, 2000, -50};
  const KVIndex flat = flat_index(cu, 4, 1000);
  EXPECT_EQ(kv_seqlen(flat, 0), 500);
  EXPECT_EQ(kv_seqlen(flat, 1), 0);      // decreasing
  EXPECT_EQ(kv_seqlen(flat, 2), 600);    // runs past total_k: 1000 - 400
  EXPECT_EQ(kv_seqlen(flat, 3), 0);      // negative length
  const int cu_neg[2] = {-100, 50};
  const KVIndex flat_neg = flat_index(cu_neg, 1, 1000);
  EXPECT_EQ(kv_row_begin(flat_neg, 0), 0);
  EXPECT_EQ(kv_seqlen(flat_neg, 0), 150);  // the length is the diff; the start is clamped to 0
  EXPECT_LE(kv_row_begin(flat_neg, 0) + kv_seqlen(flat_neg, 0), 1000);
  std::mt19937_64 rng(2);
  std::vector<int> junk(9);
  for (int it = 0; it < 500; ++it) {
    for (int& v : junk) v = int(uint32_t(rng()));
    const KVIndex f = flat_index(junk.data(), 8, 777);
    const KVIndex p = paged_index(junk.data(), nullptr, table, 8, 3, 4);
    for (int b = 0; b < 8; ++b) {
      ASSERT_GE(kv_seqlen(f, b), 0);
      ASSERT_LE(kv_row_begin(f, b) + kv_seqlen(f, b), 777);
      ASSERT_GE(kv_seqlen(p, b), 0);
      ASSERT_LE(kv_seqlen(p, b), 3 * 128);
    }
  }
}

TEST(Semantics, KvOffsetFlatPagedAndInvalidPages) {
  KVTensor t{};
  t.stride_token = 512;
  t.stride_head = 128;
  t.stride_page = 0;
  const int cu[3] = {0, 300, 1000};
  const KVIndex flat = flat_index(cu, 2, 1000);
  EXPECT_EQ(kv_offset(t, flat, 1, 3, 17), (300 + 17) * 512 + 3 * 128);

  // Paged HND: [pages, 2 heads, 128 tokens, 128].
  KVTensor pt{};
  pt.stride_token = 128;
  pt.stride_head = 128 * 128;
  pt.stride_page = 2 * 128 * 128;
  const int seqused[2] = {300, 128};
  const int table[2 * 4] = {5, 2, -1, 99, 7, 10, 0, 0};  // [B=2, max_pages=4]
  const KVIndex paged = paged_index(seqused, nullptr, table, 2, 4, 10);
  EXPECT_EQ(kv_page(paged, 0, 0), 5);
  EXPECT_EQ(kv_page(paged, 0, 2), -1);    // negative id
  EXPECT_EQ(kv_page(paged, 0, 3), -1);    // id >= num_pages
  EXPECT_EQ(kv_page(paged, 1, 1), -1);    // id == num_pages
  // kv_page_ahead: kv_page inside the table's columns, whatever the sequence's length (block 2 of
  // sequence 1 lies past its 128 keys: its id is read, the caller does not use it), -1 past them
  // without reading (a table of max_pages columns: the read at column 4 would be row 1's).
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 4; ++t) EXPECT_EQ(kv_page_ahead(paged, b, t), kv_page(paged, b, t)) << b << " " << t;
  EXPECT_EQ(kv_page_ahead(paged, 0, 4), -1);
  EXPECT_EQ(kv_page_ahead(paged, 1, 4), -1);
  EXPECT_EQ(kv_page_ahead(paged, 1, -1), -1);
  const KVIndex no_table = paged_index(seqused, nullptr, nullptr, 2, 0, 10);  // max_pages 0: no table
  EXPECT_EQ(kv_page_ahead(no_table, 0, 0), -1);
  EXPECT_EQ(kv_offset(pt, paged, 0, 1, 130), 2 * pt.stride_page + 1 * pt.stride_head + 2 * 128);
  EXPECT_EQ(kv_offset(pt, paged, 0, 0, 127), 5 * pt.stride_page + 127 * 128);
  EXPECT_EQ(kv_offset(pt, paged, 0, 0, 260), -1);
  EXPECT_EQ(kv_offset(pt, paged, 1, 1, 0), 7 * pt.stride_page + pt.stride_head);
  // NVFP4 scale rows follow the same addressing.
  EXPECT_EQ(kv_scale_row(flat, 4, 1, 2, 5), (300 + 5) * 4 + 2);
  EXPECT_EQ(kv_scale_row(paged, 2, 0, 1, 130), (2 * 2 + 1) * 128 + 2);
}

TEST(Semantics, Q2kListsHaveSetSemantics) {
  const int list[8] = {3, 0, 3, 9, 1, -1, 4, 5};
  EXPECT_EQ(q2k_length(list, 8), 5);  // stops at the first negative
  EXPECT_EQ(q2k_length(list, 3), 3);  // never past topk
  const int empty[2] = {-1, 2};
  EXPECT_EQ(q2k_length(empty, 2), 0);
  const int nb = 5;
  EXPECT_TRUE(q2k_entry_used(list, 0, nb));   // 3
  EXPECT_TRUE(q2k_entry_used(list, 1, nb));   // 0
  EXPECT_FALSE(q2k_entry_used(list, 2, nb));  // 3 again
  EXPECT_FALSE(q2k_entry_used(list, 3, nb));  // 9 >= nb
  EXPECT_TRUE(q2k_entry_used(list, 4, nb));   // 1
  // Any order of the same set uses the same blocks once each.
  std::mt19937_64 rng(4);
  for (int it = 0; it < 300; ++it) {
    int l[16];
    const int n = int(rng() % 17);
    for (int p = 0; p < 16; ++p) l[p] = p < n ? int(rng() % 12) : -1 - int(rng() % 3);
    std::vector<int> used;
    for (int p = 0; p < q2k_length(l, 16); ++p)
      if (q2k_entry_used(l, p, 8)) used.push_back(l[p]);
    std::vector<int> want;
    for (int p = 0; p < n; ++p)
      if (l[p] < 8 && std::find(want.begin(), want.end(), l[p]) == want.end()) want.push_back(l[p]);
    std::sort(used.begin(), used.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(used, want);
  }
}

TEST(Semantics, TopkRangesAgainstTheSpecSteps) {
  for (int P : {1, 5, 24, 160})
    for (int topk : {1, 4, 16, 64})
      for (int fb = 0; fb <= std::min(topk, 4); ++fb)
        for (int fe = 0; fe + fb <= topk && fe <= 4; ++fe)
          for (int64_t nvp_in : {int64_t(INT_MIN), int64_t(-5), int64_t(0), int64_t(1),
                                 int64_t(3), int64_t(P - 1), int64_t(P), int64_t(P + 1),
                                 int64_t(2 * P), int64_t(INT_MAX)}) {
            // docs/semantics.md#topk-select, steps 1-3.
            const int nvp = int(std::clamp<int64_t>(nvp_in, 0, P));
            const int fb2 = std::min(fb, nvp);
            const int fe2 = std::min(fe, nvp - fb2);
            const int mid = nvp - fe2 - fb2;
            const int target = std::min(topk - fb2 - fe2, mid);
            const TopkRanges r = topk_ranges(nvp_in, P, fb, fe, topk);
            ASSERT_EQ(r.nvp, nvp);
            ASSERT_EQ(r.fb, fb2);
            ASSERT_EQ(r.fe, fe2);
            ASSERT_EQ(r.mid_begin, fb2);
            ASSERT_EQ(r.mid_end, nvp - fe2);
            ASSERT_EQ(r.target, target);
            ASSERT_EQ(r.fb + r.fe + r.target, std::min(topk, nvp));  // the output contract
          }
}

// Order key against the value semantics: for every pair, key(a) < key(b) iff a ranks strictly
// before b (larger value, +0 over -0, +NaN first by larger payload, -NaN last by smaller payload).
TEST(Semantics, TopkOrderKeyIsTheSpecOrder) {
  std::vector<float> v;
  for (uint32_t u : {0x7FC00000u, 0x7FFFFFFFu, 0x7F800001u, 0xFFC00000u, 0xFFFFFFFFu, 0xFF800001u,
                     0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x7F7FFFFFu,
                     0xFF7FFFFFu, 0x00000001u, 0x80000001u, 0x3F800000u, 0xBF800000u})
    v.push_back(f_of(u));
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int i = 0; i < 40; ++i) v.push_back(u(rng));
  v.push_back(v.back());  // an exact tie
  auto cls = [](float x) { return std::isnan(x) ? (std::signbit(x) ? 0 : 2) : 1; };
  auto payload = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b & 0x7FFFFFu;
  };
  auto strictly_better = [&](float a, float b) {
    if (cls(a) != cls(b)) return cls(a) > cls(b);
    if (cls(a) == 2) return payload(a) > payload(b);
    if (cls(a) == 0) return payload(a) < payload(b);
    if (a != b) return a > b;
    return a == 0.0f && !std::signbit(a) && std::signbit(b);
  };
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = 0; j < v.size(); ++j) {
      const uint32_t ka = topk_order_key(v[i]), kb = topk_order_key(v[j]);
      ASSERT_EQ(ka < kb, strictly_better(v[i], v[j])) << i << " vs " << j;
      // Ties (equal keys) go to the lower block.
      ASSERT_EQ(topk_ranks_before(ka, 3, kb, 7), ka < kb || ka == kb);
      ASSERT_EQ(topk_ranks_before(ka, 7, kb, 3), ka < kb);
    }
  EXPECT_LT(topk_order_key(f_of(0x7FC00000u)), topk_order_key(INFINITY));
  EXPECT_LT(topk_order_key(-INFINITY), topk_order_key(f_of(0xFFC00000u)));
  EXPECT_LT(topk_order_key(0.0f), topk_order_key(-0.0f));
}

TEST(Semantics, EffectiveSoftmaxScale) {
  SparseAttnParams p{};
  p.softmax_scale = 0.25f;
  p.k_global_scale = 3.0f;
  p.k.dtype = DType::kBF16;
  EXPECT_EQ(effective_softmax_scale(p), 0.25f);
  p.k.dtype = DType::kFP8E4M3;
  EXPECT_EQ(effective_softmax_scale(p), 0.25f);
  p.k.dtype = DType::kNVFP4;
  EXPECT_EQ(effective_softmax_scale(p), 0.75f);
}

}  // namespace
}  // namespace flashmsa

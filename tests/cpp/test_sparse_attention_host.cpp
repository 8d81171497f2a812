// CPU reference of msa_sparse_attention (stage 3 prefill) against a naive fp64 oracle written from
// docs/semantics.md, and against itself across layouts and dtypes that must agree bit for bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "flashmsa/error.h"
#include "sparse_attn_testbed.h"

namespace flashmsa::testing::sattn {
namespace {

int uniform(std::mt19937_64& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}
bool coin(std::mt19937_64& rng, double p) {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p;
}

// Lists reduced to what D5 says they mean: used ids (before the first negative, inside [0, nb),
// page inside the cache), each once, ascending, -1 padded.
std::vector<int> canonical_q2k(const Data& d, const std::vector<int>& q2k,
                               const std::vector<std::vector<char>>* dropped = nullptr) {
  const Problem& pb = d.pb;
  std::vector<int> out(q2k.size(), -1);
  for (int kh = 0; kh < pb.hkv; ++kh) {
    for (int r = 0; r < pb.total_q(); ++r) {
      const size_t base = (size_t(kh) * pb.total_q() + r) * pb.topk;
      const int b = owner_of(d, r);
      if (b < 0) continue;
      const int nb = num_blocks_of(pb.seqlen_k[b]);
      std::set<int> sel;
      for (int e = 0; e < pb.topk && q2k[base + e] >= 0; ++e) {
        const int t = q2k[base + e];
        if (t < nb && !(dropped != nullptr && (*dropped)[b][t])) sel.insert(t);
      }
      int e = 0;
      for (int t : sel) out[base + e++] = t;
    }
  }
  return out;
}

// A random problem: uneven lengths, empty sequences, seqlen_q > seqlen_k, every q_offset mode,
// causal or not, G in {1, 3, 16}, topk in {1, 16, 33}, bf16 / fp16 q, 16-bit / fp8 / NVFP4 K/V.
// One seed in four is "long": few query rows, up to ~40 blocks per sequence.
Problem random_problem(std::mt19937_64& rng, bool long_keys) {
  Problem pb;
  const int B = uniform(rng, 1, long_keys ? 2 : 4);
  for (int b = 0; b < B; ++b) {
    int sk = coin(rng, 0.12) ? 0 : uniform(rng, 1, long_keys ? 5000 : 900);
    if (sk > 0 && coin(rng, 0.15)) sk = kBlk * uniform(rng, 1, long_keys ? 39 : 7);
    int sq = coin(rng, 0.12) ? 0 : uniform(rng, 1, long_keys ? 4 : 20);
    if (!long_keys && sk > 0 && sk < 40 && coin(rng, 0.5)) sq = uniform(rng, sk, 40);  // sq > sk
    pb.seqlen_q.push_back(sq);
    pb.seqlen_k.push_back(sk);
  }
  pb.extra_rows = uniform(rng, 0, 2);
  const int G = std::vector<int>{1, 3, 16}[uniform(rng, 0, 2)];
  pb.hkv = G == 16 ? 1 : (G == 3 ? uniform(rng, 1, 2) : std::vector<int>{1, 2, 4}[uniform(rng, 0, 2)]);
  pb.hq = G * pb.hkv;
  pb.topk = std::vector<int>{1, 16, 33}[uniform(rng, 0, 2)];
  pb.causal = coin(rng, 0.5);
  const int mode = uniform(rng, 0, 3);
  int max_sk = 0;
  for (int x : pb.seqlen_k) max_sk = std::max(max_sk, x);
  if (mode == 2) {
    pb.offset_mode = QOffsetMode::kScalar;
    pb.offset_value = uniform(rng, -40, max_sk + 40);
  } else if (mode == 3) {
    pb.offset_mode = QOffsetMode::kPerSequence;
    for (int x : pb.seqlen_k) pb.offset_per_seq.push_back(uniform(rng, -60, x + 60));
  }
  pb.q_dtype = coin(rng, 0.5) ? DType::kBF16 : DType::kFP16;
  pb.out_dtype = pb.q_dtype;
  const int kv = uniform(rng, 0, 3);
  pb.kv_dtype = kv <= 1 ? pb.q_dtype : (kv == 2 ? DType::kFP8E4M3 : DType::kNVFP4);
  pb.softmax_scale = std::uniform_real_distribution<float>(0.03f, 0.4f)(rng);
  // k_global_scale != 1 everywhere: it must only matter for NVFP4.
  pb.k_global_scale = std::uniform_real_distribution<float>(0.3f, 2.f)(rng);
  pb.v_global_scale = coin(rng, 0.5) ? 1.f : std::uniform_real_distribution<float>(0.25f, 3.f)(rng);
  pb.temperature = std::vector<float>{0.7f, 1.f, 1.9f}[uniform(rng, 0, 2)];
  return pb;
}

Layout random_paged_layout(const Problem& pb, std::mt19937_64& rng) {
  if (pb.kv_dtype == DType::kNVFP4) return Layout::kPagedHND;
  const Layout all[] = {Layout::kPagedHND, Layout::kPagedNHD, Layout::kPackedHND, Layout::kPackedNHD};
  return all[uniform(rng, 0, 3)];
}

// ---- random shapes: oracle, paged == flat, invalid pages, list canonicalisation --------------

class SparseAttentionRandom : public ::testing::TestWithParam<int> {};

TEST_P(SparseAttentionRandom, MatchesOracleAndLayoutsAgree) {
  const int seed = GetParam();
  std::mt19937_64 rng(0x5eed0000u + seed);
  const Problem pb = random_problem(rng, seed % 4 == 3);
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const std::string ctx = "seed " + std::to_string(seed) + ": " + pb.describe();

  const Storage flat = build_storage(d, Layout::kFlat, rng);
  const Result ref = run_reference(d, flat, d.q2k);
  const Oracle o = oracle(d, d.q2k);
  expect_matches_oracle(ref, o, d, ctx + " [flat]");

  // The same keys behind permuted pages (partial last page, poisoned spare pages and columns).
  const Layout layout = random_paged_layout(pb, rng);
  PagedOptions opt;
  opt.spare_pages = uniform(rng, 0, 3);
  opt.extra_cols = uniform(rng, 0, 2);
  opt.lengths_from_cu_seqlens_k = coin(rng, 0.25);
  const Storage paged = build_storage(d, layout, rng, opt);
  expect_bit_equal(run_reference(d, paged, d.q2k), ref, ctx + " [" + layout_name(layout) + " vs flat]");

  // Canonical lists (sorted, deduplicated, in range, -1 padded) mean the same set: same bits.
  expect_bit_equal(run_reference(d, flat, canonical_q2k(d, d.q2k)), ref, ctx + " [canonical lists]");

  // Page ids outside the cache: those blocks contribute nothing (oracle), exactly as if the
  // lists did not name them (flat run with the blocks removed).
  if (seed % 2 == 0) {
    PagedOptions bad = opt;
    bad.invalid_page_prob = 0.25;
    const Storage holes = build_storage(d, Layout::kPagedHND, rng, bad);
    const Result got = run_reference(d, holes, d.q2k);
    expect_matches_oracle(got, oracle(d, d.q2k, &holes.dropped), d, ctx + " [invalid pages]");
    expect_bit_equal(got, run_reference(d, flat, canonical_q2k(d, d.q2k, &holes.dropped)),
                     ctx + " [invalid pages vs lists without them]");
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SparseAttentionRandom, ::testing::Range(0, 160));

// Over all seeds the random cases must exercise what they claim to (not a vacuous suite).
TEST(SparseAttentionReference, RandomCasesAreNotVacuous) {
  int nonempty_rows = 0, empty_rows = 0, causal = 0, fp8 = 0, nvfp4 = 0, long_cases = 0;
  for (int seed = 0; seed < 160; seed += 5) {
    std::mt19937_64 rng(0x5eed0000u + seed);
    const Problem pb = random_problem(rng, seed % 4 == 3);
    Data d = make_data(pb, rng);
    random_q2k(d, rng);
    const Oracle o = oracle(d, d.q2k);
    const int n = count_nonempty(o);
    nonempty_rows += n;
    empty_rows += int(o.empty.size()) - n;
    causal += pb.causal;
    fp8 += pb.kv_dtype == DType::kFP8E4M3;
    nvfp4 += pb.kv_dtype == DType::kNVFP4;
    long_cases += seed % 4 == 3;
  }
  EXPECT_GT(nonempty_rows, 2000);
  EXPECT_GT(empty_rows, 100);
  EXPECT_GT(causal, 5);
  EXPECT_GT(fp8, 3);
  EXPECT_GT(nvfp4, 3);
  EXPECT_GT(long_cases, 3);
}

// ---- named edge cases ------------------------------------------------------------------------

Problem small_problem() {
  Problem pb;
  pb.hq = 4;
  pb.hkv = 2;
  pb.topk = 16;
  pb.softmax_scale = 0.25f;
  return pb;
}

// Empty sequences (no queries, no keys), rows past the last sequence, negative per-sequence
// offsets: exact 0 / -inf, and every output element written (outputs start as NaN).
TEST(SparseAttentionReference, EmptySequencesUncoveredRowsNegativeOffsets) {
  std::mt19937_64 rng(11);
  Problem pb = small_problem();
  pb.seqlen_q = {5, 0, 7, 3, 40};
  pb.seqlen_k = {300, 200, 0, 129, 256};
  pb.extra_rows = 3;
  pb.causal = true;
  pb.offset_mode = QOffsetMode::kPerSequence;
  pb.offset_per_seq = {-2, 5, 3, 128, -20};
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{0.5, 0.3, 0.3, 0.2, 1.0});
  const Oracle o = oracle(d, d.q2k);
  const Result res = run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k);
  expect_matches_oracle(res, o, d, "edge");
  // Sequence 0: rows 0, 1 sit at negative positions; sequence 2 has no keys; the extra rows
  // belong to nobody; sequence 4 rows 0..19 sit before key 0.
  for (int h = 0; h < pb.hq; ++h) {
    for (int r : {0, 1, 5, 11, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                  32, 33, 34, 55, 56, 57}) {
      EXPECT_TRUE(o.empty[size_t(r) * pb.hq + h]) << "row " << r;
      EXPECT_EQ(res.lse[size_t(r) * pb.hq + h], -std::numeric_limits<float>::infinity()) << r;
      EXPECT_EQ(res.lse_t[size_t(r) * pb.hq + h], -std::numeric_limits<float>::infinity()) << r;
    }
  }
  EXPECT_GT(count_nonempty(o), 40);
}

// seqlen_q > seqlen_k with the default right-aligned offset (negative): the first rows see nothing.
TEST(SparseAttentionReference, SeqlenQGreaterThanSeqlenK) {
  std::mt19937_64 rng(12);
  Problem pb = small_problem();
  pb.seqlen_q = {300};
  pb.seqlen_k = {200};
  pb.causal = true;
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{0.0, 0.0, 0.0, 0.0, 0.0});
  const Oracle o = oracle(d, d.q2k);
  expect_matches_oracle(run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k), o, d, "sq>sk");
  for (int r = 0; r < 100; ++r) EXPECT_TRUE(o.empty[size_t(r) * pb.hq]) << r;
  EXPECT_GT(count_nonempty(o), 300);
}

// Causal with an offset past every key is the non-causal result, bit for bit; an explicit scalar
// offset equal to the right-aligned default gives the default's bits.
TEST(SparseAttentionReference, OffsetsAgreeWithTheirDefinitions) {
  std::mt19937_64 rng(13);
  Problem pb = small_problem();
  pb.seqlen_q = {37, 64};
  pb.seqlen_k = {700, 700};
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const Storage s = build_storage(d, Layout::kFlat, rng);
  const Result non_causal = run_reference(d, s, d.q2k);
  d.pb.causal = true;
  d.pb.offset_mode = QOffsetMode::kScalar;
  d.pb.offset_value = 1 << 30;
  expect_bit_equal(run_reference(d, s, d.q2k), non_causal, "far offset");

  d.pb.offset_mode = QOffsetMode::kRightAligned;
  const Result right = run_reference(d, s, d.q2k);
  d.pb.offset_mode = QOffsetMode::kPerSequence;
  d.pb.offset_per_seq = {700 - 37, 700 - 64};
  expect_bit_equal(run_reference(d, s, d.q2k), right, "per-sequence == right-aligned");
  expect_matches_oracle(right, oracle(d, d.q2k), d, "right-aligned");
}

// D5: order, duplicates, ids >= nb (huge ones included) and anything after the first negative
// value do not change the bits.
TEST(SparseAttentionReference, ListOrderDuplicatesHolesAndHugeIds) {
  std::mt19937_64 rng(14);
  Problem pb = small_problem();
  pb.seqlen_q = {50, 30};
  pb.seqlen_k = {1000, 900};
  pb.topk = 33;
  pb.causal = true;
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{1.0, 0.0, 0.0, 0.0, 0.9});
  const Storage s = build_storage(d, Layout::kPagedHND, rng);
  const Result base = run_reference(d, s, d.q2k);
  expect_matches_oracle(base, oracle(d, d.q2k), d, "base");

  std::vector<int> hostile = d.q2k;
  const int tq = pb.total_q();
  for (int kh = 0; kh < pb.hkv; ++kh) {
    for (int r = 0; r < tq; ++r) {
      int* list = &hostile[(size_t(kh) * tq + r) * pb.topk];
      const int n = int(std::find_if(list, list + pb.topk, [](int x) { return x < 0; }) - list);
      std::vector<int> e(list, list + n);
      for (int x : std::vector<int>(e)) e.push_back(x);  // every id twice
      e.push_back(8);                                    // nb == 8 for both sequences
      e.push_back(std::numeric_limits<int>::max());
      e.push_back(1 << 24);
      std::shuffle(e.begin(), e.end(), rng);
      ASSERT_LT(int(e.size()), pb.topk);
      std::vector<int> out(e);
      out.push_back(-1);  // the hole, then junk that names other blocks
      while (int(out.size()) < pb.topk) out.push_back(uniform(rng, 0, 7));
      std::copy(out.begin(), out.end(), list);
    }
  }
  EXPECT_NE(hostile, d.q2k);
  expect_bit_equal(run_reference(d, s, hostile), base, "hostile lists");
}

// Every K/V layout of the same data gives the flat result bit for bit, per dtype, including the
// paged lengths taken from cu_seqlens_k and a strided q view.
TEST(SparseAttentionReference, EveryLayoutMatchesFlat) {
  for (DType kv : {DType::kBF16, DType::kFP16, DType::kFP8E4M3}) {
    std::mt19937_64 rng(15 + int(kv));
    Problem pb = small_problem();
    pb.hq = 6;
    pb.hkv = 2;
    pb.seqlen_q = {20, 9, 14};
    pb.seqlen_k = {651, 128, 1000};
    pb.causal = true;
    pb.q_dtype = kv == DType::kFP8E4M3 ? DType::kBF16 : kv;
    pb.out_dtype = pb.q_dtype;
    pb.kv_dtype = kv;
    Data d = make_data(pb, rng);
    random_q2k(d, rng);
    const Result flat = run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k);
    expect_matches_oracle(flat, oracle(d, d.q2k), d, std::string("flat ") + dtype_name(kv));
    for (Layout l : {Layout::kFlatPacked, Layout::kPagedHND, Layout::kPagedNHD, Layout::kPackedHND,
                     Layout::kPackedNHD}) {
      const Storage s = build_storage(d, l, rng, PagedOptions{3, 2, 0.0, false});
      expect_bit_equal(run_reference(d, s, d.q2k), flat,
                       std::string(layout_name(l)) + " " + dtype_name(kv));
    }
    const Storage cu = build_storage(d, Layout::kPackedNHD, rng, PagedOptions{1, 0, 0.0, true});
    expect_bit_equal(run_reference(d, cu, d.q2k), flat, "paged lengths from cu_seqlens_k");
    RunOptions strided;
    strided.q_token_pad = 96;
    expect_bit_equal(run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k, strided), flat,
                     "strided q");
  }
}

// docs/semantics.md#fp8-kv: fp8 K/V are upconverted exactly, no scale applied: identical to bf16 /
// fp16 K/V holding the same values (flat and paged, bf16 and fp16 q).
TEST(SparseAttentionReference, Fp8EqualsDequantized) {
  for (DType q : {DType::kBF16, DType::kFP16}) {
    for (bool paged : {false, true}) {
      std::mt19937_64 rng(20 + int(q) * 2 + paged);
      Problem pb = small_problem();
      pb.hq = 8;
      pb.seqlen_q = {33, 17};
      pb.seqlen_k = {1500, 777};
      pb.causal = paged;
      pb.q_dtype = q;
      pb.out_dtype = q;
      pb.kv_dtype = DType::kFP8E4M3;
      pb.v_global_scale = 0.625f;
      Data d = make_data(pb, rng);
      random_q2k(d, rng);
      const Layout l = paged ? Layout::kPackedHND : Layout::kFlat;
      const Result fp8 = run_reference(d, build_storage(d, l, rng), d.q2k);
      const Data d16 = with_kv_dtype(d, q);
      expect_bit_equal(fp8, run_reference(d16, build_storage(d16, l, rng), d.q2k),
                       std::string("fp8 vs ") + dtype_name(q));
      expect_matches_oracle(fp8, oracle(d, d.q2k), d, "fp8 oracle");
    }
  }
}

// docs/semantics.md#nvfp4: NVFP4 K/V (codes + swizzled e4m3 block scales, flat and paged row
// orders) equal bf16 K/V holding the dequantized values, with k_global_scale folded into the
// softmax scale and v_global_scale on the output.
TEST(SparseAttentionReference, Nvfp4EqualsDequantized) {
  for (bool paged : {false, true}) {
    for (DType q : {DType::kBF16, DType::kFP16}) {
      std::mt19937_64 rng(30 + paged * 2 + int(q));
      Problem pb = small_problem();
      pb.hq = 6;
      pb.hkv = 3;  // scale rows interleave heads
      pb.seqlen_q = {21, 40};
      pb.seqlen_k = {1100, 333};
      pb.causal = !paged;
      pb.q_dtype = q;
      pb.out_dtype = q;
      pb.kv_dtype = DType::kNVFP4;
      pb.softmax_scale = 0.05f;
      pb.k_global_scale = 0.37f;
      pb.v_global_scale = 1.7f;
      Data d = make_data(pb, rng);
      random_q2k(d, rng);
      const Layout l = paged ? Layout::kPagedHND : Layout::kFlat;
      const Result fp4 = run_reference(d, build_storage(d, l, rng), d.q2k);
      expect_matches_oracle(fp4, oracle(d, d.q2k), d, std::string("nvfp4 paged=") + (paged ? "1" : "0"));

      Data deq = with_kv_dtype(d, q);
      deq.pb.softmax_scale = pb.softmax_scale * pb.k_global_scale;  // the fold, in fp32
      deq.pb.k_global_scale = 123.f;                                // ignored for 16-bit K
      expect_bit_equal(fp4, run_reference(deq, build_storage(deq, l, rng), d.q2k),
                       std::string("nvfp4 vs dequantized, paged=") + (paged ? "1" : "0"));
    }
  }
}

// LSE and temperature LSE (T = 0.7 as in FlashInfer's tests, and T > 1) against the oracle;
// v_global_scale scales the output only; leaving out the LSE outputs changes nothing else.
TEST(SparseAttentionReference, LseTemperatureLseAndVGlobalScale) {
  for (float T : {0.7f, 2.5f}) {
    std::mt19937_64 rng(40);
    Problem pb = small_problem();
    pb.seqlen_q = {80, 50};
    pb.seqlen_k = {1024, 640};
    pb.causal = T > 1.f;
    pb.temperature = T;
    pb.softmax_scale = 0.3f;
    Data d = make_data(pb, rng);
    random_q2k(d, rng);
    const Storage s = build_storage(d, Layout::kFlat, rng);
    const Result r1 = run_reference(d, s, d.q2k);
    expect_matches_oracle(r1, oracle(d, d.q2k), d, "T=" + std::to_string(T));

    d.pb.v_global_scale = 3.f;
    const Result r3 = run_reference(d, s, d.q2k);
    expect_matches_oracle(r3, oracle(d, d.q2k), d, "v_global_scale=3");
    EXPECT_EQ(r3.lse, r1.lse);
    EXPECT_EQ(r3.lse_t, r1.lse_t);

    RunOptions none;
    none.lse = false;
    none.lse_t = false;
    const Result bare = run_reference(d, s, d.q2k, none);
    EXPECT_EQ(bare.out, r3.out);
    for (float x : bare.lse) EXPECT_TRUE(std::isnan(x));  // untouched
  }
}

// FlashInfer's test_fully_masked_selected_blocks (docs/semantics.md#accuracy): sq = sk = 1024,
// Hq 2, Hkv 1, causal; the first 64 tokens select only the last two blocks (all above their
// causal limit): exact 0 and -inf LSE, never NaN; the other tokens attend normally.
TEST(SparseAttentionReference, FullyMaskedSelectedBlocks) {
  std::mt19937_64 rng(50);
  Problem pb;
  pb.hq = 2;
  pb.hkv = 1;
  pb.topk = 16;
  pb.causal = true;
  pb.seqlen_q = {1024};
  pb.seqlen_k = {1024};
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{0.0, 0.0, 0.0, 0.0, 1.0});
  for (int r = 0; r < 64; ++r) {
    int* list = &d.q2k[size_t(r) * pb.topk];
    std::fill(list, list + pb.topk, -1);
    list[0] = 6;
    list[1] = 7;
  }
  const Result res = run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k);
  for (int r = 0; r < 64; ++r) {
    for (int h = 0; h < pb.hq; ++h) {
      for (int e = 0; e < kD; ++e) ASSERT_EQ(res.out[(size_t(r) * pb.hq + h) * kD + e], 0) << r;
      ASSERT_EQ(res.lse[size_t(r) * pb.hq + h], -std::numeric_limits<float>::infinity()) << r;
      ASSERT_EQ(res.lse_t[size_t(r) * pb.hq + h], -std::numeric_limits<float>::infinity()) << r;
    }
  }
  const Oracle o = oracle(d, d.q2k, nullptr, 7);
  expect_matches_oracle(res, o, d, "fully masked");
  EXPECT_GT(count_nonempty(o), 200);
}

// Shapes of FlashInfer's test_sparse_attention (docs/semantics.md#accuracy), every 5th row checked
// against the oracle: (B, Hq, Hkv, topk, seqs_q, seqs_k, causal) with random distinct sorted
// selections.
TEST(SparseAttentionReference, FlashInferSuiteShapes) {
  struct Shape {
    int hq, hkv, topk;
    std::vector<int> sq, sk;
    bool causal;
  };
  const Shape shapes[] = {{1, 1, 4, {70}, {1000}, false},
                          {4, 2, 16, {100, 37}, {2048, 700}, false},
                          {2, 2, 16, {130, 64}, {1024, 512}, true},
                          {8, 8, 16, {97, 211}, {1111, 2222}, true},
                          {16, 1, 32, {33}, {3000}, false}};
  int seed = 60;
  for (const Shape& sh : shapes) {
    std::mt19937_64 rng(seed++);
    Problem pb;
    pb.hq = sh.hq;
    pb.hkv = sh.hkv;
    pb.topk = sh.topk;
    pb.seqlen_q = sh.sq;
    pb.seqlen_k = sh.sk;
    pb.causal = sh.causal;
    Data d = make_data(pb, rng);
    random_q2k(d, rng, ListMix{0.0, 0.0, 0.0, 0.0, 0.5});
    const Result res = run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k);
    const Oracle o = oracle(d, d.q2k, nullptr, 5);
    expect_matches_oracle(res, o, d, "suite shape");
    EXPECT_GT(count_nonempty(o), 10);
  }
}

// Results do not depend on the number of threads.
TEST(SparseAttentionReference, ThreadCountDoesNotChangeBits) {
  std::mt19937_64 rng(70);
  Problem pb = small_problem();
  pb.hq = 16;
  pb.hkv = 4;
  pb.seqlen_q = {61, 3, 29};
  pb.seqlen_k = {1500, 100, 800};
  pb.causal = true;
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const Storage s = build_storage(d, Layout::kPagedHND, rng);
  const char* saved = std::getenv("FLASHMSA_NUM_THREADS");
  const std::string saved_value = saved ? saved : "";
  setenv("FLASHMSA_NUM_THREADS", "1", 1);
  const Result one = run_reference(d, s, d.q2k);
  for (const char* n : {"3", "7", "64"}) {
    setenv("FLASHMSA_NUM_THREADS", n, 1);
    ASSERT_EQ(reference::num_threads(), std::atoi(n));
    expect_bit_equal(run_reference(d, s, d.q2k), one, std::string("threads=") + n);
  }
  if (saved)
    setenv("FLASHMSA_NUM_THREADS", saved_value.c_str(), 1);
  else
    unsetenv("FLASHMSA_NUM_THREADS");
}

// The reference refuses params it cannot compute, naming what is wrong.
TEST(SparseAttentionReference, RejectsParamsItCannotCompute) {
  std::mt19937_64 rng(80);
  Problem pb = small_problem();
  pb.seqlen_q = {4};
  pb.seqlen_k = {200};
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const Storage s = build_storage(d, Layout::kFlat, rng);
  auto expect_error = [&](const Data& dd, const std::string& needle) {
    try {
      run_reference(dd, s, d.q2k);
      ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Data bad = d;
  bad.pb.hq = 5;  // not a multiple of hkv = 2
  bad.q.resize(size_t(bad.pb.total_q()) * 5 * kD);
  expect_error(bad, "num_kv_heads");
  bad = d;
  bad.pb.q_dtype = DType::kFP8E4M3;  // fp8 q is decode-only
  for (float& x : bad.q) x = round_to(DType::kFP8E4M3, x);
  expect_error(bad, "q must be");
  bad = d;
  bad.pb.out_dtype = DType::kFP8E4M3;
  expect_error(bad, "output dtype");
}

// Opt-in benchmark (run with --gtest_also_run_disabled_tests): the MiniMax-M3 4K prefill, 4096
// tokens, 64 q heads / 4 kv heads, top-16 blocks, causal, random selections (the local block plus
// 15 random earlier visible blocks per token and kv head, docs/benchmarks.md), bf16 q with K/V in
// kv_dtype; every 64th row is checked against the oracle.
void m3_prefill_4k_timing(DType kv_dtype) {
  std::mt19937_64 rng(90);
  Problem pb;
  pb.hq = 64;
  pb.hkv = 4;
  pb.topk = 16;
  pb.causal = true;
  pb.seqlen_q = {4096};
  pb.seqlen_k = {4096};
  pb.kv_dtype = kv_dtype;
  Data d = make_data(pb, rng);
  for (int kh = 0; kh < pb.hkv; ++kh) {
    for (int r = 0; r < 4096; ++r) {
      const int local = r / kBlk;
      std::vector<int> earlier(local);
      std::iota(earlier.begin(), earlier.end(), 0);
      std::shuffle(earlier.begin(), earlier.end(), rng);
      earlier.resize(std::min(local, pb.topk - 1));
      earlier.push_back(local);
      std::sort(earlier.begin(), earlier.end());
      std::copy(earlier.begin(), earlier.end(), &d.q2k[(size_t(kh) * 4096 + r) * pb.topk]);
    }
  }
  const Storage s = build_storage(d, Layout::kFlat, rng);
  double sec = 0.0, cpu = 0.0;
  RunOptions timed;
  timed.seconds = &sec;
  timed.cpu_seconds = &cpu;
  timed.lse_t = false;
  const Result res = run_reference(d, s, d.q2k, timed);
  std::printf("M3 4K prefill, %s K/V, reference::sparse_attention: %.2f s wall, %.2f s CPU, %d "
              "threads\n",
              dtype_name(kv_dtype), sec, cpu, reference::num_threads());
  expect_matches_oracle(res, oracle(d, d.q2k, nullptr, 64), d,
                        std::string("M3 4K ") + dtype_name(kv_dtype), true, false);
}

TEST(SparseAttentionReference, DISABLED_M3Prefill4kTiming) { m3_prefill_4k_timing(DType::kBF16); }
TEST(SparseAttentionReference, DISABLED_M3Prefill4kFp8Timing) {
  m3_prefill_4k_timing(DType::kFP8E4M3);
}
TEST(SparseAttentionReference, DISABLED_M3Prefill4kNvfp4Timing) {
  m3_prefill_4k_timing(DType::kNVFP4);
}

}  // namespace
}  // namespace flashmsa::testing::sattn

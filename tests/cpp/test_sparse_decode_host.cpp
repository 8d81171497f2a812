// CPU reference of msa_sparse_decode_attention (docs/semantics.md#decode): the prefill math with a
// uniform seqlen_q (cu_seqlens_q = arange * seqlen_q), fp8 queries computed as bf16, and schedule
// knobs (partial_dtype, force_fused) that never change the reference's result.
#include <gtest/gtest.h>

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

// Decode / MTP batch: B requests of seqlen_q in {1, 2, 4} tokens, contexts from empty (or shorter
// than seqlen_q) to ~3000 keys, G in {1, 3, 12, 16}, every q and KV dtype, causal by default.
Problem random_decode_problem(std::mt19937_64& rng) {
  Problem pb;
  const int B = uniform(rng, 1, 6);
  const int sq = std::vector<int>{1, 2, 4}[uniform(rng, 0, 2)];
  for (int b = 0; b < B; ++b) {
    pb.seqlen_q.push_back(sq);
    int sk = coin(rng, 0.1) ? uniform(rng, 0, sq) : uniform(rng, 1, 3000);
    if (coin(rng, 0.2)) sk = kBlk * uniform(rng, 1, 20) - (coin(rng, 0.5) ? 13 : 0);  // ragged tail
    pb.seqlen_k.push_back(sk);
  }
  // G = 12: a second, partial vector of 8 head lanes in the reference.
  const int G = std::vector<int>{1, 3, 12, 16}[uniform(rng, 0, 3)];
  pb.hkv = G >= 12 ? uniform(rng, 1, 2) : uniform(rng, 1, 4);
  pb.hq = G * pb.hkv;
  pb.topk = std::vector<int>{1, 16, 33}[uniform(rng, 0, 2)];
  pb.causal = coin(rng, 0.8);
  if (coin(rng, 0.3)) {
    pb.offset_mode = QOffsetMode::kPerSequence;
    for (int x : pb.seqlen_k) pb.offset_per_seq.push_back(uniform(rng, -5, x));
  } else if (coin(rng, 0.15)) {
    pb.offset_mode = QOffsetMode::kScalar;
    pb.offset_value = uniform(rng, -3, 2000);
  }
  const int qd = uniform(rng, 0, 2);
  pb.q_dtype = qd == 0 ? DType::kBF16 : (qd == 1 ? DType::kFP16 : DType::kFP8E4M3);
  pb.out_dtype = pb.q_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16;
  const int kv = uniform(rng, 0, 2);
  pb.kv_dtype = kv == 0 ? (pb.q_dtype == DType::kFP16 ? DType::kFP16 : DType::kBF16)
                        : (kv == 1 ? DType::kFP8E4M3 : DType::kNVFP4);
  pb.softmax_scale = std::uniform_real_distribution<float>(0.03f, 0.3f)(rng);
  pb.k_global_scale = std::uniform_real_distribution<float>(0.3f, 2.f)(rng);
  pb.v_global_scale = coin(rng, 0.5) ? 1.f : std::uniform_real_distribution<float>(0.25f, 3.f)(rng);
  return pb;
}

// Decode returns no temperature LSE (docs/semantics.md#decode).
RunOptions decode_options() {
  RunOptions o;
  o.decode = true;
  o.lse_t = false;
  return o;
}
RunOptions prefill_options() {
  RunOptions o;
  o.lse_t = false;
  return o;
}

class SparseDecodeRandom : public ::testing::TestWithParam<int> {};

// Decode == prefill over cu_seqlens_q = arange * seqlen_q, bit for bit; both match the oracle.
TEST_P(SparseDecodeRandom, EqualsPrefillAndMatchesOracle) {
  const int seed = GetParam();
  std::mt19937_64 rng(0xdec0de00u + seed);
  const Problem pb = random_decode_problem(rng);
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const std::string ctx = "seed " + std::to_string(seed) + ": " + pb.describe();
  Layout layout = Layout::kFlat;
  if (coin(rng, 0.6))
    layout = pb.kv_dtype == DType::kNVFP4 ? Layout::kPagedHND
                                          : std::vector<Layout>{Layout::kPagedHND, Layout::kPackedHND,
                                                                Layout::kPackedNHD}[uniform(rng, 0, 2)];
  const Storage s = build_storage(d, layout, rng, PagedOptions{1, 1, 0.0, false});

  RunOptions dec = decode_options();
  dec.partial = PartialDType(uniform(rng, 0, 4));
  dec.force_fused = uniform(rng, -1, 1);
  const Result decode = run_reference(d, s, d.q2k, dec);
  expect_matches_oracle(decode, oracle(d, d.q2k), d, ctx + " [" + layout_name(layout) + "]", true,
                        false);
  if (pb.q_dtype != DType::kFP8E4M3) {  // prefill takes bf16 / fp16 q only
    expect_bit_equal(decode, run_reference(d, s, d.q2k, prefill_options()), ctx + " [decode vs prefill]");
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SparseDecodeRandom, ::testing::Range(0, 80));

// fp8 e4m3 q is computed as bf16 (exact upconversion), output bf16: identical to a bf16 q holding
// the same values, in decode and (for the bf16 twin) prefill.
TEST(SparseDecodeReference, Fp8QueryEqualsBf16Query) {
  for (DType kv : {DType::kBF16, DType::kFP8E4M3, DType::kNVFP4}) {
    std::mt19937_64 rng(100 + int(kv));
    Problem pb;
    pb.hq = 16;
    pb.hkv = 2;
    pb.topk = 16;
    pb.causal = true;
    pb.seqlen_q = {2, 2, 2};
    pb.seqlen_k = {2048 - 13, 700, 1};
    pb.q_dtype = DType::kFP8E4M3;
    pb.out_dtype = DType::kBF16;
    pb.kv_dtype = kv;
    pb.k_global_scale = 0.5f;
    pb.v_global_scale = 0.75f;
    Data d = make_data(pb, rng);
    random_q2k(d, rng);
    const Layout l = kv == DType::kNVFP4 ? Layout::kPagedHND : Layout::kPackedHND;
    const Storage s = build_storage(d, l, rng);
    const Result fp8q = run_reference(d, s, d.q2k, decode_options());
    expect_matches_oracle(fp8q, oracle(d, d.q2k), d, std::string("fp8 q, kv ") + dtype_name(kv), true,
                          false);
    Data bf = d;
    bf.pb.q_dtype = DType::kBF16;
    expect_bit_equal(fp8q, run_reference(bf, s, d.q2k, decode_options()), "fp8 q vs bf16 q (decode)");
    expect_bit_equal(fp8q, run_reference(bf, s, d.q2k, prefill_options()), "fp8 q vs bf16 q (prefill)");
  }
}

// partial_dtype and force_fused pick a kernel schedule; the reference's math is the same for all.
TEST(SparseDecodeReference, ScheduleKnobsDoNotChangeTheMath) {
  std::mt19937_64 rng(110);
  Problem pb;
  pb.hq = 8;
  pb.hkv = 2;
  pb.topk = 16;
  pb.causal = true;
  pb.seqlen_q = std::vector<int>(5, 4);
  pb.seqlen_k = {3000, 129, 4, 0, 1280};
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const Storage s = build_storage(d, Layout::kPagedNHD, rng);
  const Result base = run_reference(d, s, d.q2k, decode_options());
  for (int part = 0; part <= 4; ++part) {
    for (int fused = -1; fused <= 1; ++fused) {
      RunOptions o = decode_options();
      o.partial = PartialDType(part);
      o.force_fused = fused;
      expect_bit_equal(run_reference(d, s, d.q2k, o), base,
                       "partial " + std::to_string(part) + " fused " + std::to_string(fused));
    }
  }
  expect_matches_oracle(base, oracle(d, d.q2k), d, "knobs", true, false);
}

// Rows past B * seqlen_q belong to no request: 0 / -inf. Requests whose context is shorter than
// seqlen_q have early tokens at negative positions: 0 / -inf too.
TEST(SparseDecodeReference, RowsPastTheBatchAndShortContexts) {
  std::mt19937_64 rng(120);
  Problem pb;
  pb.hq = 4;
  pb.hkv = 1;
  pb.topk = 8;
  pb.causal = true;
  pb.seqlen_q = {4, 4};
  pb.seqlen_k = {2, 500};
  pb.extra_rows = 3;
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{0.0, 0.0, 0.0, 0.0, 1.0});
  const Oracle o = oracle(d, d.q2k);
  const Result res = run_reference(d, build_storage(d, Layout::kFlat, rng), d.q2k, decode_options());
  expect_matches_oracle(res, o, d, "short contexts", true, false);
  for (int r : {0, 1, 8, 9, 10})  // positions -2, -1 of request 0; the 3 extra rows
    for (int h = 0; h < pb.hq; ++h) EXPECT_TRUE(o.empty[size_t(r) * pb.hq + h]) << r;
  EXPECT_GT(count_nonempty(o), 16);
}

// The M3 decode shape (64 q heads / 4 kv heads, top-16, MTP seqlen_q 2) on vLLM's cache layout:
// packed K|V fp8 pages with seqused_k = 128 * pages - 13 and a v descale.
TEST(SparseDecodeReference, M3PackedFp8Decode) {
  std::mt19937_64 rng(130);
  Problem pb;
  pb.hq = 64;
  pb.hkv = 4;
  pb.topk = 16;
  pb.causal = true;
  pb.seqlen_q = {2, 2, 2};
  pb.seqlen_k = {128 * 32 - 13, 128 * 20 - 13, 128 * 3 - 13};
  pb.kv_dtype = DType::kFP8E4M3;
  pb.v_global_scale = 0.4f;
  Data d = make_data(pb, rng);
  random_q2k(d, rng, ListMix{0.5, 0.1, 0.0, 0.0, 1.0});
  const Result res =
      run_reference(d, build_storage(d, Layout::kPackedHND, rng), d.q2k, decode_options());
  const Oracle o = oracle(d, d.q2k);
  expect_matches_oracle(res, o, d, "M3 decode", true, false);
  EXPECT_GT(count_nonempty(o), 300);
}

// Decode needs uniform queries: cu_seqlens_q set or seqlen_q < 1 are refused.
TEST(SparseDecodeReference, RejectsNonUniformQueries) {
  std::mt19937_64 rng(140);
  Problem pb;
  pb.hq = 2;
  pb.hkv = 1;
  pb.seqlen_q = {1, 1};
  pb.seqlen_k = {100, 300};
  Data d = make_data(pb, rng);
  random_q2k(d, rng);
  const Storage s = build_storage(d, Layout::kFlat, rng);
  std::vector<uint16_t> q(size_t(2) * pb.hq * kD, 0), out(q.size());
  SparseAttnParams p{};
  p.batch = 2;
  p.total_q = 2;
  p.num_heads = pb.hq;
  p.num_kv_heads = pb.hkv;
  p.topk = pb.topk;
  p.softmax_scale = 0.1f;
  p.k_global_scale = 1.f;
  p.v_global_scale = 1.f;
  p.lse_temperature = 1.f;
  p.q = q.data();
  p.q_dtype = DType::kBF16;
  p.q_stride_token = int64_t(pb.hq) * kD;
  p.q_stride_head = kD;
  p.k = s.k;
  p.v = s.v;
  p.kv = s.kv;
  p.q2k = d.q2k.data();
  p.q2k_head_stride = int64_t(p.total_q) * p.topk;  // contiguous (Hkv, total_q, topk)
  p.q2k_row_stride = p.topk;
  p.out = out.data();
  p.out_dtype = DType::kBF16;
  p.qi = QIndex{d.cu_q.data(), 0, 1};
  EXPECT_THROW(reference::sparse_decode(SparseDecodeParams{p, PartialDType::kDefault, -1}), Error);
  p.qi = QIndex{nullptr, 0, 1};
  EXPECT_THROW(reference::sparse_decode(SparseDecodeParams{p, PartialDType::kDefault, -1}), Error);
  p.qi = QIndex{nullptr, 1, 1};
  EXPECT_NO_THROW(reference::sparse_decode(SparseDecodeParams{p, PartialDType::kDefault, -1}));
}

}  // namespace
}  // namespace flashmsa::testing::sattn

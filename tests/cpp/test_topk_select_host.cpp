// CPU reference of msa_topk_select (stage 2) against a naive oracle written here from
// docs/semantics.md#topk-select and #d3 in terms of values (explicit NaN, signed-zero and infinity
// rules, a full sort), not the bit-key trick of semantics.h; plus the output contract checked on
// its own, and the edge cases of docs/semantics.md#edge-cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "test_util.h"

namespace flashmsa::testing {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr int kSentinel = 0x7EEEEEEE;  // no valid output takes it: an unwritten slot shows up

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- the naive oracle ------------------------------------------------------------------------

// Whether (a, block ia) ranks before (b, block ib), from the wording of
// docs/semantics.md#topk-order: a larger value is better; +0 beats -0; a positive NaN beats
// everything (a larger payload first), a negative NaN loses to everything, -inf included (a smaller
// payload first); exact ties go to the lower block.
bool naive_better(float a, int ia, float b, int ib) {
  auto rank_class = [](float x) { return std::isnan(x) ? (std::signbit(x) ? 0 : 2) : 1; };
  const int ca = rank_class(a), cb = rank_class(b);
  if (ca != cb) return ca > cb;
  if (ca == 1) {
    if (a > b) return true;
    if (a < b) return false;
    if (a == 0.0f && std::signbit(a) != std::signbit(b)) return !std::signbit(a);
    return ia < ib;
  }
  const uint32_t pa = to_bits(a) & 0x7FFFFFu, pb = to_bits(b) & 0x7FFFFFu;
  if (pa != pb) return ca == 2 ? pa > pb : pa < pb;
  return ia < ib;
}

struct TopkProblem {
  int H = 2, P = 16, S = 4, topk = 16, fb = 0, fe = 0;
  std::vector<float> score;    // [H, P, S]
  bool per_token = false;
  std::vector<int> nvp;        // [S] when per_token
  int nvp_value = 0;           // otherwise
};

// Expected out[s, h, :].
std::vector<int> oracle_row(const TopkProblem& pr, int s, int h) {
  long long n = pr.per_token ? pr.nvp[s] : pr.nvp_value;
  if (n < 0) n = 0;
  if (n > pr.P) n = pr.P;
  const int nvp = int(n);
  const int fb = std::min(pr.fb, nvp);
  const int fe = std::min(pr.fe, nvp - fb);
  std::vector<int> sel;
  for (int t = 0; t < fb; ++t) sel.push_back(t);
  for (int t = nvp - fe; t < nvp; ++t) sel.push_back(t);
  std::vector<int> mid;
  for (int t = fb; t < nvp - fe; ++t) mid.push_back(t);
  auto value = [&](int t) { return pr.score[(size_t(h) * pr.P + t) * pr.S + s]; };
  std::sort(mid.begin(), mid.end(),
            [&](int a, int b) { return naive_better(value(a), a, value(b), b); });
  const int take = std::min<int>(pr.topk - fb - fe, int(mid.size()));
  for (int c = 0; c < take; ++c) sel.push_back(mid[c]);
  std::sort(sel.begin(), sel.end());
  sel.resize(pr.topk, -1);
  return sel;
}

std::vector<int> run_reference(const TopkProblem& pr) {
  std::vector<int> out(size_t(pr.S) * pr.H * pr.topk, kSentinel);
  TopkSelectParams p{};
  p.num_heads = pr.H;
  p.num_blocks = pr.P;
  p.num_tokens = pr.S;
  p.topk = pr.topk;
  p.force_begin = pr.fb;
  p.force_end = pr.fe;
  p.score = pr.score.data();
  p.num_valid_pages = pr.per_token ? pr.nvp.data() : nullptr;
  p.num_valid_pages_value = pr.nvp_value;
  p.out = out.data();
  p.out_token_stride = int64_t(pr.H) * pr.topk;
  p.out_head_stride = pr.topk;
  reference::topk_select(p);
  return out;
}

std::string row_string(const int* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += std::to_string(v[i]) + (i + 1 < n ? "," : "");
  return s + "]";
}

// The step-5 contract of docs/semantics.md#topk-select, independent of the oracle: min(topk, nvp)
// valid entries, strictly ascending, inside [0, nvp), forced blocks present, -1 only as tail
// padding.
void check_contract(const TopkProblem& pr, const std::vector<int>& out) {
  for (int s = 0; s < pr.S; ++s) {
    long long n = pr.per_token ? pr.nvp[s] : pr.nvp_value;
    const int nvp = int(std::clamp<long long>(n, 0, pr.P));
    for (int h = 0; h < pr.H; ++h) {
      const int* row = out.data() + (size_t(s) * pr.H + h) * pr.topk;
      int valid = 0;
      while (valid < pr.topk && row[valid] >= 0) ++valid;
      ASSERT_EQ(valid, std::min(pr.topk, nvp)) << "s=" << s << " h=" << h << " "
                                               << row_string(row, pr.topk);
      for (int c = valid; c < pr.topk; ++c) ASSERT_EQ(row[c], -1) << "hole at slot " << c;
      for (int c = 0; c < valid; ++c) {
        ASSERT_LT(row[c], nvp);
        if (c > 0) ASSERT_LT(row[c - 1], row[c]) << "not strictly ascending";
      }
      const int fb = std::min(pr.fb, nvp), fe = std::min(pr.fe, nvp - fb);
      auto has = [&](int t) { return std::binary_search(row, row + valid, t); };
      for (int t = 0; t < fb; ++t) ASSERT_TRUE(has(t)) << "forced begin block " << t << " missing";
      for (int t = nvp - fe; t < nvp; ++t) ASSERT_TRUE(has(t)) << "forced end block " << t;
    }
  }
}

void check_problem(const TopkProblem& pr) {
  const std::vector<int> out = run_reference(pr);
  check_contract(pr, out);
  int bad = 0;
  for (int s = 0; s < pr.S; ++s)
    for (int h = 0; h < pr.H; ++h) {
      const std::vector<int> want = oracle_row(pr, s, h);
      const int* got = out.data() + (size_t(s) * pr.H + h) * pr.topk;
      if (!std::equal(want.begin(), want.end(), got) && ++bad <= 5)
        ADD_FAILURE() << "s=" << s << " h=" << h << " got " << row_string(got, pr.topk)
                      << " want " << row_string(want.data(), pr.topk);
    }
  EXPECT_EQ(bad, 0);
}

// ---- random problems over the grid of docs/semantics.md#accuracy ------------------------------

enum class Dist { kDistinct, kTies, kSpecials, kAllNegInf };

const uint32_t kSpecialBits[] = {
    0x7FC00000u, 0x7FFFFFFFu, 0x7F800001u,  // positive NaNs (quiet max payload, signalling min)
    0xFFC00000u, 0xFFFFFFFFu, 0xFF800001u,  // negative NaNs
    0x7F800000u, 0xFF800000u,               // +inf, -inf
    0x00000000u, 0x80000000u,               // +0, -0
    0x7F7FFFFFu, 0xFF7FFFFFu,               // +-FLT_MAX
    0x00000001u, 0x80000001u,               // +-smallest subnormal
    0x3F800000u, 0xBF800000u};              // +-1

void fill_scores(TopkProblem& pr, Dist dist, std::mt19937_64& rng) {
  const size_t n = size_t(pr.H) * pr.P * pr.S;
  pr.score.resize(n);
  switch (dist) {
    case Dist::kDistinct: {
      // Each (h, s) row is a permutation of distinct values.
      std::vector<int> perm(pr.P);
      for (int h = 0; h < pr.H; ++h)
        for (int s = 0; s < pr.S; ++s) {
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int t = 0; t < pr.P; ++t)
            pr.score[(size_t(h) * pr.P + t) * pr.S + s] = float(perm[t] - pr.P / 2) * 0.25f;
        }
      break;
    }
    case Dist::kTies: {
      // 1 + U * 2^-13 (FlashInfer's tied scores): few distinct values, many exact ties.
      for (size_t i = 0; i < n; ++i) pr.score[i] = 1.0f + float(rng() % 4) * 0x1p-13f;
      break;
    }
    case Dist::kSpecials: {
      const size_t k = sizeof(kSpecialBits) / sizeof(kSpecialBits[0]);
      std::uniform_real_distribution<float> u(-3.0f, 3.0f);
      for (size_t i = 0; i < n; ++i)
        pr.score[i] = rng() % 3 == 0 ? u(rng) : from_bits(kSpecialBits[rng() % k]);
      break;
    }
    case Dist::kAllNegInf:
      for (size_t i = 0; i < n; ++i) pr.score[i] = -kInfF;
      break;
  }
}

struct TopkGridCase {
  int P;
  int topk;
  int fb;
  int fe;
  bool per_token;
  Dist dist;
};

std::vector<TopkGridCase> grid_cases() {
  std::vector<TopkGridCase> v;
  const std::pair<int, int> forced[] = {{0, 0}, {0, 1}, {1, 1}, {2, 3}};
  for (int P : {1, 24, 128, 160, 16384})
    for (int topk : {1, 16, 33, 64})
      for (auto [fb, fe] : forced)
        for (bool per_token : {false, true})
          for (Dist d : {Dist::kDistinct, Dist::kTies, Dist::kSpecials, Dist::kAllNegInf}) {
            // Forced blocks are validated to fit in topk: shrink them when topk is small.
            const int fb2 = std::min(fb, topk);
            const int fe2 = std::min(fe, topk - fb2);
            const bool seen = std::any_of(v.begin(), v.end(), [&](const TopkGridCase& o) {
              return o.P == P && o.topk == topk && o.fb == fb2 && o.fe == fe2 &&
                     o.per_token == per_token && o.dist == d;
            });
            if (!seen) v.push_back({P, topk, fb2, fe2, per_token, d});
          }
  return v;
}

std::string grid_name(const ::testing::TestParamInfo<TopkGridCase>& info) {
  const TopkGridCase& c = info.param;
  static const char* kDist[] = {"distinct", "ties", "specials", "allneginf"};
  return "P" + std::to_string(c.P) + "_k" + std::to_string(c.topk) + "_fb" + std::to_string(c.fb) +
         "_fe" + std::to_string(c.fe) + (c.per_token ? "_pertoken_" : "_scalar_") +
         kDist[int(c.dist)];
}

class TopkSelectGrid : public ::testing::TestWithParam<TopkGridCase> {};

TEST_P(TopkSelectGrid, MatchesOracle) {
  const TopkGridCase& c = GetParam();
  std::mt19937_64 rng(uint64_t(c.P) * 1000003u + uint64_t(c.topk) * 101u + uint64_t(c.fb) * 7u +
                      uint64_t(c.fe) * 3u + (c.per_token ? 1u : 0u) + uint64_t(c.dist) * 13u);
  TopkProblem pr;
  pr.H = 2;
  pr.P = c.P;
  pr.S = c.P >= 16384 ? 3 : 12;
  pr.topk = c.topk;
  pr.fb = c.fb;
  pr.fe = c.fe;
  pr.per_token = c.per_token;
  fill_scores(pr, c.dist, rng);
  if (c.per_token) {
    // The FlashInfer clamp values, then random ones inside and outside [0, P].
    const int P = c.P;
    pr.nvp = {P + 1, 2 * P, INT_MAX, 0, -5, P};
    std::uniform_int_distribution<int> in_range(0, P);
    while (int(pr.nvp.size()) < pr.S - 1) pr.nvp.push_back(in_range(rng));
    pr.nvp.push_back(INT_MIN);
    pr.nvp.resize(pr.S);
  } else {
    // Scalar nvp is validated 0 < nvp <= P and fb + fe <= nvp.
    pr.fb = std::min(pr.fb, c.P);
    pr.fe = std::min(pr.fe, c.P - pr.fb);
    std::uniform_int_distribution<int> in_range(std::max(1, pr.fb + pr.fe), c.P);
    pr.nvp_value = rng() % 2 ? c.P : in_range(rng);
  }
  check_problem(pr);
}

INSTANTIATE_TEST_SUITE_P(Spec, TopkSelectGrid, ::testing::ValuesIn(grid_cases()), grid_name);

// ---- hand-written cases of docs/semantics.md#edge-cases ---------------------------------------

// One (s, h) row with the given scores; returns out[0, 0, :].
std::vector<int> select_one(const std::vector<float>& scores, int topk, int nvp, int fb = 0,
                            int fe = 0, bool per_token = false) {
  TopkProblem pr;
  pr.H = 1;
  pr.S = 1;
  pr.P = int(scores.size());
  pr.topk = topk;
  pr.fb = fb;
  pr.fe = fe;
  pr.score = scores;
  pr.per_token = per_token;
  pr.nvp = {nvp};
  pr.nvp_value = nvp;
  std::vector<int> out = run_reference(pr);
  check_contract(pr, out);
  return out;
}

// Order best -> worst: +NaN, +inf, 1, +0, -0, -1, -inf, -NaN (blocks 5, 4, 6, 1, 0, 7, 2, 3).
TEST(TopkSelectHost, TotalOrderOfSpecialValues) {
  const std::vector<float> scores = {-0.0f,       0.0f, -kInfF, from_bits(0xFFC00000u), kInfF,
                                     from_bits(0x7FC00000u), 1.0f, -1.0f};
  const std::vector<std::vector<int>> want = {
      {5},          {4, 5},          {4, 5, 6},          {1, 4, 5, 6},
      {0, 1, 4, 5, 6}, {0, 1, 4, 5, 6, 7}, {0, 1, 2, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}};
  for (int k = 1; k <= 8; ++k) {
    std::vector<int> got = select_one(scores, k, 8);
    EXPECT_EQ(got, want[k - 1]) << "topk " << k;
  }
}

TEST(TopkSelectHost, NanPayloadOrder) {
  // +NaN: larger payload first; -NaN: smaller payload first, both below -inf.
  const std::vector<float> scores = {from_bits(0x7FC00000u), from_bits(0x7FFFFFFFu),
                                     from_bits(0xFFFFFFFFu), from_bits(0xFFC00000u), -kInfF};
  EXPECT_EQ(select_one(scores, 1, 5), std::vector<int>({1}));
  EXPECT_EQ(select_one(scores, 2, 5), std::vector<int>({0, 1}));
  EXPECT_EQ(select_one(scores, 3, 5), std::vector<int>({0, 1, 4}));
  EXPECT_EQ(select_one(scores, 4, 5), std::vector<int>({0, 1, 3, 4}));
}

TEST(TopkSelectHost, TiesGoToTheLowerBlock) {
  EXPECT_EQ(select_one(std::vector<float>(40, 0.5f), 4, 40), std::vector<int>({0, 1, 2, 3}));
  // Ties in the middle range start after the forced begin blocks.
  std::vector<float> s(40, 2.0f);
  s[30] = 3.0f;
  EXPECT_EQ(select_one(s, 5, 40, 2, 1), std::vector<int>({0, 1, 2, 30, 39}));
  // -inf everywhere: still min(topk, nvp) blocks, the lowest ones.
  EXPECT_EQ(select_one(std::vector<float>(10, -kInfF), 3, 10), std::vector<int>({0, 1, 2}));
}

TEST(TopkSelectHost, ForcedBlocksWithTheWorstScores) {
  // Forced blocks are chosen regardless of score, even -inf and -NaN, and count inside topk.
  std::vector<float> s(20);
  for (int t = 0; t < 20; ++t) s[size_t(t)] = float(t);
  s[0] = -kInfF;
  s[1] = from_bits(0xFFC00000u);
  s[19] = from_bits(0xFFFFFFFFu);
  EXPECT_EQ(select_one(s, 5, 20, 2, 1), std::vector<int>({0, 1, 17, 18, 19}));
  // nvp = 10: the end window moves to block 9; block 19 is out of range.
  EXPECT_EQ(select_one(s, 5, 10, 2, 1), std::vector<int>({0, 1, 7, 8, 9}));
}

TEST(TopkSelectHost, ForcedRangesShrinkWhenNvpIsSmall) {
  const std::vector<float> s(10, 1.0f);
  // fb 3 + fe 4 with nvp 5: fb' = 3, fe' = 2, no middle.
  EXPECT_EQ(select_one(s, 8, 5, 3, 4, true), std::vector<int>({0, 1, 2, 3, 4, -1, -1, -1}));
  // nvp 2: fb' = 2, fe' = 0.
  EXPECT_EQ(select_one(s, 8, 2, 3, 4, true), std::vector<int>({0, 1, -1, -1, -1, -1, -1, -1}));
  // nvp 0 and negative: nothing.
  EXPECT_EQ(select_one(s, 3, 0, 1, 1, true), std::vector<int>({-1, -1, -1}));
  EXPECT_EQ(select_one(s, 3, -5, 1, 1, true), std::vector<int>({-1, -1, -1}));
  // topk == fb + fe: only forced blocks.
  std::vector<float> d(10);
  for (int t = 0; t < 10; ++t) d[size_t(t)] = float(10 - t);
  EXPECT_EQ(select_one(d, 3, 10, 1, 2), std::vector<int>({0, 8, 9}));
  EXPECT_EQ(select_one(d, 3, 10, 3, 0), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(select_one(d, 3, 10, 0, 3), std::vector<int>({7, 8, 9}));
}

// FlashInfer test: P in {128, 256}, H 2, S 64, nvp = P - 56, fb 3, fe 2, forced blocks given the
// worst scores.
TEST(TopkSelectHost, FlashInferForcedWorstScores) {
  for (int P : {128, 256}) {
    std::mt19937_64 rng{uint64_t(P)};
    TopkProblem pr;
    pr.H = 2;
    pr.P = P;
    pr.S = 64;
    pr.topk = 16;
    pr.fb = 3;
    pr.fe = 2;
    pr.nvp_value = P - 56;
    fill_scores(pr, Dist::kDistinct, rng);
    for (int h = 0; h < pr.H; ++h)
      for (int s = 0; s < pr.S; ++s)
        for (int t : {0, 1, 2, pr.nvp_value - 2, pr.nvp_value - 1})
          pr.score[(size_t(h) * P + t) * pr.S + s] = -kInfF;
    check_problem(pr);
  }
}

// FlashInfer per-token test: every row equals the row of a scalar call with that row's nvp, and the
// clamp values [P+1, 2P, 2^31-1, 0, -5, P] behave like [P, P, P, 0, 0, P].
TEST(TopkSelectHost, PerTokenEqualsScalarCalls) {
  const std::pair<int, int> forced[] = {{0, 0}, {0, 1}, {1, 1}, {2, 3}};
  for (int P : {24, 160})
    for (auto [fb, fe] : forced) {
      std::mt19937_64 rng(uint64_t(P) * 31 + uint64_t(fb) * 5 + uint64_t(fe));
      TopkProblem pr;
      pr.H = 2;
      pr.P = P;
      pr.S = 12;
      pr.topk = 16;
      pr.fb = fb;
      pr.fe = fe;
      pr.per_token = true;
      pr.nvp = {P + 1, 2 * P, INT_MAX, 0, -5, P};
      for (int s = 6; s < 12; ++s) pr.nvp.push_back(std::max(fb + fe, 1) + int(rng() % uint64_t(P - fb - fe)));
      fill_scores(pr, Dist::kDistinct, rng);
      const std::vector<int> per_token = run_reference(pr);
      check_contract(pr, per_token);
      for (int s = 0; s < pr.S; ++s) {
        const int clamped = std::clamp(pr.nvp[s], 0, P);
        const size_t row = size_t(s) * pr.H * pr.topk;
        if (clamped == 0) {
          for (int c = 0; c < pr.H * pr.topk; ++c) EXPECT_EQ(per_token[row + c], -1);
          continue;
        }
        TopkProblem scalar = pr;
        scalar.per_token = false;
        scalar.nvp_value = clamped;
        const std::vector<int> want = run_reference(scalar);
        EXPECT_TRUE(std::equal(want.begin() + row, want.begin() + row + pr.H * pr.topk,
                               per_token.begin() + row))
            << "P=" << P << " fb=" << fb << " fe=" << fe << " s=" << s;
      }
    }
}

// 2M-token row (P = 16384) with FlashInfer's tied scores: the lowest indices of each tie win.
TEST(TopkSelectHost, LargeTiedRows) {
  std::mt19937_64 rng(77);
  TopkProblem pr;
  pr.H = 1;
  pr.P = 16384;
  pr.S = 4;
  pr.topk = 16;
  pr.fe = 1;
  pr.nvp_value = 16384;
  fill_scores(pr, Dist::kTies, rng);
  check_problem(pr);
}

TEST(TopkSelectHost, DeterministicAcrossThreadCounts) {
  std::mt19937_64 rng(5);
  TopkProblem pr;
  pr.H = 3;
  pr.P = 700;
  pr.S = 50;
  pr.topk = 33;
  pr.fb = 1;
  pr.fe = 2;
  pr.nvp_value = 700;
  fill_scores(pr, Dist::kSpecials, rng);
  const char* old = std::getenv("FLASHMSA_NUM_THREADS");
  const std::string saved = old ? old : "";
  std::vector<std::vector<int>> outs;
  for (const char* n : {"1", "2", "5"}) {
    setenv("FLASHMSA_NUM_THREADS", n, 1);
    outs.push_back(run_reference(pr));
  }
  if (old) {
    setenv("FLASHMSA_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("FLASHMSA_NUM_THREADS");
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

TEST(TopkSelectHost, RejectsImpossibleParams) {
  std::vector<float> score(16, 0.0f);
  std::vector<int> out(16);
  TopkSelectParams p{};
  p.num_heads = 1;
  p.num_blocks = 16;
  p.num_tokens = 1;
  p.score = score.data();
  p.num_valid_pages_value = 16;
  p.out = out.data();
  p.topk = 65;
  EXPECT_THROW(reference::topk_select(p), Error);
  p.topk = 0;
  EXPECT_THROW(reference::topk_select(p), Error);
  p.topk = 4;
  p.force_begin = 3;
  p.force_end = 2;
  EXPECT_THROW(reference::topk_select(p), Error);
}

}  // namespace
}  // namespace flashmsa::testing

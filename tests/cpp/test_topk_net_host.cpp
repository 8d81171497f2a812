// The arithmetic of the top-k sorting-network kernel (csrc/topk_select/topk_net.h) on the CPU: the
// networks (every 0/1 input of the 16-word sort: the 0-1 principle), the merge, and a row's whole
// choice as the kernel makes it (L lanes' shares, the butterfly merge, the straddle rule and the
// second pass) against a plain sort by (order key, block), on scores built to straddle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "flashmsa/semantics.h"
#include "topk_select/topk_net.h"

namespace flashmsa::cuda::topk::net {
namespace {

TEST(TopkNet, SortOf16IsExactOnEveryBinaryInput) {
  for (uint32_t bits = 0; bits < (1u << 16); ++bits) {
    uint32_t v[16];
    for (int i = 0; i < 16; ++i) v[i] = (bits >> i) & 1u;
    sort_words(v);
    for (int i = 1; i < 16; ++i) ASSERT_LE(v[i - 1], v[i]) << bits;
    int ones = 0;
    for (int i = 0; i < 16; ++i) ones += int(v[i]);
    ASSERT_EQ(ones, __builtin_popcount(bits));
  }
}

template <int N>
void check_random_sorts(std::mt19937& rng, int trials) {
  std::uniform_int_distribution<uint32_t> small(0, 7), any;
  for (int t = 0; t < trials; ++t) {
    uint32_t v[N];
    std::vector<uint32_t> ref(N);
    for (int i = 0; i < N; ++i) ref[i] = v[i] = (t % 2) ? small(rng) : any(rng);
    sort_words(v);
    std::sort(ref.begin(), ref.end());
    for (int i = 0; i < N; ++i) ASSERT_EQ(v[i], ref[i]) << N << " " << t;
  }
}

TEST(TopkNet, SortsOf8To32AgreeWithStdSort) {
  std::mt19937 rng(1);
  check_random_sorts<8>(rng, 2000);
  check_random_sorts<16>(rng, 2000);
  check_random_sorts<32>(rng, 2000);
}

template <int K, int N>
void check_random_merges(std::mt19937& rng, int trials) {
  std::uniform_int_distribution<uint32_t> small(0, 5), any;
  for (int t = 0; t < trials; ++t) {
    uint32_t best[K], add[N];
    std::vector<uint32_t> all;
    for (int i = 0; i < K; ++i) all.push_back(best[i] = (t % 3 == 0) ? small(rng) : any(rng));
    for (int i = 0; i < N; ++i) all.push_back(add[i] = (t % 3 == 0) ? small(rng) : any(rng));
    if (t % 5 == 0)
      for (int i = K / 2; i < K; ++i) best[i] = all[i] = kSent;  // a lane's first batches
    std::sort(best, best + K);
    std::sort(add, add + N);
    merge_into(best, add);
    std::sort(all.begin(), all.end());
    for (int i = 0; i < K; ++i) ASSERT_EQ(best[i], all[i]) << K << " " << N << " " << t;
  }
}

TEST(TopkNet, MergeKeepsTheKSmallestSorted) {
  std::mt19937 rng(2);
  check_random_merges<16, 16>(rng, 3000);
  check_random_merges<32, 16>(rng, 3000);
  check_random_merges<32, 32>(rng, 3000);
}

TEST(TopkNet, OffsetBits) {
  EXPECT_EQ(offset_bits(1), 0);
  EXPECT_EQ(offset_bits(2), 1);
  EXPECT_EQ(offset_bits(3), 2);
  EXPECT_EQ(offset_bits(256), 8);
  EXPECT_EQ(offset_bits(257), 9);
  EXPECT_EQ(offset_bits(kMaxSpan), 15);
}

// One row as the kernel chooses it: blocks [lo, hi) of `score`, L lanes (part q takes lo + q,
// lo + q + L, ...), 16 blocks a batch; returns the chosen blocks, ascending.
template <int K>
std::vector<int> net_choice(const std::vector<float>& score, int lo, int hi, int target, int lanes,
                            bool* straddled) {
  const int b = offset_bits(hi - lo);
  const uint32_t high_mask = ~((1u << b) - 1u);
  auto pass = [&](auto word, uint32_t (&out)[K]) {
    std::vector<std::vector<uint32_t>> lane_best(lanes, std::vector<uint32_t>(K, kSent));
    for (int q = 0; q < lanes; ++q) {
      uint32_t best[K];
      for (auto& w : best) w = kSent;
      for (int j0 = 0; lo + q + lanes * j0 < hi; j0 += kBatch) {
        uint32_t w[kBatch];
        for (int i = 0; i < kBatch; ++i) {
          const int blk = lo + q + lanes * (j0 + i);
          w[i] = blk < hi ? word(score[blk], blk - lo) : kSent;
        }
        sort_words(w);
        merge_into(best, w);
      }
      std::copy(best, best + K, lane_best[q].begin());
    }
    for (int m = 1; m < lanes; m <<= 1) {  // the butterfly, every lane with its partner q ^ m
      auto next = lane_best;
      for (int q = 0; q < lanes; ++q) {
        uint32_t best[K], other[K];
        std::copy(lane_best[q].begin(), lane_best[q].end(), best);
        std::copy(lane_best[q ^ m].begin(), lane_best[q ^ m].end(), other);
        merge_into(best, other);
        std::copy(best, best + K, next[q].begin());
      }
      lane_best = next;
    }
    for (int q = 1; q < lanes; ++q) EXPECT_EQ(lane_best[q], lane_best[0]);
    std::copy(lane_best[0].begin(), lane_best[0].end(), out);
  };
  uint32_t best[K], best2[K];
  pass([&](float v, int off) { return word1(v, off, high_mask); }, best);
  const bool straddle = ((word_at(best, target - 1) ^ word_at(best, target)) & high_mask) == 0u;
  for (auto& w : best2) w = kSent;
  if (straddle) {
    const uint32_t cut = word_at(best, target - 1) & high_mask;
    pass([&](float v, int off) { return word2(v, off, b, high_mask, cut); }, best2);
  }
  *straddled = straddle;
  uint32_t sel[K];
  chosen_offsets(best, best2, target, straddle, high_mask, sel);
  std::vector<int> out;
  for (int i = 0; i < K; ++i) {
    if (i < target) {
      EXPECT_NE(sel[i], kSent);
      out.push_back(lo + int(sel[i]));
    } else {
      EXPECT_EQ(sel[i], kSent);
    }
  }
  return out;
}

std::vector<int> reference_choice(const std::vector<float>& score, int lo, int hi, int target) {
  std::vector<int> blocks;
  for (int j = lo; j < hi; ++j) blocks.push_back(j);
  std::stable_sort(blocks.begin(), blocks.end(), [&](int a, int c) {
    return topk_ranks_before(topk_order_key(score[a]), a, topk_order_key(score[c]), c);
  });
  blocks.resize(target);
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Scores of the kinds the kernel must get exactly right.
std::vector<float> make_row(std::mt19937& rng, int n, int kind) {
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<uint32_t> any;
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) {
    switch (kind) {
      case 0: v[i] = normal(rng); break;                                     // real-like
      case 1: v[i] = from_bits(0x3F800000u + (any(rng) & 0x3FFu)); break;    // low bits only
      case 2: v[i] = 0.5f; break;                                            // all tie
      case 3: v[i] = float(int(any(rng) % 4)); break;                        // few values
      case 4: v[i] = from_bits(any(rng)); break;                             // NaN, inf, -0...
      case 5: v[i] = from_bits(0xFFFFFFF0u | (any(rng) & 0xFu)); break;      // keys at the top
      case 6: v[i] = (i % 3 == 0) ? -std::numeric_limits<float>::infinity() : normal(rng); break;
      default: v[i] = float(i % 7) + from_bits(0x33800000u) * float(any(rng) % 3); break;
    }
  }
  return v;
}

template <int K>
void check_rows(int seed, const std::vector<int>& spans, const std::vector<int>& targets) {
  std::mt19937 rng(seed);
  int straddles = 0, rows = 0;
  for (int span : spans) {
    for (int target : targets) {
      if (target >= K) continue;
      for (int kind = 0; kind < 8; ++kind) {
        for (int lanes : {1, 2, 4, 8, 16, 32}) {
          const int lo = int(rng() % 5);
          const std::vector<float> score = make_row(rng, lo + span, kind);
          const int t = std::min(target, span);
          bool straddled = false;
          const std::vector<int> got = net_choice<K>(score, lo, lo + span, t, lanes, &straddled);
          ASSERT_EQ(got, reference_choice(score, lo, lo + span, t))
              << "span " << span << " target " << t << " kind " << kind << " lanes " << lanes;
          straddles += straddled ? 1 : 0;
          ++rows;
        }
      }
    }
  }
  EXPECT_GT(straddles, 0);  // the second pass ran
  EXPECT_LT(straddles, rows);
}

TEST(TopkNet, RowChoiceEqualsTheReference16) {
  check_rows<16>(3, {1, 2, 15, 16, 17, 31, 100, 255, 256, 257, 1000}, {1, 2, 7, 15});
}

TEST(TopkNet, RowChoiceEqualsTheReference32) {
  check_rows<32>(4, {1, 16, 31, 32, 33, 200, 1024, 2100}, {1, 16, 31});
}

}  // namespace
}  // namespace flashmsa::cuda::topk::net

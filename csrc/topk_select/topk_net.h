// msa_topk_select, sorting networks (plan kernel `net`): the pure arithmetic of a lane's row, host
// and device alike (tests/cpp/test_topk_net_host.cpp runs it on the CPU against a sort; the kernel
// is topk_net_kernel.cuh). docs/design/topk_select.md, "Sorting networks".
//
// A candidate is one 32-bit word, its order key with the low `b` bits replaced by its offset in
// the row's candidate range (b = the bits of that range's length): the word orders candidates by
// (truncated key, block), so min / max of words (one instruction each) are compare-exchanges of
// whole candidates. A lane keeps the K smallest words it has seen, sorted, and merges 16 new ones
// at a time: a sorting network over the 16, then the K smallest of both by one min per new word
// (the "bitonic split": the result is bitonic) and a bitonic merge. K > target; if the target-th
// and the (target + 1)-th smallest words differ in their truncated keys, the target smallest words
// are exactly the target best candidates (every other candidate has a larger truncated key, so a
// larger key). Otherwise (a tie of the truncated keys across the cut: rare on real scores, every
// row on ties) the boundary is resolved exactly by a second pass over the candidates whose
// truncated key equals the cut's, with the words (low b key bits << b | offset): their keys agree
// above bit b, so these words order them by (key, block) exactly.
#pragma once

#include <cstdint>
#include <utility>

#include "flashmsa/semantics.h"
#include "flashmsa/types.h"

namespace flashmsa::cuda::topk::net {

// The word of "no candidate": larger than or equal to every candidate's word.
inline constexpr uint32_t kSent = 0xFFFFFFFFu;
// New words merged at a time (one network of this many inputs).
inline constexpr int kBatch = 16;
// The widest candidate range the words can hold: offsets of b <= 15 bits (the second pass's words
// take 2 b bits, and stay below kSent).
inline constexpr int kMaxSpan = 1 << 15;

MSA_HOST_DEVICE uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }
MSA_HOST_DEVICE uint32_t umax(uint32_t a, uint32_t b) { return a < b ? b : a; }

// Compare-exchange: v[i] <= v[j] afterwards.
MSA_HOST_DEVICE void cas(uint32_t& a, uint32_t& b) {
  const uint32_t lo = umin(a, b);
  b = umax(a, b);
  a = lo;
}

// Compare-exchange of two compile-time positions (template arguments, so that no index is ever
// computed at run time and the words stay in registers).
template <int A, int B, int N>
MSA_HOST_DEVICE void cas_at(uint32_t (&v)[N]) {
  cas(v[A], v[B]);
}

// Batcher's odd-even merge sort of N words (a power of two): its comparators, in order, as a
// compile-time table (63 for N = 16).
template <int N>
struct OddEvenMergeSort {
  static_assert(N >= 2 && (N & (N - 1)) == 0, "a power of two");
  template <class F>
  static constexpr void for_each(F f) {
    for (int p = 1; p < N; p <<= 1)
      for (int k = p; k >= 1; k >>= 1)
        for (int j = k % p; j + k < N; j += 2 * k)
          for (int i = 0; i < k && i + j + k < N; ++i)
            if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) f(i + j, i + j + k);
  }
  static constexpr int count() {
    int c = 0;
    for_each([&c](int, int) { ++c; });
    return c;
  }
  static constexpr int kCount = count();
  struct Table {
    int a[kCount];
    int b[kCount];
  };
  static constexpr Table table() {
    Table t{};
    int c = 0;
    for_each([&](int a, int b) {
      t.a[c] = a;
      t.b[c] = b;
      ++c;
    });
    return t;
  }
  static constexpr Table kTable = table();
};

template <int N, int... I>
MSA_HOST_DEVICE void sort_words_impl(uint32_t (&v)[N], std::integer_sequence<int, I...>) {
  (cas_at<OddEvenMergeSort<N>::kTable.a[I], OddEvenMergeSort<N>::kTable.b[I]>(v), ...);
}

// Sorts N (a power of two) words ascending.
template <int N>
MSA_HOST_DEVICE void sort_words(uint32_t (&v)[N]) {
  sort_words_impl(v, std::make_integer_sequence<int, OddEvenMergeSort<N>::kCount>{});
}

// Half-cleaner of distance D over K words, then the rest of the bitonic merge.
template <int D, int K, int... I>
MSA_HOST_DEVICE void half_clean(uint32_t (&v)[K], std::integer_sequence<int, I...>) {
  // pair I: position (I / D) * 2 D + I % D against + D
  (cas_at<(I / D) * 2 * D + I % D, (I / D) * 2 * D + I % D + D>(v), ...);
}

// Sorts a bitonic sequence of K words ascending (half-cleaners of K / 2, K / 4, ..., 1).
template <int K, int D = K / 2>
MSA_HOST_DEVICE void bitonic_merge(uint32_t (&v)[K]) {
  half_clean<D>(v, std::make_integer_sequence<int, K / 2>{});
  if constexpr (D > 1) bitonic_merge<K, D / 2>(v);
}

// best (K words, ascending) := the K smallest of best and add (N <= K words, ascending), ascending.
// best[K - 1 - j] = min(best[K - 1 - j], add[j]) keeps exactly the K smallest (add padded with
// kSent to K words), as a bitonic sequence; the merge sorts it.
template <int K, int N>
MSA_HOST_DEVICE void merge_into(uint32_t (&best)[K], const uint32_t (&add)[N]) {
  static_assert(N <= K, "at most K new words");
#pragma unroll
  for (int j = 0; j < N; ++j) best[K - 1 - j] = umin(best[K - 1 - j], add[j]);
  bitonic_merge(best);
}

// The order key with its low b bits replaced by off (< 2^b): pass 1's word.
MSA_HOST_DEVICE uint32_t word1(float score, int off, uint32_t high_mask) {
  return (topk_order_key(score) & high_mask) | uint32_t(off);
}
// Pass 2's word of a candidate whose truncated key is cut (the boundary), else kSent: the low b
// key bits above the offset.
MSA_HOST_DEVICE uint32_t word2(float score, int off, int b, uint32_t high_mask, uint32_t cut) {
  const uint32_t key = topk_order_key(score);
  return (key & high_mask) == cut ? (((key & ~high_mask) << b) | uint32_t(off)) : kSent;
}

// Bits of an offset in a candidate range of `span` blocks (1 <= span <= kMaxSpan).
MSA_HOST_DEVICE int offset_bits(int span) {
  int b = 0;
  while ((1 << b) < span) ++b;
  return b;
}

// v[i] for a run-time i < K (a chain of selects: no local memory).
template <int K>
MSA_HOST_DEVICE uint32_t word_at(const uint32_t (&v)[K], int i) {
  uint32_t r = kSent;
#pragma unroll
  for (int j = 0; j < K; ++j) r = j == i ? v[j] : r;
  return r;
}

// The exact choice, once pass 1 (and where needed pass 2) have run: sel := the offsets of the
// target chosen candidates, ascending, then kSent. best: pass 1's K smallest words; best2: pass
// 2's K smallest words (all kSent where pass 2 was not needed); straddle: whether it was.
template <int K>
MSA_HOST_DEVICE void chosen_offsets(const uint32_t (&best)[K], const uint32_t (&best2)[K], int target,
                                    bool straddle, uint32_t high_mask, uint32_t (&sel)[K]) {
  const uint32_t cut = word_at(best, target - 1) & high_mask;
  // Pass 1's words below the cut's truncated key are chosen (all such candidates are among them);
  // without a straddle the whole first `target` words are.
  int n1 = target;
  if (straddle) {
    n1 = 0;
#pragma unroll
    for (int i = 0; i < K; ++i) n1 += (i < target && (best[i] & high_mask) < cut) ? 1 : 0;
  }
  const int n2 = target - n1;  // taken from the boundary, in pass 2's order
#pragma unroll
  for (int i = 0; i < K; ++i) sel[i] = i < n1 ? (best[i] & ~high_mask) : kSent;
  sort_words(sel);
  if (straddle) {
    uint32_t sel2[K];  // pass 2's offsets are its words' low bits as well
#pragma unroll
    for (int i = 0; i < K; ++i) sel2[i] = i < n2 ? (best2[i] & ~high_mask) : kSent;
    sort_words(sel2);
    merge_into(sel, sel2);
  }
}

}  // namespace flashmsa::cuda::topk::net

// Warpgroup-level pieces shared by the sm_90a attention kernels (KV-major, tile and MTP union):
// a 64-row query tile against one 128-key block.
//   wgmma_qk_tile    S = Q K^T (8 x wgmma m64n128k16, both operands in shared memory); _issue
//                    without the wait (union_tma_sm90.cuh overlaps it with the softmax)
//   rows_extreme     the largest scaled logit of each fragment row over its visible keys
//   rows_exp_sum     P = 2^(x - m) in place, and each row's partial sums
//   wgmma_pv_tile    O (+)= P V (8 x wgmma m64n128k16, P from registers); pack_p + _issue without
//                    the wait
// Tiles are common/wgmma.cuh's [2][rows][64] 128-byte-swizzled layout; fragment row h of a thread
// is row 16 warp + gid + 8 h of the tile, its keys 8 j + 2 tig + e (j < 16, e < 2).
#pragma once

#include <type_traits>

#include "common/wgmma.cuh"
#include "sparse_attn/attention_core.cuh"

namespace flashmsa::sparse_attn {

#if MSA_HAS_WGMMA
// bar.sync on the named barrier of warpgroup wg (ids 1.., 0 is __syncthreads).
MSA_DEVICE void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

// s = Q K^T for the 64 query rows at q_addr ([2][64][64]) and the 128 keys at k_addr ([2][128][64]):
// the 8 MMAs issued as one wgmma group (committed, not waited for: the caller's wgmma_wait and
// wgmma_fence_operand(s) complete it).
template <typename Elem>
MSA_DEVICE void wgmma_qk_issue(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  wgmma_fence_operand(s);
  wgmma_fence();
  const uint64_t da0 = wgmma_desc_sw128(q_addr, 0, 1024), db0 = wgmma_desc_sw128(k_addr, 0, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = uint32_t(kk & 3) * 32u;  // 16 dims = 32 bytes into the 64-dim half
    const uint64_t da = wgmma_desc_advance(da0, uint32_t(kk >> 2) * (64 * 128) + koff);
    const uint64_t db = wgmma_desc_advance(db0, uint32_t(kk >> 2) * (kBlockSize * 128) + koff);
    wgmma_m64n128k16_ss<Elem, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// wgmma_qk_issue into an array whose old values are dead: the first k-step's accumulators are
// write-only operands (wgmma_m64n128k16_ss_new), so the old values need no registers up to the MMA.
template <typename Elem>
MSA_DEVICE void wgmma_qk_issue_new(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  wgmma_fence();
  const uint64_t da0 = wgmma_desc_sw128(q_addr, 0, 1024), db0 = wgmma_desc_sw128(k_addr, 0, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = uint32_t(kk & 3) * 32u;
    const uint64_t da = wgmma_desc_advance(da0, uint32_t(kk >> 2) * (64 * 128) + koff);
    const uint64_t db = wgmma_desc_advance(db0, uint32_t(kk >> 2) * (kBlockSize * 128) + koff);
    if (kk == 0) wgmma_m64n128k16_ss_new<Elem>(s, da, db);
    else wgmma_m64n128k16_ss<Elem, 0>(s, da, db, 1);
  }
  wgmma_commit();
}

// wgmma_qk_issue, returning once the MMAs are complete.
template <typename Elem>
MSA_DEVICE void wgmma_qk_tile(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  wgmma_qk_issue<Elem>(s, q_addr, k_addr);
  wgmma_wait<0>();
  wgmma_fence_operand(s);
}

// P = s (already exponentiated) rounded to the compute dtype, as the A fragments of P V: the S
// accumulator layout is the A-fragment layout, k-step kk takes n8 tiles 2 kk and 2 kk + 1.
template <typename Elem>
MSA_DEVICE void pack_p(uint32_t (&pa)[8][4], const float (&s)[16][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack2<Elem>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack2<Elem>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack2<Elem>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack2<Elem>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    wgmma_fence_operand(pa[kk]);
  }
}

// o (+)= P V for the packed P (pack_p) and V the 128 keys at v_addr, read MN-major, issued as one
// wgmma group (committed, not waited for); accumulate = false: o = P V. Neither o nor pa may be
// touched until the caller's wgmma_wait (then wgmma_fence_operand of both).
template <typename Elem>
MSA_DEVICE void wgmma_pv_issue(float (&o)[16][4], const uint32_t (&pa)[8][4], uint32_t v_addr, bool accumulate) {
  wgmma_fence_operand(o);
  wgmma_fence();
  const uint64_t db0 = wgmma_desc_sw128(v_addr, kBlockSize * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t db = wgmma_desc_advance(db0, uint32_t(kk) * 2048u);  // 16 keys = 2048 bytes on
    wgmma_m64n128k16_rs<Elem, 1>(o, pa[kk], db, accumulate || kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// o (+)= P V with P = s (already exponentiated); returns once the MMAs are complete. All fragments
// are converted before the first wgmma, so that no register the MMAs read is written while they run.
template <typename Elem>
MSA_DEVICE void wgmma_pv_tile(float (&o)[16][4], const float (&s)[16][4], uint32_t v_addr, bool accumulate) {
  uint32_t pa[8][4];
  pack_p<Elem>(pa, s);
  wgmma_pv_issue<Elem>(o, pa, v_addr, accumulate);
  wgmma_wait<0>();
  wgmma_fence_operand(o);
}

// Whether key (j, e) of fragment row h is visible: kMask = false when the caller knows the whole
// block is (lim >= 128).
template <bool kMask>
MSA_DEVICE bool key_visible(int j, int e, int lim, int tig) {
  return !kMask || 8 * j + 2 * tig + e < lim;
}

// The softmax pieces over one block, for both fragment rows of a thread at once (their dependent
// chains interleave):
//   row_extreme_local  max over the thread's visible keys of row h of S * sign(sc), four running
//                      maxima instead of one chain of 32 dependent FMNMX: max is exact in any
//                      order (and a NaN score is skipped either way)
//   rows_extreme       that, reduced over each row's 4 threads (-inf when nothing is visible). The
//                      largest logit x = S * sc is then |sc| times it: taking the extreme on the raw
//                      scores keeps the scale out of the per-key work (it goes into the exponent's
//                      fma)
//   rows_exp_sum       P = 2^(x - m_use) = 2^fma(S, sc, -m_use) in place (0 for invisible keys);
//                      sum[h] += this thread's share of row h's sum P, in key order, sum_t[h] +=
//                      its share of sum 2^(T (x - m_use)) (kTemp)
template <bool kMask>
MSA_DEVICE float row_extreme_local(const float (&s)[16][4], int h, int lim, float sc, int tig) {
  float ext[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};
  if (sc >= 0.0f) {  // the negation below is an operand modifier of FMNMX, not an instruction
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = ext[(2 * j + e) & 3];
        x = key_visible<kMask>(j, e, lim, tig) ? fmaxf(x, s[j][2 * h + e]) : x;
      }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = ext[(2 * j + e) & 3];
        x = key_visible<kMask>(j, e, lim, tig) ? fmaxf(x, -s[j][2 * h + e]) : x;
      }
  }
  return fmaxf(fmaxf(ext[0], ext[1]), fmaxf(ext[2], ext[3]));
}

template <bool kMask>
MSA_DEVICE void rows_extreme(const float (&s)[16][4], const int (&lim)[2], float sc, int tig, float (&ext)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) ext[h] = row_extreme_local<kMask>(s, h, lim[h], sc, tig);
#pragma unroll
  for (int k = 1; k <= 2; k <<= 1)
#pragma unroll
    for (int h = 0; h < 2; ++h) ext[h] = fmaxf(ext[h], __shfl_xor_sync(0xffffffffu, ext[h], k));
}

template <bool kMask, bool kTemp>
MSA_DEVICE void rows_exp_sum(float (&s)[16][4], const int (&lim)[2], float sc, float temp, int tig,
                             const float (&m_use)[2], float (&sum)[2], float (&sum_t)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sv = s[j][2 * h + e];
        const bool vis = key_visible<kMask>(j, e, lim[h], tig);
        if constexpr (kTemp) sum_t[h] += vis ? exp2_approx(temp * fmaf(sv, sc, -m_use[h])) : 0.0f;
        const float pr = vis ? exp2_approx(fmaf(sv, sc, -m_use[h])) : 0.0f;
        s[j][2 * h + e] = pr;
        sum[h] += pr;
      }
}

// Calls f(std::bool_constant<kMask>{}, std::bool_constant<kTemp>{}) with the softmax variant of a
// thread's two rows, chosen once outside the element loops (a branch per element otherwise): the
// mask only where some key of the rows is cut (the masked form gives the same values where none
// is), the temperature sum only where it is asked for.
template <class F>
MSA_DEVICE void with_softmax_variant(const int (&lim)[2], bool has_temp, F&& f) {
  if (min(lim[0], lim[1]) >= kBlockSize) {
    if (has_temp) f(std::false_type{}, std::true_type{});
    else f(std::false_type{}, std::false_type{});
  } else {
    if (has_temp) f(std::true_type{}, std::true_type{});
    else f(std::true_type{}, std::false_type{});
  }
}
#endif  // MSA_HAS_WGMMA

}  // namespace flashmsa::sparse_attn

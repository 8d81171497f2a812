// The proxy decode kernels' select tail (template flag kSelect; flashmsa's extension op
// proxy_score_select, the core's run_proxy_score_select): msa_topk_select of a decode-sized call
// run by the proxy kernel itself, so that a decode step's index side is one kernel, not two
// (docs/design/proxy_score.md#select-tail).
//
// Each CTA of the grid streams an equal contiguous share of the B x Hkv x P units, so a request's
// units lie on a contiguous run of CTAs, computable from the unit range alone (cta_of below). When
// a CTA has stored its scores it arrives once on the arrival counter of every request its share
// touched; the CTA whose arrival completes a request's count (it saw count - 1) selects that
// request's rows (its tokens x all Hq heads) from the scores, which all CTAs of the request have
// stored by then. Rows no request covers (-inf scores) need no counter: CTA c fills the uncovered
// rows u = c (mod the grid) whole (fill_uncovered_rows<.., true>) and selects them itself, so
// graph-padded rows spread over the grid instead of queueing on one CTA. The counters are atom.inc
// with the wrap value count - 1: the last arrival stores 0, so a call leaves them as it found them
// (zero; the caller zeroes them once).
//
// Memory order: every thread fences its stores (gpu scope) and the CTA meets at a barrier before
// its arrivals; the arrivals are acq_rel atomics, and the last arriver's CTA meets at a barrier
// before it reads the scores, from L2 (ld.global.cg: the read-only path may not be used for data
// the grid writes).
//
// A row is selected with the top-k's own code for decode-sized rows (topk_net_kernel.cuh: the
// exact order and tie-break of every other path), in one of two forms (the plan's select_tail):
// kSelectCta, the whole CTA a row (pivot_cta_row, net_pivot_mode=rank_cta's counting over all the
// CTA's warps), rows in turn with the next rows' scores loaded ahead; kSelectWarp, a warp a row
// (pivot_warp_row, net_pivot_mode=sort's), rows over the CTA's warps.
#pragma once

#include <cstdint>

#include "topk_select/topk_net_kernel.cuh"

namespace flashmsa::cuda::proxy::decode {

// The kernels' kSelect: no tail, or the tail in either form.
inline constexpr int kSelectNone = 0;
inline constexpr int kSelectWarp = 1;
inline constexpr int kSelectCta = 2;

// Arrives on *counter, whose arrivals complete at `count`: true for the arrival that completes
// them (which stores 0). acq_rel at gpu scope: releases this CTA's stores (fenced and met at a
// barrier before), acquires those of the CTAs that arrived before.
__device__ __forceinline__ bool arrive_last(uint32_t* counter, uint32_t count) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.inc.u32 %0, [%1], %2;\n"
               : "=r"(old)
               : "l"(counter), "r"(count - 1u)
               : "memory");
  return old == count - 1u;
}

// The rows one CTA selects: a request's (its tokens) or this CTA's uncovered rows (u = begin +
// t x step of UncoveredRows), each token with all Hq heads: row j is (token of(j / Hq), head j % Hq).
struct SlotRows {
  bool uncovered;
  int64_t begin;
  int64_t step;
  int64_t tokens;
  int heads;
  UncoveredRows unc;
  __device__ __forceinline__ int64_t count() const { return tokens * heads; }
  __device__ __forceinline__ void row(int64_t j, int& s, int& h) const {
    const int64_t t = j / heads;
    h = int(j - t * heads);
    s = int(uncovered ? unc.row(begin + t * step) : begin + t);
  }
};
__device__ __forceinline__ SlotRows request_rows(const ProxyScoreParams& p, int b) {
  const RowRange rows = q_rows(p.qi, p.total_q, b);
  return SlotRows{false, rows.begin, 1, rows.len, p.num_heads, UncoveredRows{}};
}
// CTA c of `ctas`: the uncovered rows c, c + ctas, ... (fill_uncovered_rows<.., true>'s).
__device__ __forceinline__ SlotRows own_uncovered_rows(const ProxyScoreParams& p, const UncoveredRows& unc,
                                                       int64_t c, int64_t ctas) {
  const int64_t tokens = c < unc.count ? (unc.count - c + ctas - 1) / ctas : 0;
  return SlotRows{true, c, ctas, tokens, p.num_heads, unc};
}

// kSelectWarp: each row by one warp of the CTA's kWarps, from the scores in L2.
template <int kWarps>
__device__ __forceinline__ void select_rows_warp(const Params& dp, const SlotRows& rows, int warp, int lane,
                                                 uint2* stage) {
  const TopkSelectParams& tp = dp.sel.tp;
#pragma unroll 1
  for (int64_t j = warp; j < rows.count(); j += kWarps) {  // warp-uniform
    int s, h;
    rows.row(j, s, h);
    __syncwarp();  // the previous row's reads of stage are done before this row writes it
    switch (dp.sel.pivot) {
      case 8: topk::net::pivot_warp_row<8>(tp, s, h, lane, stage, topk::net::LoadL2{}); break;
      case 16: topk::net::pivot_warp_row<16>(tp, s, h, lane, stage, topk::net::LoadL2{}); break;
      default: topk::net::pivot_warp_row<32>(tp, s, h, lane, stage, topk::net::LoadL2{}); break;
    }
  }
}

// kSelectCta: each row by the whole CTA (N scores a lane over the row, Q = N / kWarps rounded up
// a warp), rows in turn, each row's visible count and scores loaded two rows ahead (the first two
// rows' loads in flight together, each later row's behind the row before it).
template <int kWarps, int N>
__device__ __forceinline__ void select_rows_cta(const Params& dp, const SlotRows& rows, int warp, int lane,
                                                topk::net::CtaRowScratch<kWarps> sm) {
  constexpr int Q = (N + kWarps - 1) / kWarps;
  const TopkSelectParams& tp = dp.sel.tp;
  const int64_t n = rows.count();
  float va[Q], vb[Q];
  int64_t na = 0, nb = 0;
  auto load = [&](int64_t j, float (&v)[Q], int64_t& nvp) {
    int s, h;
    rows.row(j, s, h);
    nvp = topk::net::row_nvp(tp, s);
    topk::net::cta_row_slots<Q>(tp, s, h, warp, lane, v, topk::net::LoadL2{});
  };
  if (n > 0) load(0, va, na);
  if (n > 1) load(1, vb, nb);
#pragma unroll 1
  for (int64_t j = 0; j < n; ++j) {  // CTA-uniform
    int s, h;
    rows.row(j, s, h);
    topk::net::pivot_cta_row<kWarps, Q>(tp, s, h, na, va, warp, lane, sm, topk::net::LoadL2{});
#pragma unroll
    for (int i = 0; i < Q; ++i) va[i] = vb[i];
    na = nb;
    if (j + 2 < n) load(j + 2, vb, nb);
  }
}

// The tail: called by every thread of the CTA once its share [u0, u0 + n) of the units and its
// uncovered rows (fill_uncovered_rows<.., true>) are stored. kForm: kSelectWarp or kSelectCta.
template <int kCtaThreads, int kForm>
__device__ __forceinline__ void select_tail(const Params& dp, int64_t u0, int64_t n) {
  static_assert(kForm == kSelectWarp || kForm == kSelectCta, "a select tail's form");
  constexpr int kWarps = kCtaThreads / 32;
  __shared__ uint2 stage[kWarps][32];
  __shared__ uint32_t lane_mins[kWarps][32];
  __shared__ int counts[kWarps];
  __shared__ int last[kCtaThreads];
  __shared__ int n_last;
  const ProxyScoreParams& p = dp.p;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const auto select = [&](const SlotRows& rows) {  // CTA-uniform
    if constexpr (kForm == kSelectWarp) {
      select_rows_warp<kWarps>(dp, rows, warp, lane, stage[warp]);
    } else {
      const topk::net::CtaRowScratch<kWarps> sm{lane_mins, counts, stage[0]};
      switch (dp.sel.pivot) {
        case 8: select_rows_cta<kWarps, 8>(dp, rows, warp, lane, sm); break;
        case 16: select_rows_cta<kWarps, 16>(dp, rows, warp, lane, sm); break;
        default: select_rows_cta<kWarps, 32>(dp, rows, warp, lane, sm); break;
      }
    }
  };
  __threadfence();  // this thread's score stores reach gpu scope before the CTA arrives
  const int64_t per_request = int64_t(p.num_kv_heads) * p.max_k_tiles;
  const int64_t units = dp.units;
  const int64_t ctas = gridDim.x;
  // The CTA whose share holds unit u: the largest c with units * c / ctas <= u (the shares'
  // floor division), i.e. c < (u + 1) * ctas / units.
  const auto cta_of = [&](int64_t u) { return ((u + 1) * ctas + units - 1) / units - 1; };
  int64_t b0 = 0, requests = 0;
  if (n > 0) {
    b0 = u0 / per_request;
    requests = (u0 + n - 1) / per_request - b0 + 1;
  }
#pragma unroll 1
  for (int64_t base = 0; base < requests; base += kCtaThreads) {  // CTA-uniform
    if (threadIdx.x == 0) n_last = 0;
    __syncthreads();  // the stores fenced (first round); n_last and last[] free (later rounds)
    const int64_t i = base + threadIdx.x;
    if (i < requests) {
      const int64_t b = b0 + i;
      const uint32_t count = uint32_t(cta_of((b + 1) * per_request - 1) - cta_of(b * per_request) + 1);
      if (arrive_last(dp.sel.arrivals + b, count)) last[atomicAdd(&n_last, 1)] = int(b);
    }
    __syncthreads();
    const int mine = n_last;
#pragma unroll 1
    for (int k = 0; k < mine; ++k) select(request_rows(p, last[k]));
    __syncthreads();  // every warp done with last[] before the next round resets it
  }
  const UncoveredRows unc = uncovered_q_rows(p.qi, p.batch, p.total_q);
  if (int64_t(blockIdx.x) < unc.count) {  // CTA-uniform
    __syncthreads();  // this CTA's fill of its uncovered rows (fenced above) seen by all its threads
    select(own_uncovered_rows(p, unc, blockIdx.x, ctas));
  }
}

}  // namespace flashmsa::cuda::proxy::decode

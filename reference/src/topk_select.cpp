// CPU reference of stage 2, msa_topk_select (docs/semantics.md#topk-select, #d3). Per (s, h):
// forced blocks [0, fb') and [nvp - fe', nvp), plus the `target` best middle blocks by
// (topk_order_key asc, block index asc); written ascending to row (s, h) of out (topk_out_row),
// -1 tail padded.
// Exactly min(topk, nvp) valid entries: -inf and NaN candidates are ordinary candidates.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "flashmsa/error.h"
#include "flashmsa/params.h"
#include "flashmsa/reference/reference.h"
#include "flashmsa/semantics.h"

namespace flashmsa::reference {
namespace {

struct Candidate {
  uint32_t key;
  int block;
};

bool ranks_before(const Candidate& a, const Candidate& b) {
  return topk_ranks_before(a.key, a.block, b.key, b.block);
}

void select_row(const TopkSelectParams& p, int s, int h, std::vector<Candidate>& cand,
                std::vector<int>& chosen) {
  const int64_t nvp_in =
      p.num_valid_pages != nullptr ? int64_t(p.num_valid_pages[s]) : p.num_valid_pages_value;
  const TopkRanges rg = topk_ranges(nvp_in, p.num_blocks, p.force_begin, p.force_end, p.topk);

  chosen.clear();
  for (int t = 0; t < rg.fb; ++t) chosen.push_back(t);
  for (int t = rg.mid_end; t < rg.nvp; ++t) chosen.push_back(t);

  if (rg.target > 0) {
    //   score: [H, P, S]; this row reads score[h, t, s] for t in the middle range.
    const float* row = p.score + int64_t(h) * p.num_blocks * p.num_tokens + s;
    cand.clear();
    for (int t = rg.mid_begin; t < rg.mid_end; ++t)
      cand.push_back({topk_order_key(row[int64_t(t) * p.num_tokens]), t});
    // (key, block) is a strict total order (blocks are distinct), so the chosen set is unique.
    if (rg.target < int(cand.size()))
      std::nth_element(cand.begin(), cand.begin() + (rg.target - 1), cand.end(), ranks_before);
    for (int c = 0; c < rg.target; ++c) chosen.push_back(cand[size_t(c)].block);
  }

  std::sort(chosen.begin(), chosen.end());
  int* out = topk_out_row(p, s, h);
  for (int c = 0; c < p.topk; ++c) out[c] = c < int(chosen.size()) ? chosen[size_t(c)] : -1;
}

}  // namespace

void topk_select(const TopkSelectParams& p) {
  MSA_CHECK(p.topk >= 1 && p.topk <= kMaxTopk, "topk_select: topk must be in [1, ", kMaxTopk,
            "], got ", p.topk);
  MSA_CHECK(p.force_begin >= 0 && p.force_end >= 0 && p.force_begin + p.force_end <= p.topk,
            "topk_select: force_begin (", p.force_begin, ") + force_end (", p.force_end,
            ") must be non-negative and at most topk (", p.topk, ")");
  MSA_CHECK(p.num_heads >= 0 && p.num_blocks >= 0 && p.num_tokens >= 0,
            "topk_select: negative score dimensions");

  const int64_t rows = int64_t(p.num_tokens) * p.num_heads;
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    std::vector<Candidate> cand;
    std::vector<int> chosen;
    cand.reserve(size_t(p.num_blocks));
    chosen.reserve(size_t(p.topk));
    for (int64_t w = begin; w < end; ++w)
      select_row(p, int(w / p.num_heads), int(w % p.num_heads), cand, chosen);
  });
}

}  // namespace flashmsa::reference

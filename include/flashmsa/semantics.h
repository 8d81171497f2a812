// The rules of MSA, written once and used by the CUDA kernels and the CPU reference alike
// (STYLE habit 12). Everything here is a small MSA_HOST_DEVICE function of plain values and params;
// docs/semantics.md explains each rule in words.
#pragma once

#include <cstdint>

#include "flashmsa/numeric.h"
#include "flashmsa/params.h"
#include "flashmsa/types.h"

namespace flashmsa {

MSA_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
MSA_HOST_DEVICE int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Number of 128-key blocks of a sequence with seqlen_k keys.
MSA_HOST_DEVICE int num_blocks(int seqlen_k) { return int(ceil_div(seqlen_k, kBlockSize)); }

// ---- sequences -------------------------------------------------------------------------------

// Query rows [begin, begin + len) of sequence b. Reads are clamped to [0, total_q] so that a
// malformed cu_seqlens_q (only the device sees it under CUDA graphs) never indexes out of bounds.
struct RowRange {
  int begin;
  int len;
};
MSA_HOST_DEVICE RowRange q_rows(const QIndex& qi, int total_q, int b) {
  if (qi.cu_seqlens_q == nullptr) {
    const int64_t begin = clamp64(int64_t(b) * qi.seqlen_q, 0, total_q);
    const int64_t end = clamp64(int64_t(b + 1) * qi.seqlen_q, begin, total_q);
    return {int(begin), int(end - begin)};
  }
  const int64_t begin = clamp64(qi.cu_seqlens_q[b], 0, total_q);
  const int64_t end = clamp64(qi.cu_seqlens_q[b + 1], begin, total_q);
  return {int(begin), int(end - begin)};
}

// Query rows no sequence covers: [0, lo) and [hi, total_q), where [lo, hi) spans the batch's rows
// (cu_seqlens_q[0] .. cu_seqlens_q[B], or B * seqlen_q, clamped as q_rows clamps). The proxy writes
// -inf there (docs/semantics.md#proxy-score-math).
struct UncoveredRows {
  int64_t lo;
  int64_t hi;
  int64_t count;  // lo + (total_q - hi)
  // The u-th uncovered row, 0 <= u < count.
  MSA_HOST_DEVICE int64_t row(int64_t u) const { return u < lo ? u : hi + (u - lo); }
};
MSA_HOST_DEVICE UncoveredRows uncovered_q_rows(const QIndex& qi, int batch, int64_t total_q) {
  int64_t lo = 0, hi = 0;
  if (batch > 0) {
    if (qi.cu_seqlens_q != nullptr) {
      lo = clamp64(qi.cu_seqlens_q[0], 0, total_q);
      hi = clamp64(qi.cu_seqlens_q[batch], lo, total_q);
    } else {
      hi = clamp64(int64_t(batch) * qi.seqlen_q, 0, total_q);
    }
  }
  return {lo, hi, lo + (total_q - hi)};
}

// Number of keys of sequence b (see KVIndex for where they come from and how they are clamped).
MSA_HOST_DEVICE int kv_seqlen(const KVIndex& kv, int b) {
  int64_t len;
  if (kv.cu_seqlens_k != nullptr) {
    len = int64_t(kv.cu_seqlens_k[b + 1]) - int64_t(kv.cu_seqlens_k[b]);
  } else {
    len = kv.seqused_k[b];
  }
  if (kv.paged) return int(clamp64(len, 0, int64_t(kv.max_pages) * kBlockSize));
  // Flat: the keys must also lie inside [0, total_k).
  const int64_t begin = clamp64(kv.cu_seqlens_k[b], 0, kv.total_k);
  return int(clamp64(len, 0, kv.total_k - begin));
}

// First flat row of sequence b (flat layout only).
MSA_HOST_DEVICE int64_t kv_row_begin(const KVIndex& kv, int b) {
  return clamp64(kv.cu_seqlens_k[b], 0, kv.total_k);
}

// Physical page of batch-local block t of sequence b, or -1 when the page id is outside the cache
// (such a block contributes no key). Callers only ask for t < num_blocks(kv_seqlen(kv, b)), which
// kv_seqlen keeps below max_pages, so page_table is never read out of bounds.
MSA_HOST_DEVICE int64_t kv_page(const KVIndex& kv, int b, int t) {
  const int page = kv.page_table[int64_t(b) * kv.page_table_stride + t];
  return (page >= 0 && page < kv.num_pages) ? page : -1;
}

// kv_page of a block whose visibility is not known yet (the sequence's length still in flight):
// any t < max_pages is inside the page table, so a kernel can read the page id beside the length
// instead of after it (two loads in flight together, not one after the other) and use it only
// for a visible block. -1 past the table's columns.
MSA_HOST_DEVICE int64_t kv_page_ahead(const KVIndex& kv, int b, int t) {
  return t >= 0 && t < kv.max_pages ? kv_page(kv, b, t) : -1;
}

// Element offset of key j (head h) of sequence b, or -1 when its page is invalid.
MSA_HOST_DEVICE int64_t kv_offset(const KVTensor& t, const KVIndex& kv, int b, int h, int j) {
  if (!kv.paged)
    return (kv_row_begin(kv, b) + j) * t.stride_token + int64_t(h) * t.stride_head;
  const int64_t page = kv_page(kv, b, j / kBlockSize);
  if (page < 0) return -1;
  return page * t.stride_page + int64_t(h) * t.stride_head + int64_t(j % kBlockSize) * t.stride_token;
}

// Logical NVFP4 scale row of key j (head h) of sequence b (valid page assumed).
MSA_HOST_DEVICE int64_t kv_scale_row(const KVIndex& kv, int num_kv_heads, int b, int h, int j) {
  if (!kv.paged) return nvfp4_scale_row_flat(kv_row_begin(kv, b) + j, h, num_kv_heads);
  return nvfp4_scale_row_paged(kv_page(kv, b, j / kBlockSize), h, j % kBlockSize, num_kv_heads);
}

// Global position of local query 0 of sequence b (docs/semantics.md#causal-alignment). 64-bit: a
// caller's int32 offset plus a row index must not overflow.
MSA_HOST_DEVICE int64_t q_offset_of(const QOffset& qo, int b, int seqlen_q, int seqlen_k) {
  switch (qo.mode) {
    case QOffsetMode::kScalar: return qo.value;
    case QOffsetMode::kPerSequence: return qo.per_sequence[b];
    default: return int64_t(seqlen_k) - seqlen_q;
  }
}

// Keys [0, col_limit) are visible to local query i: causal -> j <= q_offset + i and j < seqlen_k.
MSA_HOST_DEVICE int col_limit(bool causal, int64_t q_offset, int i, int seqlen_k) {
  if (!causal) return seqlen_k;
  return int(clamp64(q_offset + i + 1, 0, seqlen_k));
}

// ---- q2k index lists (D5) --------------------------------------------------------------------

// Entries of a list that are read: those before the first negative value.
MSA_HOST_DEVICE int q2k_length(const int* list, int topk) {
  int n = 0;
  while (n < topk && list[n] >= 0) ++n;
  return n;
}

// Whether entry p of a list (p < q2k_length) names a block that is used: inside [0, nb) and not a
// repeat of an earlier entry (a duplicated id counts once, whatever the order).
MSA_HOST_DEVICE bool q2k_entry_used(const int* list, int p, int nb) {
  const int t = list[p];
  if (t >= nb) return false;
  for (int e = 0; e < p; ++e)
    if (list[e] == t) return false;
  return true;
}

// ---- top-k selection (docs/semantics.md#topk-select, #d3) ---------------------------------------

// Order key: smaller is better. Larger values win, +0 beats -0, +NaN beats +inf, -NaN loses to -inf.
MSA_HOST_DEVICE uint32_t topk_order_key(float score) {
  const uint32_t bits = float_to_bits(score);
  return (bits & 0x80000000u) ? bits : ((~bits) & 0x7FFFFFFFu);
}

// Whether candidate (key_a, block a) ranks before (key_b, block b): ties go to the lower block.
MSA_HOST_DEVICE bool topk_ranks_before(uint32_t key_a, int a, uint32_t key_b, int b) {
  return key_a < key_b || (key_a == key_b && a < b);
}

// Row (s, h) of the output (its topk entries are contiguous).
MSA_HOST_DEVICE int* topk_out_row(const TopkSelectParams& p, int64_t s, int h) {
  return p.out + s * p.out_token_stride + int64_t(h) * p.out_head_stride;
}

// Forced and candidate ranges of one row. Forced: [0, fb) and [nvp - fe, nvp); candidates
// (middle): [fb, nvp - fe), of which `target` are chosen by score.
struct TopkRanges {
  int nvp;
  int fb;
  int fe;
  int mid_begin;
  int mid_end;
  int target;
};
MSA_HOST_DEVICE TopkRanges topk_ranges(int64_t nvp_in, int num_blocks, int force_begin,
                                       int force_end, int topk) {
  TopkRanges r;
  r.nvp = int(clamp64(nvp_in, 0, num_blocks));
  r.fb = force_begin < r.nvp ? force_begin : r.nvp;
  r.fe = force_end < r.nvp - r.fb ? force_end : r.nvp - r.fb;
  r.mid_begin = r.fb;
  r.mid_end = r.nvp - r.fe;
  const int target = topk - r.fb - r.fe;
  const int mid = r.mid_end - r.mid_begin;
  r.target = target < mid ? target : mid;
  return r;
}

// The frame of one output row at positions first, first + step, ... < topk: [0, fb) | n_sel
// chosen (left to the selection) | [nvp - fe, nvp) | -1 ... (the GPU top-k kernels: one thread a
// row with step 1, or a row's lanes or threads, each from its own first position).
MSA_HOST_DEVICE void write_topk_frame(int* out_row, int topk, const TopkRanges& r, int n_sel, int first,
                                      int step) {
  for (int j = first; j < topk; j += step) {
    if (j < r.fb) {
      out_row[j] = j;
    } else if (j >= r.fb + n_sel) {
      const int e = j - r.fb - n_sel;
      out_row[j] = e < r.fe ? r.nvp - r.fe + e : -1;
    }
  }
}

// ---- attention scales ------------------------------------------------------------------------

// softmax_scale times k_global_scale when K is NVFP4 (k_global_scale is ignored for other dtypes).
MSA_HOST_DEVICE float effective_softmax_scale(const SparseAttnParams& p) {
  return p.k.dtype == DType::kNVFP4 ? p.softmax_scale * p.k_global_scale : p.softmax_scale;
}

}  // namespace flashmsa

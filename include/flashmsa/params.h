// Plain-old-data parameters of the four MSA ops. One struct per op; the same struct drives the CUDA
// kernels (device pointers) and the CPU reference (host pointers). Every pointer carries its shape;
// strides are in storage elements (bytes for NVFP4 data). Built and validated from caller tensors
// by the make_*_params functions of api.h: a Params value that exists has passed every host check.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashmsa/types.h"

namespace flashmsa {

// One K, V or index-K cache, flat or paged. A packed K|V view (docs/semantics.md#packed-kv) or an
// NHD paged cache is just a KVTensor whose strides say so.
struct KVTensor {
  const void* data;      // flat: [total_k, num_kv_heads, width]; paged: [num_pages, num_kv_heads, 128, width]
                         // width = 128 (bf16/fp16/fp8) or 64 bytes (NVFP4, low nibble = even element)
  DType dtype;
  int64_t stride_token;  // between consecutive tokens (flat rows / rows inside a page)
  int64_t stride_head;   // between kv heads
  int64_t stride_page;   // between pages (paged only; 0 for flat)
  const uint8_t* scale;  // NVFP4 only: [scale_bytes] e4m3 block scales, 128x4-swizzled, one per 16
                         // values; logical row = token * Hkv + head (flat) or
                         // (page * Hkv + head) * 128 + token_in_page (paged). nullptr otherwise.
  int64_t scale_bytes;   // validated >= ceil(rows / 128) * 128 * 8
};

// Where the keys of sequence b live and how long it is (docs/semantics.md#seqlen-k).
//   lengths: from cu_seqlens_k diffs when cu_seqlens_k != nullptr, else seqused_k[b];
//            clamped to [0, max_pages * 128] (paged) and to the rows of the flat tensor (flat).
//   rows:    flat: key j of sequence b is row cu_seqlens_k[b] + j (rows >= total_k never read);
//            paged: key j is token j % 128 of page page_table[b * page_table_stride + j / 128];
//            a page id outside [0, num_pages) makes that block contribute no key.
struct KVIndex {
  int batch;                  // B
  bool paged;                 // the layout: paged (page_table) or flat (cu_seqlens_k rows). Never
                              // told from page_table's pointer: an empty (B, 0) table has none
  const int* cu_seqlens_k;    // [B + 1] int32, or nullptr
  const int* seqused_k;       // [B] int32 (paged), or nullptr
  const int* page_table;      // [B, max_pages] int32 (paged; may be nullptr when max_pages == 0)
  int64_t page_table_stride;  // elements between rows of page_table
  int max_pages;              // page_table columns
  int num_pages;              // pages in the cache (paged)
  int64_t total_k;            // rows of the flat tensor (flat)
};

// Global position of local query i of sequence b is q_offset(b) + i
// (docs/semantics.md#causal-alignment).
enum class QOffsetMode : int32_t {
  kRightAligned = 0,  // seqlen_k[b] - seqlen_q[b]
  kScalar = 1,        // value
  kPerSequence = 2,   // per_sequence[b]
};
struct QOffset {
  QOffsetMode mode;
  int value;                // kScalar
  const int* per_sequence;  // [B] int32, kPerSequence
};

// Query rows: sequence b owns rows [cu_seqlens_q[b], cu_seqlens_q[b+1]). When cu_seqlens_q is
// nullptr, every sequence has seqlen_q rows and sequence b owns rows [b * seqlen_q, (b+1) * seqlen_q)
// (decode / MTP).
struct QIndex {
  const int* cu_seqlens_q;  // [B + 1] int32, or nullptr
  int seqlen_q;             // uniform length when cu_seqlens_q == nullptr
  int max_seqlen_q;         // upper bound on every seqlen_q[b] (schedules may use it as a grid size;
                            // kernels stay correct if it is too small)
};

// ---------------------------------------------------------------------------------------------
// Stage 1: out[h, t, r] = max over visible keys j of block t of dot(q[r, h], k[j, h / G]), unscaled.
// The NVFP4 variant (msa_proxy_score_fp4, q and k both NVFP4) scores
// logit_scale * dot(dequant(q), dequant(k)) with logit_scale = q_global_scale * k_global_scale.
struct ProxyScoreParams {
  int batch;              // B
  int total_q;            // rows of q
  int num_heads;          // Hq: index query heads
  int num_kv_heads;       // Hkv: index key heads; G = Hq / Hkv
  int max_k_tiles;        // P: block columns of out
  bool causal;
  bool reduce_heads;      // out has one head row: the max over heads
  const void* q;          // [total_q, Hq, 128] (NVFP4: [total_q, Hq, 64] bytes)
  DType q_dtype;          // bf16 / fp16 / fp8 (fp8 only with fp8 k) / NVFP4 (only with NVFP4 k)
  int64_t q_stride_token; // elements (bytes for NVFP4)
  int64_t q_stride_head;  // last dim contiguous
  const uint8_t* q_scale; // NVFP4 q: e4m3 block scales, 128x4-swizzled, row = token * Hq + head
  KVTensor k;             // bf16 / fp16 (== q_dtype), fp8, or NVFP4 (with its scales, KVTensor.scale)
  float logit_scale;      // NVFP4: q_global_scale * k_global_scale; 1 otherwise
  KVIndex kv;
  QIndex qi;
  QOffset q_offset;
  float* out;             // [reduce_heads ? 1 : Hq, P, total_q] contiguous
};

// Stage 2: per (token s, head h) row, the topk best blocks of score[h, :, s] within [0, nvp),
// forced sink/local blocks included, ascending, -1 tail padded (docs/semantics.md#topk-select).
struct TopkSelectParams {
  int num_heads;                // H
  int num_blocks;               // P
  int num_tokens;               // S
  int topk;                     // 1..64
  int force_begin;              // >= 0
  int force_end;                // >= 0, force_begin + force_end <= topk
  const float* score;           // [H, P, S] contiguous
  const int* num_valid_pages;   // [S] int32 per-token nvp (clamped to [0, P]), or nullptr
  int num_valid_pages_value;    // scalar nvp when num_valid_pages == nullptr (validated 0 < nvp <= P)
  int* out;                     // [S, H, topk], row (s, h) at out + s * out_token_stride + h * out_head_stride
  int64_t out_token_stride;     // any >= 0 with rows disjoint, e.g. H * topk (contiguous) or topk
  int64_t out_head_stride;      // (head-major: a transposed view of a contiguous (H, S, topk)): S * topk
};

// Stage 3 (prefill and general varlen): exact attention over the selected blocks.
struct SparseAttnParams {
  int batch;                    // B
  int total_q;
  int num_heads;                // Hq
  int num_kv_heads;             // Hkv; G = Hq / Hkv
  int topk;                     // q2k entries per (kv head, row)
  bool causal;
  float softmax_scale;          // as given (k_global_scale NOT folded in: see semantics.h)
  float k_global_scale;         // NVFP4 K only: multiplies softmax_scale (1 otherwise)
  float v_global_scale;         // multiplies the output, any KV dtype (1 when not given)
  float lse_temperature;        // T of the temperature LSE
  const void* q;                // [total_q, Hq, 128]
  DType q_dtype;                // bf16 / fp16 (decode: also fp8, computed in bf16)
  int64_t q_stride_token;
  int64_t q_stride_head;
  KVTensor k;
  KVTensor v;
  KVIndex kv;
  QIndex qi;
  QOffset q_offset;
  const int* q2k;               // batch-local block ids, set semantics (D5); row (kh, r) at q2k_row()
  int64_t q2k_head_stride;      // any >= 0, e.g. total_q * topk (contiguous) or topk (the transpose
  int64_t q2k_row_stride;       // of a token-major (total_q, Hkv, topk): row stride Hkv * topk)
  void* out;                    // [total_q, Hq, 128] contiguous, out_dtype
  DType out_dtype;              // bf16 / fp16
  float* lse;                   // [total_q, Hq] natural log, or nullptr
  float* lse_temperature_out;   // [total_q, Hq], or nullptr
  void* workspace;              // caller-owned device scratch, or nullptr (see api.h workspace sizes)
  size_t workspace_bytes;
};

// The q2k list of (kv head kh, query row r): topk consecutive entries.
MSA_HOST_DEVICE const int* q2k_row(const SparseAttnParams& p, int kh, int64_t r) {
  return p.q2k + kh * p.q2k_head_stride + r * p.q2k_row_stride;
}

// Decode / MTP shares the math of SparseAttnParams (qi.cu_seqlens_q == nullptr, uniform seqlen_q);
// these are the schedule knobs only decode has.
enum class PartialDType : int32_t { kFloat32 = 0, kBF16 = 1, kFP16 = 2, kFP8E4M3 = 3, kDefault = 4 };
struct SparseDecodeParams {
  SparseAttnParams attn;
  PartialDType partial_dtype;   // split-K partial outputs (kDefault: the compute dtype)
  int force_fused;              // -1: heuristic, 0: split-K + combine, 1: fused
};

}  // namespace flashmsa

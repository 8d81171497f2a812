// Argument groups that several ops share: q and its heads, where each sequence's queries and keys
// live (cu_seqlens_q, cu_seqlens_k, page_table, seqused_k -> QIndex / KVIndex) and q_offset.
// Used by the proxy (csrc/proxy_score/proxy_score_params.cpp) and both attention ops
// (csrc/sparse_attn/sparse_attn_params.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "common/tensor_checks.h"
#include "flashmsa/api.h"
#include "flashmsa/params.h"

namespace flashmsa::checks {

// q (total_q, Hq, 128), contiguous, 16-byte aligned. `allowed` lists its dtypes in words.
DType check_q(const Ctx& c, const TensorRef& q, bool allow_fp8, const char* allowed);

// num_kv_heads of k (already rank-checked), and G = Hq / Hkv >= 1 integral (any G).
int check_heads(const Ctx& c, int64_t hq, const TensorRef& k);

// page_table (B, max_pages) int32 with unit column stride (rows may be strided, even broadcast).
void check_page_table(const Ctx& c, const TensorRef& pt, int64_t batch, const char* batch_what);

// KVIndex of a paged cache (page table checked) / a flat cache (cu_seqlens_k checked); lengths are
// filled by the caller.
KVIndex paged_index(const TensorRef& pt, int batch, int64_t num_pages);
KVIndex flat_index(const TensorRef& cu_k, int batch, int64_t total_k);

// KVTensor of a flat (total_k, Hkv, W) or paged (P, Hkv, 128, W) cache whose shape was checked:
// strides of a contiguous tensor, or (`strided`) the view's own strides: a packed K|V view
// (is_packed_kv) or a compact cache in another dim order (is_permuted_kv). No scales.
KVTensor kv_tensor(const TensorRef& t, DType dtype, bool paged, bool strided);

// Lengths of a paged cache read from seqused_k (B,), checked on the host when it can read them.
void fill_seqused(const Ctx& c, const TensorRef& seqused_k, int batch, const char* batch_what,
                  KVIndex& kv);

// Query rows of a varlen op: cu_seqlens_q, and max_seqlen_q as given or, when the offsets are
// host-readable, their largest difference; else total_q, a bound that is always safe.
QIndex varlen_q_index(const Ctx& c, const TensorRef& cu_seqlens_q,
                      std::optional<int64_t> max_seqlen_q, int total_q);

// q_offset: None (right-aligned), a Python int, or an int32 (B,) tensor on the device.
QOffset make_q_offset(const Ctx& c, const QOffsetArg& a, int64_t batch);

}  // namespace flashmsa::checks

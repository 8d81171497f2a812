// Argument groups that several ops share (see kv_index.h).
#include "common/kv_index.h"

#include <array>
#include <string>

namespace flashmsa::checks {

DType check_q(const Ctx& c, const TensorRef& q, bool allow_fp8, const char* allowed) {
  check_tensor(c, q, "q", 16);
  const bool ok = q.dtype == ScalarType::kBF16 || q.dtype == ScalarType::kFP16 ||
                  (allow_fp8 && q.dtype == ScalarType::kFP8E4M3);
  MSA_OP_CHECK(c, ok, "q must be ", allowed, ", got ", dtype_str(q));
  MSA_OP_CHECK(c, q.ndim == 3, "q must be 3D (total_q, num_qo_heads, head_dim), got shape ",
               shape_str(q));
  MSA_OP_CHECK(c, q.size(2) == kHeadDim, "head_dim must be 128, got ", q.size(2),
               " (q.shape[2] of q ", shape_str(q), ")");
  MSA_OP_CHECK(c, q.size(1) >= 1, "q must have num_qo_heads >= 1, got shape ", shape_str(q));
  check_contiguous(c, q, "q");
  return q.dtype == ScalarType::kBF16 ? DType::kBF16
         : q.dtype == ScalarType::kFP16 ? DType::kFP16
                                        : DType::kFP8E4M3;
}

int check_heads(const Ctx& c, int64_t hq, const TensorRef& k) {
  const int64_t hkv = k.size(1);
  MSA_OP_CHECK(c, hkv >= 1, "k must have num_kv_heads >= 1, got shape ", shape_str(k));
  MSA_OP_CHECK(c, hq % hkv == 0, "num_qo_heads must be a multiple of num_kv_heads, got ",
               "num_qo_heads = ", hq, " (q.shape[1]) and num_kv_heads = ", hkv, " (k.shape[1])");
  return to_int(c, hkv, "num_kv_heads");
}

void check_page_table(const Ctx& c, const TensorRef& pt, int64_t batch, const char* batch_what) {
  check_tensor(c, pt, "page_table");
  MSA_OP_CHECK(c, pt.dtype == ScalarType::kInt32 && pt.ndim == 2,
               "page_table must be int32 of shape (batch, max_pages), got ", dtype_str(pt),
               " of shape ", shape_str(pt));
  MSA_OP_CHECK(c, pt.size(0) == batch, "page_table must have batch_size = ", batch, " rows (",
               batch_what, "), got shape ", shape_str(pt));
  MSA_OP_CHECK(c, pt.size(1) <= 1 || pt.stride(1) == 1,
               "page_table must be contiguous in its last dim, got strides ", strides_str(pt));
  to_int(c, pt.size(1), "page_table.shape[1] (max_pages)");
}

KVIndex paged_index(const TensorRef& pt, int batch, int64_t num_pages) {
  KVIndex kv{};
  kv.batch = batch;
  kv.paged = true;  // by shape: an empty (B, 0) table has no data pointer
  kv.page_table = static_cast<const int*>(pt.data);
  kv.page_table_stride = pt.size(0) <= 1 ? pt.size(1) : pt.stride(0);
  kv.max_pages = int(pt.size(1));
  kv.num_pages = int(num_pages);
  kv.total_k = 0;
  return kv;
}

KVIndex flat_index(const TensorRef& cu_k, int batch, int64_t total_k) {
  KVIndex kv{};
  kv.batch = batch;
  kv.paged = false;
  kv.cu_seqlens_k = static_cast<const int*>(cu_k.data);
  kv.total_k = total_k;
  return kv;
}

KVTensor kv_tensor(const TensorRef& t, DType dtype, bool paged, bool strided) {
  KVTensor r{};
  r.data = t.data;
  r.dtype = dtype;
  std::array<int64_t, kMaxDims> s{};
  if (strided) {
    // A size-1 dim may carry any stride; give it twice the view's size (a packed cache's total
    // size), like a compact outermost dim, so strides stay multiples of the token row.
    for (int d = 0; d < t.ndim; ++d) s[d] = t.sizes[d] == 1 ? 2 * t.numel() : t.strides[d];
  } else {
    s = contiguous_strides(t);
  }
  if (paged) {
    r.stride_page = s[0];
    r.stride_head = s[1];
    r.stride_token = s[2];
  } else {
    r.stride_page = 0;
    r.stride_token = s[0];
    r.stride_head = s[1];
  }
  r.scale = nullptr;
  r.scale_bytes = 0;
  return r;
}

void fill_seqused(const Ctx& c, const TensorRef& seqused_k, int batch, const char* batch_what,
                  KVIndex& kv) {
  check_int32_vector(c, seqused_k, "seqused_k", batch, batch_what);
  if (seqused_k.device < 0)
    check_seqused_values((std::string(c.op) + ": ").c_str(),
                         static_cast<const int*>(seqused_k.data), batch, "seqused_k");
  kv.seqused_k = static_cast<const int*>(seqused_k.data);
}

QIndex varlen_q_index(const Ctx& c, const TensorRef& cu_seqlens_q,
                      std::optional<int64_t> max_seqlen_q, int total_q) {
  QIndex qi;
  qi.cu_seqlens_q = static_cast<const int*>(cu_seqlens_q.data);
  qi.seqlen_q = 0;
  if (max_seqlen_q) {
    MSA_OP_CHECK(c, *max_seqlen_q >= 0, "max_seqlen_q must be >= 0, got ", *max_seqlen_q);
    qi.max_seqlen_q = to_int(c, *max_seqlen_q, "max_seqlen_q");
  } else {
    qi.max_seqlen_q =
        cu_seqlens_q.device < 0 ? max_seqlen(qi.cu_seqlens_q, cu_seqlens_q.size(0)) : total_q;
  }
  return qi;
}

QOffset make_q_offset(const Ctx& c, const QOffsetArg& a, int64_t batch) {
  QOffset qo{QOffsetMode::kRightAligned, 0, nullptr};
  MSA_OP_CHECK(c, !(a.value && a.tensor.defined()),
               "q_offset must be an int or an int32 tensor, not both");
  if (a.value) {
    qo.mode = QOffsetMode::kScalar;
    qo.value = to_int(c, *a.value, "q_offset");
  } else if (a.tensor.defined()) {
    const TensorRef& t = a.tensor;
    MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32, "q_offset must be int32, got ", dtype_str(t));
    check_int32_vector(c, t, "q_offset", batch, "batch_size");
    qo.mode = QOffsetMode::kPerSequence;
    qo.per_sequence = static_cast<const int*>(t.data);
  }
  return qo;
}

}  // namespace flashmsa::checks

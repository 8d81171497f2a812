// msa_sparse_attention (prefill / general varlen) and msa_sparse_decode_attention: caller
// arguments -> validated SparseAttnParams / SparseDecodeParams. Every host check of the two ops,
// once, before anything is written (docs/semantics.md#validation). The ops differ
// in how queries are laid out (cu_seqlens_q vs a uniform seqlen_q), in q's dtypes and in their
// extra outputs; k / v, q2k_indices, the scales, output, lse, workspace and q_offset are checked
// and filled by the same code (check_operands, fill_common).
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "common/kv_index.h"
#include "common/tensor_checks.h"
#include "flashmsa/api.h"
#include "flashmsa/numeric.h"

namespace flashmsa {

using namespace checks;

namespace {

constexpr double kDefaultSoftmaxScale = 0.08838834764831845;  // head_dim ** -0.5 = 128 ** -0.5

// Optional caller-owned scratch: 1-D contiguous uint8 on the device.
void fill_workspace(const Ctx& c, const TensorRef& w, void** data, size_t* bytes) {
  *data = nullptr;
  *bytes = 0;
  if (!w.defined()) return;
  check_tensor(c, w, "workspace", 16);
  MSA_OP_CHECK(c, w.dtype == ScalarType::kUInt8 && w.ndim == 1,
               "workspace must be a 1-D uint8 tensor, got ", dtype_str(w), " of shape ",
               shape_str(w));
  check_contiguous(c, w, "workspace");
  *data = w.data;
  *bytes = size_t(w.numel());
}

// (rows, cols) float32 contiguous output such as lse; nullptr when not requested.
float* check_row_output(const Ctx& c, const TensorRef& t, const char* name, int64_t total_q,
                        int64_t hq) {
  if (!t.defined()) return nullptr;
  check_tensor(c, t, name);
  MSA_OP_CHECK(c, t.dtype == ScalarType::kFloat32, name, " must be float32, got ", dtype_str(t));
  MSA_OP_CHECK(c, t.ndim == 2 && t.size(0) == total_q && t.size(1) == hq, name,
               " must be (total_q, num_qo_heads) = (", total_q, ", ", hq, "), got ",
               shape_str(t));
  check_contiguous(c, t, name);
  return static_cast<float*>(t.data);
}

// output (total_q, Hq, 128) of `dtype`, contiguous.
void* check_attn_output(const Ctx& c, const TensorRef& out, int64_t total_q, int64_t hq,
                        DType dtype) {
  MSA_OP_CHECK(c, out.defined(), "out must be given (the caller allocates it)");
  check_tensor(c, out, "out", 16);
  const ScalarType want = dtype == DType::kBF16 ? ScalarType::kBF16 : ScalarType::kFP16;
  MSA_OP_CHECK(c, out.dtype == want, "out must be ", scalar_type_name(want), ", got ",
               dtype_str(out));
  MSA_OP_CHECK(c, out.ndim == 3 && out.size(0) == total_q && out.size(1) == hq &&
                      out.size(2) == kHeadDim,
               "out must be (total_q, num_qo_heads, 128) = (", total_q, ", ", hq,
               ", 128), got ", shape_str(out));
  check_contiguous(c, out, "out");
  return out.data;
}

// q2k_indices (Hkv, total_q, topk) int32, 1 <= topk <= 64 (D4): rows of topk consecutive entries at
// any non-negative head / row strides (docs/semantics.md#q2k-layout): contiguous, the transpose(0,
// 1) of a token-major (total_q, Hkv, topk) (top-k's own layout), a row range or a padded buffer,
// an expand() of one head's rows. Every read goes through q2k_row(). Sets p.topk and the strides.
void check_q2k(const Ctx& c, const TensorRef& t, int64_t hkv, int64_t total_q, SparseAttnParams& p) {
  check_tensor(c, t, "q2k_indices");
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 3 && t.size(0) == hkv &&
                      t.size(1) == total_q,
               "q2k_indices must be int32 of shape (Hkv, total_q, topk) = (", hkv, ", ", total_q,
               ", topk), got ", dtype_str(t), " of shape ", shape_str(t));
  const int64_t topk = t.size(2);
  MSA_OP_CHECK(c, topk >= 1, "q2k_indices topk dimension must be positive, got shape ",
               shape_str(t));
  MSA_OP_CHECK_SUPPORTED(c, topk <= kMaxTopk, "q2k_indices topk (q2k_indices.shape[2]) must be <= ",
                         kMaxTopk, " in flashmsa, got ", topk);
  MSA_OP_CHECK(c, has_unit_rows_3d(t),
               "q2k_indices must have unit stride in its last dim and non-negative strides (rows "
               "of topk consecutive int32, e.g. contiguous or topk.transpose(0, 1)), got strides ",
               strides_str(t));
  p.topk = int(topk);
  p.q2k_head_stride = used_stride(t, 0);
  p.q2k_row_stride = used_stride(t, 1);
}

// ---- K/V of the attention ops ----------------------------------------------------------------

struct KVPair {
  KVTensor k;
  KVTensor v;
  int num_kv_heads;
};

// NVFP4 block scales of k or v: uint8, contiguous, holding the 128-row padded swizzled layout.
const uint8_t* check_nvfp4_scale(const Ctx& c, const TensorRef& s, const char* name, int64_t rows) {
  MSA_OP_CHECK(c, s.defined(), "NVFP4 KV requires k_scale and v_scale (", name, " is None)");
  check_tensor(c, s, name);
  MSA_OP_CHECK(c, s.dtype == ScalarType::kUInt8, "k_scale/v_scale must be uint8 (E4M3 bytes), got ",
               name, " ", dtype_str(s));
  check_contiguous(c, s, name);
  const int64_t need = nvfp4_scale_bytes(rows);
  MSA_OP_CHECK(c, s.numel() >= need, name,
               " must hold the 128-row-padded swizzled scale layout for ", rows, " KV rows (", need,
               " bytes), got ", s.numel());
  return static_cast<const uint8_t*>(s.data);
}

// k/v of msa_sparse_attention and msa_sparse_decode_attention. `compute` is q's compute dtype
// (bf16 for fp8 q). Checks dtype combinations (incl. NVFP4 and its scales), flat/paged shapes,
// and contiguity or packed views (docs/semantics.md#sparse-attention, #nvfp4, #packed-kv).
KVPair check_kv(const Ctx& c, const KVArgs& a, bool paged, DType compute) {
  const TensorRef& k = a.k;
  const TensorRef& v = a.v;
  check_tensor(c, k, "k", 16);
  check_tensor(c, v, "v", 16);

  DType kv_dtype;
  if (k.dtype == ScalarType::kFP8E4M3) {
    MSA_OP_CHECK(c, v.dtype == ScalarType::kFP8E4M3,
                 "k and v must both be float8_e4m3fn, got v ", dtype_str(v));
    kv_dtype = DType::kFP8E4M3;
  } else if (k.dtype == ScalarType::kUInt8) {
    MSA_OP_CHECK(c, v.dtype == ScalarType::kUInt8,
                 "k and v must both be packed uint8 for NVFP4, got v ", dtype_str(v));
    kv_dtype = DType::kNVFP4;
  } else {
    const ScalarType want = compute == DType::kBF16 ? ScalarType::kBF16 : ScalarType::kFP16;
    MSA_OP_CHECK(c, k.dtype == want, "k/v dtype must match q (or be fp8/packed NVFP4): expected ",
                 scalar_type_name(want), ", got k ", dtype_str(k));
    MSA_OP_CHECK(c, v.dtype == want, "k/v dtype must match q (or be fp8/packed NVFP4): expected ",
                 scalar_type_name(want), ", got v ", dtype_str(v));
    kv_dtype = compute;
  }
  const bool nvfp4 = kv_dtype == DType::kNVFP4;
  const int64_t width = nvfp4 ? kNvfp4Width : kHeadDim;

  if (paged) {
    MSA_OP_CHECK(c, k.ndim == 4 && k.size(2) == kBlockSize && k.size(3) == width,
                 "paged k/v must be (num_pages, num_kv_heads, 128, ", width, "), got k ",
                 shape_str(k));
  } else {
    MSA_OP_CHECK(c, k.ndim == 3 && k.size(2) == width, "flat k/v must be (total_k, num_kv_heads, ",
                 width, "), got k ", shape_str(k));
  }
  bool same_shape = v.ndim == k.ndim;
  for (int d = 0; same_shape && d < k.ndim; ++d) same_shape = v.sizes[d] == k.sizes[d];
  MSA_OP_CHECK(c, same_shape, "v must have the same shape and dtype as k, got k ", shape_str(k),
               " and v ", shape_str(v));

  // Read through the views' own strides: packed K|V views, or paged K and V each a compact buffer
  // in another dim order (NHD pages); docs/semantics.md#packed-kv.
  bool strided = false;
  if (!(k.is_contiguous() && v.is_contiguous())) {
    strided = paged && !nvfp4 && (is_packed_kv(k, v) || is_permuted_kv(k, v));
    MSA_OP_CHECK(c, strided,
                 "k/v must be contiguous, paged K and V views of compact caches in another dim "
                 "order (e.g. NHD pages (num_pages, 128, num_kv_heads, 128).transpose(1, 2)), or "
                 "K/V views split from a paged KV cache that packs K and V in one 2*head_dim "
                 "content dim per token (bf16/fp16/fp8 only); got k strides ",
                 strides_str(k), ", v strides ", strides_str(v), ", v - k = ",
                 byte_distance(k.data, v.data), " bytes");
  }

  KVPair r;
  r.k = kv_tensor(k, kv_dtype, paged, strided);
  r.v = kv_tensor(v, kv_dtype, paged, strided);
  r.num_kv_heads = to_int(c, k.size(1), "num_kv_heads");
  if (paged) to_int(c, k.size(0), "k.shape[0] (num_pages)");

  if (nvfp4) {
    // Logical scale rows (numeric.h): (token, head) for flat caches, (page, head, token) for paged.
    const int64_t rows = paged ? k.size(0) * k.size(1) * kBlockSize : k.size(0) * k.size(1);
    r.k.scale = check_nvfp4_scale(c, a.k_scale, "k_scale", rows);
    r.v.scale = check_nvfp4_scale(c, a.v_scale, "v_scale", rows);
    r.k.scale_bytes = a.k_scale.numel();
    r.v.scale_bytes = a.v_scale.numel();
  } else {
    // FlashInfer ignores them here; a caller passing fp8 descales as tensors would get silently
    // unscaled results, so they are refused with the way to apply them.
    MSA_OP_CHECK(c, !a.k_scale.defined() && !a.v_scale.defined(),
                 "k_scale/v_scale are NVFP4 block scales and need packed uint8 k/v, got k ",
                 dtype_str(k), "; fold fp8 descales into softmax_scale and v_global_scale");
  }
  return r;
}

// Scales shared by prefill and decode.
void fill_scales(const Ctx& c, const KVArgs& a, const std::optional<double>& softmax_scale,
                 DType kv_dtype, SparseAttnParams& p) {
  const double scale = softmax_scale.value_or(kDefaultSoftmaxScale);
  check_float_scalar(c, scale, "softmax_scale");
  p.softmax_scale = float(scale);
  // k_global_scale is a dequant multiplier of NVFP4 K only, ignored for other dtypes.
  p.k_global_scale = 1.0f;
  if (a.k_global_scale) {
    check_float_scalar(c, *a.k_global_scale, "k_global_scale");
    if (kv_dtype == DType::kNVFP4) p.k_global_scale = float(*a.k_global_scale);
    check_float_scalar(c, double(p.softmax_scale) * p.k_global_scale, "softmax_scale * k_global_scale");
  }
  p.v_global_scale = 1.0f;
  if (a.v_global_scale) {
    check_float_scalar(c, *a.v_global_scale, "v_global_scale");
    p.v_global_scale = float(*a.v_global_scale);
  }
}

// ---- what prefill and decode share -------------------------------------------------------------

// Outputs (and the workspace) of an attention call against every other argument and each other.
template <typename Args>
void check_outputs_apart(const Ctx& c, const Args& a, const TensorRef& lse_t,
                         const TensorRef& cu_seqlens_q) {
  const std::initializer_list<NamedRef> all = {
      {"q", &a.q},
      {"k", &a.kv.k},
      {"v", &a.kv.v},
      {"k_scale", &a.kv.k_scale},
      {"v_scale", &a.kv.v_scale},
      {"q2k_indices", &a.q2k_indices},
      {"cu_seqlens_q", &cu_seqlens_q},
      {"cu_seqlens_k", &a.cu_seqlens_k},
      {"page_table", &a.page_table},
      {"seqused_k", &a.seqused_k},
      {"q_offset", &a.q_offset.tensor},
      {"out", &a.output},
      {"lse", &a.lse},
      {"lse_temperature", &lse_t},
      {"workspace", &a.workspace}};
  check_no_overlap(c, a.output, "out", all);
  check_no_overlap(c, a.lse, "lse", all);
  check_no_overlap(c, lse_t, "lse_temperature", all);
  check_no_overlap(c, a.workspace, "workspace", all);
}

// k / v and q2k_indices against q: dtypes, shapes, heads and topk. `compute` is q's compute dtype
// (bf16 for fp8 q). Sets p.topk.
template <typename Args>
KVPair check_operands(const Ctx& c, const Args& a, bool paged, DType compute, SparseAttnParams& p) {
  // k's rank and last dims are checked before its head count is read.
  const KVPair kv = check_kv(c, a.kv, paged, compute);
  check_heads(c, a.q.size(1), a.kv.k);
  check_q2k(c, a.q2k_indices, kv.num_kv_heads, a.q.size(0), p);
  return kv;
}

// Everything else both ops fill alike, once the KV index (p.kv) is known: scales, output, lse,
// workspace, the problem sizes, q, k, v, q_offset and q2k. Leaves p.qi and the temperature LSE to
// the caller.
template <typename Args>
void fill_common(const Ctx& c, const Args& a, const KVPair& kv, DType compute, int batch,
                 SparseAttnParams& p) {
  const TensorRef& q = a.q;
  const int64_t total_q = q.size(0);
  const int64_t hq = q.size(1);
  fill_scales(c, a.kv, a.softmax_scale, kv.k.dtype, p);
  p.out_dtype = compute;
  p.out = check_attn_output(c, a.output, total_q, hq, compute);
  p.lse = check_row_output(c, a.lse, "lse", total_q, hq);
  fill_workspace(c, a.workspace, &p.workspace, &p.workspace_bytes);

  p.batch = batch;
  p.total_q = to_int(c, total_q, "q.shape[0] (total_q)");
  p.num_heads = to_int(c, hq, "q.shape[1] (num_qo_heads)");
  p.num_kv_heads = kv.num_kv_heads;
  p.causal = a.causal;
  p.q = q.data;
  p.q_stride_token = hq * kHeadDim;
  p.q_stride_head = kHeadDim;
  p.k = kv.k;
  p.v = kv.v;
  p.q_offset = make_q_offset(c, a.q_offset, batch);
  p.q2k = static_cast<const int*>(a.q2k_indices.data);
}

}  // namespace

namespace {

// Whether dims of the given sizes and strides, taken by increasing stride, each step exactly over
// the ones before: a compact buffer in some dim order. Size-1 dims take no part.
template <size_t N>
bool compact_in_some_order(const std::array<int64_t, N>& size, const std::array<int64_t, N>& stride) {
  std::array<int, N> order{};
  for (size_t d = 0; d < N; ++d) order[d] = int(d);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return stride[a] < stride[b]; });
  int64_t expected = 1;
  for (int d : order) {
    if (size[d] == 1) continue;
    if (stride[d] != expected) return false;
    expected *= size[d];
  }
  return true;
}

bool same_views(const TensorRef& k, const TensorRef& v) {
  if (k.ndim != 4 || v.ndim != 4 || k.dtype != v.dtype) return false;
  // NVFP4 caches are read contiguous only (docs/semantics.md#packed-kv).
  if (k.dtype == ScalarType::kUInt8 || elt_size(k.dtype) == 0) return false;
  // A size-1 dim's stride is never used (kv_tensor gives it one value for both).
  for (int d = 0; d < 4; ++d)
    if (k.sizes[d] != v.sizes[d] || (k.sizes[d] != 1 && k.strides[d] != v.strides[d])) return false;
  return k.size(3) == kHeadDim && k.stride(3) == 1;
}

}  // namespace

bool is_packed_kv(const TensorRef& k, const TensorRef& v) {
  if (!same_views(k, v)) return false;
  if (byte_distance(k.data, v.data) != kHeadDim * elt_size(k.dtype)) return false;
  // The cache behind the views: (P, Hkv, 128, 2, 128), K in plane 0 and V in plane 1 of dim 3,
  // compact in some dim order (e.g. HND or NHD pages).
  return compact_in_some_order<5>({k.size(0), k.size(1), k.size(2), 2, kHeadDim},
                                  {k.stride(0), k.stride(1), k.stride(2), kHeadDim, 1});
}

bool is_permuted_kv(const TensorRef& k, const TensorRef& v) {
  // Each a compact (P, Hkv, 128, 128) buffer in some dim order, e.g. NHD pages (P, 128, Hkv, 128)
  // seen through transpose(1, 2); K and V alike.
  return same_views(k, v) &&
         compact_in_some_order<4>({k.size(0), k.size(1), k.size(2), kHeadDim},
                                  {k.stride(0), k.stride(1), k.stride(2), 1});
}

// ---- msa_sparse_attention ----------------------------------------------------------------------

SparseAttnParams make_sparse_attention_params(const SparseAttnArgs& a) {
  const Ctx c{"msa_sparse_attention", "q", a.q.device};
  SparseAttnParams p{};
  p.q_dtype = check_q(c, a.q, /*allow_fp8=*/false, "bf16/fp16");
  const int64_t total_q = a.q.size(0);
  const bool paged = a.page_table.defined();
  const KVPair kv = check_operands(c, a, paged, p.q_dtype, p);

  const int batch = check_cu_seqlens_ref(c, a.cu_seqlens_q, "cu_seqlens_q");
  check_host_cu_seqlens(c, a.cu_seqlens_q, total_q, "cu_seqlens_q", "q.shape[0] (total_q)");
  if (a.cu_seqlens_k.defined()) {
    check_cu_seqlens_ref(c, a.cu_seqlens_k, "cu_seqlens_k");
    MSA_OP_CHECK(c, a.cu_seqlens_k.size(0) == a.cu_seqlens_q.size(0),
                 "cu_seqlens_k must have batch_size + 1 = ", a.cu_seqlens_q.size(0),
                 " entries (as cu_seqlens_q), got ", a.cu_seqlens_k.size(0));
  }
  if (paged) {
    MSA_OP_CHECK(c, a.seqused_k.defined(), "paged KV requires seqused_k");
    check_page_table(c, a.page_table, batch, "len(cu_seqlens_q) - 1");
    p.kv = paged_index(a.page_table, batch, a.kv.k.size(0));
    if (a.cu_seqlens_k.defined()) {
      // On the paged path, lengths come from cu_seqlens_k when the caller passes it.
      check_host_cu_seqlens(c, a.cu_seqlens_k, -1, "cu_seqlens_k", "");
      check_int32_vector(c, a.seqused_k, "seqused_k", batch, "len(cu_seqlens_q) - 1");
      p.kv.cu_seqlens_k = static_cast<const int*>(a.cu_seqlens_k.data);
      p.kv.seqused_k = static_cast<const int*>(a.seqused_k.data);
    } else {
      fill_seqused(c, a.seqused_k, batch, "len(cu_seqlens_q) - 1", p.kv);
    }
  } else {
    MSA_OP_CHECK(c, a.cu_seqlens_k.defined(), "cu_seqlens_k is required for the non-paged path");
    check_host_cu_seqlens(c, a.cu_seqlens_k, a.kv.k.size(0), "cu_seqlens_k",
                          "k.shape[0] (total_k)");
    p.kv = flat_index(a.cu_seqlens_k, batch, a.kv.k.size(0));
  }

  fill_common(c, a, kv, p.q_dtype, batch, p);
  p.lse_temperature = 1.0f;
  p.lse_temperature_out =
      check_row_output(c, a.lse_temperature, "lse_temperature", total_q, a.q.size(1));
  if (p.lse_temperature_out != nullptr) {
    check_float_scalar(c, a.lse_temperature_scale, "lse_temperature_scale");
    // The temperature LSE shares the online softmax's running max, which bounds exp(T * (s - m))
    // by 1 only for T > 0 (docs/semantics.md#temperature-lse); FlashInfer's kernel makes the
    // same assumption silently.
    MSA_OP_CHECK_SUPPORTED(c, a.lse_temperature_scale > 0,
                           "lse_temperature_scale must be > 0 when return_temperature_lse is set, got ",
                           a.lse_temperature_scale);
    p.lse_temperature = float(a.lse_temperature_scale);
  }
  check_outputs_apart(c, a, a.lse_temperature, a.cu_seqlens_q);
  p.qi = varlen_q_index(c, a.cu_seqlens_q, a.max_seqlen_q, p.total_q);
  return p;
}

// ---- msa_sparse_decode_attention ---------------------------------------------------------------

SparseDecodeParams make_sparse_decode_params(const SparseDecodeArgs& a) {
  const Ctx c{"msa_sparse_decode_attention", "q", a.q.device};
  SparseDecodeParams d{};
  SparseAttnParams& p = d.attn;
  MSA_OP_CHECK(c, a.seqlen_q > 0, "seqlen_q must be positive, got ", a.seqlen_q);
  p.q_dtype = check_q(c, a.q, /*allow_fp8=*/true, "bf16/fp16/fp8_e4m3");
  const int64_t total_q = a.q.size(0);
  MSA_OP_CHECK(c, total_q % a.seqlen_q == 0, "q rows (", total_q, ") must be batch_size * seqlen_q (",
               a.seqlen_q, ")");
  const int64_t batch64 = total_q / a.seqlen_q;
  const int batch = to_int(c, batch64, "batch_size (q.shape[0] / seqlen_q)");
  // fp8 q is upconverted to bf16, which is then the compute and output dtype.
  const DType compute = decode_out_dtype(p.q_dtype);
  const bool paged = a.page_table.defined();
  const KVPair kv = check_operands(c, a, paged, compute, p);

  if (paged) {
    // cu_seqlens_k is ignored on the paged path (FlashInfer): lengths come from seqused_k.
    MSA_OP_CHECK(c, a.seqused_k.defined(), "paged decode requires seqused_k");
    check_page_table(c, a.page_table, batch, "q.shape[0] / seqlen_q");
    p.kv = paged_index(a.page_table, batch, a.kv.k.size(0));
    fill_seqused(c, a.seqused_k, batch, "batch_size = q.shape[0] / seqlen_q", p.kv);
  } else {
    MSA_OP_CHECK(c, a.cu_seqlens_k.defined(), "flat decode requires cu_seqlens_k");
    check_cu_seqlens_ref(c, a.cu_seqlens_k, "cu_seqlens_k");
    MSA_OP_CHECK(c, a.cu_seqlens_k.size(0) == batch64 + 1, "cu_seqlens_k must have batch_size + 1 = ",
                 batch64 + 1, " entries (batch_size = q.shape[0] / seqlen_q), got ",
                 a.cu_seqlens_k.size(0));
    check_host_cu_seqlens(c, a.cu_seqlens_k, a.kv.k.size(0), "cu_seqlens_k",
                          "k.shape[0] (total_k)");
    p.kv = flat_index(a.cu_seqlens_k, batch, a.kv.k.size(0));
  }

  fill_common(c, a, kv, compute, batch, p);
  p.lse_temperature = 1.0f;
  p.lse_temperature_out = nullptr;
  const int pd = int(a.partial_dtype);
  MSA_OP_CHECK(c, pd >= int(PartialDType::kFloat32) && pd <= int(PartialDType::kDefault),
               "unsupported partial_dtype ", pd);
  d.partial_dtype = a.partial_dtype != PartialDType::kDefault ? a.partial_dtype
                    : compute == DType::kBF16                 ? PartialDType::kBF16
                                                              : PartialDType::kFP16;
  d.force_fused = a.force_fused ? int(*a.force_fused) : -1;
  check_outputs_apart(c, a, TensorRef{}, TensorRef{});
  const int seqlen_q = to_int(c, a.seqlen_q, "seqlen_q");
  p.qi = QIndex{nullptr, seqlen_q, seqlen_q};
  return d;
}

}  // namespace flashmsa

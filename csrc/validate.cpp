// Validation of the four ops: caller tensors (TensorRef) and Python scalars -> Params. Every host
// check of SPEC (the "Validation" paragraphs of 1.1, 2.1, 4.1, 4.5, 4.6, 5 and D4-D9) lives here,
// once, and runs before anything is written. A message starts with the op's Python name and names
// the Python argument, what was expected and what was given; FlashInfer's wording is kept where
// SPEC quotes it, so callers that match on FlashInfer's messages keep working.
// docs/semantics.md ("What is validated where") lists the rules in words.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "flashmsa/api.h"
#include "flashmsa/error.h"
#include "flashmsa/numeric.h"

// Checks inside one make_* call: the op's Python name prefixes the message.
#define MSA_OP_CHECK(ctx, cond, ...) MSA_CHECK(cond, (ctx).op, ": ", __VA_ARGS__)
#define MSA_OP_CHECK_SUPPORTED(ctx, cond, ...) \
  MSA_CHECK_SUPPORTED(cond, (ctx).op, ": ", __VA_ARGS__)

namespace flashmsa {

namespace {

constexpr double kDefaultSoftmaxScale = 0.08838834764831845;  // head_dim ** -0.5 = 128 ** -0.5
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kIntMin = std::numeric_limits<int>::min();

// ---- formatting ------------------------------------------------------------------------------

// No iostreams in the library (see flashmsa/error.h): numbers through std::to_string.
std::string dims_str(const int64_t* v, int n) {
  std::string s = "(";
  for (int d = 0; d < n; ++d) {
    if (d) s += ", ";
    s += std::to_string(v[d]);
  }
  s += n == 1 ? ",)" : ")";
  return s;
}

std::string shape_str(const TensorRef& t) {
  if (!t.defined()) return "None";
  return dims_str(t.sizes, std::min(t.ndim, kMaxDims));
}

std::string strides_str(const TensorRef& t) { return dims_str(t.strides, std::min(t.ndim, kMaxDims)); }

std::string device_str(int device) {
  return device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device);
}

const char* dtype_str(const TensorRef& t) { return scalar_type_name(t.dtype); }

// b - a in bytes; the two pointers may belong to unrelated allocations.
int64_t byte_distance(const void* a, const void* b) {
  return int64_t(reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a));
}

int64_t elt_size(ScalarType t) {
  switch (t) {
    case ScalarType::kBF16:
    case ScalarType::kFP16: return 2;
    case ScalarType::kFP8E4M3:
    case ScalarType::kUInt8: return 1;
    case ScalarType::kFloat32:
    case ScalarType::kInt32: return 4;
    case ScalarType::kInt64: return 8;
    default: return 0;
  }
}

// ---- generic tensor checks -------------------------------------------------------------------

// One make_* call: the op's Python name, and the tensor whose device every other tensor must share.
struct Ctx {
  const char* op;
  const char* anchor;  // Python name of that tensor (q or max_score)
  int device;          // its device (-1: host)
};

// Row-major strides of t's sizes: what Params carry for a contiguous tensor. torch lets a size-1
// dim have any stride; kernels that build descriptors from strides should not see such values.
std::array<int64_t, kMaxDims> contiguous_strides(const TensorRef& t) {
  std::array<int64_t, kMaxDims> s{};
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    s[d] = expected;
    expected *= t.sizes[d];
  }
  return s;
}

// Every defined tensor: a shape the TensorRef can hold, memory behind its elements, the anchor's
// device, and an address aligned to `align` bytes (its element size, or 16 for the operands the
// kernels load and store in 16-byte vectors).
void check_tensor(const Ctx& c, const TensorRef& t, const char* name, int64_t align = 0) {
  MSA_OP_CHECK(c, t.defined(), name, " must be given");
  MSA_OP_CHECK(c, t.ndim <= kMaxDims, name, " must have at most ", kMaxDims, " dims, got ", t.ndim,
               "-D");
  for (int d = 0; d < t.ndim; ++d)
    MSA_OP_CHECK(c, t.sizes[d] >= 0, name, " has a negative size: ", shape_str(t));
  MSA_OP_CHECK(c, t.numel() == 0 || t.data != nullptr, name, " has elements ", shape_str(t),
               " but no data pointer");
  MSA_OP_CHECK(c, t.device == c.device, name, " must be on the same device as ", c.anchor, " (",
               device_str(c.device), "), got ", device_str(t.device));
  if (align == 0) align = std::max<int64_t>(elt_size(t.dtype), 1);
  MSA_OP_CHECK(c, t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data) % uintptr_t(align) == 0,
               name, " must be ", align, "-byte aligned, got address ", t.data);
}

void check_contiguous(const Ctx& c, const TensorRef& t, const char* name) {
  MSA_OP_CHECK(c, t.is_contiguous(), name, " must be contiguous, got shape ", shape_str(t),
               " with strides ", strides_str(t));
}

// A tensor size or Python int that a Params int field will hold.
int to_int(const Ctx& c, int64_t v, const char* what) {
  MSA_OP_CHECK(c, v >= kIntMin && v <= kIntMax, what, " (", v, ") does not fit in int32");
  return int(v);
}

// A 1-D contiguous int32 tensor with `expected` entries (`what` says where that number comes from).
void check_int32_vector(const Ctx& c, const TensorRef& t, const char* name, int64_t expected,
                        const std::string& what) {
  check_tensor(c, t, name);
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 1, name, " must be 1-D int32, got ",
               dtype_str(t), " of shape ", shape_str(t));
  MSA_OP_CHECK(c, t.size(0) == expected, name, " must have ", what, " = ", expected,
               " entries, got ", t.size(0));
  check_contiguous(c, t, name);
}

// cu_seqlens_q / cu_seqlens_k: 1-D contiguous int32 (B + 1,). Returns B.
int check_cu_seqlens_ref(const Ctx& c, const TensorRef& t, const char* name) {
  check_tensor(c, t, name);
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 1, name,
               " must be 1-D int32 (batch_size + 1,), got ", dtype_str(t), " of shape ",
               shape_str(t));
  MSA_OP_CHECK(c, t.size(0) >= 2, name, " must have batch_size + 1 >= 2 entries, got ", t.size(0));
  check_contiguous(c, t, name);
  return to_int(c, t.size(0) - 1, "batch_size");
}

void check_float_scalar(const Ctx& c, double v, const char* name) {
  MSA_OP_CHECK(c, std::isfinite(v) && std::isfinite(float(v)), name,
               " must be a finite float32 value, got ", v);
}

// ---- host-readable contents ------------------------------------------------------------------

void check_cu_seqlens_values(const char* prefix, const int* v, int64_t count, int64_t total,
                             const char* name, const char* total_what) {
  MSA_CHECK(count >= 2, prefix, name, " must have batch_size + 1 >= 2 entries, got ", count);
  MSA_CHECK(v[0] == 0, prefix, name, "[0] must be 0, got ", v[0]);
  for (int64_t i = 1; i < count; ++i)
    MSA_CHECK(v[i] >= v[i - 1], prefix, name, " must be non-decreasing, got ", name, "[", i,
              "] = ", v[i], " < ", name, "[", i - 1, "] = ", v[i - 1]);
  // Rows past the last sequence are padding (FlashInfer and padded CUDA-graph batches allow them);
  // they belong to no sequence and read 0 / -inf. Only a sequence reaching past `total` is an error.
  MSA_CHECK(total < 0 || v[count - 1] <= total, prefix, name, "[-1] must be <= ", total_what, " (",
            total, "), got ", v[count - 1]);
}

void check_seqused_values(const char* prefix, const int* v, int64_t count, const char* name) {
  for (int64_t i = 0; i < count; ++i)
    MSA_CHECK(v[i] >= 0, prefix, name, "[", i, "] must be >= 0, got ", v[i]);
}

// Largest seqlen of host-readable, already validated cu_seqlens.
int max_seqlen(const int* cu, int64_t count) {
  int m = 0;
  for (int64_t i = 1; i < count; ++i) m = std::max(m, cu[i] - cu[i - 1]);
  return m;
}

// ---- shared argument groups ------------------------------------------------------------------

// q (total_q, Hq, 128), contiguous. `allowed` lists its dtypes in words for the message.
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

// num_kv_heads of k (already shape-checked), and G = Hq / Hkv >= 1 integral (any G: D6).
int check_heads(const Ctx& c, int64_t hq, const TensorRef& k) {
  const int64_t hkv = k.size(1);
  MSA_OP_CHECK(c, hkv >= 1, "k must have num_kv_heads >= 1, got shape ", shape_str(k));
  MSA_OP_CHECK(c, hq % hkv == 0, "num_qo_heads must be a multiple of num_kv_heads, got ",
               "num_qo_heads = ", hq, " (q.shape[1]) and num_kv_heads = ", hkv, " (k.shape[1])");
  return to_int(c, hkv, "num_kv_heads");
}

// page_table (B, max_pages) int32 with unit column stride (rows may be strided, even broadcast).
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

// Params view of a paged page table / flat cu_seqlens_k; lengths are filled by the caller.
KVIndex paged_index(const TensorRef& pt, int batch, int64_t num_pages) {
  KVIndex kv{};
  kv.batch = batch;
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
  kv.cu_seqlens_k = static_cast<const int*>(cu_k.data);
  kv.total_k = total_k;
  return kv;
}

// q_offset: None (right-aligned), a Python int, or an int32 (B,) tensor on the device.
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
  MSA_OP_CHECK(c, out.defined(), "output must be given (the caller allocates it)");
  check_tensor(c, out, "output", 16);
  const ScalarType want = dtype == DType::kBF16 ? ScalarType::kBF16 : ScalarType::kFP16;
  MSA_OP_CHECK(c, out.dtype == want, "output must be ", scalar_type_name(want), ", got ",
               dtype_str(out));
  MSA_OP_CHECK(c, out.ndim == 3 && out.size(0) == total_q && out.size(1) == hq &&
                      out.size(2) == kHeadDim,
               "output must be (total_q, num_qo_heads, 128) = (", total_q, ", ", hq,
               ", 128), got ", shape_str(out));
  check_contiguous(c, out, "output");
  return out.data;
}

// q2k_indices (Hkv, total_q, topk) int32 contiguous, 1 <= topk <= 64 (D4). Returns topk.
int check_q2k(const Ctx& c, const TensorRef& t, int64_t hkv, int64_t total_q) {
  check_tensor(c, t, "q2k_indices");
  MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 3 && t.size(0) == hkv &&
                      t.size(1) == total_q,
               "q2k_indices must be int32 of shape (Hkv, total_q, topk) = (", hkv, ", ", total_q,
               ", topk), got ", dtype_str(t), " of shape ", shape_str(t));
  MSA_OP_CHECK(c, t.is_contiguous(), "q2k_indices must be contiguous (e.g. ",
               "topk.transpose(0, 1).contiguous()), got strides ", strides_str(t));
  const int64_t topk = t.size(2);
  MSA_OP_CHECK(c, topk >= 1, "q2k_indices topk dimension must be positive, got shape ",
               shape_str(t));
  MSA_OP_CHECK_SUPPORTED(c, topk <= kMaxTopk, "q2k_indices topk (q2k_indices.shape[2]) must be <= ",
                         kMaxTopk, " in flashmsa, got ", topk);
  return int(topk);
}

// ---- K/V of the attention ops ----------------------------------------------------------------

struct KVPair {
  KVTensor k;
  KVTensor v;
  int num_kv_heads;
};

KVTensor kv_tensor(const TensorRef& t, DType dtype, bool paged, bool packed) {
  KVTensor r{};
  r.data = t.data;
  r.dtype = dtype;
  std::array<int64_t, kMaxDims> s{};
  if (packed) {
    // A size-1 dim may carry any stride; give it the packed cache's total size, like a compact
    // outermost dim, so strides stay multiples of the 256-value token row.
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
// and contiguity or packed views (SPEC 4.1, 4.4-4.6, 5).
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

  bool packed = false;
  if (!(k.is_contiguous() && v.is_contiguous())) {
    packed = paged && !nvfp4 && is_packed_kv(k, v);
    MSA_OP_CHECK(c, packed,
                 "k/v must be contiguous, or K/V views split from a paged KV cache that packs K "
                 "and V in one 2*head_dim content dim per token (bf16/fp16/fp8 only); got k strides ",
                 strides_str(k), ", v strides ", strides_str(v), ", v - k = ",
                 byte_distance(k.data, v.data), " bytes");
  }

  KVPair r;
  r.k = kv_tensor(k, kv_dtype, paged, packed);
  r.v = kv_tensor(v, kv_dtype, paged, packed);
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

// Scales shared by prefill and decode (SPEC 4.2, 4.4, 4.5).
void fill_scales(const Ctx& c, const KVArgs& a, const std::optional<double>& softmax_scale,
                 DType kv_dtype, SparseAttnParams& p) {
  const double scale = softmax_scale.value_or(kDefaultSoftmaxScale);
  check_float_scalar(c, scale, "softmax_scale");
  p.softmax_scale = float(scale);
  // k_global_scale is a dequant multiplier of NVFP4 K only; SPEC 4.4: ignored for other dtypes.
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

// Lengths of a paged cache read from seqused_k (B,).
void fill_seqused(const Ctx& c, const TensorRef& seqused_k, int batch, const char* batch_what,
                  KVIndex& kv) {
  check_int32_vector(c, seqused_k, "seqused_k", batch, batch_what);
  if (seqused_k.device < 0)
    check_seqused_values((std::string(c.op) + ": ").c_str(),
                         static_cast<const int*>(seqused_k.data), batch, "seqused_k");
  kv.seqused_k = static_cast<const int*>(seqused_k.data);
}

// cu_seqlens whose contents the host can read are checked here (make_* is the only host pass).
void check_host_cu_seqlens(const Ctx& c, const TensorRef& t, int64_t total, const char* name,
                           const char* total_what) {
  if (t.device >= 0) return;
  check_cu_seqlens_values((std::string(c.op) + ": ").c_str(), static_cast<const int*>(t.data),
                          t.size(0), total, name, total_what);
}

// Query rows of a varlen op: cu_seqlens_q, and max_seqlen_q as given or, when the offsets are
// host-readable, their largest difference; else total_q, a bound that is always safe.
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

}  // namespace

// ---- public helpers --------------------------------------------------------------------------

void check_cu_seqlens(const int* host_values, int64_t count, int64_t total, const char* name) {
  check_cu_seqlens_values("", host_values, count, total, name, "the number of rows it indexes");
}

void check_seqused_k(const int* host_values, int64_t count, const char* name) {
  check_seqused_values("", host_values, count, name);
}

bool is_packed_kv(const TensorRef& k, const TensorRef& v) {
  if (k.ndim != 4 || v.ndim != 4 || k.dtype != v.dtype) return false;
  if (k.dtype == ScalarType::kUInt8) return false;  // NVFP4 caches are never packed (SPEC 4.6)
  const int64_t elt = elt_size(k.dtype);
  if (elt == 0) return false;
  for (int d = 0; d < 4; ++d)
    if (k.sizes[d] != v.sizes[d] || k.strides[d] != v.strides[d]) return false;
  if (k.size(3) != kHeadDim || k.stride(3) != 1) return false;
  if (byte_distance(k.data, v.data) != kHeadDim * elt) return false;
  // The cache behind the views: (P, Hkv, 128, 2, 128), K in plane 0 and V in plane 1 of dim 3.
  // Its sized dims, taken by increasing stride, must each step exactly over the ones before
  // (a compact buffer in some dim order, e.g. HND or NHD pages); size-1 dims take no part.
  const std::array<int64_t, 5> size = {k.size(0), k.size(1), k.size(2), 2, kHeadDim};
  const std::array<int64_t, 5> stride = {k.stride(0), k.stride(1), k.stride(2), kHeadDim, 1};
  std::array<int, 5> order = {0, 1, 2, 3, 4};
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return stride[a] < stride[b]; });
  int64_t expected = 1;
  for (int d : order) {
    if (size[d] == 1) continue;
    if (stride[d] != expected) return false;
    expected *= size[d];
  }
  return true;
}

// ---- msa_proxy_score -------------------------------------------------------------------------

namespace {

// q of msa_proxy_score_fp4: packed NVFP4 uint8 (total_q, Hq, 64), contiguous.
void check_fp4_q(const Ctx& c, const TensorRef& q) {
  check_tensor(c, q, "q_fp4", 4);
  MSA_OP_CHECK(c, q.dtype == ScalarType::kUInt8, "q_fp4 must be uint8 (packed e2m1 pairs), got ",
               dtype_str(q));
  MSA_OP_CHECK(c, q.ndim == 3 && q.size(2) == kNvfp4Width,
               "q_fp4 must be (total_q, num_qo_heads, 64) (head_dim 128 packed two per byte), got ",
               shape_str(q));
  MSA_OP_CHECK(c, q.size(1) >= 1, "q_fp4 must have num_qo_heads >= 1, got shape ", shape_str(q));
  check_contiguous(c, q, "q_fp4");
}

// NVFP4 block scales of the fp4 proxy's q or k: uint8, contiguous, the 128x4-swizzled layout of
// `rows` logical rows (padded to 128 rows).
const uint8_t* check_fp4_proxy_scale(const Ctx& c, const TensorRef& s, const char* name, int64_t rows,
                                     const char* rows_what) {
  MSA_OP_CHECK(c, s.defined(), name, " must be given (uint8 e4m3 block scales)");
  check_tensor(c, s, name);
  MSA_OP_CHECK(c, s.dtype == ScalarType::kUInt8, name, " must be uint8 (e4m3 bytes), got ", dtype_str(s));
  check_contiguous(c, s, name);
  const int64_t need = nvfp4_scale_bytes(rows);
  MSA_OP_CHECK(c, s.numel() >= need, name, " must hold the 128-row-padded swizzled scale layout for ",
               rows, " rows (", rows_what, "): ", need, " bytes, got ", s.numel());
  return static_cast<const uint8_t*>(s.data);
}

// Both proxy variants: fp4 = msa_proxy_score_fp4 (q, k packed NVFP4 with scales and global scales).
ProxyScoreParams make_proxy_params(const ProxyScoreArgs& a, bool fp4) {
  const Ctx c{fp4 ? "msa_proxy_score_fp4" : "msa_proxy_score", fp4 ? "q_fp4" : "q", a.q.device};
  const char* kname = fp4 ? "k_fp4" : "k";
  ProxyScoreParams p{};
  if (fp4) {
    check_fp4_q(c, a.q);
    p.q_dtype = DType::kNVFP4;
  } else {
    p.q_dtype = check_q(c, a.q, /*allow_fp8=*/true, "bf16, fp16, or fp8 e4m3");
  }
  const TensorRef& q = a.q;
  const TensorRef& k = a.k;
  const int64_t total_q = q.size(0);
  const int64_t hq = q.size(1);
  const int64_t width = fp4 ? kNvfp4Width : kHeadDim;

  check_tensor(c, k, kname, fp4 ? 4 : 16);
  const bool paged = a.page_table.defined();
  if (paged) {
    MSA_OP_CHECK(c, k.ndim == 4 && k.size(2) == kBlockSize && k.size(3) == width, "paged ", kname,
                 " must be (num_pages, num_kv_heads, 128, ", width, "), got ", shape_str(k));
  } else {
    MSA_OP_CHECK(c, k.ndim == 3 && k.size(2) == width, "flat ", kname, " must be (total_k, num_kv_heads, ",
                 width, ")", fp4 ? " (head_dim 128 packed two per byte)" : " with head_dim 128",
                 ", got ", shape_str(k));
  }
  const int hkv = check_heads(c, hq, k);
  DType k_dtype = p.q_dtype;
  if (fp4) {
    MSA_OP_CHECK(c, k.dtype == ScalarType::kUInt8, "k_fp4 must be uint8 (packed e2m1 pairs), got ",
                 dtype_str(k));
  } else {
    const bool k_fp8 = k.dtype == ScalarType::kFP8E4M3;
    MSA_OP_CHECK(c, p.q_dtype != DType::kFP8E4M3 || k_fp8, "fp8 q requires fp8 k, got k ",
                 dtype_str(k));
    MSA_OP_CHECK(c, k_fp8 || k.dtype == q.dtype, "k dtype must match q (or be float8_e4m3fn), got q ",
                 dtype_str(q), " and k ", dtype_str(k));
    if (k_fp8) k_dtype = DType::kFP8E4M3;
    MSA_OP_CHECK(c, !a.q_scale.defined() && !a.k_scale.defined() && !a.q_global_scale &&
                        !a.k_global_scale,
                 "q_scale / k_scale / global scales belong to msa_proxy_score_fp4");
  }
  check_contiguous(c, k, kname);

  const int batch = check_cu_seqlens_ref(c, a.cu_seqlens_q, "cu_seqlens_q");
  check_host_cu_seqlens(c, a.cu_seqlens_q, total_q, "cu_seqlens_q", "q.shape[0] (total_q)");
  if (paged) {
    // cu_seqlens_k is ignored on the paged path (SPEC 1.1): lengths come from seqused_k.
    MSA_OP_CHECK(c, a.seqused_k.defined(), "paged proxy requires seqused_k");
    check_page_table(c, a.page_table, batch, "len(cu_seqlens_q) - 1");
    to_int(c, k.size(0), "k.shape[0] (num_pages)");
    p.kv = paged_index(a.page_table, batch, k.size(0));
    fill_seqused(c, a.seqused_k, batch, "len(cu_seqlens_q) - 1", p.kv);
  } else {
    MSA_OP_CHECK(c, a.cu_seqlens_k.defined(), "flat proxy requires cu_seqlens_k");
    check_cu_seqlens_ref(c, a.cu_seqlens_k, "cu_seqlens_k");
    MSA_OP_CHECK(c, a.cu_seqlens_k.size(0) == a.cu_seqlens_q.size(0),
                 "cu_seqlens_k must have batch_size + 1 = ", a.cu_seqlens_q.size(0),
                 " entries (as cu_seqlens_q), got ", a.cu_seqlens_k.size(0));
    check_host_cu_seqlens(c, a.cu_seqlens_k, k.size(0), "cu_seqlens_k", "k.shape[0] (total_k)");
    p.kv = flat_index(a.cu_seqlens_k, batch, k.size(0));
  }

  MSA_OP_CHECK(c, a.max_k_tiles >= 1, "max_k_tiles must be >= 1, got ", a.max_k_tiles);
  const int64_t out_heads = a.reduce_heads ? 1 : hq;
  const TensorRef& out = a.output;
  MSA_OP_CHECK(c, out.defined(), "output must be given (the caller allocates it)");
  check_tensor(c, out, "output");
  MSA_OP_CHECK(c, out.dtype == ScalarType::kFloat32, "output must be float32, got ", dtype_str(out));
  MSA_OP_CHECK(c, out.ndim == 3 && out.size(0) == out_heads && out.size(1) == a.max_k_tiles &&
                      out.size(2) == total_q,
               "output must be (", out_heads, ", ", a.max_k_tiles, ", ", total_q, ") = (",
               a.reduce_heads ? "1" : "num_qo_heads", ", max_k_tiles, total_q), got ",
               shape_str(out));
  check_contiguous(c, out, "output");

  p.batch = batch;
  p.total_q = to_int(c, total_q, "q.shape[0] (total_q)");
  p.num_heads = to_int(c, hq, "q.shape[1] (num_qo_heads)");
  p.num_kv_heads = hkv;
  p.max_k_tiles = to_int(c, a.max_k_tiles, "max_k_tiles");
  p.causal = a.causal;
  p.reduce_heads = a.reduce_heads;
  p.q = q.data;
  p.q_stride_token = hq * width;
  p.q_stride_head = width;
  p.k = kv_tensor(k, k_dtype, paged, /*packed=*/false);
  p.logit_scale = 1.0f;
  if (fp4) {
    p.q_scale = check_fp4_proxy_scale(c, a.q_scale, "q_scale", total_q * hq, "total_q * num_qo_heads");
    const int64_t k_rows = paged ? k.size(0) * hkv * kBlockSize : k.size(0) * hkv;
    p.k.scale = check_fp4_proxy_scale(c, a.k_scale, "k_scale", k_rows,
                                      paged ? "num_pages * num_kv_heads * 128" : "total_k * num_kv_heads");
    p.k.scale_bytes = a.k_scale.numel();
    MSA_OP_CHECK(c, a.q_global_scale.has_value() && a.k_global_scale.has_value(),
                 "q_global_scale and k_global_scale must be given");
    check_float_scalar(c, *a.q_global_scale, "q_global_scale");
    check_float_scalar(c, *a.k_global_scale, "k_global_scale");
    const double product = double(float(*a.q_global_scale)) * double(float(*a.k_global_scale));
    check_float_scalar(c, product, "q_global_scale * k_global_scale");
    p.logit_scale = float(*a.q_global_scale) * float(*a.k_global_scale);
  }
  p.qi = varlen_q_index(c, a.cu_seqlens_q, a.max_seqlen_q, p.total_q);
  p.q_offset = make_q_offset(c, a.q_offset, batch);
  p.out = static_cast<float*>(out.data);
  return p;
}

}  // namespace

ProxyScoreParams make_proxy_score_params(const ProxyScoreArgs& a) { return make_proxy_params(a, false); }
ProxyScoreParams make_proxy_score_fp4_params(const ProxyScoreArgs& a) { return make_proxy_params(a, true); }

// ---- msa_topk_select -------------------------------------------------------------------------

TopkSelectParams make_topk_select_params(const TopkSelectArgs& a) {
  const Ctx c{"msa_topk_select", "max_score", a.max_score.device};
  const TensorRef& s = a.max_score;
  check_tensor(c, s, "max_score");
  MSA_OP_CHECK(c, s.dtype == ScalarType::kFloat32, "max_score must be float32, got ", dtype_str(s));
  MSA_OP_CHECK(c, s.ndim == 3, "max_score must be 3D (num_qo_heads, max_k_tiles, total_qo_len), got ",
               s.ndim, "D ", shape_str(s));
  check_contiguous(c, s, "max_score");
  const int64_t h = s.size(0), num_blocks = s.size(1), tokens = s.size(2);

  MSA_OP_CHECK(c, a.topk >= 1, "topk must be >= 1, got ", a.topk);
  MSA_OP_CHECK_SUPPORTED(c, a.topk <= kMaxTopk, "topk must be <= ", kMaxTopk,
                         " in flashmsa, got ", a.topk);
  const int64_t fb = a.force_begin_blocks, fe = a.force_end_blocks;
  MSA_OP_CHECK(c, fb >= 0 && fe >= 0, "force_begin_blocks / force_end_blocks must be >= 0, got ",
               fb, " / ", fe);
  // Written as fb <= topk - fe: Python ints near 2^63 must not overflow the sum.
  MSA_OP_CHECK(c, fb <= a.topk - fe, "force_begin_blocks + force_end_blocks (", fb, " + ", fe,
               ") must be <= topk (", a.topk, ")");

  TopkSelectParams p{};
  MSA_OP_CHECK(c, !(a.num_valid_pages_value && a.num_valid_pages.defined()),
               "num_valid_pages must be an int or an int32 tensor, not both");
  if (a.num_valid_pages.defined()) {
    const TensorRef& t = a.num_valid_pages;
    check_tensor(c, t, "num_valid_pages");
    MSA_OP_CHECK(c, t.dtype == ScalarType::kInt32 && t.ndim == 1,
                 "num_valid_pages tensor must be 1D int32, got ", dtype_str(t), " of shape ",
                 shape_str(t));
    MSA_OP_CHECK(c, t.size(0) == tokens, "num_valid_pages tensor must have total_qo_len (", tokens,
                 ") entries, got ", t.size(0));
    MSA_OP_CHECK(c, t.is_contiguous(), "num_valid_pages tensor must be contiguous, got strides ",
                 strides_str(t));
    // Values stay on the device: clamped per row to [0, P] (semantics.h topk_ranges), not checked.
    p.num_valid_pages = static_cast<const int*>(t.data);
    p.num_valid_pages_value = 0;
  } else {
    // None means every block column (FlashInfer), validated like an explicit int.
    const int64_t nvp = a.num_valid_pages_value.value_or(num_blocks);
    MSA_OP_CHECK(c, nvp > 0 && nvp <= num_blocks, "num_valid_pages must be in (0, max_k_tiles=",
                 num_blocks, "], got ", nvp);
    MSA_OP_CHECK(c, fb <= nvp - fe, "force_begin_blocks + force_end_blocks (", fb, " + ", fe,
                 ") must be <= num_valid_pages (", nvp, ")");
    p.num_valid_pages = nullptr;
    p.num_valid_pages_value = int(nvp);
  }

  const TensorRef& out = a.output;
  MSA_OP_CHECK(c, out.defined(), "output must be given (the caller allocates it)");
  check_tensor(c, out, "output");
  MSA_OP_CHECK(c, out.dtype == ScalarType::kInt32, "output must be int32, got ", dtype_str(out));
  MSA_OP_CHECK(c, out.ndim == 3 && out.size(0) == tokens && out.size(1) == h &&
                      out.size(2) == a.topk,
               "output shape must be (", tokens, ", ", h, ", ", a.topk,
               ") = (total_qo_len, num_qo_heads, topk), got ", shape_str(out));
  check_contiguous(c, out, "output");

  p.num_heads = to_int(c, h, "max_score.shape[0] (num_qo_heads)");
  p.num_blocks = to_int(c, num_blocks, "max_score.shape[1] (max_k_tiles)");
  p.num_tokens = to_int(c, tokens, "max_score.shape[2] (total_qo_len)");
  p.topk = int(a.topk);
  p.force_begin = int(fb);
  p.force_end = int(fe);
  p.score = static_cast<const float*>(s.data);
  p.out = static_cast<int*>(out.data);
  return p;
}

// ---- msa_sparse_attention --------------------------------------------------------------------

SparseAttnParams make_sparse_attention_params(const SparseAttnArgs& a) {
  const Ctx c{"msa_sparse_attention", "q", a.q.device};
  SparseAttnParams p{};
  p.q_dtype = check_q(c, a.q, /*allow_fp8=*/false, "bf16/fp16");
  const TensorRef& q = a.q;
  const int64_t total_q = q.size(0);
  const int64_t hq = q.size(1);
  const bool paged = a.page_table.defined();

  // k's rank and last dims are checked before its head count is read.
  const KVPair kv = check_kv(c, a.kv, paged, p.q_dtype);
  check_heads(c, hq, a.kv.k);
  p.topk = check_q2k(c, a.q2k_indices, kv.num_kv_heads, total_q);

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
      // SPEC 0: on the paged path, lengths come from cu_seqlens_k when the caller passes it.
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

  fill_scales(c, a.kv, a.softmax_scale, kv.k.dtype, p);
  p.lse_temperature = 1.0f;
  p.lse_temperature_out = check_row_output(c, a.lse_temperature, "lse_temperature", total_q, hq);
  if (p.lse_temperature_out != nullptr) {
    check_float_scalar(c, a.lse_temperature_scale, "lse_temperature_scale");
    // The temperature LSE shares the online softmax's running max, which bounds exp(T * (s - m))
    // by 1 only for T > 0 (SPEC 4.3); FlashInfer's kernel makes the same assumption silently.
    MSA_OP_CHECK_SUPPORTED(c, a.lse_temperature_scale > 0,
                           "lse_temperature_scale must be > 0 when return_temperature_lse is set, got ",
                           a.lse_temperature_scale);
    p.lse_temperature = float(a.lse_temperature_scale);
  }
  p.out = check_attn_output(c, a.output, total_q, hq, p.q_dtype);
  p.out_dtype = p.q_dtype;
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
  p.qi = varlen_q_index(c, a.cu_seqlens_q, a.max_seqlen_q, p.total_q);
  p.q_offset = make_q_offset(c, a.q_offset, batch);
  p.q2k = static_cast<const int*>(a.q2k_indices.data);
  return p;
}

// ---- msa_sparse_decode_attention -------------------------------------------------------------

SparseDecodeParams make_sparse_decode_params(const SparseDecodeArgs& a) {
  const Ctx c{"msa_sparse_decode_attention", "q", a.q.device};
  SparseDecodeParams d{};
  SparseAttnParams& p = d.attn;
  MSA_OP_CHECK(c, a.seqlen_q > 0, "seqlen_q must be positive, got ", a.seqlen_q);
  p.q_dtype = check_q(c, a.q, /*allow_fp8=*/true, "bf16/fp16/fp8_e4m3");
  const TensorRef& q = a.q;
  const int64_t total_q = q.size(0);
  const int64_t hq = q.size(1);
  MSA_OP_CHECK(c, total_q % a.seqlen_q == 0, "q rows (", total_q, ") must be batch_size * seqlen_q (",
               a.seqlen_q, ")");
  const int64_t batch64 = total_q / a.seqlen_q;
  const int batch = to_int(c, batch64, "batch_size (q.shape[0] / seqlen_q)");
  // fp8 q is upconverted to bf16, which is then the compute and output dtype (SPEC 5).
  const DType compute = p.q_dtype == DType::kFP8E4M3 ? DType::kBF16 : p.q_dtype;
  const bool paged = a.page_table.defined();

  const KVPair kv = check_kv(c, a.kv, paged, compute);
  check_heads(c, hq, a.kv.k);
  p.topk = check_q2k(c, a.q2k_indices, kv.num_kv_heads, total_q);

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

  fill_scales(c, a.kv, a.softmax_scale, kv.k.dtype, p);
  p.lse_temperature = 1.0f;
  p.lse_temperature_out = nullptr;
  p.out_dtype = compute;
  p.out = check_attn_output(c, a.output, total_q, hq, compute);
  p.lse = check_row_output(c, a.lse, "lse", total_q, hq);
  fill_workspace(c, a.workspace, &p.workspace, &p.workspace_bytes);

  const int pd = int(a.partial_dtype);
  MSA_OP_CHECK(c, pd >= int(PartialDType::kFloat32) && pd <= int(PartialDType::kDefault),
               "unsupported partial_dtype ", pd);
  d.partial_dtype = a.partial_dtype != PartialDType::kDefault ? a.partial_dtype
                    : compute == DType::kBF16                 ? PartialDType::kBF16
                                                              : PartialDType::kFP16;
  d.force_fused = a.force_fused ? int(*a.force_fused) : -1;

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
  const int seqlen_q = to_int(c, a.seqlen_q, "seqlen_q");
  p.qi = QIndex{nullptr, seqlen_q, seqlen_q};
  p.q_offset = make_q_offset(c, a.q_offset, batch);
  p.q2k = static_cast<const int*>(a.q2k_indices.data);
  return d;
}

}  // namespace flashmsa

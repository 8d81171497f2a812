// PyTorch binding of the four MSA ops: the Python extension flashmsa._C.
//
// Each op is registered with TORCH_LIBRARY(flashmsa, m). Outputs are allocated by the Python
// wrappers (python/flashmsa/msa_ops.py) and passed in as mutable arguments, so every schema returns
// () and a fake implementation has nothing to compute (torch.compile / opcheck). An op only
//   1. describes its tensors to the core (TensorRef, tensor_ref.h),
//   2. calls make_*_params (ALL validation, docs/semantics.md#d9; throws flashmsa::Error),
//   3. runs the validated params on the caller's device and current stream.
// flashmsa::Error kinds become the Python exceptions docs/semantics.md#d9 names (ValueError,
// TypeError, NotImplementedError, RuntimeError).
// clang-format off
#define PY_SSIZE_T_CLEAN
#include <Python.h>  // before any other header, as Python requires
// clang-format on

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#if defined(FLASHMSA_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "flashmsa/api.h"
#include "flashmsa/error.h"
#include "tensor_ref.h"

namespace flashmsa::torch_binding {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Runs fn, turning a flashmsa::Error into the c10 error torch maps onto the matching Python
// exception. Other exceptions (c10 errors from the binding itself) pass through unchanged.
template <typename Fn>
auto translate_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::kValue:
        TORCH_CHECK_VALUE(false, e.what());
      case ErrorKind::kType:
        TORCH_CHECK_TYPE(false, e.what());
      case ErrorKind::kNotSupported:
        TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
      case ErrorKind::kRuntime:
        break;
    }
    TORCH_CHECK(false, e.what());
  }
}

// Device ordinal of a tensor as the core counts it: -1 for host memory.
int tensor_device(const at::Tensor& t) { return t.device().is_cuda() ? t.device().index() : -1; }

// Sets the current CUDA device for a CUDA call and hands out its current stream (the stream the
// caller's PyTorch work is ordered on, so no synchronisation is needed and CUDA-graph capture sees
// every launch). Host calls get no guard and a null stream.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
#if defined(FLASHMSA_WITH_CUDA)
    if (device >= 0) {
      guard_.emplace(static_cast<c10::DeviceIndex>(device));
      stream_ = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    }
#else
    (void)device;
#endif
  }
  cudaStream_t stream() const { return stream_; }

 private:
#if defined(FLASHMSA_WITH_CUDA)
  std::optional<c10::cuda::CUDAGuard> guard_;
#endif
  cudaStream_t stream_ = nullptr;
};

QOffsetArg q_offset_arg(const Describe& ref, std::optional<int64_t> value,
                        const OptTensor& tensor) {
  QOffsetArg q;
  q.value = value;
  q.tensor = ref(tensor, "q_offset");
  return q;
}

KVArgs kv_args(const Describe& ref, const at::Tensor& k, const at::Tensor& v,
               const OptTensor& k_scale, const OptTensor& v_scale,
               std::optional<double> k_global_scale, std::optional<double> v_global_scale) {
  KVArgs kv;
  kv.k = ref(k, "k");
  kv.v = ref(v, "v");
  kv.k_scale = ref(k_scale, "k_scale");
  kv.v_scale = ref(v_scale, "v_scale");
  kv.k_global_scale = k_global_scale;
  kv.v_global_scale = v_global_scale;
  return kv;
}

PartialDType partial_dtype_of(std::optional<c10::ScalarType> t) {
  if (!t.has_value()) return PartialDType::kDefault;
  switch (*t) {
    case c10::ScalarType::Float:
      return PartialDType::kFloat32;
    case c10::ScalarType::BFloat16:
      return PartialDType::kBF16;
    case c10::ScalarType::Half:
      return PartialDType::kFP16;
    case c10::ScalarType::Float8_e4m3fn:
      return PartialDType::kFP8E4M3;
    default:
      TORCH_CHECK_VALUE(false,
                        "msa_sparse_decode_attention: partial_dtype must be None, "
                        "torch.float32, torch.bfloat16, torch.float16 or torch.float8_e4m3fn, "
                        "got torch.",
                        c10::getDtypeNames(*t).first);
  }
}

// Device scratch of an attention call: the caller's workspace when it is large enough, else a
// temporary from PyTorch's caching allocator (stream-ordered on the current stream, and taken from
// the graph's private pool during CUDA-graph capture). A caller-owned workspace that is too small
// is an error rather than a silent fallback: the caller chose it so that capture allocates nothing.
std::optional<at::Tensor> provide_workspace(const char* op, SparseAttnParams& attn, size_t need,
                                            bool caller_owned, const at::Tensor& like) {
  if (attn.workspace_bytes >= need) return std::nullopt;
  MSA_CHECK(!caller_owned, op, ": workspace holds ", attn.workspace_bytes,
            " bytes but this call needs ", need,
            " bytes; grow it (MSASparseAttentionWorkspace.reserve) before CUDA-graph capture");
  at::Tensor scratch = at::empty({static_cast<int64_t>(need)}, like.options().dtype(at::kByte));
  attn.workspace = scratch.data_ptr();
  attn.workspace_bytes = need;
  return scratch;
}

// ---- msa_proxy_score ---------------------------------------------------------------------------

// The arguments both proxy ops share, after q and k.
struct ProxyCommon {
  const at::Tensor& cu_seqlens_q;
  const OptTensor& cu_seqlens_k;
  const OptTensor& page_table;
  const OptTensor& seqused_k;
  bool causal;
  std::optional<int64_t> max_seqlen_q;
  int64_t max_k_tiles;
  std::optional<int64_t> q_offset_value;
  const OptTensor& q_offset;
  bool reduce_heads;
  const at::Tensor& output;
};

// Fills a, validates (fp4: the msa_proxy_score_fp4 rules) and runs on q's device.
void run_proxy(const Describe& ref, ProxyScoreArgs& a, const at::Tensor& q, const ProxyCommon& c, bool fp4) {
  a.cu_seqlens_q = ref(c.cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_k = ref(c.cu_seqlens_k, "cu_seqlens_k");
  a.page_table = ref(c.page_table, "page_table");
  a.seqused_k = ref(c.seqused_k, "seqused_k");
  a.causal = c.causal;
  a.max_seqlen_q = c.max_seqlen_q;
  a.max_k_tiles = c.max_k_tiles;
  a.output = ref(c.output, "output");
  a.reduce_heads = c.reduce_heads;
  a.q_offset = q_offset_arg(ref, c.q_offset_value, c.q_offset);
  const ProxyScoreParams p = fp4 ? make_proxy_score_fp4_params(a) : make_proxy_score_params(a);
  DeviceScope scope(tensor_device(q));
  run_proxy_score(p, tensor_device(q), scope.stream());
}

void proxy_score(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cu_seqlens_q,
                 const OptTensor& cu_seqlens_k, const OptTensor& page_table,
                 const OptTensor& seqused_k, bool causal, std::optional<int64_t> max_seqlen_q,
                 int64_t max_k_tiles, std::optional<int64_t> q_offset_value,
                 const OptTensor& q_offset, bool reduce_heads, const at::Tensor& output) {
  translate_errors([&] {
    const Describe ref("msa_proxy_score");
    ProxyScoreArgs a;
    a.q = ref(q, "q");
    a.k = ref(k, "k");
    run_proxy(ref, a, q,
              {cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q, max_k_tiles,
               q_offset_value, q_offset, reduce_heads, output},
              /*fp4=*/false);
  });
}

void proxy_score_fp4(const at::Tensor& q_fp4, const at::Tensor& k_fp4, const at::Tensor& q_scale,
                     const at::Tensor& k_scale, double q_global_scale, double k_global_scale,
                     const at::Tensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                     const OptTensor& page_table, const OptTensor& seqused_k, bool causal,
                     std::optional<int64_t> max_seqlen_q, int64_t max_k_tiles,
                     std::optional<int64_t> q_offset_value, const OptTensor& q_offset, bool reduce_heads,
                     const at::Tensor& output) {
  translate_errors([&] {
    const Describe ref("msa_proxy_score_fp4");
    ProxyScoreArgs a;
    a.q = ref(q_fp4, "q_fp4");
    a.k = ref(k_fp4, "k_fp4");
    a.q_scale = ref(q_scale, "q_scale");
    a.k_scale = ref(k_scale, "k_scale");
    a.q_global_scale = q_global_scale;
    a.k_global_scale = k_global_scale;
    run_proxy(ref, a, q_fp4,
              {cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q, max_k_tiles,
               q_offset_value, q_offset, reduce_heads, output},
              /*fp4=*/true);
  });
}

// ---- msa_topk_select ---------------------------------------------------------------------------

void topk_select(const at::Tensor& max_score, int64_t topk,
                 std::optional<int64_t> num_valid_pages_value, const OptTensor& num_valid_pages,
                 int64_t force_begin_blocks, int64_t force_end_blocks, const at::Tensor& output) {
  translate_errors([&] {
    const Describe ref("msa_topk_select");
    TopkSelectArgs a;
    a.max_score = ref(max_score, "max_score");
    a.topk = topk;
    a.num_valid_pages_value = num_valid_pages_value;
    a.num_valid_pages = ref(num_valid_pages, "num_valid_pages");
    a.output = ref(output, "output");
    a.force_begin_blocks = force_begin_blocks;
    a.force_end_blocks = force_end_blocks;
    const TopkSelectParams p = make_topk_select_params(a);
    DeviceScope scope(tensor_device(max_score));
    run_topk_select(p, tensor_device(max_score), scope.stream());
  });
}

// ---- msa_sparse_attention ----------------------------------------------------------------------

struct SparseAttentionInputs {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  const at::Tensor& q2k_indices;
  const at::Tensor& cu_seqlens_q;
  const OptTensor& cu_seqlens_k;
  bool causal;
  std::optional<double> softmax_scale;
  const OptTensor& page_table;
  const OptTensor& seqused_k;
  const OptTensor& k_scale;
  const OptTensor& v_scale;
  std::optional<double> k_global_scale;
  std::optional<double> v_global_scale;
  std::optional<int64_t> q_offset_value;
  const OptTensor& q_offset;
  double lse_temperature_scale;
  const at::Tensor& out;
  const OptTensor& lse;
  const OptTensor& lse_t;
  const OptTensor& workspace;
};

SparseAttnParams sparse_attention_params(const SparseAttentionInputs& in) {
  const Describe ref("msa_sparse_attention");
  SparseAttnArgs a;
  a.q = ref(in.q, "q");
  a.kv = kv_args(ref, in.k, in.v, in.k_scale, in.v_scale, in.k_global_scale, in.v_global_scale);
  a.q2k_indices = ref(in.q2k_indices, "q2k_indices");
  a.cu_seqlens_q = ref(in.cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_k = ref(in.cu_seqlens_k, "cu_seqlens_k");
  a.causal = in.causal;
  a.softmax_scale = in.softmax_scale;
  a.page_table = ref(in.page_table, "page_table");
  a.seqused_k = ref(in.seqused_k, "seqused_k");
  a.q_offset = q_offset_arg(ref, in.q_offset_value, in.q_offset);
  a.lse_temperature_scale = in.lse_temperature_scale;
  a.output = ref(in.out, "out");
  a.lse = ref(in.lse, "lse");
  a.lse_temperature = ref(in.lse_t, "lse_t");
  a.workspace = ref(in.workspace, "workspace");
  return make_sparse_attention_params(a);
}

#define MSA_SPARSE_ATTENTION_PARAMS                                                             \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &q2k_indices, \
      const at::Tensor &cu_seqlens_q, const OptTensor &cu_seqlens_k, bool causal,               \
      std::optional<double> softmax_scale, const OptTensor &page_table,                         \
      const OptTensor &seqused_k, const OptTensor &k_scale, const OptTensor &v_scale,           \
      std::optional<double> k_global_scale, std::optional<double> v_global_scale,               \
      std::optional<int64_t> q_offset_value, const OptTensor &q_offset,                         \
      double lse_temperature_scale, const at::Tensor &out, const OptTensor &lse,                \
      const OptTensor &lse_t, const OptTensor &workspace
#define MSA_SPARSE_ATTENTION_INPUTS                                                            \
  SparseAttentionInputs {                                                                      \
    q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, page_table,       \
        seqused_k, k_scale, v_scale, k_global_scale, v_global_scale, q_offset_value, q_offset, \
        lse_temperature_scale, out, lse, lse_t, workspace                                      \
  }

void sparse_attention(MSA_SPARSE_ATTENTION_PARAMS) {
  translate_errors([&] {
    SparseAttnParams p = sparse_attention_params(MSA_SPARSE_ATTENTION_INPUTS);
    const int device = tensor_device(q);
    DeviceScope scope(device);
    std::optional<at::Tensor> scratch;
    if (device >= 0) {
      scratch = provide_workspace("msa_sparse_attention", p, sparse_attention_workspace_bytes(p),
                                  workspace.has_value(), q);
    }
    run_sparse_attention(p, device, scope.stream());
  });
}

// Bytes of device scratch the same call needs (0 on the CPU): MSASparseAttentionWorkspace grows to
// it before the call, outside CUDA-graph capture.
int64_t sparse_attention_workspace_size(MSA_SPARSE_ATTENTION_PARAMS) {
  return translate_errors([&] {
    const SparseAttnParams p = sparse_attention_params(MSA_SPARSE_ATTENTION_INPUTS);
    const int device = tensor_device(q);
    if (device < 0) return int64_t{0};  // the CPU reference needs no scratch
    DeviceScope scope(device);           // the plan reads the limits of q's device
    return static_cast<int64_t>(sparse_attention_workspace_bytes(p));
  });
}

// ---- msa_sparse_decode_attention ---------------------------------------------------------------

struct SparseDecodeInputs {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  const at::Tensor& q2k_indices;
  const OptTensor& page_table;
  const OptTensor& seqused_k;
  const OptTensor& cu_seqlens_k;
  int64_t seqlen_q;
  bool causal;
  std::optional<double> softmax_scale;
  const OptTensor& k_scale;
  const OptTensor& v_scale;
  std::optional<double> k_global_scale;
  std::optional<double> v_global_scale;
  std::optional<int64_t> q_offset_value;
  const OptTensor& q_offset;
  std::optional<c10::ScalarType> partial_dtype;
  std::optional<bool> force_fused;
  const at::Tensor& out;
  const OptTensor& lse;
  const OptTensor& workspace;
};

SparseDecodeParams sparse_decode_params(const SparseDecodeInputs& in) {
  const Describe ref("msa_sparse_decode_attention");
  SparseDecodeArgs a;
  a.q = ref(in.q, "q");
  a.kv = kv_args(ref, in.k, in.v, in.k_scale, in.v_scale, in.k_global_scale, in.v_global_scale);
  a.q2k_indices = ref(in.q2k_indices, "q2k_indices");
  a.page_table = ref(in.page_table, "page_table");
  a.seqused_k = ref(in.seqused_k, "seqused_k");
  a.cu_seqlens_k = ref(in.cu_seqlens_k, "cu_seqlens_k");
  a.seqlen_q = in.seqlen_q;
  a.causal = in.causal;
  a.softmax_scale = in.softmax_scale;
  a.q_offset = q_offset_arg(ref, in.q_offset_value, in.q_offset);
  a.partial_dtype = partial_dtype_of(in.partial_dtype);
  a.force_fused = in.force_fused;
  a.output = ref(in.out, "out");
  a.lse = ref(in.lse, "lse");
  a.workspace = ref(in.workspace, "workspace");
  return make_sparse_decode_params(a);
}

#define MSA_SPARSE_DECODE_PARAMS                                                                \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &q2k_indices, \
      const OptTensor &page_table, const OptTensor &seqused_k, const OptTensor &cu_seqlens_k,   \
      int64_t seqlen_q, bool causal, std::optional<double> softmax_scale,                       \
      const OptTensor &k_scale, const OptTensor &v_scale, std::optional<double> k_global_scale, \
      std::optional<double> v_global_scale, std::optional<int64_t> q_offset_value,              \
      const OptTensor &q_offset, std::optional<c10::ScalarType> partial_dtype,                  \
      std::optional<bool> force_fused, const at::Tensor &out, const OptTensor &lse,             \
      const OptTensor &workspace
#define MSA_SPARSE_DECODE_INPUTS                                                                   \
  SparseDecodeInputs {                                                                             \
    q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q, causal, softmax_scale,    \
        k_scale, v_scale, k_global_scale, v_global_scale, q_offset_value, q_offset, partial_dtype, \
        force_fused, out, lse, workspace                                                           \
  }

void sparse_decode(MSA_SPARSE_DECODE_PARAMS) {
  translate_errors([&] {
    SparseDecodeParams p = sparse_decode_params(MSA_SPARSE_DECODE_INPUTS);
    const int device = tensor_device(q);
    DeviceScope scope(device);
    std::optional<at::Tensor> scratch;
    if (device >= 0) {
      scratch = provide_workspace("msa_sparse_decode_attention", p.attn,
                                  sparse_decode_workspace_bytes(p), workspace.has_value(), q);
    }
    run_sparse_decode(p, device, scope.stream());
  });
}

int64_t sparse_decode_workspace_size(MSA_SPARSE_DECODE_PARAMS) {
  return translate_errors([&] {
    const SparseDecodeParams p = sparse_decode_params(MSA_SPARSE_DECODE_INPUTS);
    const int device = tensor_device(q);
    if (device < 0) return int64_t{0};
    DeviceScope scope(device);
    return static_cast<int64_t>(sparse_decode_workspace_bytes(p));
  });
}

// ---- checks of host copies ---------------------------------------------------------------------
// The Python layer reads cu_seqlens / seqused_k of CUDA tensors on the host when FlashInfer does
// (msa_proxy_score's derived max_seqlen_q / max_k_tiles); these run the core's content checks on
// that copy. make_* checks host tensors itself.

void check_cu_seqlens_host(const at::Tensor& values, int64_t total, c10::string_view name) {
  translate_errors([&] {
    const std::string n(name);
    TORCH_CHECK_VALUE(values.device().is_cpu() && values.scalar_type() == at::kInt &&
                          values.dim() == 1 && values.is_contiguous(),
                      n, ": the host copy must be a contiguous 1-D int32 CPU tensor");
    check_cu_seqlens(values.data_ptr<int>(), values.numel(), total, n.c_str());
  });
}

void check_seqused_k_host(const at::Tensor& values, c10::string_view name) {
  translate_errors([&] {
    const std::string n(name);
    TORCH_CHECK_VALUE(values.device().is_cpu() && values.scalar_type() == at::kInt &&
                          values.dim() == 1 && values.is_contiguous(),
                      n, ": the host copy must be a contiguous 1-D int32 CPU tensor");
    check_seqused_k(values.data_ptr<int>(), values.numel(), n.c_str());
  });
}

}  // namespace
}  // namespace flashmsa::torch_binding

// Schemas. Outputs are caller-allocated mutable arguments (Tensor(a!)); optional outputs are
// Tensor(b!)? and so on. q_offset arrives split: an int (q_offset_value) or an int32 tensor.
TORCH_LIBRARY(flashmsa, m) {
  m.def(
      "proxy_score(Tensor q, Tensor k, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, "
      "Tensor? page_table, Tensor? seqused_k, bool causal, int? max_seqlen_q, int max_k_tiles, "
      "int? q_offset_value, Tensor? q_offset, bool reduce_heads, Tensor(a!) output) -> ()");
  m.def(
      "proxy_score_fp4(Tensor q_fp4, Tensor k_fp4, Tensor q_scale, Tensor k_scale, "
      "float q_global_scale, float k_global_scale, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, "
      "Tensor? page_table, Tensor? seqused_k, bool causal, int? max_seqlen_q, int max_k_tiles, "
      "int? q_offset_value, Tensor? q_offset, bool reduce_heads, Tensor(a!) output) -> ()");
  m.def(
      "topk_select(Tensor max_score, int topk, int? num_valid_pages_value, "
      "Tensor? num_valid_pages, int force_begin_blocks, int force_end_blocks, "
      "Tensor(a!) output) -> ()");
#define MSA_SPARSE_ATTENTION_SCHEMA_ARGS                                          \
  "Tensor q, Tensor k, Tensor v, Tensor q2k_indices, Tensor cu_seqlens_q, "       \
  "Tensor? cu_seqlens_k, bool causal, float? softmax_scale, Tensor? page_table, " \
  "Tensor? seqused_k, Tensor? k_scale, Tensor? v_scale, float? k_global_scale, "  \
  "float? v_global_scale, int? q_offset_value, Tensor? q_offset, float lse_temperature_scale, "
  m.def("sparse_attention(" MSA_SPARSE_ATTENTION_SCHEMA_ARGS
        "Tensor(a!) out, Tensor(b!)? lse, Tensor(c!)? lse_t, Tensor(d!)? workspace) -> ()");
  m.def("sparse_attention_workspace_size(" MSA_SPARSE_ATTENTION_SCHEMA_ARGS
        "Tensor out, Tensor? lse, Tensor? lse_t, Tensor? workspace) -> int");
#define MSA_SPARSE_DECODE_SCHEMA_ARGS                                                         \
  "Tensor q, Tensor k, Tensor v, Tensor q2k_indices, Tensor? page_table, Tensor? seqused_k, " \
  "Tensor? cu_seqlens_k, int seqlen_q, bool causal, float? softmax_scale, Tensor? k_scale, "  \
  "Tensor? v_scale, float? k_global_scale, float? v_global_scale, int? q_offset_value, "      \
  "Tensor? q_offset, ScalarType? partial_dtype, bool? force_fused, "
  m.def("sparse_decode(" MSA_SPARSE_DECODE_SCHEMA_ARGS
        "Tensor(a!) out, Tensor(b!)? lse, Tensor(c!)? workspace) -> ()");
  m.def("sparse_decode_workspace_size(" MSA_SPARSE_DECODE_SCHEMA_ARGS
        "Tensor out, Tensor? lse, Tensor? workspace) -> int");
  m.def("check_cu_seqlens(Tensor host_values, int total, str name) -> ()");
  m.def("check_seqused_k(Tensor host_values, str name) -> ()");
}

// One implementation serves both keys: the core dispatches on where the memory is (host ->
// reference, device -> kernels). A build without CUDA still registers the CUDA key so that CUDA
// tensors get the core's clear NotImplementedError instead of a dispatcher error.
#define MSA_REGISTER_IMPLS(m)                                             \
  m.impl("proxy_score", &flashmsa::torch_binding::proxy_score);           \
  m.impl("proxy_score_fp4", &flashmsa::torch_binding::proxy_score_fp4);   \
  m.impl("topk_select", &flashmsa::torch_binding::topk_select);           \
  m.impl("sparse_attention", &flashmsa::torch_binding::sparse_attention); \
  m.impl("sparse_attention_workspace_size",                               \
         &flashmsa::torch_binding::sparse_attention_workspace_size);      \
  m.impl("sparse_decode", &flashmsa::torch_binding::sparse_decode);       \
  m.impl("sparse_decode_workspace_size", &flashmsa::torch_binding::sparse_decode_workspace_size)

TORCH_LIBRARY_IMPL(flashmsa, CPU, m) {
  MSA_REGISTER_IMPLS(m);
  m.impl("check_cu_seqlens", &flashmsa::torch_binding::check_cu_seqlens_host);
  m.impl("check_seqused_k", &flashmsa::torch_binding::check_seqused_k_host);
}
TORCH_LIBRARY_IMPL(flashmsa, CUDA, m) { MSA_REGISTER_IMPLS(m); }

// ---- the Python module -------------------------------------------------------------------------
// Importing flashmsa._C loads this library, whose static initialisers above register the ops.

namespace {

PyObject* py_built_with_cuda(PyObject*, PyObject*) {
  if (flashmsa::built_with_cuda()) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyMethodDef module_methods[] = {
    {"built_with_cuda", py_built_with_cuda, METH_NOARGS,
     "Whether this build of flashmsa has CUDA kernels (else CUDA tensors raise "
     "NotImplementedError)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "flashmsa native ops, registered as torch.ops.flashmsa.* when this module is imported.",
    -1,
    module_methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }

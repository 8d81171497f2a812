// PyTorch binding of the MSA ops: the Python extension flashmsa._C.
//
// Each op is registered with TORCH_LIBRARY(flashmsa, m). Outputs are allocated by the Python
// wrappers (python/flashmsa/msa_ops.py) and passed in as mutable arguments, so every schema returns
// () and a fake implementation has nothing to compute (torch.compile / opcheck). An op's arguments
// are stated once, in its table below: each entry is the argument's schema text and where the
// core's Args take it; the schema and the Args fill both come from the table (a boxed kernel reads
// the call's values off the stack in table order). An op only
//   1. describes its tensors to the core (TensorRef, tensor_ref.h),
//   2. calls make_*_params (ALL validation, docs/semantics.md#d9; throws flashmsa::Error),
//   3. asks the core for the call's plan (plan.h) with the options of its trailing `plan` argument
//      (empty: the library's own choices; tests and benchmarks force schedules and kernels through
//      it, via the private *_planned functions of python/flashmsa/msa_ops.py), provides plan.bytes
//      of device scratch, and
//   4. runs the validated params with that plan on the caller's device and current stream.
// flashmsa::Error kinds become the Python exceptions docs/semantics.md#d9 names (ValueError,
// TypeError, NotImplementedError, RuntimeError).
// clang-format off
#define PY_SSIZE_T_CLEAN
#include <Python.h>  // before any other header, as Python requires
// clang-format on

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#if defined(FLASHMSA_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "flashmsa/api.h"
#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "tensor_ref.h"

namespace flashmsa::torch_binding {
namespace {

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

// Sets the current CUDA device for a CUDA call and hands out its current stream (the stream the
// caller's PyTorch work is ordered on, so no synchronisation is needed and CUDA-graph capture sees
// every launch). Host calls (device -1) get no guard and a null stream.
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

// ---- argument tables ---------------------------------------------------------------------------

// One argument value of a call, read as its table entry declares it.
class In {
 public:
  In(const c10::IValue& value, const char* name, const Describe& describe)
      : value_(value), name_(name), describe_(describe) {}

  TensorRef tensor() const { return value_.isNone() ? TensorRef{} : describe_(value_.toTensor(), name_); }
  bool boolean() const { return value_.toBool(); }
  std::optional<bool> opt_boolean() const {
    return value_.isNone() ? std::nullopt : std::optional<bool>(value_.toBool());
  }
  int64_t integer() const { return value_.toInt(); }
  std::optional<int64_t> opt_integer() const {
    return value_.isNone() ? std::nullopt : std::optional<int64_t>(value_.toInt());
  }
  double real() const { return value_.toDouble(); }
  std::optional<double> opt_real() const {
    return value_.isNone() ? std::nullopt : std::optional<double>(value_.toDouble());
  }
  PartialDType partial_dtype() const;

 private:
  const c10::IValue& value_;
  const char* name_;
  const Describe& describe_;
};

PartialDType In::partial_dtype() const {
  if (value_.isNone()) return PartialDType::kDefault;
  const c10::ScalarType t = value_.toScalarType();
  switch (t) {
    case c10::ScalarType::Float:
      return PartialDType::kFloat32;
    case c10::ScalarType::BFloat16:
      return PartialDType::kBF16;
    case c10::ScalarType::Half:
      return PartialDType::kFP16;
    case c10::ScalarType::Float8_e4m3fn:
      return PartialDType::kFP8E4M3;
    default:
      TORCH_CHECK_VALUE(false, describe_.op(), ": ", name_,
                        " must be None, torch.float32, torch.bfloat16, torch.float16 or "
                        "torch.float8_e4m3fn, got torch.", c10::getDtypeNames(t).first);
  }
}

// An entry of an op's table: the argument's schema text ("<type> <name>[=<default>]", outputs with
// their alias annotation, e.g. "Tensor(a!) output") and where the core's Args take its value.
template <typename Args>
struct Param {
  const char* decl;
  void (*set)(Args& args, const In& value);
};

// The argument name of a schema declaration: its last word, without a default.
std::string param_name(std::string_view decl) {
  std::string_view name = decl.substr(decl.rfind(' ') + 1);
  return std::string(name.substr(0, name.find('=')));
}

// The declaration without an alias annotation ("Tensor(a!)? lse" -> "Tensor? lse"): the arguments
// of an op's workspace query, which writes nothing.
std::string read_only(std::string_view decl) {
  std::string s(decl);
  const size_t open = s.find('(');
  if (open != std::string::npos && open < s.find(' ')) s.erase(open, s.find(')') - open + 1);
  return s;
}

// The trailing argument of the ops that take plan options (parse_*_options, plan.h).
constexpr const char* kPlanDecl = "str plan=\"\"";

// kRun: the op; kWorkspaceSize: <name>_workspace_size, the bytes of the call's plan;
// kDescribe: <name>_describe, one line naming the plan's schedule / kernel and why
// (describe_*_plan, api.h), which the Python package logs under FLASHMSA_LOG=info.
enum class Mode { kRun, kWorkspaceSize, kDescribe };

const char* mode_suffix(Mode mode) {
  return mode == Mode::kRun ? "" : (mode == Mode::kWorkspaceSize ? "_workspace_size" : "_describe");
}

// The text a kDescribe call leaves for boxed() to return.
thread_local std::string t_description;

// Schema of op Op: its name, the table's declarations (plus `plan`), and the result.
template <typename Op>
std::string schema(Mode mode) {
  std::string s = std::string(Op::kName) + mode_suffix(mode);
  s += "(";
  const char* sep = "";
  for (const auto& param : Op::params()) {
    s += sep;
    s += mode == Mode::kRun ? std::string(param.decl) : read_only(param.decl);
    sep = ", ";
  }
  if (Op::kHasPlan) s += std::string(sep) + kPlanDecl;
  s += mode == Mode::kRun ? ") -> ()" : (mode == Mode::kWorkspaceSize ? ") -> int" : ") -> str");
  return s;
}

template <typename Op>
const std::vector<std::string>& param_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& param : Op::params()) v.push_back(param_name(param.decl));
    return v;
  }();
  return names;
}

// The boxed kernel of op Op: fills Op::Args from the stack in table order, runs Op::exec with the
// plan text, and leaves the result (nothing, or the workspace bytes) on the stack.
template <typename Op, Mode kMode>
void boxed(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const auto& params = Op::params();
  const size_t n = params.size() + (Op::kHasPlan ? 1 : 0);
  const int64_t result = translate_errors([&] {
    const auto values = torch::jit::last(*stack, n);
    const Describe describe(Op::kPublicName);
    typename Op::Args args;
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set(args, In(values[i], param_names<Op>()[i].c_str(), describe));
    const std::string_view plan = Op::kHasPlan ? std::string_view(values[n - 1].toStringRef()) : "";
    return Op::exec(args, plan, kMode);
  });
  torch::jit::drop(*stack, n);
  if (kMode == Mode::kWorkspaceSize) torch::jit::push(*stack, result);
  if (kMode == Mode::kDescribe) torch::jit::push(*stack, std::move(t_description));
}

// Device scratch of an attention call: the caller's workspace when it is large enough, else a
// temporary from PyTorch's caching allocator (stream-ordered on the current stream, and taken from
// the graph's private pool during CUDA-graph capture). A caller-owned workspace that is too small
// is an error rather than a silent fallback: the caller chose it so that capture allocates nothing.
std::optional<at::Tensor> provide_workspace(const char* op, SparseAttnParams& attn, size_t need,
                                            bool caller_owned, int device) {
  if (attn.workspace_bytes >= need) return std::nullopt;
  MSA_CHECK(!caller_owned, op, ": workspace holds ", attn.workspace_bytes,
            " bytes but this call needs ", need,
            " bytes; grow it (MSASparseAttentionWorkspace.reserve) before CUDA-graph capture");
  at::Tensor scratch = at::empty({static_cast<int64_t>(need)},
                                 at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  attn.workspace = scratch.data_ptr();
  attn.workspace_bytes = need;
  return scratch;
}

// ---- msa_proxy_score, msa_proxy_score_fp4 ------------------------------------------------------
// q_offset arrives split: an int (q_offset_value) or an int32 tensor.

#define MSA_PROXY_COMMON_PARAMS                                                                     \
  {"Tensor cu_seqlens_q", [](auto& a, const In& v) { a.cu_seqlens_q = v.tensor(); }},              \
  {"Tensor? cu_seqlens_k", [](auto& a, const In& v) { a.cu_seqlens_k = v.tensor(); }},             \
  {"Tensor? page_table", [](auto& a, const In& v) { a.page_table = v.tensor(); }},                 \
  {"Tensor? seqused_k", [](auto& a, const In& v) { a.seqused_k = v.tensor(); }},                   \
  {"bool causal", [](auto& a, const In& v) { a.causal = v.boolean(); }},                           \
  {"int? max_seqlen_q", [](auto& a, const In& v) { a.max_seqlen_q = v.opt_integer(); }},           \
  {"int max_k_tiles", [](auto& a, const In& v) { a.max_k_tiles = v.integer(); }},                  \
  {"int? q_offset_value", [](auto& a, const In& v) { a.q_offset.value = v.opt_integer(); }},       \
  {"Tensor? q_offset", [](auto& a, const In& v) { a.q_offset.tensor = v.tensor(); }},              \
  {"bool reduce_heads", [](auto& a, const In& v) { a.reduce_heads = v.boolean(); }},               \
  {"Tensor(a!) output", [](auto& a, const In& v) { a.output = v.tensor(); }}

int64_t run_proxy(const ProxyScoreParams& p, std::string_view plan_text, int device, Mode mode) {
  DeviceScope scope(device);
  const ProxyScoreOptions options = parse_proxy_score_options(plan_text);
  if (mode == Mode::kDescribe) {
    t_description = describe_proxy_score_plan(p, options, device);
    return 0;
  }
  const ProxyScorePlan plan = make_proxy_score_plan(p, options, device);
  run_proxy_score(p, plan, device, scope.stream());
  return 0;
}

struct ProxyScoreOp {
  using Args = ProxyScoreArgs;
  static constexpr const char* kName = "proxy_score";
  static constexpr const char* kPublicName = "msa_proxy_score";
  static constexpr bool kHasPlan = true;
  static constexpr bool kWorkspaceQuery = false;
  static const std::vector<Param<Args>>& params() {
    static const std::vector<Param<Args>> table = {
        {"Tensor q", [](Args& a, const In& v) { a.q = v.tensor(); }},
        {"Tensor k", [](Args& a, const In& v) { a.k = v.tensor(); }},
        MSA_PROXY_COMMON_PARAMS,
    };
    return table;
  }
  static int64_t exec(Args& a, std::string_view plan, Mode mode) {
    return run_proxy(make_proxy_score_params(a), plan, a.q.device, mode);
  }
};

struct ProxyScoreFp4Op {
  using Args = ProxyScoreArgs;
  static constexpr const char* kName = "proxy_score_fp4";
  static constexpr const char* kPublicName = "msa_proxy_score_fp4";
  static constexpr bool kHasPlan = true;
  static constexpr bool kWorkspaceQuery = false;
  static const std::vector<Param<Args>>& params() {
    static const std::vector<Param<Args>> table = {
        {"Tensor q_fp4", [](Args& a, const In& v) { a.q = v.tensor(); }},
        {"Tensor k_fp4", [](Args& a, const In& v) { a.k = v.tensor(); }},
        {"Tensor q_scale", [](Args& a, const In& v) { a.q_scale = v.tensor(); }},
        {"Tensor k_scale", [](Args& a, const In& v) { a.k_scale = v.tensor(); }},
        {"float q_global_scale", [](Args& a, const In& v) { a.q_global_scale = v.real(); }},
        {"float k_global_scale", [](Args& a, const In& v) { a.k_global_scale = v.real(); }},
        MSA_PROXY_COMMON_PARAMS,
    };
    return table;
  }
  static int64_t exec(Args& a, std::string_view plan, Mode mode) {
    return run_proxy(make_proxy_score_fp4_params(a), plan, a.q.device, mode);
  }
};

// ---- msa_topk_select ---------------------------------------------------------------------------

struct TopkSelectOp {
  using Args = TopkSelectArgs;
  static constexpr const char* kName = "topk_select";
  static constexpr const char* kPublicName = "msa_topk_select";
  static constexpr bool kHasPlan = true;
  static constexpr bool kWorkspaceQuery = false;
  static const std::vector<Param<Args>>& params() {
    static const std::vector<Param<Args>> table = {
        {"Tensor max_score", [](Args& a, const In& v) { a.max_score = v.tensor(); }},
        {"int topk", [](Args& a, const In& v) { a.topk = v.integer(); }},
        {"int? num_valid_pages_value", [](Args& a, const In& v) { a.num_valid_pages_value = v.opt_integer(); }},
        {"Tensor? num_valid_pages", [](Args& a, const In& v) { a.num_valid_pages = v.tensor(); }},
        {"int force_begin_blocks", [](Args& a, const In& v) { a.force_begin_blocks = v.integer(); }},
        {"int force_end_blocks", [](Args& a, const In& v) { a.force_end_blocks = v.integer(); }},
        {"Tensor(a!) output", [](Args& a, const In& v) { a.output = v.tensor(); }},
    };
    return table;
  }
  static int64_t exec(Args& a, std::string_view plan_text, Mode mode) {
    const TopkSelectParams p = make_topk_select_params(a);
    const int device = a.max_score.device;
    DeviceScope scope(device);
    const TopkSelectOptions options = parse_topk_select_options(plan_text);
    if (mode == Mode::kDescribe) {
      t_description = describe_topk_select_plan(p, options, device);
      return 0;
    }
    const TopkSelectPlan plan = make_topk_select_plan(p, options, device);
    run_topk_select(p, plan, device, scope.stream());
    return 0;
  }
};

// ---- msa_sparse_attention, msa_sparse_decode_attention -----------------------------------------
// Each has a workspace query (<name>_workspace_size, the same arguments read-only, -> int): the
// bytes of the call's plan, 0 on the CPU. MSASparseAttentionWorkspace grows to it before the call,
// outside CUDA-graph capture.

#define MSA_KV_PARAMS(Args)                                                                              \
  {"Tensor? k_scale", [](Args& a, const In& v) { a.kv.k_scale = v.tensor(); }},                          \
  {"Tensor? v_scale", [](Args& a, const In& v) { a.kv.v_scale = v.tensor(); }},                          \
  {"float? k_global_scale", [](Args& a, const In& v) { a.kv.k_global_scale = v.opt_real(); }},          \
  {"float? v_global_scale", [](Args& a, const In& v) { a.kv.v_global_scale = v.opt_real(); }},          \
  {"int? q_offset_value", [](Args& a, const In& v) { a.q_offset.value = v.opt_integer(); }},            \
  {"Tensor? q_offset", [](Args& a, const In& v) { a.q_offset.tensor = v.tensor(); }}

struct SparseAttentionOp {
  using Args = SparseAttnArgs;
  static constexpr const char* kName = "sparse_attention";
  static constexpr const char* kPublicName = "msa_sparse_attention";
  static constexpr bool kHasPlan = true;
  static constexpr bool kWorkspaceQuery = true;
  static const std::vector<Param<Args>>& params() {
    static const std::vector<Param<Args>> table = {
        {"Tensor q", [](Args& a, const In& v) { a.q = v.tensor(); }},
        {"Tensor k", [](Args& a, const In& v) { a.kv.k = v.tensor(); }},
        {"Tensor v", [](Args& a, const In& v) { a.kv.v = v.tensor(); }},
        {"Tensor q2k_indices", [](Args& a, const In& v) { a.q2k_indices = v.tensor(); }},
        {"Tensor cu_seqlens_q", [](Args& a, const In& v) { a.cu_seqlens_q = v.tensor(); }},
        {"Tensor? cu_seqlens_k", [](Args& a, const In& v) { a.cu_seqlens_k = v.tensor(); }},
        {"bool causal", [](Args& a, const In& v) { a.causal = v.boolean(); }},
        {"float? softmax_scale", [](Args& a, const In& v) { a.softmax_scale = v.opt_real(); }},
        {"Tensor? page_table", [](Args& a, const In& v) { a.page_table = v.tensor(); }},
        {"Tensor? seqused_k", [](Args& a, const In& v) { a.seqused_k = v.tensor(); }},
        MSA_KV_PARAMS(Args),
        {"float lse_temperature_scale", [](Args& a, const In& v) { a.lse_temperature_scale = v.real(); }},
        {"Tensor(a!) out", [](Args& a, const In& v) { a.output = v.tensor(); }},
        {"Tensor(b!)? lse", [](Args& a, const In& v) { a.lse = v.tensor(); }},
        {"Tensor(c!)? lse_t", [](Args& a, const In& v) { a.lse_temperature = v.tensor(); }},
        {"Tensor(d!)? workspace", [](Args& a, const In& v) { a.workspace = v.tensor(); }},
    };
    return table;
  }
  static int64_t exec(Args& a, std::string_view plan_text, Mode mode) {
    SparseAttnParams p = make_sparse_attention_params(a);
    const int device = a.q.device;
    DeviceScope scope(device);  // the plan reads the facts of q's device
    const SparseAttnOptions options = parse_sparse_attention_options(plan_text);
    if (mode == Mode::kDescribe) {
      t_description = describe_sparse_attention_plan(p, options, device);
      return 0;
    }
    const SparseAttnPlan plan = make_sparse_attention_plan(p, options, device);
    if (mode == Mode::kWorkspaceSize) return static_cast<int64_t>(plan.bytes);
    std::optional<at::Tensor> scratch;
    if (device >= 0) scratch = provide_workspace(kPublicName, p, plan.bytes, a.workspace.defined(), device);
    run_sparse_attention(p, plan, device, scope.stream());
    return 0;
  }
};

struct SparseDecodeOp {
  using Args = SparseDecodeArgs;
  static constexpr const char* kName = "sparse_decode";
  static constexpr const char* kPublicName = "msa_sparse_decode_attention";
  static constexpr bool kHasPlan = true;
  static constexpr bool kWorkspaceQuery = true;
  static const std::vector<Param<Args>>& params() {
    static const std::vector<Param<Args>> table = {
        {"Tensor q", [](Args& a, const In& v) { a.q = v.tensor(); }},
        {"Tensor k", [](Args& a, const In& v) { a.kv.k = v.tensor(); }},
        {"Tensor v", [](Args& a, const In& v) { a.kv.v = v.tensor(); }},
        {"Tensor q2k_indices", [](Args& a, const In& v) { a.q2k_indices = v.tensor(); }},
        {"Tensor? page_table", [](Args& a, const In& v) { a.page_table = v.tensor(); }},
        {"Tensor? seqused_k", [](Args& a, const In& v) { a.seqused_k = v.tensor(); }},
        {"Tensor? cu_seqlens_k", [](Args& a, const In& v) { a.cu_seqlens_k = v.tensor(); }},
        {"int seqlen_q", [](Args& a, const In& v) { a.seqlen_q = v.integer(); }},
        {"bool causal", [](Args& a, const In& v) { a.causal = v.boolean(); }},
        {"float? softmax_scale", [](Args& a, const In& v) { a.softmax_scale = v.opt_real(); }},
        MSA_KV_PARAMS(Args),
        {"ScalarType? partial_dtype", [](Args& a, const In& v) { a.partial_dtype = v.partial_dtype(); }},
        {"bool? force_fused", [](Args& a, const In& v) { a.force_fused = v.opt_boolean(); }},
        {"Tensor(a!) out", [](Args& a, const In& v) { a.output = v.tensor(); }},
        {"Tensor(b!)? lse", [](Args& a, const In& v) { a.lse = v.tensor(); }},
        {"Tensor(c!)? workspace", [](Args& a, const In& v) { a.workspace = v.tensor(); }},
    };
    return table;
  }
  static int64_t exec(Args& a, std::string_view plan_text, Mode mode) {
    SparseDecodeParams p = make_sparse_decode_params(a);
    const int device = a.q.device;
    DeviceScope scope(device);
    const SparseDecodeOptions options = parse_sparse_decode_options(plan_text);
    if (mode == Mode::kDescribe) {
      t_description = describe_sparse_decode_plan(p, options, device);
      return 0;
    }
    const SparseAttnPlan plan = make_sparse_decode_plan(p, options, device);
    if (mode == Mode::kWorkspaceSize) return static_cast<int64_t>(plan.bytes);
    std::optional<at::Tensor> scratch;
    if (device >= 0) scratch = provide_workspace(kPublicName, p.attn, plan.bytes, a.workspace.defined(), device);
    run_sparse_decode(p, plan, device, scope.stream());
    return 0;
  }
};

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

// ---- registration ------------------------------------------------------------------------------

template <typename Op>
void define(torch::Library& m) {
  m.def(torch::schema(schema<Op>(Mode::kRun).c_str()));
  if (Op::kWorkspaceQuery) m.def(torch::schema(schema<Op>(Mode::kWorkspaceSize).c_str()));
  m.def(torch::schema(schema<Op>(Mode::kDescribe).c_str()));
}

// One implementation serves the CPU and CUDA keys: the core dispatches on where the memory is
// (host -> reference, device -> kernels). A build without CUDA still registers the CUDA key so
// that CUDA tensors get the core's clear NotImplementedError instead of a dispatcher error.
template <typename Op>
void implement(torch::Library& m) {
  m.impl(Op::kName, torch::CppFunction::makeFromBoxedFunction<&boxed<Op, Mode::kRun>>());
  if (Op::kWorkspaceQuery) {
    static const std::string name = std::string(Op::kName) + "_workspace_size";
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed<Op, Mode::kWorkspaceSize>>());
  }
  static const std::string describe_name = std::string(Op::kName) + "_describe";
  m.impl(describe_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed<Op, Mode::kDescribe>>());
}

void implement_all(torch::Library& m) {
  implement<ProxyScoreOp>(m);
  implement<ProxyScoreFp4Op>(m);
  implement<TopkSelectOp>(m);
  implement<SparseAttentionOp>(m);
  implement<SparseDecodeOp>(m);
}

}  // namespace
}  // namespace flashmsa::torch_binding

TORCH_LIBRARY(flashmsa, m) {
  using namespace flashmsa::torch_binding;
  define<ProxyScoreOp>(m);
  define<ProxyScoreFp4Op>(m);
  define<TopkSelectOp>(m);
  define<SparseAttentionOp>(m);
  define<SparseDecodeOp>(m);
  m.def("check_cu_seqlens(Tensor host_values, int total, str name) -> ()");
  m.def("check_seqused_k(Tensor host_values, str name) -> ()");
}

TORCH_LIBRARY_IMPL(flashmsa, CPU, m) {
  flashmsa::torch_binding::implement_all(m);
  m.impl("check_cu_seqlens", &flashmsa::torch_binding::check_cu_seqlens_host);
  m.impl("check_seqused_k", &flashmsa::torch_binding::check_seqused_k_host);
}
TORCH_LIBRARY_IMPL(flashmsa, CUDA, m) { flashmsa::torch_binding::implement_all(m); }

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

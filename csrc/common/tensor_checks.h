// Host checks shared by the ops' make_*_params (csrc/<op>/<op>_params.cpp): message formatting,
// checks of one caller tensor (TensorRef) or Python scalar, and checks of the index contents the
// host can read. Every message starts with the op's Python name and names the Python argument,
// what was expected and what was given (docs/semantics.md#validation).
#pragma once

#include <array>
#include <initializer_list>
#include <cstdint>
#include <optional>
#include <string>

#include "flashmsa/error.h"
#include "flashmsa/types.h"

// A check inside one make_* call: the op's Python name prefixes the message.
#define MSA_OP_CHECK(ctx, cond, ...) MSA_CHECK(cond, (ctx).op, ": ", __VA_ARGS__)
#define MSA_OP_CHECK_SUPPORTED(ctx, cond, ...) \
  MSA_CHECK_SUPPORTED(cond, (ctx).op, ": ", __VA_ARGS__)

namespace flashmsa::checks {

// ---- formatting (no iostreams in the library: see flashmsa/error.h) ----------------------------

std::string shape_str(const TensorRef& t);    // "(2, 3)", "(5,)", "None"
std::string strides_str(const TensorRef& t);
std::string device_str(int device);           // "cpu" or "cuda:N"
const char* dtype_str(const TensorRef& t);
// b - a in bytes; the two pointers may belong to unrelated allocations.
int64_t byte_distance(const void* a, const void* b);
// Bytes per element of a caller dtype (0 for kOther).
int64_t elt_size(ScalarType t);

// ---- one make_* call ---------------------------------------------------------------------------

// The op's Python name, and the tensor whose device every other tensor must share.
struct Ctx {
  const char* op;
  const char* anchor;  // Python name of that tensor (q, q_fp4 or max_score)
  int device;          // its device (-1: host)
};

// Row-major strides of t's sizes: what Params carry for a contiguous tensor. torch lets a size-1
// dim have any stride; kernels that build descriptors from strides should not see such values.
std::array<int64_t, kMaxDims> contiguous_strides(const TensorRef& t);

// Whether a 3-D t is rows of t.size(2) consecutive elements (unit last stride) placed by any
// non-negative strides of dims 0 and 1, by torch's rule for size-1 dims. Rows may overlap (an
// input the kernels only read, e.g. an expand()): q2k_indices.
bool has_unit_rows_3d(const TensorRef& t);

// has_unit_rows_3d, and no two rows share an element (an output the kernels write row by row:
// top-k's output). Sufficient test: the sized row dims, by increasing stride, each step over the
// whole span of the rows before.
bool has_disjoint_unit_rows_3d(const TensorRef& t);

// t.stride(d), or 0 for a dim of size 1 (whose stride torch leaves arbitrary and no index uses).
int64_t used_stride(const TensorRef& t, int d);

// Every defined tensor: a shape the TensorRef can hold, memory behind its elements, the anchor's
// device, and an address aligned to `align` bytes (its element size when 0, or 16 for the operands
// the kernels load and store in 16-byte vectors).
void check_tensor(const Ctx& c, const TensorRef& t, const char* name, int64_t align = 0);
void check_contiguous(const Ctx& c, const TensorRef& t, const char* name);

// An output must not share memory with any other argument of the call (`others`: name, tensor;
// undefined tensors and tensors on another device are skipped): the ops read their inputs while
// writing, and no kernel or reference pass is written to survive aliasing.
struct NamedRef {
  const char* name;
  const TensorRef* t;
};
void check_no_overlap(const Ctx& c, const TensorRef& out, const char* name,
                      std::initializer_list<NamedRef> others);

// A tensor size or Python int that a Params int field will hold.
int to_int(const Ctx& c, int64_t v, const char* what);

// A 1-D contiguous int32 tensor with `expected` entries (`what` says where that number comes from).
void check_int32_vector(const Ctx& c, const TensorRef& t, const char* name, int64_t expected,
                        const std::string& what);

// cu_seqlens_q / cu_seqlens_k: 1-D contiguous int32 (B + 1,). Returns B.
int check_cu_seqlens_ref(const Ctx& c, const TensorRef& t, const char* name);

// A Python float that a Params float field will hold: finite in float32.
void check_float_scalar(const Ctx& c, double v, const char* name);

// ---- contents the host can read ----------------------------------------------------------------

// prefix: "op: " or "" (the public check_cu_seqlens / check_seqused_k of api.h).
void check_cu_seqlens_values(const char* prefix, const int* v, int64_t count, int64_t total,
                             const char* name, const char* total_what);
void check_seqused_values(const char* prefix, const int* v, int64_t count, const char* name);

// cu_seqlens on the host are checked by the make_* call (its only host pass); device ones are not
// read. `total` < 0 skips the bound on the last entry.
void check_host_cu_seqlens(const Ctx& c, const TensorRef& t, int64_t total, const char* name,
                           const char* total_what);

// Largest seqlen of host-readable, already validated cu_seqlens.
int max_seqlen(const int* cu, int64_t count);

}  // namespace flashmsa::checks

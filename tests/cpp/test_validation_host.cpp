// Validation layer (csrc/<op>/<op>_params.cpp): for a valid baseline of each op, make_* succeeds
// and fills Params as params.h says; then one case per rejected input, asserting the error kind,
// that the message names the Python argument as a word, and the reason. Rejection cases are data:
// a baseline and a mutation of the caller's arguments.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "flashmsa/api.h"
#include "flashmsa/semantics.h"
#include "flashmsa/error.h"
#include "test_util.h"

namespace flashmsa::testing {
namespace {

using ST = ScalarType;
constexpr int64_t kD = kHeadDim;

// ---- helpers ---------------------------------------------------------------------------------

bool is_ident(char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }

// Whether `word` occurs in msg with no identifier character on either side ("q" is not found in
// "cu_seqlens_q", but is in "q must be ...").
bool contains_word(const std::string& msg, const std::string& word) {
  for (size_t pos = msg.find(word); pos != std::string::npos; pos = msg.find(word, pos + 1)) {
    const bool left = pos == 0 || !is_ident(msg[pos - 1]);
    const size_t end = pos + word.size();
    const bool right = end == msg.size() || !is_ident(msg[end]);
    if (left && right) return true;
  }
  return false;
}

// Runs fn and expects a flashmsa::Error of `kind` naming `arg` and containing `reason`.
void expect_error(const std::function<void()>& fn, ErrorKind kind, const std::string& arg,
                  const std::string& reason) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << msg;
    EXPECT_TRUE(contains_word(msg, arg)) << "argument '" << arg << "' not named in: " << msg;
    EXPECT_NE(msg.find(reason), std::string::npos) << "'" << reason << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "no flashmsa::Error thrown (expected one naming '" << arg << "')";
}

// A reference to the same memory shifted by `bytes` (for misalignment and packed views).
TensorRef shifted(TensorRef t, int64_t bytes) {
  t.data = static_cast<char*>(t.data) + bytes;
  return t;
}

TensorRef on_device(TensorRef t, int device) {
  t.device = device;
  return t;
}

TensorRef with_dtype(TensorRef t, ST dtype) {
  t.dtype = dtype;
  return t;
}

// Same memory, a new shape (contiguous strides); validation never reads these tensors' elements.
TensorRef reshaped(TensorRef t, std::vector<int64_t> sizes) {
  t.ndim = int(sizes.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.sizes[d] = sizes[d];
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

TensorRef with_stride(TensorRef t, int dim, int64_t stride) {
  t.strides[dim] = stride;
  return t;
}

// ---- baselines -------------------------------------------------------------------------------
// Two sequences: seqlen_q {5, 3} (total_q 8), seqlen_k {200, 130} (total_k 330, 2 + 2 blocks).
// Paged caches have 5 pages, page_table (2, 3).

const std::vector<int> kSeqQ = {5, 3};
const std::vector<int> kSeqK = {200, 130};
constexpr int64_t kTotalQ = 8, kTotalK = 330, kPages = 5, kMaxPages = 3;

struct ProxySetup {
  HostTensor q, k, cu_q, cu_k, page_table, seqused_k, out, qoff;
  ProxyScoreArgs a;

  explicit ProxySetup(bool paged, ST q_dt = ST::kBF16, ST k_dt = ST::kBF16, int64_t hq = 4,
                      int64_t hkv = 2, bool reduce = false) {
    q = HostTensor(q_dt, {kTotalQ, hq, kD});
    cu_q = cu_seqlens(kSeqQ);
    a.q = q.ref();
    a.cu_seqlens_q = cu_q.ref();
    if (paged) {
      k = HostTensor(k_dt, {kPages, hkv, kBlockSize, kD});
      page_table = int_tensor({3, 0, 4, 1, 2, -1}, {2, kMaxPages});
      seqused_k = int_tensor(kSeqK);
      a.page_table = page_table.ref();
      a.seqused_k = seqused_k.ref();
    } else {
      k = HostTensor(k_dt, {kTotalK, hkv, kD});
      cu_k = cu_seqlens(kSeqK);
      a.cu_seqlens_k = cu_k.ref();
    }
    a.k = k.ref();
    a.max_k_tiles = 2;
    a.reduce_heads = reduce;
    out = HostTensor(ST::kFloat32, {reduce ? 1 : hq, 2, kTotalQ});
    a.output = out.ref();
  }
  ProxyScoreParams make() const { return make_proxy_score_params(a); }
};

struct TopkSetup {
  HostTensor score, nvp, out;
  TopkSelectArgs a;
  static constexpr int64_t kH = 2, kP = 8, kS = 5;

  explicit TopkSetup(int64_t topk = 4) {
    score = HostTensor(ST::kFloat32, {kH, kP, kS});
    out = HostTensor(ST::kInt32, {kS, kH, topk});
    nvp = int_tensor({1, 2, 8, 9, -1});  // device-side values: clamped by the op, never checked
    a.max_score = score.ref();
    a.output = out.ref();
    a.topk = topk;
  }
  TopkSelectParams make() const { return make_topk_select_params(a); }
};

enum class KVKind { kFlat, kPaged, kPagedCuK, kFlatNvfp4, kPagedNvfp4, kPackedHND, kPackedNHD };

// Shared by prefill and decode: K/V (with NVFP4 scales or packed views) of `kind`.
struct KVSetup {
  HostTensor k, v, cache, k_scale, v_scale;
  KVArgs a;
  int64_t hkv;
  int64_t scale_rows = 0;

  KVSetup(KVKind kind, ST dt, int64_t hkv_) : hkv(hkv_) {
    const bool nvfp4 = kind == KVKind::kFlatNvfp4 || kind == KVKind::kPagedNvfp4;
    const int64_t width = nvfp4 ? kNvfp4Width : kD;
    const ST kv_dt = nvfp4 ? ST::kUInt8 : dt;
    switch (kind) {
      case KVKind::kFlat:
      case KVKind::kFlatNvfp4:
        k = HostTensor(kv_dt, {kTotalK, hkv, width});
        v = HostTensor(kv_dt, {kTotalK, hkv, width});
        scale_rows = kTotalK * hkv;
        break;
      case KVKind::kPaged:
      case KVKind::kPagedCuK:
      case KVKind::kPagedNvfp4:
        k = HostTensor(kv_dt, {kPages, hkv, kBlockSize, width});
        v = HostTensor(kv_dt, {kPages, hkv, kBlockSize, width});
        scale_rows = kPages * hkv * kBlockSize;
        break;
      case KVKind::kPackedHND: {
        // cache (P, Hkv, 128, 256): k = cache[..., :128], v = cache[..., 128:].
        cache = HostTensor(dt, {kPages, hkv, kBlockSize, 2 * kD});
        a.k = strided_ref(cache.bytes.data(), dt, {kPages, hkv, kBlockSize, kD},
                          {hkv * kBlockSize * 2 * kD, kBlockSize * 2 * kD, 2 * kD, 1});
        a.v = shifted(a.k, kD * int64_t(scalar_size(dt)));
        return;
      }
      case KVKind::kPackedNHD: {
        // cache (P, 128, Hkv, 256).permute(0, 2, 1, 3), then split in K and V halves.
        cache = HostTensor(dt, {kPages, kBlockSize, hkv, 2 * kD});
        a.k = strided_ref(cache.bytes.data(), dt, {kPages, hkv, kBlockSize, kD},
                          {kBlockSize * hkv * 2 * kD, 2 * kD, hkv * 2 * kD, 1});
        a.v = shifted(a.k, kD * int64_t(scalar_size(dt)));
        return;
      }
    }
    a.k = k.ref();
    a.v = v.ref();
    if (nvfp4) {
      k_scale = HostTensor(ST::kUInt8, {nvfp4_scale_bytes(scale_rows)});
      v_scale = HostTensor(ST::kUInt8, {nvfp4_scale_bytes(scale_rows)});
      a.k_scale = k_scale.ref();
      a.v_scale = v_scale.ref();
    }
  }
};

bool is_paged(KVKind kind) { return kind != KVKind::kFlat && kind != KVKind::kFlatNvfp4; }

struct AttnSetup {
  HostTensor q, q2k, cu_q, cu_k, page_table, seqused_k, out, lse, lse_t, qoff, workspace;
  KVSetup kv;
  SparseAttnArgs a;

  explicit AttnSetup(KVKind kind = KVKind::kFlat, ST q_dt = ST::kBF16, ST kv_dt = ST::kBF16,
                     int64_t hq = 4, int64_t hkv = 2, int64_t topk = 4)
      : kv(kind, kv_dt, hkv) {
    q = HostTensor(q_dt, {kTotalQ, hq, kD});
    q2k = HostTensor(ST::kInt32, {hkv, kTotalQ, topk});
    cu_q = cu_seqlens(kSeqQ);
    a.q = q.ref();
    a.kv = kv.a;
    a.q2k_indices = q2k.ref();
    a.cu_seqlens_q = cu_q.ref();
    if (is_paged(kind)) {
      page_table = int_tensor({3, 0, 4, 1, 2, -1}, {2, kMaxPages});
      seqused_k = int_tensor(kSeqK);
      a.page_table = page_table.ref();
      a.seqused_k = seqused_k.ref();
      if (kind == KVKind::kPagedCuK) {
        cu_k = cu_seqlens(kSeqK);
        a.cu_seqlens_k = cu_k.ref();
      }
    } else {
      cu_k = cu_seqlens(kSeqK);
      a.cu_seqlens_k = cu_k.ref();
    }
    out = HostTensor(q_dt, {kTotalQ, hq, kD});
    lse = HostTensor(ST::kFloat32, {kTotalQ, hq});
    a.output = out.ref();
    a.lse = lse.ref();
  }
  SparseAttnParams make() const { return make_sparse_attention_params(a); }
};

// Three requests of seqlen_q 2 (total_q 6), seqused_k {300, 129, 0}, Hq 6 / Hkv 2 (G = 3).
struct DecodeSetup {
  HostTensor q, q2k, cu_k, page_table, seqused_k, out, lse, qoff, workspace;
  KVSetup kv;
  SparseDecodeArgs a;
  static constexpr int64_t kB = 3, kSeqlenQ = 2, kTotal = kB * kSeqlenQ;

  explicit DecodeSetup(KVKind kind = KVKind::kPaged, ST q_dt = ST::kBF16, ST kv_dt = ST::kBF16,
                       int64_t hq = 6, int64_t hkv = 2, int64_t topk = 4)
      : kv(kind, kv_dt, hkv) {
    q = HostTensor(q_dt, {kTotal, hq, kD});
    q2k = HostTensor(ST::kInt32, {hkv, kTotal, topk});
    a.q = q.ref();
    a.kv = kv.a;
    a.q2k_indices = q2k.ref();
    a.seqlen_q = kSeqlenQ;
    if (is_paged(kind)) {
      page_table = int_tensor({0, 1, 2, 3, 4, -1, 7, 7, 7}, {kB, kMaxPages});
      seqused_k = int_tensor({300, 129, 0});
      a.page_table = page_table.ref();
      a.seqused_k = seqused_k.ref();
    } else {
      cu_k = cu_seqlens({300, 30, 0});
      a.cu_seqlens_k = cu_k.ref();
    }
    const ST out_dt = q_dt == ST::kFP8E4M3 ? ST::kBF16 : q_dt;
    out = HostTensor(out_dt, {kTotal, hq, kD});
    lse = HostTensor(ST::kFloat32, {kTotal, hq});
    a.output = out.ref();
    a.lse = lse.ref();
  }
  SparseDecodeParams make() const { return make_sparse_decode_params(a); }
};

// ---- accepted inputs: Params contents --------------------------------------------------------

TEST(ValidationProxy, FlatBaselineFillsParams) {
  ProxySetup s(/*paged=*/false);
  const ProxyScoreParams p = s.make();
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.total_q, 8);
  EXPECT_EQ(p.num_heads, 4);
  EXPECT_EQ(p.num_kv_heads, 2);
  EXPECT_EQ(p.max_k_tiles, 2);
  EXPECT_TRUE(p.causal);
  EXPECT_FALSE(p.reduce_heads);
  EXPECT_EQ(p.q, s.q.bytes.data());
  EXPECT_EQ(p.q_dtype, DType::kBF16);
  EXPECT_EQ(p.q_stride_token, 4 * kD);
  EXPECT_EQ(p.q_stride_head, kD);
  EXPECT_EQ(p.k.data, s.k.bytes.data());
  EXPECT_EQ(p.k.dtype, DType::kBF16);
  EXPECT_EQ(p.k.stride_token, 2 * kD);
  EXPECT_EQ(p.k.stride_head, kD);
  EXPECT_EQ(p.k.stride_page, 0);
  EXPECT_EQ(p.k.scale, nullptr);
  EXPECT_EQ(p.kv.batch, 2);
  EXPECT_EQ(p.kv.page_table, nullptr);
  EXPECT_EQ(p.kv.cu_seqlens_k, s.cu_k.as<int>());
  EXPECT_EQ(p.kv.seqused_k, nullptr);
  EXPECT_EQ(p.kv.total_k, kTotalK);
  EXPECT_EQ(p.qi.cu_seqlens_q, s.cu_q.as<int>());
  EXPECT_EQ(p.qi.max_seqlen_q, 5);  // host cu_seqlens_q: the exact maximum
  EXPECT_EQ(p.q_offset.mode, QOffsetMode::kRightAligned);
  EXPECT_EQ(p.out, s.out.as<float>());
}

TEST(ValidationProxy, PagedBaselineFillsParams) {
  ProxySetup s(/*paged=*/true);
  const ProxyScoreParams p = s.make();
  EXPECT_EQ(p.kv.page_table, s.page_table.as<int>());
  EXPECT_EQ(p.kv.page_table_stride, kMaxPages);
  EXPECT_EQ(p.kv.max_pages, kMaxPages);
  EXPECT_EQ(p.kv.num_pages, kPages);
  EXPECT_EQ(p.kv.seqused_k, s.seqused_k.as<int>());
  EXPECT_EQ(p.kv.cu_seqlens_k, nullptr);  // paged proxy: lengths from seqused_k
  EXPECT_EQ(p.k.stride_page, 2 * kBlockSize * kD);
  EXPECT_EQ(p.k.stride_head, kBlockSize * kD);
  EXPECT_EQ(p.k.stride_token, kD);
}

TEST(ValidationProxy, PagedIgnoresCuSeqlensK) {
  ProxySetup s(/*paged=*/true);
  HostTensor bad = int_tensor({7, 3});  // wrong in every way, but unused on the paged path
  s.a.cu_seqlens_k = bad.ref();
  EXPECT_EQ(s.make().kv.cu_seqlens_k, nullptr);
}

TEST(ValidationProxy, ReduceHeadsOutputHasOneRow) {
  ProxySetup s(/*paged=*/false, ST::kBF16, ST::kBF16, 4, 2, /*reduce=*/true);
  EXPECT_TRUE(s.make().reduce_heads);
}

TEST(ValidationProxy, DtypeCombinations) {
  EXPECT_EQ(ProxySetup(false, ST::kFP16, ST::kFP16).make().k.dtype, DType::kFP16);
  const ProxyScoreParams mixed = ProxySetup(false, ST::kBF16, ST::kFP8E4M3).make();
  EXPECT_EQ(mixed.q_dtype, DType::kBF16);
  EXPECT_EQ(mixed.k.dtype, DType::kFP8E4M3);
  const ProxyScoreParams fp8 = ProxySetup(true, ST::kFP8E4M3, ST::kFP8E4M3).make();
  EXPECT_EQ(fp8.q_dtype, DType::kFP8E4M3);
}

TEST(ValidationProxy, AnyGroupSize) {
  // D6: G = 5 and G = 3 (not powers of two) and G = 1.
  EXPECT_EQ(ProxySetup(false, ST::kBF16, ST::kBF16, 5, 1).make().num_heads, 5);
  EXPECT_EQ(ProxySetup(true, ST::kBF16, ST::kBF16, 6, 2).make().num_kv_heads, 2);
  EXPECT_EQ(ProxySetup(true, ST::kBF16, ST::kBF16, 3, 3).make().num_kv_heads, 3);
}

TEST(ValidationProxy, QOffsetForms) {
  ProxySetup s(false);
  s.a.q_offset.value = -300;
  ProxyScoreParams p = s.make();
  EXPECT_EQ(p.q_offset.mode, QOffsetMode::kScalar);
  EXPECT_EQ(p.q_offset.value, -300);
  s.a.q_offset.value.reset();
  s.qoff = int_tensor({4, -4});
  s.a.q_offset.tensor = s.qoff.ref();
  p = s.make();
  EXPECT_EQ(p.q_offset.mode, QOffsetMode::kPerSequence);
  EXPECT_EQ(p.q_offset.per_sequence, s.qoff.as<int>());
}

TEST(ValidationProxy, MaxSeqlenQGivenOrBounded) {
  ProxySetup s(false);
  s.a.max_seqlen_q = 64;  // a hint larger than the real maximum is kept as given
  EXPECT_EQ(s.make().qi.max_seqlen_q, 64);
}

// On a device, cu_seqlens / seqused_k / page ids are not read on the host (D9, D10): garbage
// contents pass, max_seqlen_q falls back to total_q.
TEST(ValidationProxy, DeviceContentsAreNotRead) {
  ProxySetup s(true);
  s.seqused_k.as<int>()[0] = -5;
  s.cu_q.as<int>()[0] = 99;
  for (TensorRef* t : {&s.a.q, &s.a.k, &s.a.cu_seqlens_q, &s.a.page_table, &s.a.seqused_k,
                       &s.a.output})
    t->device = 1;
  const ProxyScoreParams p = s.make();
  EXPECT_EQ(p.qi.max_seqlen_q, kTotalQ);
}

TEST(ValidationTopk, ScalarNvpDefaultsToAllBlocks) {
  TopkSetup s;
  const TopkSelectParams p = s.make();
  EXPECT_EQ(p.num_heads, 2);
  EXPECT_EQ(p.num_blocks, 8);
  EXPECT_EQ(p.num_tokens, 5);
  EXPECT_EQ(p.topk, 4);
  EXPECT_EQ(p.force_begin, 0);
  EXPECT_EQ(p.force_end, 0);
  EXPECT_EQ(p.num_valid_pages, nullptr);
  EXPECT_EQ(p.num_valid_pages_value, 8);
  EXPECT_EQ(p.score, s.score.as<float>());
  EXPECT_EQ(p.out, s.out.as<int>());
  EXPECT_EQ(p.out_token_stride, 2 * 4);  // contiguous (S, H, topk)
  EXPECT_EQ(p.out_head_stride, 4);
}

// The output may also be the transpose(0, 1) of a contiguous (H, S, topk): the attention ops'
// head-major layout, written directly (docs/semantics.md#topk-output).
TEST(ValidationTopk, OutputHeadMajorView) {
  TopkSetup s;
  HostTensor head_major(ST::kInt32, {TopkSetup::kH, TopkSetup::kS, 4});
  TensorRef view = head_major.ref();
  std::swap(view.sizes[0], view.sizes[1]);
  std::swap(view.strides[0], view.strides[1]);  // (S, H, topk) with strides (topk, S * topk, 1)
  s.a.output = view;
  const TopkSelectParams p = s.make();
  EXPECT_EQ(p.out, head_major.as<int>());
  EXPECT_EQ(p.out_token_stride, 4);
  EXPECT_EQ(p.out_head_stride, TopkSetup::kS * 4);
  EXPECT_EQ(topk_out_row(p, 3, 1), head_major.as<int>() + (1 * TopkSetup::kS + 3) * 4);
  // One token or one head: both layouts are the same; a size-1 dim's stride is free.
  TopkSetup one;
  one.a.output = with_stride(one.a.output, 2, 7);  // topk 4: not free
  EXPECT_THROW(one.make(), Error);
  HostTensor single(ST::kInt32, {1, 2, 4});
  TopkSetup t;
  t.score = HostTensor(ST::kFloat32, {2, 8, 1});
  t.a.max_score = t.score.ref();
  t.a.output = with_stride(single.ref(), 0, 12345);
  EXPECT_EQ(t.make().out_head_stride, 4);
  EXPECT_EQ(t.make().out_token_stride, 0);
  // A row range of a larger head-major buffer with rows padded past topk: disjoint rows.
  TopkSetup r;
  HostTensor buf(ST::kInt32, {TopkSetup::kH, TopkSetup::kS + 3, 6});
  r.a.output = strided_ref(buf.as<int>() + 2 * 6, ST::kInt32, {TopkSetup::kS, TopkSetup::kH, 4},
                           {6, (TopkSetup::kS + 3) * 6, 1});
  const TopkSelectParams q = r.make();
  EXPECT_EQ(topk_out_row(q, 3, 1), buf.as<int>() + (1 * (TopkSetup::kS + 3) + 2 + 3) * 6);
}

TEST(ValidationTopk, ExplicitScalarAndTensorNvp) {
  TopkSetup s;
  s.a.num_valid_pages_value = 3;
  s.a.force_begin_blocks = 1;
  s.a.force_end_blocks = 2;
  TopkSelectParams p = s.make();
  EXPECT_EQ(p.num_valid_pages_value, 3);
  EXPECT_EQ(p.force_begin, 1);
  EXPECT_EQ(p.force_end, 2);
  s.a.num_valid_pages_value.reset();
  s.a.num_valid_pages = s.nvp.ref();  // values -1 and 9 are clamped per row, not errors
  p = s.make();
  EXPECT_EQ(p.num_valid_pages, s.nvp.as<int>());
}

TEST(ValidationTopk, AnyTopkUpTo64) {
  for (int64_t topk : {1, 7, 16, 33, 64}) {
    TopkSetup s(topk);
    s.a.force_end_blocks = std::min<int64_t>(topk, 8);
    EXPECT_EQ(s.make().topk, topk);
  }
}

TEST(ValidationAttention, FlatBaselineFillsParams) {
  AttnSetup s;
  const SparseAttnParams p = s.make();
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.total_q, 8);
  EXPECT_EQ(p.num_heads, 4);
  EXPECT_EQ(p.num_kv_heads, 2);
  EXPECT_EQ(p.topk, 4);
  EXPECT_FALSE(p.causal);  // prefill's default
  EXPECT_FLOAT_EQ(p.softmax_scale, 1.0f / std::sqrt(128.0f));
  EXPECT_EQ(p.k_global_scale, 1.0f);
  EXPECT_EQ(p.v_global_scale, 1.0f);
  EXPECT_EQ(p.lse_temperature, 1.0f);
  EXPECT_EQ(p.q_dtype, DType::kBF16);
  EXPECT_EQ(p.out_dtype, DType::kBF16);
  EXPECT_EQ(p.q_stride_token, 4 * kD);
  EXPECT_EQ(p.q_stride_head, kD);
  EXPECT_EQ(p.k.data, s.kv.k.bytes.data());
  EXPECT_EQ(p.v.data, s.kv.v.bytes.data());
  EXPECT_EQ(p.k.stride_token, 2 * kD);
  EXPECT_EQ(p.v.stride_head, kD);
  EXPECT_EQ(p.kv.page_table, nullptr);
  EXPECT_EQ(p.kv.cu_seqlens_k, s.cu_k.as<int>());
  EXPECT_EQ(p.kv.total_k, kTotalK);
  EXPECT_EQ(p.qi.cu_seqlens_q, s.cu_q.as<int>());
  EXPECT_EQ(p.qi.max_seqlen_q, 5);
  EXPECT_EQ(p.q2k, s.q2k.as<int>());
  EXPECT_EQ(p.out, s.out.bytes.data());
  EXPECT_EQ(p.lse, s.lse.as<float>());
  EXPECT_EQ(p.lse_temperature_out, nullptr);
  EXPECT_EQ(p.workspace, nullptr);
  EXPECT_EQ(p.workspace_bytes, 0u);
}

// Rows past cu_seqlens_q[-1] are padding (they read 0 / -inf); a flat cache may hold more rows
// than cu_seqlens_k reaches.
TEST(ValidationAttention, PaddedRowsAccepted) {
  AttnSetup s;
  s.cu_q.as<int>()[2] = 6;
  s.cu_k.as<int>()[2] = 250;
  const SparseAttnParams p = s.make();
  EXPECT_EQ(p.total_q, 8);
  EXPECT_EQ(p.qi.max_seqlen_q, 5);
}

// q2k_indices: rows of topk consecutive entries at any non-negative strides, read through
// q2k_row() (docs/semantics.md#q2k-layout); a size-1 dim's stride is not used.
TEST(ValidationAttention, Q2kRowsAtAnyStrides) {
  AttnSetup s;  // q2k (2, 8, 4)
  HostTensor buf(ST::kInt32, {2, 12, 6});
  const auto rows_at = [&](std::initializer_list<int64_t> strides, int64_t offset = 0) {
    s.a.q2k_indices = strided_ref(buf.as<int>() + offset, ST::kInt32, {2, 8, 4}, strides);
    return s.make();
  };
  SparseAttnParams p = rows_at({72, 6, 1}, 12);  // a row range of a padded head-major buffer
  EXPECT_EQ(p.q2k_head_stride, 72);
  EXPECT_EQ(p.q2k_row_stride, 6);
  EXPECT_EQ(q2k_row(p, 1, 5), buf.as<int>() + 12 + 72 + 5 * 6);
  p = rows_at({4, 8, 1});  // the transpose of a token-major buffer
  EXPECT_EQ(q2k_row(p, 1, 5), buf.as<int>() + 4 + 5 * 8);
  p = rows_at({0, 4, 1});  // one head's rows expanded over both heads
  EXPECT_EQ(q2k_row(p, 1, 5), q2k_row(p, 0, 5));
  AttnSetup one(KVKind::kFlat, ST::kBF16, ST::kBF16, 2, 1, 4);  // Hkv 1: dim 0's stride unused
  one.a.q2k_indices = with_stride(one.a.q2k_indices, 0, -7);
  EXPECT_EQ(one.make().q2k_head_stride, 0);
  AttnSetup topk1(KVKind::kFlat, ST::kBF16, ST::kBF16, 4, 2, 1);  // topk 1: last stride unused
  topk1.a.q2k_indices = with_stride(topk1.a.q2k_indices, 2, 3);
  EXPECT_NO_THROW(topk1.make());
}

TEST(ValidationAttention, PagedLengthsFromSequsedOrCuSeqlensK) {
  AttnSetup paged(KVKind::kPaged);
  SparseAttnParams p = paged.make();
  EXPECT_EQ(p.kv.page_table, paged.page_table.as<int>());
  EXPECT_EQ(p.kv.cu_seqlens_k, nullptr);
  EXPECT_EQ(p.kv.seqused_k, paged.seqused_k.as<int>());
  EXPECT_EQ(p.kv.num_pages, kPages);
  EXPECT_EQ(p.kv.max_pages, kMaxPages);
  EXPECT_EQ(p.k.stride_page, 2 * kBlockSize * kD);
  EXPECT_EQ(p.k.stride_token, kD);

  AttnSetup both(KVKind::kPagedCuK);  // docs/semantics.md#seqlen-k: cu_seqlens_k wins if passed
  p = both.make();
  EXPECT_EQ(p.kv.cu_seqlens_k, both.cu_k.as<int>());
  EXPECT_EQ(p.kv.page_table, both.page_table.as<int>());
}

TEST(ValidationAttention, PackedViewsKeepTheirStrides) {
  AttnSetup hnd(KVKind::kPackedHND);
  SparseAttnParams p = hnd.make();
  EXPECT_EQ(p.k.data, hnd.kv.cache.bytes.data());
  EXPECT_EQ(p.v.data, hnd.kv.cache.bytes.data() + kD * 2);
  EXPECT_EQ(p.k.stride_token, 2 * kD);
  EXPECT_EQ(p.k.stride_head, kBlockSize * 2 * kD);
  EXPECT_EQ(p.k.stride_page, 2 * kBlockSize * 2 * kD);
  EXPECT_EQ(p.v.stride_page, p.k.stride_page);

  AttnSetup nhd(KVKind::kPackedNHD, ST::kBF16, ST::kFP8E4M3);
  p = nhd.make();
  EXPECT_EQ(p.k.dtype, DType::kFP8E4M3);
  EXPECT_EQ(p.v.data, nhd.kv.cache.bytes.data() + kD);
  EXPECT_EQ(p.k.stride_token, 2 * 2 * kD);
  EXPECT_EQ(p.k.stride_head, 2 * kD);
}

TEST(ValidationAttention, Nvfp4KVAndScales) {
  for (KVKind kind : {KVKind::kFlatNvfp4, KVKind::kPagedNvfp4}) {
    AttnSetup s(kind);
    s.a.kv.k_global_scale = 0.5;
    s.a.kv.v_global_scale = 3.0;
    const SparseAttnParams p = s.make();
    EXPECT_EQ(p.k.dtype, DType::kNVFP4);
    EXPECT_EQ(p.k.scale, s.kv.k_scale.as<uint8_t>());
    EXPECT_EQ(p.v.scale, s.kv.v_scale.as<uint8_t>());
    EXPECT_EQ(p.k.scale_bytes, nvfp4_scale_bytes(s.kv.scale_rows));
    EXPECT_EQ(p.k_global_scale, 0.5f);
    EXPECT_EQ(p.v_global_scale, 3.0f);
    if (kind == KVKind::kPagedNvfp4) {
      EXPECT_EQ(p.k.stride_token, kNvfp4Width);  // bytes
      EXPECT_EQ(p.k.stride_head, kBlockSize * kNvfp4Width);
    }
  }
}

TEST(ValidationAttention, KGlobalScaleOnlyForNvfp4) {
  AttnSetup s(KVKind::kFlat, ST::kBF16, ST::kFP8E4M3);
  s.a.kv.k_global_scale = 0.25;  // docs/semantics.md#fp8-kv: ignored for fp8
  s.a.kv.v_global_scale = 2.0;   // applied for every dtype
  s.a.softmax_scale = 0.5;
  const SparseAttnParams p = s.make();
  EXPECT_EQ(p.k_global_scale, 1.0f);
  EXPECT_EQ(p.v_global_scale, 2.0f);
  EXPECT_EQ(p.softmax_scale, 0.5f);
}

TEST(ValidationAttention, OptionalOutputsAndWorkspace) {
  AttnSetup s;
  s.lse_t = HostTensor(ST::kFloat32, {kTotalQ, 4});
  s.workspace = HostTensor(ST::kUInt8, {4096});
  s.a.lse_temperature = s.lse_t.ref();
  s.a.lse_temperature_scale = 0.7;
  s.a.lse = TensorRef{};
  s.a.workspace = s.workspace.ref();
  const SparseAttnParams p = s.make();
  EXPECT_EQ(p.lse, nullptr);
  EXPECT_EQ(p.lse_temperature_out, s.lse_t.as<float>());
  EXPECT_FLOAT_EQ(p.lse_temperature, 0.7f);
  EXPECT_EQ(p.workspace, s.workspace.bytes.data());
  EXPECT_EQ(p.workspace_bytes, 4096u);
}

TEST(ValidationAttention, LseTemperatureScaleUncheckedWhenNotReturned) {
  AttnSetup s;
  s.a.lse_temperature_scale = -1.0;
  EXPECT_EQ(s.make().lse_temperature, 1.0f);
}

TEST(ValidationAttention, GroupSizesAndTopk) {
  // D6: any G (here 3, 12 and 1); D4: topk 1..64 (FlashInfer's prefill: 4/8/16/32 only).
  EXPECT_EQ(AttnSetup(KVKind::kFlat, ST::kBF16, ST::kBF16, 6, 2).make().num_heads, 6);
  EXPECT_EQ(AttnSetup(KVKind::kPaged, ST::kFP16, ST::kFP16, 12, 1).make().num_kv_heads, 1);
  EXPECT_EQ(AttnSetup(KVKind::kFlat, ST::kBF16, ST::kBF16, 2, 2, 64).make().topk, 64);
  EXPECT_EQ(AttnSetup(KVKind::kFlat, ST::kBF16, ST::kBF16, 4, 2, 1).make().topk, 1);
}

TEST(ValidationAttention, StridesOfSizeOneDimsAreNormalized) {
  // torch gives size-1 dims arbitrary strides; Params carry the row-major ones.
  AttnSetup s(KVKind::kPaged, ST::kBF16, ST::kBF16, 4, 1);
  s.a.kv.k = with_stride(s.a.kv.k, 1, 12345);
  s.a.kv.v = with_stride(s.a.kv.v, 1, 777);
  const SparseAttnParams p = s.make();
  EXPECT_EQ(p.k.stride_head, kBlockSize * kD);
  EXPECT_EQ(p.v.stride_head, kBlockSize * kD);
}

TEST(ValidationAttention, FailedCallWritesNothing) {
  AttnSetup s;
  std::memset(s.out.bytes.data(), 0x5A, s.out.bytes.size());
  s.a.q2k_indices = with_dtype(s.a.q2k_indices, ST::kInt64);
  EXPECT_THROW(s.make(), Error);
  for (uint8_t b : s.out.bytes) ASSERT_EQ(b, 0x5A);
}

TEST(ValidationDecode, PagedBaselineFillsParams) {
  DecodeSetup s;
  const SparseDecodeParams d = s.make();
  const SparseAttnParams& p = d.attn;
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.total_q, 6);
  EXPECT_EQ(p.num_heads, 6);
  EXPECT_EQ(p.num_kv_heads, 2);  // G = 3: FlashInfer's decode would accept it, D6 any G
  EXPECT_TRUE(p.causal);          // decode's default
  EXPECT_EQ(p.qi.cu_seqlens_q, nullptr);
  EXPECT_EQ(p.qi.seqlen_q, 2);
  EXPECT_EQ(p.qi.max_seqlen_q, 2);
  EXPECT_EQ(p.kv.seqused_k, s.seqused_k.as<int>());
  EXPECT_EQ(p.kv.cu_seqlens_k, nullptr);
  EXPECT_EQ(p.kv.page_table, s.page_table.as<int>());
  EXPECT_EQ(p.out_dtype, DType::kBF16);
  EXPECT_EQ(d.partial_dtype, PartialDType::kBF16);
  EXPECT_EQ(d.force_fused, -1);
  EXPECT_EQ(p.lse, s.lse.as<float>());
  EXPECT_EQ(p.lse_temperature_out, nullptr);
}

TEST(ValidationDecode, FlatAndSchedulingKnobs) {
  DecodeSetup s(KVKind::kFlat, ST::kFP16, ST::kFP16);
  s.a.force_fused = false;
  SparseDecodeParams d = s.make();
  EXPECT_EQ(d.attn.kv.cu_seqlens_k, s.cu_k.as<int>());
  EXPECT_EQ(d.attn.kv.page_table, nullptr);
  EXPECT_EQ(d.attn.kv.total_k, kTotalK);
  EXPECT_EQ(d.partial_dtype, PartialDType::kFP16);
  EXPECT_EQ(d.force_fused, 0);
  s.a.force_fused = true;
  s.a.partial_dtype = PartialDType::kFloat32;
  d = s.make();
  EXPECT_EQ(d.force_fused, 1);
  EXPECT_EQ(d.partial_dtype, PartialDType::kFloat32);
}

TEST(ValidationDecode, Fp8QueryComputesInBf16) {
  DecodeSetup s(KVKind::kPaged, ST::kFP8E4M3, ST::kBF16);
  const SparseDecodeParams d = s.make();
  EXPECT_EQ(d.attn.q_dtype, DType::kFP8E4M3);
  EXPECT_EQ(d.attn.k.dtype, DType::kBF16);
  EXPECT_EQ(d.attn.out_dtype, DType::kBF16);
  EXPECT_EQ(d.partial_dtype, PartialDType::kBF16);
  EXPECT_EQ(DecodeSetup(KVKind::kPagedNvfp4, ST::kFP8E4M3).make().attn.k.dtype, DType::kNVFP4);
  EXPECT_EQ(DecodeSetup(KVKind::kPackedNHD, ST::kFP8E4M3, ST::kFP8E4M3).make().attn.k.dtype,
            DType::kFP8E4M3);
}

TEST(ValidationDecode, GroupsAbove16) {
  // FlashInfer's decode raises for G > 16; D6 lifts it.
  EXPECT_EQ(DecodeSetup(KVKind::kPaged, ST::kBF16, ST::kBF16, 64, 2).make().attn.num_heads, 64);
}

// ---- host-readable contents and packed views, directly -----------------------------------------

TEST(ValidationHostValues, CuSeqlens) {
  const std::vector<int> ok = {0, 5, 5, 8};
  EXPECT_NO_THROW(check_cu_seqlens(ok.data(), 4, 8, "cu_seqlens_q"));
  EXPECT_NO_THROW(check_cu_seqlens(ok.data(), 4, -1, "cu_seqlens_k"));  // no total to match
  const std::vector<int> start = {1, 5, 8}, down = {0, 5, 4, 8};
  expect_error([&] { check_cu_seqlens(start.data(), 3, 8, "cu_seqlens_q"); }, ErrorKind::kValue,
               "cu_seqlens_q", "[0] must be 0");
  expect_error([&] { check_cu_seqlens(down.data(), 4, 8, "cu_seqlens_k"); }, ErrorKind::kValue,
               "cu_seqlens_k", "non-decreasing");
  EXPECT_NO_THROW(check_cu_seqlens(ok.data(), 4, 9, "cu_seqlens_q"));  // row 8 is padding
  expect_error([&] { check_cu_seqlens(ok.data(), 4, 7, "cu_seqlens_q"); }, ErrorKind::kValue,
               "cu_seqlens_q", "[-1] must be <= the number of rows it indexes (7), got 8");
  expect_error([&] { check_cu_seqlens(ok.data(), 1, 0, "cu_seqlens_q"); }, ErrorKind::kValue,
               "cu_seqlens_q", ">= 2 entries");
}

TEST(ValidationHostValues, SequsedK) {
  const std::vector<int> ok = {0, 1 << 30, 5}, bad = {3, -1};
  EXPECT_NO_THROW(check_seqused_k(ok.data(), 3, "seqused_k"));  // beyond the page table: clamped
  expect_error([&] { check_seqused_k(bad.data(), 2, "seqused_k"); }, ErrorKind::kValue,
               "seqused_k", "[1] must be >= 0");
}

struct PackedGeometry {
  HostTensor cache = HostTensor(ST::kBF16, {4, 128, 2, 2 * kD});  // NHD storage, 256 per token
  TensorRef k = strided_ref(cache.bytes.data(), ST::kBF16, {4, 2, 128, kD},
                            {128 * 2 * 2 * kD, 2 * kD, 2 * 2 * kD, 1});
  TensorRef v = shifted(k, kD * 2);
};

TEST(ValidationPackedKV, AcceptsHndNhdAndSizeOneDims) {
  PackedGeometry g;
  EXPECT_TRUE(is_packed_kv(g.k, g.v));  // NHD
  HostTensor hnd(ST::kFP16, {3, 2, 128, 2 * kD});
  TensorRef k = strided_ref(hnd.bytes.data(), ST::kFP16, {3, 2, 128, kD},
                            {2 * 128 * 2 * kD, 128 * 2 * kD, 2 * kD, 1});
  EXPECT_TRUE(is_packed_kv(k, shifted(k, kD * 2)));
  // One kv head and one page: those dims may carry any stride.
  TensorRef one = strided_ref(hnd.bytes.data(), ST::kFP8E4M3, {1, 1, 128, kD}, {0, 99, 2 * kD, 1});
  EXPECT_TRUE(is_packed_kv(one, shifted(one, kD)));
}

TEST(ValidationPackedKV, PermutedSeparateViews) {
  // Separate K and V caches with NHD pages (P, 128, Hkv, 128), seen as (P, Hkv, 128, 128).
  HostTensor kc(ST::kBF16, {4, 128, 2, kD}), vc(ST::kBF16, {4, 128, 2, kD});
  TensorRef k = strided_ref(kc.bytes.data(), ST::kBF16, {4, 2, 128, kD}, {128 * 2 * kD, kD, 2 * kD, 1});
  TensorRef v = strided_ref(vc.bytes.data(), ST::kBF16, {4, 2, 128, kD}, {128 * 2 * kD, kD, 2 * kD, 1});
  EXPECT_TRUE(is_permuted_kv(k, v));
  EXPECT_FALSE(is_packed_kv(k, v));  // two caches, not one packed cache
  EXPECT_TRUE(is_permuted_kv(with_dtype(k, ST::kFP8E4M3), with_dtype(v, ST::kFP8E4M3)));
  EXPECT_FALSE(is_permuted_kv(k, with_stride(v, 2, 4 * kD)));     // strides differ
  EXPECT_FALSE(is_permuted_kv(with_dtype(k, ST::kUInt8), with_dtype(v, ST::kUInt8)));  // NVFP4
  TensorRef padded = strided_ref(kc.bytes.data(), ST::kBF16, {4, 2, 128, kD}, {128 * 2 * 144, 144, 2 * 144, 1});
  EXPECT_FALSE(is_permuted_kv(padded, padded));                    // token rows padded: not compact
  TensorRef overlap = with_stride(k, 0, kD);
  EXPECT_FALSE(is_permuted_kv(overlap, overlap));                  // pages overlap heads
  TensorRef last = with_stride(k, 3, 2);
  EXPECT_FALSE(is_permuted_kv(last, last));                        // non-unit last stride
  // One page: its stride may differ between K and V (never used; kv_tensor sets one value).
  TensorRef k1 = strided_ref(kc.bytes.data(), ST::kBF16, {1, 2, 128, kD}, {7, kD, 2 * kD, 1});
  TensorRef v1 = with_stride(k1, 0, 128 * 2 * kD);
  v1.data = vc.bytes.data();
  EXPECT_TRUE(is_permuted_kv(k1, v1));
}

TEST(ValidationPackedKV, RejectsOtherGeometries) {
  PackedGeometry g;
  EXPECT_FALSE(is_packed_kv(g.k, shifted(g.k, kD * 2 + 2)));  // v not 128 elements after k
  EXPECT_FALSE(is_packed_kv(g.k, shifted(g.k, -kD * 2)));     // v before k
  EXPECT_FALSE(is_packed_kv(g.k, with_stride(g.v, 2, 8 * kD)));  // strides differ
  // Token rows padded to 288 values: not a compact buffer.
  TensorRef pk = strided_ref(g.k.data, ST::kBF16, {4, 2, 128, kD}, {128 * 2 * 288, 288, 2 * 288, 1});
  EXPECT_FALSE(is_packed_kv(pk, shifted(pk, kD * 2)));
  // Two sized dims with the same stride (overlapping pages).
  TensorRef ov = with_stride(g.k, 0, 2 * kD);
  EXPECT_FALSE(is_packed_kv(ov, shifted(ov, kD * 2)));
  // Non-unit last stride, and K/V halves that interleave element by element.
  TensorRef il = strided_ref(g.k.data, ST::kBF16, {4, 2, 128, kD},
                             {128 * 2 * 2 * kD, 2 * kD, 2 * 2 * kD, 2});
  EXPECT_FALSE(is_packed_kv(il, shifted(il, 2)));
  // NVFP4 data, flat (3-D) views and mismatched dtypes are never packed views.
  EXPECT_FALSE(is_packed_kv(with_dtype(g.k, ST::kUInt8), with_dtype(shifted(g.k, kD), ST::kUInt8)));
  TensorRef flat = strided_ref(g.k.data, ST::kBF16, {512, 2, kD}, {2 * kD, 128 * 2 * 2 * kD, 1});
  EXPECT_FALSE(is_packed_kv(flat, shifted(flat, kD * 2)));
  EXPECT_FALSE(is_packed_kv(g.k, with_dtype(g.v, ST::kFP16)));
  // Two separate contiguous caches are not a packed pair.
  HostTensor k2(ST::kBF16, {4, 2, 128, kD});
  EXPECT_FALSE(is_packed_kv(k2.ref(), shifted(k2.ref(), kD * 2)));
}

// ---- rejected inputs, as data ----------------------------------------------------------------

template <typename Setup>
struct Reject {
  const char* name;                     // test name suffix
  std::function<std::unique_ptr<Setup>()> setup;
  std::function<void(Setup&)> mutate;
  ErrorKind kind;
  const char* arg;                      // the Python argument the message must name
  const char* reason;                   // a fragment of the message
};
template <typename Setup>
void PrintTo(const Reject<Setup>& r, std::ostream* os) {
  *os << r.name;
}
template <typename Setup>
std::string case_name(const ::testing::TestParamInfo<Reject<Setup>>& info) {
  return info.param.name;
}

constexpr ErrorKind kV = ErrorKind::kValue;
constexpr ErrorKind kNS = ErrorKind::kNotSupported;

// -- msa_proxy_score

using ProxyReject = Reject<ProxySetup>;
std::unique_ptr<ProxySetup> proxy_flat() { return std::make_unique<ProxySetup>(false); }
std::unique_ptr<ProxySetup> proxy_paged() { return std::make_unique<ProxySetup>(true); }

const std::vector<ProxyReject> kProxyRejects = {
    {"QFloat32", proxy_flat, [](ProxySetup& s) { s.a.q.dtype = ST::kFloat32; }, kV, "q", "must be bf16, fp16, or fp8 e4m3"},
    {"QInt8Other", proxy_flat, [](ProxySetup& s) { s.a.q.dtype = ST::kOther; }, kV, "q", "got unsupported dtype"},
    {"Fp8QWithBf16K", proxy_flat, [](ProxySetup& s) { s.a.q.dtype = ST::kFP8E4M3; }, kV, "k", "fp8 q requires fp8 k"},
    {"KDtypeMismatch", proxy_flat, [](ProxySetup& s) { s.a.k.dtype = ST::kFP16; }, kV, "k", "k dtype must match q"},
    {"KNvfp4", proxy_flat, [](ProxySetup& s) { s.a.k.dtype = ST::kUInt8; }, kV, "k", "k dtype must match q"},
    {"Q2D", proxy_flat, [](ProxySetup& s) { s.a.q = reshaped(s.a.q, {8, 4 * kD}); }, kV, "q", "q must be 3D"},
    {"QTooManyDims", proxy_flat, [](ProxySetup& s) { s.a.q.ndim = 5; }, kV, "q", "at most 4 dims"},
    {"HeadDim64", proxy_flat, [](ProxySetup& s) { s.a.q = reshaped(s.a.q, {8, 8, 64}); }, kV, "q", "head_dim must be 128, got 64"},
    {"HeadsNotMultiple", proxy_flat, [](ProxySetup& s) { s.a.q = reshaped(s.a.q, {8, 3, kD}); }, kV, "num_qo_heads", "must be a multiple of num_kv_heads"},
    {"ZeroKvHeads", proxy_flat, [](ProxySetup& s) { s.a.k = reshaped(s.a.k, {kTotalK, 0, kD}); }, kV, "k", "num_kv_heads >= 1"},
    {"QNotContiguous", proxy_flat, [](ProxySetup& s) { s.a.q = with_stride(s.a.q, 0, 8 * kD); }, kV, "q", "q must be contiguous"},
    {"QMisaligned", proxy_flat, [](ProxySetup& s) { s.a.q = shifted(s.a.q, 2); }, kV, "q", "16-byte aligned"},
    {"QNoData", proxy_flat, [](ProxySetup& s) { s.a.q.data = nullptr; }, kV, "q", "no data pointer"},
    {"KOtherDevice", proxy_flat, [](ProxySetup& s) { s.a.k.device = 0; }, kV, "k", "must be on the same device as q (cpu), got cuda:0"},
    {"KNotContiguous", proxy_paged, [](ProxySetup& s) { s.a.k = with_stride(s.a.k, 2, 2 * kD); }, kV, "k", "k must be contiguous"},
    {"PagedWithoutSeqused", proxy_paged, [](ProxySetup& s) { s.a.seqused_k = TensorRef{}; }, kV, "seqused_k", "paged proxy requires seqused_k"},
    {"PagedKShape", proxy_paged, [](ProxySetup& s) { s.a.k = reshaped(s.a.k, {kPages * 2, 2, 64, kD}); }, kV, "k", "paged k must be (num_pages, num_kv_heads, 128, 128)"},
    {"PagedK3D", proxy_paged, [](ProxySetup& s) { s.a.k = reshaped(s.a.k, {kPages * 128, 2, kD}); }, kV, "k", "paged k must be"},
    {"FlatWithoutCuSeqlensK", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_k = TensorRef{}; }, kV, "cu_seqlens_k", "flat proxy requires cu_seqlens_k"},
    {"FlatK4D", proxy_flat, [](ProxySetup& s) { s.a.k = reshaped(s.a.k, {3, 110, 2, kD}); }, kV, "k", "flat k must be"},
    {"FlatKWidth", proxy_flat, [](ProxySetup& s) { s.a.k = reshaped(s.a.k, {kTotalK, 4, 64}); }, kV, "k", "flat k must be"},
    {"OutputMissing", proxy_flat, [](ProxySetup& s) { s.a.output = TensorRef{}; }, kV, "output", "must be given"},
    {"OutputShape", proxy_flat, [](ProxySetup& s) { s.a.output = reshaped(s.a.output, {4, 8, 2}); }, kV, "output", "output must be (4, 2, 8)"},
    {"OutputShapeReduce", proxy_flat, [](ProxySetup& s) { s.a.reduce_heads = true; }, kV, "output", "output must be (1, 2, 8)"},
    {"OutputMaxKTiles", proxy_flat, [](ProxySetup& s) { s.a.max_k_tiles = 3; }, kV, "output", "output must be (4, 3, 8)"},
    {"OutputDtype", proxy_flat, [](ProxySetup& s) { s.a.output.dtype = ST::kFP16; }, kV, "output", "output must be float32"},
    {"OutputNotContiguous", proxy_flat, [](ProxySetup& s) { s.a.output = with_stride(s.a.output, 2, 2); }, kV, "output", "output must be contiguous"},
    {"OutputOtherDevice", proxy_flat, [](ProxySetup& s) { s.a.output.device = 2; }, kV, "output", "same device as q"},
    {"MaxKTilesZero", proxy_flat, [](ProxySetup& s) { s.a.max_k_tiles = 0; }, kV, "max_k_tiles", "must be >= 1"},
    {"MaxKTilesOverflow", proxy_flat, [](ProxySetup& s) { s.a.max_k_tiles = int64_t(1) << 32; s.a.output = reshaped(s.a.output, {4, int64_t(1) << 32, 8}); }, kV, "max_k_tiles", "must be <= 16777216 (2^31 keys / 128), got 4294967296"},
    {"MaxKTilesBeyondKeys", proxy_flat, [](ProxySetup& s) { s.a.max_k_tiles = (1 << 24) + 1; s.a.output = reshaped(s.a.output, {4, (1 << 24) + 1, 8}); }, kV, "max_k_tiles", "must be <= 16777216"},
    {"OutputOverQ", proxy_flat, [](ProxySetup& s) { s.a.output.data = s.a.q.data; }, kV, "output", "output must not share memory with q"},
    {"OutputOverCuSeqlensQ", proxy_flat, [](ProxySetup& s) { s.a.output.data = s.a.cu_seqlens_q.data; }, kV, "output", "must not share memory with cu_seqlens_q"},
    {"OutputOverPageTable", proxy_paged, [](ProxySetup& s) { s.a.output.data = static_cast<char*>(s.a.page_table.data) - 16; }, kV, "output", "must not share memory with page_table"},
    {"MaxSeqlenQNegative", proxy_flat, [](ProxySetup& s) { s.a.max_seqlen_q = -1; }, kV, "max_seqlen_q", "must be >= 0"},
    {"CuSeqlensQMissing", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q = TensorRef{}; }, kV, "cu_seqlens_q", "cu_seqlens_q must be given"},
    {"CuSeqlensQInt64", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q.dtype = ST::kInt64; }, kV, "cu_seqlens_q", "must be 1-D int32"},
    {"CuSeqlensQ2D", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q = reshaped(s.a.cu_seqlens_q, {3, 1}); }, kV, "cu_seqlens_q", "must be 1-D int32"},
    {"CuSeqlensQOneEntry", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q = reshaped(s.a.cu_seqlens_q, {1}); }, kV, "cu_seqlens_q", ">= 2 entries"},
    {"CuSeqlensQStrided", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q = with_stride(s.a.cu_seqlens_q, 0, 2); }, kV, "cu_seqlens_q", "must be contiguous"},
    {"CuSeqlensQOtherDevice", proxy_flat, [](ProxySetup& s) { s.a.cu_seqlens_q.device = 0; }, kV, "cu_seqlens_q", "same device as q"},
    {"CuSeqlensQStart", proxy_flat, [](ProxySetup& s) { s.cu_q.as<int>()[0] = 1; }, kV, "cu_seqlens_q", "cu_seqlens_q[0] must be 0"},
    {"CuSeqlensQDecreasing", proxy_flat, [](ProxySetup& s) { s.cu_q.as<int>()[1] = 9; }, kV, "cu_seqlens_q", "must be non-decreasing"},
    {"CuSeqlensQTotal", proxy_flat, [](ProxySetup& s) { s.cu_q.as<int>()[2] = 9; }, kV, "cu_seqlens_q", "[-1] must be <= q.shape[0] (total_q) (8), got 9"},
    {"CuSeqlensKCount", proxy_flat, [](ProxySetup& s) { s.cu_k = cu_seqlens({200, 100, 30}); s.a.cu_seqlens_k = s.cu_k.ref(); }, kV, "cu_seqlens_k", "must have batch_size + 1 = 3 entries"},
    {"CuSeqlensKTotal", proxy_flat, [](ProxySetup& s) { s.cu_k.as<int>()[2] = 331; }, kV, "cu_seqlens_k", "[-1] must be <= k.shape[0]"},
    {"PageTableInt64", proxy_paged, [](ProxySetup& s) { s.a.page_table.dtype = ST::kInt64; }, kV, "page_table", "page_table must be int32 of shape (batch, max_pages)"},
    {"PageTable1D", proxy_paged, [](ProxySetup& s) { s.a.page_table = reshaped(s.a.page_table, {6}); }, kV, "page_table", "page_table must be int32 of shape"},
    {"PageTableRows", proxy_paged, [](ProxySetup& s) { s.a.page_table = reshaped(s.a.page_table, {3, 2}); }, kV, "page_table", "batch_size = 2 rows"},
    {"PageTableColumnStride", proxy_paged, [](ProxySetup& s) { s.a.page_table = with_stride(s.a.page_table, 1, 2); }, kV, "page_table", "contiguous in its last dim"},
    {"SequsedCount", proxy_paged, [](ProxySetup& s) { s.a.seqused_k = reshaped(s.a.seqused_k, {1}); }, kV, "seqused_k", "must have len(cu_seqlens_q) - 1 = 2 entries"},
    {"SequsedInt64", proxy_paged, [](ProxySetup& s) { s.a.seqused_k.dtype = ST::kInt64; }, kV, "seqused_k", "must be 1-D int32"},
    {"SequsedNegative", proxy_paged, [](ProxySetup& s) { s.seqused_k.as<int>()[1] = -3; }, kV, "seqused_k", "seqused_k[1] must be >= 0, got -3"},
    {"QOffsetInt64", proxy_flat, [](ProxySetup& s) { s.qoff = HostTensor(ST::kInt64, {2}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "q_offset must be int32"},
    {"QOffsetCount", proxy_flat, [](ProxySetup& s) { s.qoff = int_tensor({1, 2, 3}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "batch_size = 2 entries"},
    {"QOffset2D", proxy_flat, [](ProxySetup& s) { s.qoff = int_tensor({1, 2}, {2, 1}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "must be 1-D int32"},
    {"QOffsetOtherDevice", proxy_flat, [](ProxySetup& s) { s.qoff = int_tensor({1, 2}); s.a.q_offset.tensor = on_device(s.qoff.ref(), 0); }, kV, "q_offset", "same device as q"},
    {"QOffsetIntOverflow", proxy_flat, [](ProxySetup& s) { s.a.q_offset.value = int64_t(1) << 31; }, kV, "q_offset", "does not fit in int32"},
    {"QOffsetBoth", proxy_flat, [](ProxySetup& s) { s.qoff = int_tensor({1, 2}); s.a.q_offset.tensor = s.qoff.ref(); s.a.q_offset.value = 3; }, kV, "q_offset", "not both"},
};

class ProxyRejectTest : public ::testing::TestWithParam<ProxyReject> {};
TEST_P(ProxyRejectTest, Throws) {
  const ProxyReject& r = GetParam();
  std::unique_ptr<ProxySetup> s = r.setup();
  ASSERT_NO_THROW(s->make()) << "baseline must be valid";
  r.mutate(*s);
  expect_error([&] { s->make(); }, r.kind, r.arg, r.reason);
}
INSTANTIATE_TEST_SUITE_P(ValidationProxy, ProxyRejectTest, ::testing::ValuesIn(kProxyRejects),
                         case_name<ProxySetup>);

// -- msa_topk_select

using TopkReject = Reject<TopkSetup>;
std::unique_ptr<TopkSetup> topk4() { return std::make_unique<TopkSetup>(); }

const std::vector<TopkReject> kTopkRejects = {
    {"ScoreMissing", topk4, [](TopkSetup& s) { s.a.max_score = TensorRef{}; }, kV, "max_score", "must be given"},
    {"ScoreFloat16", topk4, [](TopkSetup& s) { s.a.max_score.dtype = ST::kFP16; }, kV, "max_score", "max_score must be float32, got float16"},
    {"ScoreNotContiguous", topk4, [](TopkSetup& s) { s.a.max_score = with_stride(s.a.max_score, 2, 2); }, kV, "max_score", "max_score must be contiguous"},
    {"Score2D", topk4, [](TopkSetup& s) { s.a.max_score = reshaped(s.a.max_score, {16, 5}); }, kV, "max_score", "max_score must be 3D"},
    {"ScoreMisaligned", topk4, [](TopkSetup& s) { s.a.max_score = shifted(s.a.max_score, 2); }, kV, "max_score", "4-byte aligned"},
    {"TopkZero", topk4, [](TopkSetup& s) { s.a.topk = 0; }, kV, "topk", "topk must be >= 1"},
    {"TopkNegative", topk4, [](TopkSetup& s) { s.a.topk = -16; }, kV, "topk", "topk must be >= 1"},
    {"Topk65", topk4, [](TopkSetup& s) { s.a.topk = 65; s.a.output = reshaped(s.a.output, {5, 2, 65}); }, kNS, "topk", "topk must be <= 64"},
    {"ForceBeginNegative", topk4, [](TopkSetup& s) { s.a.force_begin_blocks = -1; }, kV, "force_begin_blocks", "must be >= 0"},
    {"ForceEndNegative", topk4, [](TopkSetup& s) { s.a.force_end_blocks = -2; }, kV, "force_end_blocks", "must be >= 0"},
    {"ForcedHuge", topk4, [](TopkSetup& s) { s.a.force_begin_blocks = std::numeric_limits<int64_t>::max(); s.a.force_end_blocks = std::numeric_limits<int64_t>::max(); }, kV, "force_end_blocks", "must be <= topk (4)"},
    {"ForcedAboveTopk", topk4, [](TopkSetup& s) { s.a.force_begin_blocks = 3; s.a.force_end_blocks = 2; }, kV, "force_begin_blocks", "must be <= topk (4)"},
    {"NvpZero", topk4, [](TopkSetup& s) { s.a.num_valid_pages_value = 0; }, kV, "num_valid_pages", "must be in (0, max_k_tiles=8], got 0"},
    {"NvpAboveBlocks", topk4, [](TopkSetup& s) { s.a.num_valid_pages_value = 9; }, kV, "num_valid_pages", "must be in (0, max_k_tiles=8], got 9"},
    {"NvpHuge", topk4, [](TopkSetup& s) { s.a.num_valid_pages_value = int64_t(1) << 40; }, kV, "num_valid_pages", "must be in (0, max_k_tiles=8]"},
    {"ForcedAboveNvp", topk4, [](TopkSetup& s) { s.a.num_valid_pages_value = 2; s.a.force_begin_blocks = 1; s.a.force_end_blocks = 2; }, kV, "num_valid_pages", "must be <= num_valid_pages (2)"},
    {"NoBlocks", topk4, [](TopkSetup& s) { s.a.max_score = reshaped(s.a.max_score, {2, 0, 5}); }, kV, "num_valid_pages", "must be in (0, max_k_tiles=0]"},
    {"NvpTensorInt64", topk4, [](TopkSetup& s) { s.a.num_valid_pages = with_dtype(s.nvp.ref(), ST::kInt64); }, kV, "num_valid_pages", "tensor must be 1D int32"},
    {"NvpTensor2D", topk4, [](TopkSetup& s) { s.a.num_valid_pages = reshaped(s.nvp.ref(), {5, 1}); }, kV, "num_valid_pages", "tensor must be 1D int32"},
    {"NvpTensorCount", topk4, [](TopkSetup& s) { s.a.num_valid_pages = reshaped(s.nvp.ref(), {4}); }, kV, "num_valid_pages", "must have total_qo_len (5) entries, got 4"},
    {"NvpTensorStrided", topk4, [](TopkSetup& s) { s.a.num_valid_pages = with_stride(s.nvp.ref(), 0, 2); }, kV, "num_valid_pages", "tensor must be contiguous"},
    {"NvpTensorOtherDevice", topk4, [](TopkSetup& s) { s.a.num_valid_pages = on_device(s.nvp.ref(), 3); }, kV, "num_valid_pages", "same device as max_score (cpu), got cuda:3"},
    {"NvpBoth", topk4, [](TopkSetup& s) { s.a.num_valid_pages = s.nvp.ref(); s.a.num_valid_pages_value = 4; }, kV, "num_valid_pages", "not both"},
    {"OutputMissing", topk4, [](TopkSetup& s) { s.a.output = TensorRef{}; }, kV, "output", "must be given"},
    {"OutputOverScore", topk4, [](TopkSetup& s) { s.a.output.data = static_cast<float*>(s.a.max_score.data) + 4; }, kV, "output", "output must not share memory with max_score"},
    {"OutputOverNvpTensor", topk4, [](TopkSetup& s) { s.a.num_valid_pages = s.nvp.ref(); s.a.output.data = s.a.num_valid_pages.data; }, kV, "output", "must not share memory with num_valid_pages"},
    {"OutputShape", topk4, [](TopkSetup& s) { s.a.output = reshaped(s.a.output, {2, 5, 4}); }, kV, "output", "output shape must be (5, 2, 4)"},
    {"OutputTopk", topk4, [](TopkSetup& s) { s.a.output = reshaped(s.a.output, {5, 2, 16}); }, kV, "output", "output shape must be (5, 2, 4)"},
    {"OutputDtype", topk4, [](TopkSetup& s) { s.a.output.dtype = ST::kInt64; }, kV, "output", "output must be int32, got int64"},
    {"OutputTokensOverlap", topk4, [](TopkSetup& s) { s.a.output = with_stride(s.a.output, 0, 4); }, kV, "output", "output must have unit stride in its last dim and rows that do not overlap"},
    {"OutputRowsNotContiguous", topk4, [](TopkSetup& s) { s.a.output = with_stride(with_stride(with_stride(s.a.output, 2, 2), 1, 8), 0, 16); }, kV, "output", "output must have unit stride in its last dim"},
    {"OutputHeadMajorOverlap", topk4, [](TopkSetup& s) { s.a.output = with_stride(with_stride(s.a.output, 0, 4), 1, 16); }, kV, "output", "rows that do not overlap"},
    {"OutputHeadsShareRows", topk4, [](TopkSetup& s) { s.a.output = with_stride(s.a.output, 1, 0); }, kV, "output", "rows that do not overlap"},
    {"OutputOtherDevice", topk4, [](TopkSetup& s) { s.a.output.device = 0; }, kV, "output", "same device as max_score"},
};

class TopkRejectTest : public ::testing::TestWithParam<TopkReject> {};
TEST_P(TopkRejectTest, Throws) {
  const TopkReject& r = GetParam();
  std::unique_ptr<TopkSetup> s = r.setup();
  ASSERT_NO_THROW(s->make()) << "baseline must be valid";
  r.mutate(*s);
  expect_error([&] { s->make(); }, r.kind, r.arg, r.reason);
}
INSTANTIATE_TEST_SUITE_P(ValidationTopk, TopkRejectTest, ::testing::ValuesIn(kTopkRejects),
                         case_name<TopkSetup>);

// -- msa_sparse_attention

using AttnReject = Reject<AttnSetup>;
std::unique_ptr<AttnSetup> attn_flat() { return std::make_unique<AttnSetup>(); }
std::unique_ptr<AttnSetup> attn_paged() { return std::make_unique<AttnSetup>(KVKind::kPaged); }
std::unique_ptr<AttnSetup> attn_paged_cuk() { return std::make_unique<AttnSetup>(KVKind::kPagedCuK); }
std::unique_ptr<AttnSetup> attn_nvfp4() { return std::make_unique<AttnSetup>(KVKind::kPagedNvfp4); }
std::unique_ptr<AttnSetup> attn_nvfp4_flat() { return std::make_unique<AttnSetup>(KVKind::kFlatNvfp4); }
std::unique_ptr<AttnSetup> attn_packed() { return std::make_unique<AttnSetup>(KVKind::kPackedHND); }
std::unique_ptr<AttnSetup> attn_fp8() { return std::make_unique<AttnSetup>(KVKind::kPaged, ST::kBF16, ST::kFP8E4M3); }

const std::vector<AttnReject> kAttnRejects = {
    {"OutputOverQ", attn_flat, [](AttnSetup& s) { s.a.output.data = s.a.q.data; }, kV, "out", "out must not share memory with q"},
    {"OutputOverV", attn_paged, [](AttnSetup& s) { s.a.output.data = s.a.kv.v.data; }, kV, "out", "out must not share memory with v"},
    {"LseOverOutput", attn_flat, [](AttnSetup& s) { s.a.lse.data = s.a.output.data; }, kV, "out", "must not share memory with lse"},
    {"LseOverQ2k", attn_flat, [](AttnSetup& s) { s.a.lse.data = s.a.q2k_indices.data; }, kV, "lse", "lse must not share memory with q2k_indices"},
    {"WorkspaceOverK", attn_flat, [](AttnSetup& s) { s.workspace = HostTensor(ST::kUInt8, {64}); s.a.workspace = s.workspace.ref(); s.a.workspace.data = s.a.kv.k.data; }, kV, "workspace", "workspace must not share memory with k"},
    {"LseTemperatureOverLse", attn_flat, [](AttnSetup& s) { s.a.lse_temperature = s.a.lse; }, kV, "lse", "must not share memory with lse_temperature"},
    // q
    {"QMissing", attn_flat, [](AttnSetup& s) { s.a.q = TensorRef{}; }, kV, "q", "q must be given"},
    {"QFp8", attn_flat, [](AttnSetup& s) { s.a.q.dtype = ST::kFP8E4M3; }, kV, "q", "q must be bf16/fp16, got float8_e4m3fn"},
    {"QFloat32", attn_flat, [](AttnSetup& s) { s.a.q.dtype = ST::kFloat32; }, kV, "q", "q must be bf16/fp16"},
    {"Q4D", attn_flat, [](AttnSetup& s) { s.a.q = reshaped(s.a.q, {8, 4, 1, kD}); }, kV, "q", "q must be 3D"},
    {"HeadDim256", attn_flat, [](AttnSetup& s) { s.a.q = reshaped(s.a.q, {8, 2, 256}); }, kV, "q", "head_dim must be 128, got 256"},
    {"ZeroQHeads", attn_flat, [](AttnSetup& s) { s.a.q = reshaped(s.a.q, {8, 0, kD}); }, kV, "q", "num_qo_heads >= 1"},
    {"HeadsNotMultiple", attn_flat, [](AttnSetup& s) { s.a.q = reshaped(s.a.q, {8, 3, kD}); }, kV, "num_kv_heads", "num_qo_heads must be a multiple of num_kv_heads"},
    {"QNotContiguous", attn_flat, [](AttnSetup& s) { s.a.q = with_stride(s.a.q, 1, 2 * kD); }, kV, "q", "q must be contiguous"},
    {"QMisaligned", attn_flat, [](AttnSetup& s) { s.a.q = shifted(s.a.q, 8); }, kV, "q", "16-byte aligned"},
    // q2k_indices
    {"Q2kMissing", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = TensorRef{}; }, kV, "q2k_indices", "must be given"},
    {"Q2kInt64", attn_flat, [](AttnSetup& s) { s.a.q2k_indices.dtype = ST::kInt64; }, kV, "q2k_indices", "q2k_indices must be int32 of shape (Hkv, total_q, topk)"},
    {"Q2k2D", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {16, 4}); }, kV, "q2k_indices", "must be int32 of shape (Hkv, total_q, topk) = (2, 8, topk)"},
    {"Q2kHeads", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {1, 8, 8}); }, kV, "q2k_indices", "= (2, 8, topk), got int32 of shape (1, 8, 8)"},
    {"Q2kTokenMajor", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {8, 2, 4}); }, kV, "q2k_indices", "(Hkv, total_q, topk)"},
    {"Q2kRows", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {2, 4, 8}); }, kV, "q2k_indices", "(Hkv, total_q, topk)"},
    {"Q2kStridedRows", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = strided_ref(s.q2k.bytes.data(), ST::kInt32, {2, 8, 4}, {64, 8, 2}); }, kV, "q2k_indices", "q2k_indices must have unit stride in its last dim and non-negative strides"},
    {"Q2kNegativeStride", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = strided_ref(s.q2k.bytes.data() + 4 * 56, ST::kInt32, {2, 8, 4}, {32, -4, 1}); }, kV, "q2k_indices", "got strides (32, -4, 1)"},
    {"Q2kHeadsSwapped", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = strided_ref(s.q2k.bytes.data(), ST::kInt32, {2, 8, 4}, {4, 8, 2}); }, kV, "q2k_indices", "got strides"},
    {"Q2kTopkZero", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {2, 8, 0}); }, kV, "q2k_indices", "topk dimension must be positive"},
    {"Q2kTopk65", attn_flat, [](AttnSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {2, 8, 65}); }, kNS, "q2k_indices", "must be <= 64"},
    {"Q2kOtherDevice", attn_flat, [](AttnSetup& s) { s.a.q2k_indices.device = 0; }, kV, "q2k_indices", "same device as q"},
    // k / v dtypes
    {"KMissing", attn_flat, [](AttnSetup& s) { s.a.kv.k = TensorRef{}; }, kV, "k", "k must be given"},
    {"VMissing", attn_flat, [](AttnSetup& s) { s.a.kv.v = TensorRef{}; }, kV, "v", "v must be given"},
    {"KFp16WithBf16Q", attn_flat, [](AttnSetup& s) { s.a.kv.k.dtype = ST::kFP16; s.a.kv.v.dtype = ST::kFP16; }, kV, "k", "k/v dtype must match q (or be fp8/packed NVFP4): expected bfloat16, got k float16"},
    {"VFp16WithBf16Q", attn_flat, [](AttnSetup& s) { s.a.kv.v.dtype = ST::kFP16; }, kV, "v", "got v float16"},
    {"KFloat32", attn_flat, [](AttnSetup& s) { s.a.kv.k.dtype = ST::kFloat32; }, kV, "k", "k/v dtype must match q"},
    {"Fp8KBf16V", attn_fp8, [](AttnSetup& s) { s.a.kv.v.dtype = ST::kBF16; }, kV, "v", "k and v must both be float8_e4m3fn"},
    {"Nvfp4KBf16V", attn_nvfp4, [](AttnSetup& s) { s.a.kv.v.dtype = ST::kBF16; }, kV, "v", "k and v must both be packed uint8 for NVFP4"},
    {"Nvfp4NoKScale", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k_scale = TensorRef{}; }, kV, "k_scale", "NVFP4 KV requires k_scale and v_scale"},
    {"Nvfp4NoVScale", attn_nvfp4, [](AttnSetup& s) { s.a.kv.v_scale = TensorRef{}; }, kV, "v_scale", "NVFP4 KV requires k_scale and v_scale"},
    {"Nvfp4ScaleFp8", attn_nvfp4, [](AttnSetup& s) { s.a.kv.v_scale.dtype = ST::kFP8E4M3; }, kV, "v_scale", "k_scale/v_scale must be uint8 (E4M3 bytes)"},
    {"Nvfp4KScaleSmall", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k_scale = reshaped(s.a.kv.k_scale, {nvfp4_scale_bytes(kPages * 2 * 128) - 1}); }, kV, "k_scale", "128-row-padded swizzled scale layout for 1280 KV rows (10240 bytes)"},
    {"Nvfp4FlatVScaleSmall", attn_nvfp4_flat, [](AttnSetup& s) { s.a.kv.v_scale = reshaped(s.a.kv.v_scale, {660 * 8}); }, kV, "v_scale", "for 660 KV rows (6144 bytes), got 5280"},
    {"Nvfp4ScaleStrided", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k_scale = reshaped(s.a.kv.k_scale, {1280, 8}); s.a.kv.k_scale.strides[0] = 16; }, kV, "k_scale", "k_scale must be contiguous"},
    {"Nvfp4ScaleOtherDevice", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k_scale.device = 0; }, kV, "k_scale", "same device as q"},
    {"Nvfp4Width128", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {kPages, 1, 128, 128}); s.a.kv.v = s.a.kv.k; }, kV, "k", "paged k/v must be (num_pages, num_kv_heads, 128, 64)"},
    {"Nvfp4NotContiguous", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k = with_stride(s.a.kv.k, 2, 128); s.a.kv.v = shifted(s.a.kv.k, 64); }, kV, "k", "k/v must be contiguous"},
    {"ScalesForBf16", attn_flat, [](AttnSetup& s) { s.kv.k_scale = HostTensor(ST::kUInt8, {16}); s.a.kv.k_scale = s.kv.k_scale.ref(); }, kV, "k_scale", "k_scale/v_scale are NVFP4 block scales"},
    {"ScalesForFp8", attn_fp8, [](AttnSetup& s) { s.kv.v_scale = HostTensor(ST::kFloat32, {1}); s.a.kv.v_scale = s.kv.v_scale.ref(); }, kV, "v_scale", "fold fp8 descales into softmax_scale"},
    // k / v shapes and layouts
    {"PagedWithoutSeqused", attn_paged, [](AttnSetup& s) { s.a.seqused_k = TensorRef{}; }, kV, "seqused_k", "paged KV requires seqused_k"},
    {"PagedKPageSize64", attn_paged, [](AttnSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {10, 2, 64, kD}); s.a.kv.v = reshaped(s.a.kv.v, {10, 2, 64, kD}); }, kV, "k", "paged k/v must be (num_pages, num_kv_heads, 128, 128)"},
    {"PagedK3D", attn_paged, [](AttnSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {640, 2, kD}); }, kV, "k", "paged k/v must be"},
    {"FlatWithoutCuSeqlensK", attn_flat, [](AttnSetup& s) { s.a.cu_seqlens_k = TensorRef{}; }, kV, "cu_seqlens_k", "cu_seqlens_k is required for the non-paged path"},
    {"FlatK4D", attn_flat, [](AttnSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {1, 330, 2, kD}); }, kV, "k", "flat k/v must be (total_k, num_kv_heads, 128)"},
    {"FlatKWidth", attn_flat, [](AttnSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {330, 4, 64}); }, kV, "k", "flat k/v must be"},
    {"VShape", attn_flat, [](AttnSetup& s) { s.a.kv.v = reshaped(s.a.kv.v, {329, 2, kD}); }, kV, "v", "v must have the same shape and dtype as k"},
    {"VShapePaged", attn_paged, [](AttnSetup& s) { s.a.kv.v = reshaped(s.a.kv.v, {kPages, 1, 128, kD}); }, kV, "v", "v must have the same shape and dtype as k"},
    {"VOtherDevice", attn_flat, [](AttnSetup& s) { s.a.kv.v.device = 0; }, kV, "v", "v must be on the same device as q (cpu), got cuda:0"},
    {"KMisaligned", attn_flat, [](AttnSetup& s) { s.a.kv.k = shifted(s.a.kv.k, 4); }, kV, "k", "16-byte aligned"},
    {"FlatKStrided", attn_flat, [](AttnSetup& s) { s.a.kv.k = with_stride(s.a.kv.k, 0, 4 * kD); }, kV, "k", "k/v must be contiguous, paged K and V views of compact caches in another dim order"},
    {"FlatPackedViews", attn_flat, [](AttnSetup& s) { s.a.kv.k = with_stride(with_stride(s.a.kv.k, 0, 4 * kD), 1, 2 * kD); s.a.kv.v = shifted(s.a.kv.k, 2 * kD); }, kV, "k", "k/v must be contiguous"},
    {"PagedNhdUnpacked", attn_paged, [](AttnSetup& s) { s.a.kv.k = strided_ref(s.a.kv.k.data, ST::kBF16, {kPages, 2, 128, kD}, {2 * 128 * kD, kD, 2 * kD, 1}); }, kV, "k", "k/v must be contiguous"},
    {"PackedWrongOffset", attn_packed, [](AttnSetup& s) { s.a.kv.v = shifted(s.a.kv.k, 64 * 2); }, kV, "k", "v - k = 128 bytes"},
    {"PackedVStrides", attn_packed, [](AttnSetup& s) { s.a.kv.v = with_stride(s.a.kv.v, 0, s.a.kv.v.strides[0] * 2); }, kV, "k", "k/v must be contiguous"},
    {"PackedPaddedRows", attn_packed, [](AttnSetup& s) { for (TensorRef* t : {&s.a.kv.k, &s.a.kv.v}) { t->strides[2] = 272; t->strides[1] = 272 * 128; t->strides[0] = 2 * 272 * 128; } }, kV, "k", "got k strides (69632, 34816, 272, 1)"},
    {"PackedLastStride", attn_packed, [](AttnSetup& s) { s.a.kv.k = with_stride(s.a.kv.k, 3, 2); s.a.kv.v = with_stride(s.a.kv.v, 3, 2); }, kV, "k", "k/v must be contiguous"},
    // sequences and pages
    {"CuSeqlensQInt64", attn_flat, [](AttnSetup& s) { s.a.cu_seqlens_q.dtype = ST::kInt64; }, kV, "cu_seqlens_q", "must be 1-D int32"},
    {"CuSeqlensQTotal", attn_flat, [](AttnSetup& s) { s.cu_q.as<int>()[2] = 9; }, kV, "cu_seqlens_q", "[-1] must be <= q.shape[0]"},
    {"CuSeqlensQOtherDevice", attn_flat, [](AttnSetup& s) { s.a.cu_seqlens_q.device = 1; }, kV, "cu_seqlens_q", "same device as q"},
    {"CuSeqlensKCount", attn_flat, [](AttnSetup& s) { s.a.cu_seqlens_k = reshaped(s.a.cu_seqlens_k, {2}); }, kV, "cu_seqlens_k", "must have batch_size + 1 = 3 entries"},
    {"CuSeqlensKTotal", attn_flat, [](AttnSetup& s) { s.cu_k.as<int>()[2] = 400; }, kV, "cu_seqlens_k", "[-1] must be <= k.shape[0] (total_k) (330), got 400"},
    {"CuSeqlensKDecreasing", attn_flat, [](AttnSetup& s) { s.cu_k.as<int>()[1] = 331; }, kV, "cu_seqlens_k", "non-decreasing"},
    {"PagedCuSeqlensKCount", attn_paged_cuk, [](AttnSetup& s) { s.a.cu_seqlens_k = reshaped(s.a.cu_seqlens_k, {4}); }, kV, "cu_seqlens_k", "batch_size + 1 = 3"},
    {"PagedCuSeqlensKStart", attn_paged_cuk, [](AttnSetup& s) { s.cu_k.as<int>()[0] = -1; }, kV, "cu_seqlens_k", "cu_seqlens_k[0] must be 0"},
    {"PagedCuSeqlensKSequsedCount", attn_paged_cuk, [](AttnSetup& s) { s.a.seqused_k = reshaped(s.a.seqused_k, {3}); }, kV, "seqused_k", "2 entries"},
    {"PageTableInt64", attn_paged, [](AttnSetup& s) { s.a.page_table.dtype = ST::kInt64; }, kV, "page_table", "page_table must be int32 of shape (batch, max_pages)"},
    {"PageTable3D", attn_paged, [](AttnSetup& s) { s.a.page_table = reshaped(s.a.page_table, {2, 3, 1}); }, kV, "page_table", "page_table must be int32 of shape"},
    {"PageTableRows", attn_paged, [](AttnSetup& s) { s.a.page_table = reshaped(s.a.page_table, {1, 6}); }, kV, "page_table", "batch_size = 2 rows"},
    {"PageTableOtherDevice", attn_paged, [](AttnSetup& s) { s.a.page_table.device = 0; }, kV, "page_table", "same device as q"},
    {"SequsedInt64", attn_paged, [](AttnSetup& s) { s.a.seqused_k.dtype = ST::kInt64; }, kV, "seqused_k", "must be 1-D int32"},
    {"SequsedCount", attn_paged, [](AttnSetup& s) { s.a.seqused_k = reshaped(s.a.seqused_k, {1}); }, kV, "seqused_k", "2 entries, got 1"},
    {"SequsedNegative", attn_paged, [](AttnSetup& s) { s.seqused_k.as<int>()[0] = -1; }, kV, "seqused_k", "seqused_k[0] must be >= 0"},
    {"QOffsetFloat", attn_flat, [](AttnSetup& s) { s.qoff = HostTensor(ST::kFloat32, {2}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "q_offset must be int32, got float32"},
    {"QOffsetCount", attn_paged, [](AttnSetup& s) { s.qoff = int_tensor({0}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "batch_size = 2 entries, got 1"},
    {"MaxSeqlenQOverflow", attn_flat, [](AttnSetup& s) { s.a.max_seqlen_q = int64_t(1) << 31; }, kV, "max_seqlen_q", "does not fit in int32"},
    // scalars
    {"SoftmaxScaleInf", attn_flat, [](AttnSetup& s) { s.a.softmax_scale = std::numeric_limits<double>::infinity(); }, kV, "softmax_scale", "must be a finite float32 value"},
    {"SoftmaxScaleNaN", attn_flat, [](AttnSetup& s) { s.a.softmax_scale = std::nan(""); }, kV, "softmax_scale", "finite"},
    {"VGlobalScaleNaN", attn_flat, [](AttnSetup& s) { s.a.kv.v_global_scale = std::nan(""); }, kV, "v_global_scale", "finite"},
    {"KGlobalScaleOverflow", attn_nvfp4, [](AttnSetup& s) { s.a.kv.k_global_scale = 1e39; }, kV, "k_global_scale", "finite float32"},
    {"TemperatureScaleZero", attn_flat, [](AttnSetup& s) { s.lse_t = HostTensor(ST::kFloat32, {8, 4}); s.a.lse_temperature = s.lse_t.ref(); s.a.lse_temperature_scale = 0.0; }, kNS, "lse_temperature_scale", "must be > 0"},
    {"TemperatureScaleNaN", attn_flat, [](AttnSetup& s) { s.lse_t = HostTensor(ST::kFloat32, {8, 4}); s.a.lse_temperature = s.lse_t.ref(); s.a.lse_temperature_scale = std::nan(""); }, kV, "lse_temperature_scale", "finite"},
    // outputs and workspace
    {"OutputMissing", attn_flat, [](AttnSetup& s) { s.a.output = TensorRef{}; }, kV, "out", "must be given"},
    {"OutputDtype", attn_flat, [](AttnSetup& s) { s.a.output.dtype = ST::kFP16; }, kV, "out", "out must be bfloat16, got float16"},
    {"OutputShape", attn_flat, [](AttnSetup& s) { s.a.output = reshaped(s.a.output, {8, 2, 256}); }, kV, "out", "out must be (total_q, num_qo_heads, 128) = (8, 4, 128)"},
    {"OutputNotContiguous", attn_flat, [](AttnSetup& s) { s.a.output = with_stride(s.a.output, 0, 1024); }, kV, "out", "out must be contiguous"},
    {"OutputOtherDevice", attn_flat, [](AttnSetup& s) { s.a.output.device = 0; }, kV, "out", "same device as q"},
    {"LseDtype", attn_flat, [](AttnSetup& s) { s.a.lse.dtype = ST::kBF16; }, kV, "lse", "lse must be float32"},
    {"LseShape", attn_flat, [](AttnSetup& s) { s.a.lse = reshaped(s.a.lse, {4, 8}); }, kV, "lse", "lse must be (total_q, num_qo_heads) = (8, 4)"},
    {"LseNotContiguous", attn_flat, [](AttnSetup& s) { s.a.lse = with_stride(s.a.lse, 0, 8); }, kV, "lse", "lse must be contiguous"},
    {"LseTemperatureShape", attn_flat, [](AttnSetup& s) { s.lse_t = HostTensor(ST::kFloat32, {8}); s.a.lse_temperature = s.lse_t.ref(); }, kV, "lse_temperature", "lse_temperature must be (total_q, num_qo_heads)"},
    {"WorkspaceDtype", attn_flat, [](AttnSetup& s) { s.workspace = HostTensor(ST::kFloat32, {64}); s.a.workspace = s.workspace.ref(); }, kV, "workspace", "workspace must be a 1-D uint8 tensor"},
    {"WorkspaceOtherDevice", attn_flat, [](AttnSetup& s) { s.workspace = HostTensor(ST::kUInt8, {64}); s.a.workspace = on_device(s.workspace.ref(), 0); }, kV, "workspace", "same device as q"},
};

class AttnRejectTest : public ::testing::TestWithParam<AttnReject> {};
TEST_P(AttnRejectTest, Throws) {
  const AttnReject& r = GetParam();
  std::unique_ptr<AttnSetup> s = r.setup();
  ASSERT_NO_THROW(s->make()) << "baseline must be valid";
  r.mutate(*s);
  expect_error([&] { s->make(); }, r.kind, r.arg, r.reason);
}
INSTANTIATE_TEST_SUITE_P(ValidationAttention, AttnRejectTest, ::testing::ValuesIn(kAttnRejects),
                         case_name<AttnSetup>);

// -- msa_sparse_decode_attention

using DecodeReject = Reject<DecodeSetup>;
std::unique_ptr<DecodeSetup> dec_paged() { return std::make_unique<DecodeSetup>(); }
std::unique_ptr<DecodeSetup> dec_flat() { return std::make_unique<DecodeSetup>(KVKind::kFlat); }
std::unique_ptr<DecodeSetup> dec_fp8q() { return std::make_unique<DecodeSetup>(KVKind::kPaged, ST::kFP8E4M3, ST::kFP8E4M3); }
std::unique_ptr<DecodeSetup> dec_nvfp4() { return std::make_unique<DecodeSetup>(KVKind::kPagedNvfp4); }

const std::vector<DecodeReject> kDecodeRejects = {
    {"OutputOverQ", dec_paged, [](DecodeSetup& s) { s.a.output.data = s.a.q.data; }, kV, "out", "out must not share memory with q"},
    {"OutputOverSeqused", dec_paged, [](DecodeSetup& s) { s.a.output.data = s.a.seqused_k.data; }, kV, "out", "must not share memory with seqused_k"},
    {"SeqlenQZero", dec_paged, [](DecodeSetup& s) { s.a.seqlen_q = 0; }, kV, "seqlen_q", "seqlen_q must be positive, got 0"},
    {"SeqlenQNegative", dec_paged, [](DecodeSetup& s) { s.a.seqlen_q = -2; }, kV, "seqlen_q", "must be positive"},
    {"RowsNotMultiple", dec_paged, [](DecodeSetup& s) { s.a.seqlen_q = 4; }, kV, "seqlen_q", "q rows (6) must be batch_size * seqlen_q (4)"},
    {"QFloat32", dec_paged, [](DecodeSetup& s) { s.a.q.dtype = ST::kFloat32; }, kV, "q", "q must be bf16/fp16/fp8_e4m3, got float32"},
    {"Q2D", dec_paged, [](DecodeSetup& s) { s.a.q = reshaped(s.a.q, {6, 6 * kD}); }, kV, "q", "q must be 3D"},
    {"HeadDim", dec_paged, [](DecodeSetup& s) { s.a.q = reshaped(s.a.q, {6, 12, 64}); }, kV, "q", "head_dim must be 128"},
    {"HeadsNotMultiple", dec_paged, [](DecodeSetup& s) { s.a.q = reshaped(s.a.q, {6, 5, kD}); }, kV, "num_qo_heads", "must be a multiple of num_kv_heads"},
    {"Fp8QWithFp16K", dec_fp8q, [](DecodeSetup& s) { s.a.kv.k.dtype = ST::kFP16; s.a.kv.v.dtype = ST::kFP16; }, kV, "k", "expected bfloat16, got k float16"},
    {"Fp8QOutputFp8", dec_fp8q, [](DecodeSetup& s) { s.a.output.dtype = ST::kFP8E4M3; }, kV, "out", "out must be bfloat16, got float8_e4m3fn"},
    {"Fp16QOutputBf16", [] { return std::make_unique<DecodeSetup>(KVKind::kFlat, ST::kFP16, ST::kFP16); }, [](DecodeSetup& s) { s.a.output.dtype = ST::kBF16; }, kV, "out", "out must be float16"},
    {"PagedWithoutSeqused", dec_paged, [](DecodeSetup& s) { s.a.seqused_k = TensorRef{}; }, kV, "seqused_k", "paged decode requires seqused_k"},
    {"Seqused2D", dec_paged, [](DecodeSetup& s) { s.a.seqused_k = reshaped(s.a.seqused_k, {3, 1}); }, kV, "seqused_k", "must be 1-D int32"},
    {"SequsedCount", dec_paged, [](DecodeSetup& s) { s.a.seqused_k = reshaped(s.a.seqused_k, {2}); }, kV, "seqused_k", "= 3 entries, got 2"},
    {"SequsedNegative", dec_paged, [](DecodeSetup& s) { s.seqused_k.as<int>()[2] = -7; }, kV, "seqused_k", "seqused_k[2] must be >= 0"},
    {"PageTableRows", dec_paged, [](DecodeSetup& s) { s.a.page_table = reshaped(s.a.page_table, {1, 9}); }, kV, "page_table", "batch_size = 3 rows"},
    {"PageTableDtype", dec_paged, [](DecodeSetup& s) { s.a.page_table.dtype = ST::kFloat32; }, kV, "page_table", "must be int32 of shape (batch, max_pages)"},
    {"PageTableColumnStride", dec_paged, [](DecodeSetup& s) { s.a.page_table = with_stride(s.a.page_table, 1, 3); }, kV, "page_table", "contiguous in its last dim"},
    {"PagedKShape", dec_paged, [](DecodeSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {kPages, 2, 128, 64}); s.a.kv.v = s.a.kv.k; }, kV, "k", "paged k/v must be (num_pages, num_kv_heads, 128, 128)"},
    {"FlatWithoutCuSeqlensK", dec_flat, [](DecodeSetup& s) { s.a.cu_seqlens_k = TensorRef{}; }, kV, "cu_seqlens_k", "flat decode requires cu_seqlens_k"},
    {"FlatCuSeqlensKCount", dec_flat, [](DecodeSetup& s) { s.a.cu_seqlens_k = reshaped(s.a.cu_seqlens_k, {3}); }, kV, "cu_seqlens_k", "batch_size + 1 = 4 entries"},
    {"FlatCuSeqlensKInt64", dec_flat, [](DecodeSetup& s) { s.a.cu_seqlens_k.dtype = ST::kInt64; }, kV, "cu_seqlens_k", "must be 1-D int32"},
    {"FlatCuSeqlensKTotal", dec_flat, [](DecodeSetup& s) { s.cu_k.as<int>()[3] = 331; }, kV, "cu_seqlens_k", "[-1] must be <= k.shape[0] (total_k) (330), got 331"},
    {"FlatK4D", dec_flat, [](DecodeSetup& s) { s.a.kv.k = reshaped(s.a.kv.k, {1, 330, 2, kD}); }, kV, "k", "flat k/v must be"},
    {"Q2kRows", dec_paged, [](DecodeSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {2, 3, 8}); }, kV, "q2k_indices", "q2k_indices must be int32 of shape (Hkv, total_q, topk) = (2, 6, topk)"},
    {"Q2kColumnStride", dec_paged, [](DecodeSetup& s) { s.a.q2k_indices = with_stride(s.a.q2k_indices, 2, 2); }, kV, "q2k_indices", "q2k_indices must have unit stride in its last dim"},
    {"Q2kTopk128", dec_paged, [](DecodeSetup& s) { s.a.q2k_indices = reshaped(s.a.q2k_indices, {2, 6, 128}); }, kNS, "q2k_indices", "must be <= 64 in flashmsa, got 128"},
    {"Nvfp4ScaleSmall", dec_nvfp4, [](DecodeSetup& s) { s.a.kv.v_scale = reshaped(s.a.kv.v_scale, {100}); }, kV, "v_scale", "swizzled scale layout for 1280 KV rows"},
    {"Nvfp4ScaleInt32", dec_nvfp4, [](DecodeSetup& s) { s.a.kv.k_scale.dtype = ST::kInt32; }, kV, "k_scale", "k_scale/v_scale must be uint8"},
    {"PartialDtype", dec_paged, [](DecodeSetup& s) { s.a.partial_dtype = PartialDType(9); }, kV, "partial_dtype", "unsupported partial_dtype 9"},
    {"QOffsetCount", dec_paged, [](DecodeSetup& s) { s.qoff = int_tensor({1, 2}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "batch_size = 3 entries, got 2"},
    {"QOffsetInt64", dec_paged, [](DecodeSetup& s) { s.qoff = HostTensor(ST::kInt64, {3}); s.a.q_offset.tensor = s.qoff.ref(); }, kV, "q_offset", "q_offset must be int32"},
    {"LseShape", dec_paged, [](DecodeSetup& s) { s.a.lse = reshaped(s.a.lse, {3, 12}); }, kV, "lse", "lse must be (total_q, num_qo_heads) = (6, 6)"},
    {"OutputShape", dec_paged, [](DecodeSetup& s) { s.a.output = reshaped(s.a.output, {6, 3, 256}); }, kV, "out", "(total_q, num_qo_heads, 128) = (6, 6, 128)"},
    {"SoftmaxScaleInf", dec_paged, [](DecodeSetup& s) { s.a.softmax_scale = -std::numeric_limits<double>::infinity(); }, kV, "softmax_scale", "finite"},
    {"WorkspaceNotContiguous", dec_paged, [](DecodeSetup& s) { s.workspace = HostTensor(ST::kUInt8, {64}); s.a.workspace = with_stride(s.workspace.ref(), 0, 2); }, kV, "workspace", "workspace must be contiguous"},
    {"PagedStridedOverlapping", dec_paged, [](DecodeSetup& s) { s.a.kv.v = shifted(s.a.kv.k, 2 * kD); s.a.kv.k = with_stride(s.a.kv.k, 2, 2 * kD); s.a.kv.v = with_stride(s.a.kv.v, 2, 2 * kD); }, kV, "k", "k/v must be contiguous"},
};

class DecodeRejectTest : public ::testing::TestWithParam<DecodeReject> {};
TEST_P(DecodeRejectTest, Throws) {
  const DecodeReject& r = GetParam();
  std::unique_ptr<DecodeSetup> s = r.setup();
  ASSERT_NO_THROW(s->make()) << "baseline must be valid";
  r.mutate(*s);
  expect_error([&] { s->make(); }, r.kind, r.arg, r.reason);
}
INSTANTIATE_TEST_SUITE_P(ValidationDecode, DecodeRejectTest, ::testing::ValuesIn(kDecodeRejects),
                         case_name<DecodeSetup>);

// ---- hostile but valid inputs -----------------------------------------------------------------

// An empty (B, 0) page table has no data pointer: it still selects the paged layout (every
// sequence then has no key), never the flat one.
TEST(ValidationProxy, EmptyPageTableIsPaged) {
  ProxySetup s(/*paged=*/true);
  s.a.page_table = reshaped(s.a.page_table, {2, 0});
  s.a.page_table.data = nullptr;
  s.a.max_k_tiles = 1;
  s.out = HostTensor(ST::kFloat32, {4, 1, kTotalQ});
  s.a.output = s.out.ref();
  const ProxyScoreParams p = s.make();
  EXPECT_TRUE(p.kv.paged);
  EXPECT_EQ(p.kv.max_pages, 0);
  for (int64_t i = 0; i < s.out.numel(); ++i) s.out.as<float>()[i] = 7.0f;
  run_proxy_score(p, make_proxy_score_plan(p, {}, -1), -1, nullptr);
  for (int64_t i = 0; i < s.out.numel(); ++i)
    ASSERT_TRUE(std::isinf(s.out.as<float>()[i]) && s.out.as<float>()[i] < 0) << i;
}

TEST(ValidationAttention, EmptyPageTableIsPaged) {
  AttnSetup s(KVKind::kPaged);
  s.a.page_table = reshaped(s.a.page_table, {2, 0});
  s.a.page_table.data = nullptr;
  for (int64_t i = 0; i < s.q2k.numel(); ++i) s.q2k.as<int>()[i] = int(i % 3) - 1;
  const SparseAttnParams p = s.make();
  EXPECT_TRUE(p.kv.paged);
  run_sparse_attention(p, make_sparse_attention_plan(p, {}, -1), -1, nullptr);
  for (int64_t i = 0; i < s.out.numel(); ++i) ASSERT_EQ(s.out.get(i), 0.0f) << i;
  for (int64_t i = 0; i < s.lse.numel(); ++i) ASSERT_TRUE(std::isinf(s.lse.get(i))) << i;
}

TEST(ValidationDecode, EmptyPageTableIsPaged) {
  DecodeSetup s;
  s.a.page_table = reshaped(s.a.page_table, {3, 0});
  s.a.page_table.data = nullptr;
  const SparseDecodeParams d = s.make();
  EXPECT_TRUE(d.attn.kv.paged);
  run_sparse_decode(d, make_sparse_decode_plan(d, {}, -1), -1, nullptr);
  for (int64_t i = 0; i < s.out.numel(); ++i) ASSERT_EQ(s.out.get(i), 0.0f) << i;
}

// Tensors with no elements are contiguous whatever their strides (torch's rule): a wrapper-made
// (4, 2, 0) output with strides (2, 1, 1) and an empty q are accepted.
TEST(ValidationProxy, ZeroElementTensorsAreContiguous) {
  ProxySetup s(/*paged=*/false);
  s.a.q = strided_ref(s.q.bytes.data(), ST::kBF16, {0, 4, kD}, {1, 1, 1});
  s.cu_q = cu_seqlens({0, 0});
  s.a.cu_seqlens_q = s.cu_q.ref();
  s.a.output = strided_ref(s.out.bytes.data(), ST::kFloat32, {4, 2, 0}, {2, 1, 1});
  const ProxyScoreParams p = s.make();
  EXPECT_EQ(p.total_q, 0);
  run_proxy_score(p, make_proxy_score_plan(p, {}, -1), -1, nullptr);
}

TEST(ValidationDecode, ZeroBatch) {
  DecodeSetup s;
  s.a.q = strided_ref(s.q.bytes.data(), ST::kBF16, {0, 6, kD}, {kD, kD, 1});
  s.a.q2k_indices = strided_ref(s.q2k.bytes.data(), ST::kInt32, {2, 0, 4}, {4, 4, 1});
  s.a.page_table = strided_ref(s.page_table.bytes.data(), ST::kInt32, {0, kMaxPages}, {1, 1});
  s.a.seqused_k = strided_ref(s.seqused_k.bytes.data(), ST::kInt32, {0}, {4});
  s.a.output = strided_ref(s.out.bytes.data(), ST::kBF16, {0, 6, kD}, {1, 1, 1});
  s.a.lse = strided_ref(s.lse.bytes.data(), ST::kFloat32, {0, 6}, {1, 1});
  const SparseDecodeParams d = s.make();
  EXPECT_EQ(d.attn.batch, 0);
  run_sparse_decode(d, make_sparse_decode_plan(d, {}, -1), -1, nullptr);
}

// ---- error messages ----------------------------------------------------------------------------

// throw_error's text for every kind of piece the checks pass (what operator<< would print).
TEST(ErrorMessage, FormatsEveryPieceKind) {
  const std::string name = "q";
  try {
    MSA_CHECK(false, name, " ", std::string_view("view"), " ", int(-3), " ", int64_t(1) << 40, " ",
              size_t(197792), " ", uint32_t(4000000000u), " ", 0.07, " ", 1e-9f, " ", true, " ",
              'x', " ", static_cast<const char*>(nullptr));
    FAIL() << "MSA_CHECK(false) returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kValue);
    EXPECT_STREQ(e.what(), "q view -3 1099511627776 197792 4000000000 0.07 1e-09 1 x (null)");
  }
  try {
    MSA_CHECK_SUPPORTED(false, "kernel needs ", size_t(240000), " bytes");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotSupported);
    EXPECT_STREQ(e.what(), "kernel needs 240000 bytes");
  }
}

}  // namespace
}  // namespace flashmsa::testing

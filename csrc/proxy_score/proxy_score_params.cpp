// msa_proxy_score and msa_proxy_score_fp4: caller arguments -> validated ProxyScoreParams. Every
// host check of the two ops, once, before anything is written (docs/semantics.md#validation); the
// shared tensor checks are in csrc/common/.
#include <cstdint>

#include "common/kv_index.h"
#include "common/tensor_checks.h"
#include "flashmsa/api.h"
#include "flashmsa/numeric.h"

namespace flashmsa {

using namespace checks;

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
    // cu_seqlens_k is ignored on the paged path (docs/semantics.md#proxy-score): lengths come
    // from seqused_k.
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
  // Key positions are int32: block 2^24 would start at key 2^31, so no column past it holds a key.
  MSA_OP_CHECK(c, a.max_k_tiles <= kMaxKTiles, "max_k_tiles must be <= ", kMaxKTiles,
               " (2^31 keys / 128), got ", a.max_k_tiles);
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
  check_no_overlap(c, out, "output",
                   {{fp4 ? "q_fp4" : "q", &a.q}, {kname, &a.k}, {"cu_seqlens_q", &a.cu_seqlens_q},
                    {"cu_seqlens_k", &a.cu_seqlens_k}, {"page_table", &a.page_table},
                    {"seqused_k", &a.seqused_k}, {"q_offset", &a.q_offset.tensor},
                    {"q_scale", &a.q_scale}, {"k_scale", &a.k_scale}});
  p.out = static_cast<float*>(out.data);
  return p;
}

}  // namespace

ProxyScoreParams make_proxy_score_params(const ProxyScoreArgs& a) { return make_proxy_params(a, false); }
ProxyScoreParams make_proxy_score_fp4_params(const ProxyScoreArgs& a) { return make_proxy_params(a, true); }


}  // namespace flashmsa

// msa_topk_select: caller arguments -> validated TopkSelectParams. Every host check of the op,
// once, before anything is written (docs/semantics.md#validation).
#include <cstdint>

#include "common/tensor_checks.h"
#include "flashmsa/api.h"

namespace flashmsa {

using namespace checks;

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
  // Rows of topk consecutive int32 that do not overlap: contiguous (FlashInfer's layout), the
  // transpose of a contiguous (H, S, topk) (the head-major layout the attention ops take, written
  // directly), a row range or padded rows of a larger buffer (docs/semantics.md#topk-output).
  MSA_OP_CHECK(c, has_disjoint_unit_rows_3d(out),
               "output must have unit stride in its last dim and rows that do not overlap (e.g. "
               "contiguous, or the transpose(0, 1) of a contiguous (num_qo_heads, total_qo_len, "
               "topk) tensor), got shape ", shape_str(out), " with strides ", strides_str(out));
  p.out_token_stride = used_stride(out, 0);
  p.out_head_stride = used_stride(out, 1);

  p.num_heads = to_int(c, h, "max_score.shape[0] (num_qo_heads)");
  p.num_blocks = to_int(c, num_blocks, "max_score.shape[1] (max_k_tiles)");
  p.num_tokens = to_int(c, tokens, "max_score.shape[2] (total_qo_len)");
  p.topk = int(a.topk);
  p.force_begin = int(fb);
  p.force_end = int(fe);
  p.score = static_cast<const float*>(s.data);
  check_no_overlap(c, out, "output",
                   {{"max_score", &a.max_score}, {"num_valid_pages", &a.num_valid_pages}});
  p.out = static_cast<int*>(out.data);
  return p;
}

}  // namespace flashmsa

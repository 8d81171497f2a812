"""Loads the native extension ``flashmsa._C`` and registers fake implementations of its ops.

Importing ``_C`` registers ``torch.ops.flashmsa.{proxy_score, proxy_score_fp4, topk_select,
sparse_attention, sparse_decode}`` (and the two workspace-size queries). Every op writes into caller-allocated
outputs passed as mutable arguments and returns nothing, so its fake (meta) implementation has
nothing to compute: ``torch.compile`` traces the Python wrappers in :mod:`flashmsa.msa_ops`, whose
``torch.empty`` calls give the outputs their shapes.
"""

import torch

try:
    from . import _C
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "flashmsa's native extension flashmsa._C is missing or failed to load; install the package "
        "with `pip install --no-build-isolation .` against the torch you run with"
    ) from e

ops = torch.ops.flashmsa


def built_with_cuda() -> bool:
    """Whether this build has CUDA kernels (a CPU-only build runs the C++ reference only)."""
    return bool(_C.built_with_cuda())


@torch.library.register_fake("flashmsa::proxy_score")
def _proxy_score_fake(q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal,
                      max_seqlen_q, max_k_tiles, q_offset_value, q_offset, reduce_heads, output):
    return None


@torch.library.register_fake("flashmsa::proxy_score_fp4")
def _proxy_score_fp4_fake(q_fp4, k_fp4, q_scale, k_scale, q_global_scale, k_global_scale,
                          cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q,
                          max_k_tiles, q_offset_value, q_offset, reduce_heads, output):
    return None


@torch.library.register_fake("flashmsa::topk_select")
def _topk_select_fake(max_score, topk, num_valid_pages_value, num_valid_pages,
                      force_begin_blocks, force_end_blocks, output):
    return None


@torch.library.register_fake("flashmsa::sparse_attention")
def _sparse_attention_fake(q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, causal,
                           softmax_scale, page_table, seqused_k, k_scale, v_scale, k_global_scale,
                           v_global_scale, q_offset_value, q_offset, lse_temperature_scale, out,
                           lse, lse_t, workspace):
    return None


@torch.library.register_fake("flashmsa::sparse_decode")
def _sparse_decode_fake(q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q,
                        causal, softmax_scale, k_scale, v_scale, k_global_scale, v_global_scale,
                        q_offset_value, q_offset, partial_dtype, force_fused, out, lse, workspace):
    return None

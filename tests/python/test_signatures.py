"""Signature parity with flashinfer.msa_ops (docs/semantics.md#d1): the functions take the same
parameters in the same order, with the same kinds (positional-or-keyword / keyword-only) and
defaults, so ``import flashmsa.msa_ops as msa_ops`` replaces ``flashinfer.msa_ops`` in user code.
The expected lists are those of flashinfer-python 0.7.4 (2026-11, flashinfer/msa_ops/*.py): main's,
with ``workspace=None`` (PR #4355) and ``out=None`` appended to both attention ops and
``use_fp32_acc=True`` to ``msa_proxy_score``. What flashmsa does not provide of that release (its
experimental Blackwell and multi-GPU functions) is listed in docs/semantics.md#differences."""

import inspect

import pytest
import torch

import flashmsa
import flashmsa.msa_ops as msa_ops

P = inspect.Parameter.POSITIONAL_OR_KEYWORD
K = inspect.Parameter.KEYWORD_ONLY
REQUIRED = inspect.Parameter.empty

EXPECTED = {
    "msa_proxy_score": [
        ("q", P, REQUIRED), ("k", P, REQUIRED), ("cu_seqlens_q", P, REQUIRED),
        ("cu_seqlens_k", P, None),
        ("page_table", K, None), ("seqused_k", K, None), ("causal", K, True),
        ("max_seqlen_q", K, None), ("max_k_tiles", K, None), ("output", K, None),
        ("reduce_heads", K, False), ("q_offset", K, None), ("use_fp32_acc", K, True),
    ],
    "msa_proxy_score_fp4": [
        ("q_fp4", P, REQUIRED), ("k_fp4", P, REQUIRED), ("q_scale", P, REQUIRED),
        ("k_scale", P, REQUIRED), ("q_global_scale", P, REQUIRED), ("k_global_scale", P, REQUIRED),
        ("cu_seqlens_q", P, REQUIRED), ("cu_seqlens_k", P, None),
        ("page_table", K, None), ("seqused_k", K, None), ("causal", K, True),
        ("max_seqlen_q", K, None), ("max_k_tiles", K, None), ("output", K, None),
        ("reduce_heads", K, False), ("q_offset", K, None),
    ],
    "msa_topk_select": [
        ("max_score", P, REQUIRED), ("topk", P, REQUIRED), ("num_valid_pages", P, None),
        ("output", P, None), ("force_begin_blocks", P, 0), ("force_end_blocks", P, 0),
    ],
    "msa_sparse_attention": [
        ("q", P, REQUIRED), ("k", P, REQUIRED), ("v", P, REQUIRED), ("q2k_indices", P, REQUIRED),
        ("cu_seqlens_q", P, REQUIRED), ("cu_seqlens_k", P, None), ("causal", P, False),
        ("softmax_scale", P, None), ("page_table", P, None), ("seqused_k", P, None),
        ("return_softmax_lse", P, False), ("k_scale", P, None), ("v_scale", P, None),
        ("k_global_scale", P, None), ("v_global_scale", P, None), ("q_offset", P, None),
        ("return_temperature_lse", P, False), ("lse_temperature_scale", P, 1.0),
        ("workspace", P, None), ("out", P, None),
    ],
    "msa_sparse_decode_attention": [
        ("q", P, REQUIRED), ("k", P, REQUIRED), ("v", P, REQUIRED), ("q2k_indices", P, REQUIRED),
        ("page_table", K, None), ("seqused_k", K, None), ("cu_seqlens_k", K, None),
        ("seqlen_q", K, 1), ("causal", K, True), ("softmax_scale", K, None),
        ("return_softmax_lse", K, False), ("k_scale", K, None), ("v_scale", K, None),
        ("k_global_scale", K, None), ("v_global_scale", K, None), ("q_offset", K, None),
        ("partial_dtype", K, None), ("force_fused", K, None), ("workspace", K, None),
        ("out", K, None),
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signature_matches_flashinfer(name):
    params = list(inspect.signature(getattr(msa_ops, name)).parameters.values())
    got = [(p.name, p.kind, p.default) for p in params]
    assert got == EXPECTED[name]
    # Same objects at the top level of the package.
    assert getattr(flashmsa, name) is getattr(msa_ops, name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_docstring_documents_every_parameter(name):
    doc = getattr(msa_ops, name).__doc__
    for param, *_ in EXPECTED[name]:
        assert param in doc, f"{name} docstring does not mention {param}"


def test_module_exports_flashinfer_names():
    # flashinfer.msa_ops.__all__ (PR #4355).
    expected = {"MSASparseAttentionWorkspace", "SUPPORTS_PACKED_KV", "msa_proxy_score",
                "msa_proxy_score_fp4", "msa_sparse_attention", "msa_sparse_decode_attention",
                "msa_topk_select", "supports_packed_kv"}
    assert expected <= set(msa_ops.__all__)
    for name in expected:
        assert hasattr(msa_ops, name)
    assert msa_ops.SUPPORTS_PACKED_KV is True


def test_supports_packed_kv():
    assert msa_ops.supports_packed_kv("cpu") is True
    assert msa_ops.supports_packed_kv(torch.device("cuda", 0)) is True
    assert msa_ops.supports_packed_kv("meta") is False


def test_workspace_signature():
    sig = inspect.signature(msa_ops.MSASparseAttentionWorkspace)
    assert list(sig.parameters)[:1] == ["device"]  # FlashInfer: MSASparseAttentionWorkspace(device)
    ws = msa_ops.MSASparseAttentionWorkspace("cpu")
    assert ws.device == torch.device("cpu") and ws.nbytes == 0

"""The registered ops pass torch.library.opcheck (schema and mutation annotations, fake tensors,
AOT dispatch), and the Python wrappers trace under torch.compile(fullgraph=True) when the host
dims (max_seqlen_q / max_k_tiles) are given, with results equal to eager."""

import ast
import inspect

import pytest
import torch

from flashmsa.testing import reference as ref
from flashmsa import msa_ops
from flashmsa.testing import paginate

BF16 = torch.bfloat16
ops = torch.ops.flashmsa


def _proxy_inputs():
    q = torch.randn(20, 4, 128, dtype=BF16)
    k = torch.randn(500, 1, 128, dtype=BF16)
    return q, k, ref.cu_seqlens([12, 8]), ref.cu_seqlens([300, 200])


def _attn_inputs():
    q = torch.randn(20, 4, 128, dtype=BF16)
    k = torch.randn(500, 2, 128, dtype=BF16)
    v = torch.randn(500, 2, 128, dtype=BF16)
    q2k = torch.full((2, 20, 16), -1, dtype=torch.int32)
    q2k[..., :2] = torch.tensor([0, 1], dtype=torch.int32)
    return q, k, v, q2k, ref.cu_seqlens([12, 8]), ref.cu_seqlens([300, 200])


def _opcheck_cases():
    q, k, cu_q, cu_k = _proxy_inputs()
    out = torch.empty(4, 3, 20)
    yield "proxy_score", ops.proxy_score.default, (
        q, k, cu_q, cu_k, None, None, True, 12, 3, None, None, False, out)
    cache, table, used = paginate(k, [300, 200])
    yield "proxy_score_paged_offset", ops.proxy_score.default, (
        q, cache, cu_q, None, table, used, True, None, 3, None,
        torch.tensor([5, -2], dtype=torch.int32), False, torch.empty(4, 3, 20))
    yield "proxy_score_reduce", ops.proxy_score.default, (
        q, k, cu_q, cu_k, None, None, False, 12, 3, 7, None, True, torch.empty(1, 3, 20))
    from flashmsa.testing import quantize_nvfp4
    q4, qs, qg = quantize_nvfp4(q)
    k4, ks, kg = quantize_nvfp4(k)
    yield "proxy_score_fp4", ops.proxy_score_fp4.default, (
        q4, k4, qs, ks, qg, kg, cu_q, cu_k, None, None, True, 12, 3, None, None, False,
        torch.empty(4, 3, 20))
    score = torch.randn(2, 40, 9)
    yield "topk_select", ops.topk_select.default, (
        score, 16, None, None, 1, 1, torch.empty(9, 2, 16, dtype=torch.int32))
    yield "topk_select_per_token", ops.topk_select.default, (
        score, 8, None, torch.randint(-2, 45, (9,), dtype=torch.int32), 0, 2,
        torch.empty(9, 2, 8, dtype=torch.int32))
    # The head-major output view (docs/semantics.md#topk-output).
    yield "topk_select_head_major", ops.topk_select.default, (
        score, 16, None, None, 0, 1, torch.empty(2, 9, 16, dtype=torch.int32).transpose(0, 1))
    q, k, v, q2k, cu_q, cu_k = _attn_inputs()
    yield "sparse_attention", ops.sparse_attention.default, (
        q, k, v, q2k, cu_q, cu_k, True, None, None, None, None, None, None, None, None, None, 1.0,
        torch.empty_like(q), torch.empty(20, 4), torch.empty(20, 4), None)
    yield "sparse_attention_no_lse", ops.sparse_attention.default, (
        q, k, v, q2k, cu_q, cu_k, False, 0.1, None, None, None, None, None, 0.5, 3, None, 1.0,
        torch.empty_like(q), None, None, torch.empty(0, dtype=torch.uint8))
    cache, table, used = paginate(torch.cat([k, v], 1), [300, 200])
    kp, vp = cache[:, :2].contiguous(), cache[:, 2:].contiguous()
    qd = torch.randn(4, 4, 128, dtype=BF16)
    q2kd = q2k[:, :4].contiguous()
    yield "sparse_decode", ops.sparse_decode.default, (
        qd, kp, vp, q2kd, table, used, None, 2, True, None, None, None, None, None, None, None,
        None, None, torch.empty_like(qd), torch.empty(4, 4), None)
    yield "sparse_decode_split_f32", ops.sparse_decode.default, (
        qd, kp, vp, q2kd, table, used, None, 2, True, None, None, None, None, None, None, None,
        torch.float32, False, torch.empty_like(qd), None, None)


CASES = list(_opcheck_cases())


@pytest.mark.parametrize("name,op,args", CASES, ids=[c[0] for c in CASES])
def test_opcheck(name, op, args):
    torch.library.opcheck(op, args)


def _pipeline(index_q, index_k, q, k, v, cu_q, cu_k, nvp):
    scores = msa_ops.msa_proxy_score(index_q, index_k, cu_q, cu_k, max_seqlen_q=12,
                                     max_k_tiles=3)
    sel = msa_ops.msa_topk_select(scores, 16, nvp, force_end_blocks=1)
    q2k = sel.transpose(0, 1).contiguous()
    out, lse = msa_ops.msa_sparse_attention(q, k, v, q2k, cu_q, cu_k, causal=True,
                                            return_softmax_lse=True)
    dec = msa_ops.msa_sparse_decode_attention(q[:4], k, v, q2k[:, :4].contiguous(),
                                              cu_seqlens_k=cu_k[:2], seqlen_q=4)
    return scores, sel, out, lse, dec


def test_torch_compile_fullgraph_pipeline():
    torch._dynamo.reset()
    q, k, v, _, cu_q, cu_k = _attn_inputs()
    index_q = torch.randn(20, 2, 128, dtype=BF16)
    index_k = torch.randn(500, 1, 128, dtype=BF16)
    nvp = torch.tensor([1, 2, 3] * 6 + [2, 2], dtype=torch.int32)
    args = (index_q, index_k, q, k, v, cu_q, cu_k, nvp)
    eager = _pipeline(*args)
    compiled = torch.compile(_pipeline, fullgraph=True, backend="aot_eager")(*args)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_each_op(backend):
    torch._dynamo.reset()
    q, k, cu_q, cu_k = _proxy_inputs()

    def proxy_then_topk(q, k, cu_q, cu_k):
        s = msa_ops.msa_proxy_score(q, k, cu_q, cu_k, max_seqlen_q=12, max_k_tiles=3,
                                    q_offset=4)
        return s, msa_ops.msa_topk_select(s, 2)

    eager = proxy_then_topk(q, k, cu_q, cu_k)
    compiled = torch.compile(proxy_then_topk, fullgraph=True, backend=backend)(q, k, cu_q, cu_k)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_wrappers_do_not_call_locals():
    # The compile tests above fail on torch 2.11, whose Dynamo cannot trace locals() (2.15's can, so
    # they pass here either way): the public wrappers pass their arguments by name.
    calls = [node for node in ast.walk(ast.parse(inspect.getsource(msa_ops)))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "locals"]
    assert not calls, [f"msa_ops.py:{node.lineno}" for node in calls]

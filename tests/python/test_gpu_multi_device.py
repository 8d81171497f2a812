"""The ops on a second GPU while the first is the current device (an engine that drives several
GPUs from one process, or calls an op outside its device context):

* every op with its tensors on cuda:1 while cuda:0 is current runs on cuda:1 (the binding's device
  guard and stream; the per-device caches of device limits, shared-memory opt-ins and occupancy)
  and gives the bits the same call gives on cuda:0 (the same kernels and plans on two H200s: every
  kernel is deterministic, docs/semantics.md#d11): proxy score (flat prefill, paged decode, NVFP4),
  top-k, sparse attention prefill (KV-major and shared-selection tiles) and decode (split-K, fused,
  MTP);
* the M3 decode step captured in a CUDA graph on cuda:1 replays the eager step's bits;
* tensors on two GPUs, or a workspace on the other GPU, raise ValueError naming the argument.

Skipped (not passed) without two CUDA devices or without a flashmsa build with CUDA kernels.
"""

from __future__ import annotations

import pytest
import torch

import flashmsa

if not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and flashmsa.built_with_cuda()):
    pytest.skip("needs two CUDA devices and a flashmsa build with CUDA kernels", allow_module_level=True)

from flashmsa import msa_ops  # noqa: E402
from flashmsa import testing as ft  # noqa: E402
from flashmsa.testing import inputs as mi  # noqa: E402
from flashmsa.testing.timing import capture_graph  # noqa: E402

D0, D1 = torch.device("cuda", 0), torch.device("cuda", 1)
TOPK = 16


def moved(args: dict, device) -> dict:
    return {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}


def same_bits(a, b) -> bool:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.detach().cpu().contiguous().view(torch.uint8),
                        y.detach().cpu().contiguous().view(torch.uint8))
        for x, y in zip(a, b))


# ---- the calls, built on the CPU with a seeded generator, moved to a device per run ------------

def proxy_prefill():
    gen = torch.Generator().manual_seed(1)
    sq, sk = [300, 77], [1000, 640]
    args = dict(q=mi.randn((sum(sq), 4, 128), gen, "cpu"), k=mi.randn((sum(sk), 1, 128), gen, "cpu"),
                cu_seqlens_q=ft.cu_seqlens(sq), cu_seqlens_k=ft.cu_seqlens(sk))
    return msa_ops.msa_proxy_score, args


def proxy_decode_paged():
    gen = torch.Generator().manual_seed(2)
    sk = [4096, 1500, 2048]
    k, table, used = ft.paginate(mi.randn((sum(sk), 1, 128), gen, "cpu"), sk, extra_pages=3,
                                 generator=torch.Generator().manual_seed(3))
    args = dict(q=mi.randn((len(sk), 4, 128), gen, "cpu"), k=k.to(torch.float8_e4m3fn),
                cu_seqlens_q=ft.cu_seqlens([1] * len(sk)), page_table=table, seqused_k=used)
    return msa_ops.msa_proxy_score, args


def proxy_fp4():
    gen = torch.Generator().manual_seed(4)
    s = 700
    q4, q_sc, q_gs = ft.quantize_nvfp4(mi.randn((s, 4, 128), gen, "cpu"))
    k4, k_sc, k_gs = ft.quantize_nvfp4(mi.randn((s, 1, 128), gen, "cpu"))
    cu = ft.cu_seqlens([s])
    args = dict(q_fp4=q4, k_fp4=k4, q_scale=q_sc, k_scale=k_sc, q_global_scale=q_gs,
                k_global_scale=k_gs, cu_seqlens_q=cu, cu_seqlens_k=cu)
    return msa_ops.msa_proxy_score_fp4, args


def topk():
    gen = torch.Generator().manual_seed(5)
    s, p = 200, 40
    scores = torch.randn((4, p, s), generator=gen)
    nvp = (torch.arange(s, dtype=torch.int32) * p // s + 1).to(torch.int32)
    args = dict(max_score=scores, topk=TOPK, num_valid_pages=nvp, force_end_blocks=1)
    return msa_ops.msa_topk_select, args


def sparse_prefill(pattern: str):
    def build():
        gen = torch.Generator().manual_seed(6)
        s = 2048
        pos = torch.arange(s)
        sel = (mi.clustered_selection(s, 4, TOPK, 7, "cpu") if pattern == "clustered"
               else mi.random_selection(pos, 4, TOPK, gen))
        cu = ft.cu_seqlens([s])
        args = dict(q=mi.randn((s, 64, 128), gen, "cpu"), k=mi.randn((s, 4, 128), gen, "cpu"),
                    v=mi.randn((s, 4, 128), gen, "cpu"), q2k_indices=sel, cu_seqlens_q=cu,
                    cu_seqlens_k=cu, causal=True, return_softmax_lse=True)
        return msa_ops.msa_sparse_attention, args
    return build


def sparse_decode(b: int, ctx: int, seqlen_q: int, kv_dtype=torch.bfloat16):
    def build():
        gen = torch.Generator().manual_seed(8)
        nb = ctx // mi.BLOCK
        lengths = torch.randint(seqlen_q, ctx + 1, (b,), generator=gen)
        lengths[0] = ctx
        pos = (lengths.view(-1, 1) - seqlen_q + torch.arange(seqlen_q)).view(-1)
        table = torch.randperm(b * nb, generator=gen).view(b, nb).to(torch.int32)
        args = dict(q=mi.randn((b * seqlen_q, 64, 128), gen, "cpu"),
                    k=mi.randn((b * nb, 4, mi.BLOCK, 128), gen, "cpu").to(kv_dtype),
                    v=mi.randn((b * nb, 4, mi.BLOCK, 128), gen, "cpu").to(kv_dtype),
                    q2k_indices=mi.random_selection(pos, 4, TOPK, gen), page_table=table,
                    seqused_k=lengths.to(torch.int32), seqlen_q=seqlen_q, causal=True,
                    return_softmax_lse=True)
        return msa_ops.msa_sparse_decode_attention, args
    return build


CALLS = {
    "proxy_prefill": proxy_prefill,
    "proxy_decode_paged_fp8": proxy_decode_paged,
    "proxy_fp4": proxy_fp4,
    "topk": topk,
    "prefill_random": sparse_prefill("random"),
    "prefill_clustered": sparse_prefill("clustered"),
    "decode_b1_split": sparse_decode(1, 32768, 1),
    "decode_b64_fused_fp8": sparse_decode(64, 2048, 1, torch.float8_e4m3fn),
    "decode_b8_mtp": sparse_decode(8, 4096, 4),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_op_on_the_second_gpu_matches_the_first(name):
    fn, args = CALLS[name]()
    torch.cuda.set_device(D0)
    first = fn(**moved(args, D0))
    second = fn(**moved(args, D1))  # cuda:0 stays current
    assert torch.cuda.current_device() == 0
    outs = second if isinstance(second, (tuple, list)) else (second,)
    assert all(t.device == D1 for t in outs)
    torch.cuda.synchronize(D0)
    torch.cuda.synchronize(D1)
    assert same_bits(second, first), f"{name}: cuda:1 and cuda:0 results differ"


def test_decode_step_graph_on_the_second_gpu():
    """proxy -> top-k (writing the head-major q2k) -> decode with a workspace, captured on cuda:1."""
    gen = torch.Generator().manual_seed(9)
    b, ctx = 8, 4096
    nb = ctx // mi.BLOCK
    table = torch.randperm(b * nb, generator=gen).view(b, nb).to(torch.int32).to(D1)
    used = torch.full((b,), ctx, dtype=torch.int32, device=D1)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=D1)
    idx_q, idx_k = mi.randn((b, 4, 128), gen, "cpu").to(D1), mi.randn((b * nb, 1, 128, 128), gen, "cpu").to(D1)
    q = mi.randn((b, 64, 128), gen, "cpu").to(D1)
    k = mi.randn((b * nb, 4, 128, 128), gen, "cpu").to(D1)
    v = mi.randn((b * nb, 4, 128, 128), gen, "cpu").to(D1)
    nvp = torch.full((b,), nb, dtype=torch.int32, device=D1)
    scores = torch.empty((4, nb, b), dtype=torch.float32, device=D1)
    q2k = torch.empty((4, b, TOPK), dtype=torch.int32, device=D1)
    ws = msa_ops.MSASparseAttentionWorkspace(D1)

    def step():
        msa_ops.msa_proxy_score(idx_q, idx_k, cu_q, None, page_table=table, seqused_k=used,
                                max_seqlen_q=1, max_k_tiles=nb, output=scores)
        msa_ops.msa_topk_select(scores, TOPK, num_valid_pages=nvp, force_end_blocks=1,
                                output=q2k.transpose(0, 1))
        out = msa_ops.msa_sparse_decode_attention(q, k, v, q2k, page_table=table, seqused_k=used,
                                                  workspace=ws)
        return out, q2k

    torch.cuda.set_device(D0)
    with torch.cuda.device(D1):
        eager = tuple(t.clone() for t in step())
        graph, static = capture_graph(step)
        for t in static:  # poisoned: a replay that writes nothing cannot pass
            t.fill_(-7 if not t.is_floating_point() else float("nan"))
        graph.replay()
        torch.cuda.synchronize(D1)
    assert same_bits(static, eager)


@pytest.mark.parametrize("name,arg", [("proxy_prefill", "k"), ("topk", "num_valid_pages"),
                                      ("prefill_random", "q2k_indices"),
                                      ("decode_b1_split", "page_table")])
def test_tensors_on_two_gpus_raise(name, arg):
    fn, args = CALLS[name]()
    args = moved(args, D1)
    args[arg] = args[arg].to(D0)
    with pytest.raises(ValueError, match=rf"{arg} must be on the same device as"):
        fn(**args)


@pytest.mark.parametrize("name", ["prefill_random", "decode_b1_split"])
def test_workspace_on_the_other_gpu_raises(name):
    fn, args = CALLS[name]()
    with pytest.raises(ValueError, match="workspace must be on the same device as"):
        fn(**moved(args, D1), workspace=msa_ops.MSASparseAttentionWorkspace(D0, 1 << 20))

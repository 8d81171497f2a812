"""CUDA graphs and determinism of the four ops on the GPU (docs/semantics.md#d10, #d11).

* Each op captured in a torch.cuda.CUDAGraph with max_seqlen_q / max_k_tiles / output= /
  workspace= given, replayed, and compared bit for bit with an eager call; then new inputs are
  copied into the static buffers and the replay must match an eager call on those.
* The whole MiniMax-M3 decode step (per-head selection: proxy over 4 index heads -> per-token top-k
  with force_end_blocks=1 -> transpose -> decode) captured at B=64, ctx 4096 and replayed on new
  inputs, including new sequence lengths; with a bf16 and with an NVFP4 indexer.
* Capturing the proxy without max_seqlen_q (or max_k_tiles) raises ValueError instead of syncing.
* Every op run twice on the same inputs gives bit-identical results; prefill under both schedules
  (plan option schedule=query_major / kv_major) with random and clustered selections.

Skipped (not passed) without a CUDA device or without a flashmsa build with CUDA kernels.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import flashmsa

if not (torch.cuda.is_available() and flashmsa.built_with_cuda()):
    pytest.skip("needs a CUDA device and a flashmsa build with CUDA kernels",
                allow_module_level=True)

from flashmsa import msa_ops  # noqa: E402
from flashmsa import testing as ft  # noqa: E402
from flashmsa.testing import inputs as mi  # noqa: E402
from flashmsa.testing.timing import capture_graph  # noqa: E402

DEV = torch.device("cuda")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
TOPK = 16


# ---- helpers ---------------------------------------------------------------------------------

def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def assert_bitwise_equal(actual, expected, what: str):
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what}[{i}]: {a.shape} vs {e.shape}"
        diff = (bits(a) != bits(e)).nonzero()
        assert diff.numel() == 0, (f"{what}[{i}]: {diff.shape[0]} bytes differ, first at byte "
                                   f"{diff[0].tolist()}")


def clone(out):
    return tuple(t.clone() for t in out) if isinstance(out, (tuple, list)) else out.clone()


def poison(out):
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(-7)


def accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def new_workspace():
    return msa_ops.MSASparseAttentionWorkspace(DEV)


def graph_kwargs(fn, *, output=None, workspace=None, max_seqlen_q=None) -> dict:
    """The capture arguments an attention op takes in this build (FlashInfer's prefill has no
    max_seqlen_q / output; flashmsa may add them). test_attention_ops_take_a_workspace pins the
    one argument D10 requires."""
    kw = {}
    if workspace is not None:
        kw["workspace"] = workspace
    if output is not None and accepts(fn, "output"):
        kw["output"] = output
    if max_seqlen_q is not None and accepts(fn, "max_seqlen_q"):
        kw["max_seqlen_q"] = max_seqlen_q
    return kw


capture = capture_graph  # warm up on a side stream, capture there: (graph, static outputs)


def replay_and_check(graph, static_out, eager_fn, what):
    expected = clone(eager_fn())
    poison(static_out)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(static_out, expected, what)


def refill(*tensors, gen):
    for t in tensors:
        if t.is_floating_point():
            t.copy_(mi.randn(t.shape, gen, DEV, torch.float32).to(t.dtype))
        else:
            raise TypeError("refill only floating-point inputs")


# ---- inputs ----------------------------------------------------------------------------------

class Prefill:
    """One causal sequence in the M3 head layout, flat or paged, bf16 or fp8 K/V."""

    def __init__(self, s, gen, *, hq=64, hkv=4, layout="flat", kv_dtype=BF16, pattern="random",
                 options=None):
        self.s, self.hq, self.hkv = s, hq, hkv
        self.options = options  # plan options (msa_ops._sparse_attention_planned)
        self.q = mi.randn((s, hq, 128), gen, DEV)
        k, v = mi.randn((s, hkv, 128), gen, DEV), mi.randn((s, hkv, 128), gen, DEV)
        self.cu_q = ft.cu_seqlens([s], DEV)
        self.kw = {}
        self.cu_k = self.cu_q
        if layout == "paged":
            cache, table, used = ft.paginate(torch.cat([k, v], dim=-1), [s], extra_pages=2,
                                             generator=torch.Generator().manual_seed(s))
            k, v = cache[..., :128].contiguous(), cache[..., 128:].contiguous()
            self.kw = dict(page_table=table, seqused_k=used)
            self.cu_k = None
        self.k, self.v = k.to(kv_dtype), v.to(kv_dtype)
        pos = torch.arange(s, device=DEV)
        if pattern == "clustered":
            self.sel = mi.clustered_selection(s, hkv, TOPK, 5, DEV)
        else:
            self.sel = mi.random_selection(pos, hkv, TOPK, gen)

    def run(self, **kw):
        return msa_ops._sparse_attention_planned(
            self.q, self.k, self.v, self.sel, self.cu_q, self.cu_k, causal=True,
            return_softmax_lse=True, **self.kw, **kw, options=self.options)


class Decode:
    """A paged decode batch: b requests of ragged length <= ctx, seqlen_q tokens each."""

    def __init__(self, b, ctx, seqlen_q, gen, *, hq=64, hkv=4, kv_dtype=BF16, options=None):
        self.b, self.seqlen_q = b, seqlen_q
        self.options = options  # plan options (msa_ops._sparse_decode_planned), None: the library's
        nb = ctx // mi.BLOCK
        lengths = torch.randint(seqlen_q, ctx + 1, (b,), generator=gen, device=DEV)
        lengths[0] = ctx
        self.seqused = lengths.to(torch.int32)
        self.page_table = torch.randperm(b * nb, generator=gen, device=DEV).view(b, nb)
        self.page_table = self.page_table.to(torch.int32).contiguous()
        self.k = mi.randn((b * nb, hkv, mi.BLOCK, 128), gen, DEV).to(kv_dtype)
        self.v = mi.randn((b * nb, hkv, mi.BLOCK, 128), gen, DEV).to(kv_dtype)
        self.q = mi.randn((b * seqlen_q, hq, 128), gen, DEV)
        pos = (lengths.view(-1, 1) - seqlen_q + torch.arange(seqlen_q, device=DEV)).view(-1)
        self.sel = mi.random_selection(pos, hkv, TOPK, gen)

    def run(self, **kw):
        if self.options is not None:
            kw["options"] = self.options
        fn = msa_ops._sparse_decode_planned if self.options is not None else \
            msa_ops.msa_sparse_decode_attention
        return fn(self.q, self.k, self.v, self.sel, page_table=self.page_table,
                  seqused_k=self.seqused, seqlen_q=self.seqlen_q, causal=True,
                  return_softmax_lse=True, **kw)


# ---- CUDA graphs -----------------------------------------------------------------------------

def test_attention_ops_take_a_workspace():
    assert hasattr(msa_ops, "MSASparseAttentionWorkspace")
    assert accepts(msa_ops.msa_sparse_attention, "workspace")
    assert accepts(msa_ops.msa_sparse_decode_attention, "workspace")


@pytest.mark.parametrize("layout", ["flat", "paged"])
def test_proxy_score_graph_replay(layout):
    gen = mi.cuda_generator(11, DEV)
    sq, sk = [300, 1, 77], [2048, 640, 1000]
    hq, hk = 4, 1
    p = math.ceil(max(sk) / mi.BLOCK)
    q = mi.randn((sum(sq), hq, 128), gen, DEV)
    cu_q = ft.cu_seqlens(sq, DEV)
    k = mi.randn((sum(sk), hk, 128), gen, DEV)
    if layout == "flat":
        kw = dict(cu_seqlens_k=ft.cu_seqlens(sk, DEV))
    else:
        k, table, used = ft.paginate(k, sk, extra_pages=2,
                                     generator=torch.Generator().manual_seed(1))
        kw = dict(page_table=table, seqused_k=used)
    static_out = torch.empty((hq, p, sum(sq)), dtype=torch.float32, device=DEV)

    def eager():
        return msa_ops.msa_proxy_score(q, k, cu_q, max_seqlen_q=max(sq), max_k_tiles=p, **kw)

    def graphed():
        return msa_ops.msa_proxy_score(q, k, cu_q, max_seqlen_q=max(sq), max_k_tiles=p,
                                       output=static_out, **kw)
    graph, out = capture(graphed)
    assert out.data_ptr() == static_out.data_ptr()
    replay_and_check(graph, static_out, eager, "proxy replay")
    refill(q, k, gen=gen)
    replay_and_check(graph, static_out, eager, "proxy replay on new inputs")


def test_topk_select_graph_replay():
    gen = mi.cuda_generator(12, DEV)
    h, p, s = 4, 300, 512
    score = torch.randn((h, p, s), generator=gen, device=DEV)
    nvp = torch.randint(1, p + 1, (s,), generator=gen, device=DEV).to(torch.int32)
    static_out = torch.empty((s, h, TOPK), dtype=torch.int32, device=DEV)

    def eager():
        return msa_ops.msa_topk_select(score, TOPK, num_valid_pages=nvp, force_end_blocks=1)

    def graphed():
        return msa_ops.msa_topk_select(score, TOPK, num_valid_pages=nvp, force_end_blocks=1,
                                       output=static_out)
    graph, _ = capture(graphed)
    replay_and_check(graph, static_out, eager, "topk replay")
    score.copy_(torch.randn(score.shape, generator=gen, device=DEV))
    nvp.copy_(torch.randint(1, p + 1, (s,), generator=gen, device=DEV))
    replay_and_check(graph, static_out, eager, "topk replay on new inputs")


@pytest.fixture(params=["query_major", "kv_major"])
def prefill_schedule(request):
    """Both prefill schedules, forced through the plan options of each call."""
    return request.param


@pytest.mark.parametrize("layout,kv_dtype,pattern", [
    ("flat", BF16, "random"), ("flat", BF16, "clustered"), ("paged", FP8, "clustered")])
def test_sparse_attention_graph_replay(layout, kv_dtype, pattern, prefill_schedule):
    gen = mi.cuda_generator(13, DEV)
    x = Prefill(1024, gen, layout=layout, kv_dtype=kv_dtype, pattern=pattern,
                options=dict(schedule=prefill_schedule))
    static_out = torch.empty_like(x.q)
    ws = new_workspace()
    kw = graph_kwargs(msa_ops.msa_sparse_attention, output=static_out, workspace=ws,
                      max_seqlen_q=x.s)
    graph, out = capture(lambda: x.run(**kw))
    replay_and_check(graph, out, x.run, "sparse attention replay")
    refill(x.q, gen=gen)
    x.k.copy_(mi.randn(x.k.shape, gen, DEV, torch.float32).to(x.k.dtype))
    replay_and_check(graph, out, x.run, "sparse attention replay on new inputs")


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_workspace_grows_once_and_capture_refuses_growth(op):
    """The ops run against the caller's workspace as it is and grow it only where the core finds
    it too small (then they run again): the first eager call grows an empty workspace, the next
    ones keep its buffer, the bits are those of the op without a workspace; under CUDA-graph
    capture a workspace too small for the call is a ValueError naming the bytes it needs."""
    gen = mi.cuda_generator(21, DEV)
    if op == "decode":
        x = Decode(8, 4096, 1, gen)
        call = lambda **kw: x.run(force_fused=False, **kw)  # noqa: E731  split-K: partials in the workspace
    else:
        x = Prefill(2048, gen, options=dict(schedule="kv_major"))
        call = x.run
    expected = clone(call())
    ws = new_workspace()
    assert ws.nbytes == 0
    assert_bitwise_equal(call(workspace=ws), expected, f"{op} growing its workspace")
    grown = ws.buffer
    assert ws.nbytes > 0
    for _ in range(2):
        assert_bitwise_equal(call(workspace=ws), expected, f"{op} on its grown workspace")
        assert ws.buffer is grown
    small = new_workspace()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"cannot grow during CUDA graph capture"):
        with torch.cuda.graph(graph, stream=stream):
            call(workspace=small)
    torch.cuda.synchronize()
    assert small.nbytes == 0


@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("fused", [True, False])
def test_sparse_decode_graph_replay(seqlen_q, fused):
    gen = mi.cuda_generator(14, DEV)
    x = Decode(16, 2048, seqlen_q, gen)
    static_out = torch.empty_like(x.q)
    ws = new_workspace()
    kw = graph_kwargs(msa_ops.msa_sparse_decode_attention, output=static_out, workspace=ws)
    graph, out = capture(lambda: x.run(force_fused=fused, **kw))
    replay_and_check(graph, out, lambda: x.run(force_fused=fused), "decode replay")
    refill(x.q, x.v, gen=gen)
    replay_and_check(graph, out, lambda: x.run(force_fused=fused), "decode replay on new inputs")


@pytest.mark.parametrize("fused", [True, False])
def test_sparse_decode_mtp_union_regs_graph_replay(fused):
    """MTP union items with fp8 K/V converted in registers (plan options kernel=regs, mtp=union)."""
    gen = mi.cuda_generator(16, DEV)
    x = Decode(16, 2048, 4, gen, kv_dtype=FP8, options=dict(kernel="regs", mtp="union"))
    static_out = torch.empty_like(x.q)
    ws = new_workspace()
    kw = graph_kwargs(msa_ops.msa_sparse_decode_attention, output=static_out, workspace=ws)
    graph, out = capture(lambda: x.run(force_fused=fused, **kw))
    replay_and_check(graph, out, lambda: x.run(force_fused=fused), "union regs decode replay")
    refill(x.q, gen=gen)
    x.v.copy_(mi.randn(x.v.shape, gen, DEV, torch.float32).to(x.v.dtype))
    replay_and_check(graph, out, lambda: x.run(force_fused=fused),
                     "union regs decode replay on new inputs")


@pytest.mark.parametrize("kv_dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_sparse_decode_mtp_auto_b64_graph_replay(kv_dtype):
    """auto's MTP plan at B64 / 4 tokens / M3 heads: the sm_90a wgmma union kernel on an sm_90 GPU
    (bf16, and fp8 K/V converted by its converter warps: wgmma_fp8=auto), the union kernels
    elsewhere. Captured once, replayed bit for bit, also on new inputs; run twice eagerly, the same
    bits."""
    gen = mi.cuda_generator(17, DEV)
    x = Decode(64, 2048, 4, gen, kv_dtype=kv_dtype)
    a, b = twice(lambda: x.run())
    assert_bitwise_equal(b, a, "auto MTP B64 decode run twice")
    static_out = torch.empty_like(x.q)
    ws = new_workspace()
    kw = graph_kwargs(msa_ops.msa_sparse_decode_attention, output=static_out, workspace=ws)
    graph, out = capture(lambda: x.run(**kw))
    replay_and_check(graph, out, lambda: x.run(), "auto MTP B64 decode replay")
    refill(x.q, gen=gen)
    x.v.copy_(mi.randn(x.v.shape, gen, DEV, torch.float32).to(x.v.dtype))
    replay_and_check(graph, out, lambda: x.run(), "auto MTP B64 decode replay on new inputs")


@pytest.mark.parametrize("kv_dtype", [BF16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("b", [1, 8, 64])
def test_sparse_decode_split_warps8_graph_replay(b, kv_dtype):
    """Decode with 8 warps per CTA (plan option split_warps=8; fp8 K/V converted in registers):
    B1 / 32K (16 splits of one block), B8 (2 blocks per split) and B64 (fused), replayed to the
    eager call's bits, then on new inputs."""
    gen = mi.cuda_generator(17, DEV)
    x = Decode(b, 32768 if b == 1 else 4096, 1, gen, kv_dtype=kv_dtype, options=dict(split_warps=8))
    static_out = torch.empty_like(x.q)
    ws = new_workspace()
    kw = graph_kwargs(msa_ops.msa_sparse_decode_attention, output=static_out, workspace=ws)
    graph, out = capture(lambda: x.run(**kw))
    replay_and_check(graph, out, lambda: x.run(), "split_warps=8 decode replay")
    refill(x.q, x.v, gen=gen)
    replay_and_check(graph, out, lambda: x.run(), "split_warps=8 decode replay on new inputs")


@pytest.mark.parametrize("indexer", ["bf16", "nvfp4"])
def test_m3_decode_pipeline_graph_replay(indexer):
    """vLLM's M3 decode step, per-head selection (index heads == kv heads == 4), B=64, ctx 4096;
    nvfp4: the NVFP4 indexer (msa_proxy_score_fp4 over the quantized index q and K, paged), new
    inputs quantized with the global scales the graph captured."""
    gen = mi.cuda_generator(15, DEV)
    b, ctx, hq, hkv, idx_hq, idx_hk = 64, 4096, 64, 4, 4, 1
    nb = ctx // mi.BLOCK
    page_table = torch.randperm(b * nb, generator=gen, device=DEV).view(b, nb)
    page_table = page_table.to(torch.int32).contiguous()
    seqused = torch.full((b,), ctx, dtype=torch.int32, device=DEV)
    cu_q = torch.arange(0, b + 1, dtype=torch.int32, device=DEV)
    idx_q = mi.randn((b, idx_hq, 128), gen, DEV)
    idx_k = mi.randn((b * nb, idx_hk, mi.BLOCK, 128), gen, DEV)
    q = mi.randn((b, hq, 128), gen, DEV)
    k = mi.randn((b * nb, hkv, mi.BLOCK, 128), gen, DEV)
    v = mi.randn((b * nb, hkv, mi.BLOCK, 128), gen, DEV)
    fp4 = indexer == "nvfp4"
    if fp4:
        q4, q_sc, q_gs = ft.quantize_nvfp4(idx_q)
        k4, k_sc, k_gs = ft.quantize_nvfp4(idx_k)
    score_buf = torch.empty((idx_hq, nb, b), dtype=torch.float32, device=DEV)
    sel_buf = torch.empty((b, idx_hq, TOPK), dtype=torch.int32, device=DEV)
    out_buf = torch.empty_like(q)
    ws = new_workspace()

    def step(static: bool):
        kw = dict(page_table=page_table, seqused_k=seqused, causal=True, max_seqlen_q=1,
                  max_k_tiles=nb, reduce_heads=False, output=score_buf if static else None)
        if fp4:
            scores = msa_ops.msa_proxy_score_fp4(q4, k4, q_sc, k_sc, q_gs, k_gs, cu_q, None, **kw)
        else:
            scores = msa_ops.msa_proxy_score(idx_q, idx_k, cu_q, None, **kw)
        nvp = ((seqused - 1) // mi.BLOCK + 1).to(torch.int32)  # position // 128 + 1, per token
        sel = msa_ops.msa_topk_select(scores, TOPK, num_valid_pages=nvp, force_end_blocks=1,
                                      output=sel_buf if static else None)
        q2k = sel.transpose(0, 1).contiguous()
        kw = (graph_kwargs(msa_ops.msa_sparse_decode_attention, output=out_buf, workspace=ws)
              if static else {})
        return msa_ops.msa_sparse_decode_attention(q, k, v, q2k, page_table=page_table,
                                                   seqused_k=seqused, seqlen_q=1, causal=True,
                                                   **kw)
    graph, out = capture(lambda: step(True))
    replay_and_check(graph, out, lambda: step(False), "M3 decode step replay")
    # New step: new data everywhere and new (ragged) lengths, same static buffers.
    refill(idx_q, idx_k, q, k, v, gen=gen)
    if fp4:
        for x, data, scale, gs in ((idx_q, q4, q_sc, q_gs), (idx_k, k4, k_sc, k_gs)):
            new_data, new_scale, _ = ft.quantize_nvfp4(x, gs)
            data.copy_(new_data)
            scale.copy_(new_scale)
    seqused.copy_(torch.randint(1, ctx + 1, (b,), generator=gen, device=DEV))
    replay_and_check(graph, out, lambda: step(False), "M3 decode step replay on new inputs")


@pytest.mark.parametrize("missing", ["max_seqlen_q", "max_k_tiles"])
def test_proxy_capture_without_dims_raises(missing):
    gen = mi.cuda_generator(16, DEV)
    s = 256
    q, k = mi.randn((s, 4, 128), gen, DEV), mi.randn((s, 1, 128), gen, DEV)
    cu = ft.cu_seqlens([s], DEV)
    dims = dict(max_seqlen_q=s, max_k_tiles=s // mi.BLOCK)
    del dims[missing]
    msa_ops.msa_proxy_score(q, k, cu, cu, **dims)  # eager is fine: it may read cu_seqlens
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=missing):
        with torch.cuda.graph(graph):
            msa_ops.msa_proxy_score(q, k, cu, cu, **dims)


# ---- determinism -----------------------------------------------------------------------------

def twice(fn):
    first = clone(fn())
    torch.cuda.synchronize()
    return first, fn()


@pytest.mark.parametrize("case", ["prefill", "decode-paged"])
def test_proxy_score_deterministic(case):
    gen = mi.cuda_generator(21, DEV)
    if case == "prefill":
        s = 8192
        q, k = mi.randn((s, 4, 128), gen, DEV), mi.randn((s, 1, 128), gen, DEV)
        cu = ft.cu_seqlens([s], DEV)
        a, b = twice(lambda: msa_ops.msa_proxy_score(q, k, cu, cu, max_seqlen_q=s,
                                                     max_k_tiles=s // mi.BLOCK))
    else:
        x = Decode(64, 8192, 1, gen, hq=4, hkv=1)
        cu_q = torch.arange(0, 65, dtype=torch.int32, device=DEV)
        a, b = twice(lambda: msa_ops.msa_proxy_score(
            x.q, x.k, cu_q, None, page_table=x.page_table, seqused_k=x.seqused, max_seqlen_q=1,
            max_k_tiles=x.page_table.shape[1]))
    assert_bitwise_equal(b, a, f"proxy {case} run twice")


@pytest.mark.parametrize("p,s", [(64, 8192), (1024, 2048)])
def test_topk_select_deterministic(p, s):
    gen = mi.cuda_generator(22, DEV)
    score = torch.randn((4, p, s), generator=gen, device=DEV)
    score[:, ::5] = score[:, 1::5][:, : score[:, ::5].shape[1]]  # exact ties across blocks
    nvp = torch.randint(1, p + 1, (s,), generator=gen, device=DEV).to(torch.int32)
    a, b = twice(lambda: msa_ops.msa_topk_select(score, TOPK, num_valid_pages=nvp,
                                                 force_end_blocks=1))
    assert_bitwise_equal(b, a, "topk run twice")


@pytest.mark.parametrize("layout,kv_dtype", [("flat", BF16), ("paged", FP8)])
@pytest.mark.parametrize("pattern", ["random", "clustered"])
def test_sparse_attention_deterministic(layout, kv_dtype, pattern, prefill_schedule):
    gen = mi.cuda_generator(23, DEV)
    x = Prefill(4096, gen, layout=layout, kv_dtype=kv_dtype, pattern=pattern,
                options=dict(schedule=prefill_schedule))
    a, b = twice(x.run)
    assert_bitwise_equal(b, a, f"sparse attention {pattern} {prefill_schedule} run twice")


@pytest.mark.parametrize("pattern,chunk_rows", [("random", None), ("clustered", None), ("random", 100)])
def test_kv_major_prefill_deterministic_repeated(pattern, chunk_rows):
    """The KV-major schedule called 12 times on the same inputs: every output bit the same as the
    first call's. Its sm_90a kernel stages each warp's partials in the tile's consumed query
    buffer, whose rows belong to other warps too; two identical calls once differed on the H200
    (at 9738086) before a warpgroup barrier ordered every warp's S = Q K^T reads before those
    writes. They differed again at 2d277ce (random, call 10): each item's K / V block is copied by
    all four warpgroups and a warpgroup's first MMA waited for its own copies only (fixed by a CTA
    barrier in round 0). Rare interleavings, hence the repeats; chunk_rows=100 makes many short
    lists, so many more item starts."""
    gen = mi.cuda_generator(26, DEV)
    options = dict(schedule="kv_major")
    if chunk_rows is not None:
        options["chunk_rows"] = chunk_rows
    x = Prefill(4096, gen, pattern=pattern, options=options)
    first = clone(x.run())
    for i in range(11):
        assert_bitwise_equal(x.run(), first, f"kv_major {pattern} chunk_rows={chunk_rows} call {i + 2} vs call 1")


@pytest.mark.parametrize("fused", [True, False, None])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_sparse_decode_deterministic(fused, seqlen_q):
    gen = mi.cuda_generator(24, DEV)
    x = Decode(64, 8192, seqlen_q, gen)
    a, b = twice(lambda: x.run(force_fused=fused))
    assert_bitwise_equal(b, a, "decode run twice")


@pytest.mark.parametrize("fused", [True, False, None])
def test_sparse_decode_mtp_union_regs_deterministic(fused):
    gen = mi.cuda_generator(25, DEV)
    x = Decode(64, 8192, 4, gen, kv_dtype=FP8, options=dict(kernel="regs", mtp="union"))
    a, b = twice(lambda: x.run(force_fused=fused))
    assert_bitwise_equal(b, a, "union regs decode run twice")

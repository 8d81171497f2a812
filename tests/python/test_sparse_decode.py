"""msa_sparse_decode_attention against the float64 torch reference (docs/semantics.md#decode):
uniform seqlen_q per request, right-aligned positions, GQA up to 16, fp8 q (bf16 output), fp8 /
NVFP4 K/V, paged / flat / packed caches, every partial dtype and schedule, index-list semantics and
the return conventions."""

import dataclasses
import functools
import math
from typing import List

import pytest
import torch

from flashmsa.testing import reference as ref
from conftest import DEVICES
from test_sparse_attention import Q2K_VIEWS, q2k_view, shared_rows
from flashmsa import msa_ops
from flashmsa.testing import cases, pack_kv, paginate, quantize_nvfp4

FP8 = torch.float8_e4m3fn


DecodeCase = cases.DecodeCase
CASES = cases.cases(cases.DECODE, "reference")


def _selection(case: DecodeCase, seqlens_k: List[int]) -> torch.Tensor:
    if case.selection not in ("random", "holes", "duplicates", "unsorted"):
        raise ValueError(f"{case}: selection {case.selection!r} is not one of this builder's")
    total_q = case.batch * case.seqlen_q
    sel = torch.full((case.hkv, total_q, case.topk), -1, dtype=torch.int32)
    for r in range(total_q):
        nb = math.ceil(seqlens_k[r // case.seqlen_q] / 128)
        for h in range(case.hkv):
            n = int(torch.randint(0, min(case.topk, nb) + 1, (1,))) if nb else 0
            ids = torch.randperm(nb)[:n]
            if case.selection != "unsorted":
                ids = ids.sort().values
            if case.selection == "holes" and n:
                ids = torch.cat([ids[: n // 2], torch.tensor([-1]), ids[n // 2:]])[: case.topk]
            if case.selection == "duplicates" and n:
                ids = torch.cat([ids, ids[:1]])[: case.topk]
            sel[h, r, : len(ids)] = ids.to(torch.int32)
    return sel


def build(case: DecodeCase, device: str):
    if isinstance(case.seqlens, list):
        seqlens_k = list(case.seqlens)
    elif case.seqlens == "multiples":  # random multiples of 128 in [256, 1920]
        seqlens_k = [128 * int(torch.randint(2, 16, (1,))) for _ in range(case.batch)]
    else:
        raise ValueError(f"{case}: seqlens {case.seqlens!r} is not one of this builder's")
    if case.invalid_pages or case.softmax_scale is not None or case.v_global_scale is not None \
            or case.layout not in ("flat", "paged", "packed", "nhd"):
        raise ValueError(f"{case}: an option this builder does not implement")
    total_q = case.batch * case.seqlen_q
    compute = torch.bfloat16 if case.q_dtype == FP8 else case.q_dtype
    q = (torch.randn(total_q, case.hq, 128) / 3).to(case.q_dtype)
    k = torch.randn(sum(seqlens_k), case.hkv, 128) / 3
    v = torch.randn(sum(seqlens_k), case.hkv, 128) / 3
    kw = dict(seqlen_q=case.seqlen_q, causal=case.causal, return_softmax_lse=True,
              partial_dtype=case.partial_dtype, force_fused=case.force_fused)
    if case.layout == "flat":
        k_st, v_st = k.to(compute), v.to(compute)
        kw["cu_seqlens_k"] = ref.cu_seqlens(seqlens_k)
        loc = dict(cu_seqlens_k=kw["cu_seqlens_k"])
    else:
        cache, page_table, seqused = paginate(torch.cat([k, v], 1).to(compute), seqlens_k)
        k_st = cache[:, :case.hkv].contiguous()
        v_st = cache[:, case.hkv:].contiguous()
        kw.update(page_table=page_table, seqused_k=seqused)
        loc = dict(page_table=page_table, seqused_k=seqused)
    out_scale = 1.0
    if case.kv == "fp8":
        k_st, v_st = k_st.to(FP8), v_st.to(FP8)
        k_deq, v_deq = ref.f64(k_st), ref.f64(v_st)
    elif case.kv == "nvfp4":
        kd, ks, kgs = quantize_nvfp4(k_st, global_scale=448 * 6 / float(k.abs().max()))
        vd, vs, vgs = quantize_nvfp4(v_st, global_scale=448 * 6 / float(v.abs().max()))
        k_deq, v_deq = ref.nvfp4_dequant(kd, ks) * kgs, ref.nvfp4_dequant(vd, vs)
        out_scale = vgs
        k_st, v_st = kd, vd
        kw.update(k_scale=ks, v_scale=vs, k_global_scale=kgs, v_global_scale=vgs)
    else:
        k_deq, v_deq = ref.f64(k_st), ref.f64(v_st)
    if case.layout == "packed":
        cache, k_st, v_st = pack_kv(k_st, v_st)
        cache = cache.to(device)
        k_st, v_st = cache[..., :128], cache[..., 128:]
    elif case.layout == "nhd":  # separate K and V caches, NHD pages seen as (P, H, 128, W)
        k_st, v_st = (x.transpose(1, 2).contiguous().to(device).transpose(1, 2) for x in (k_st, v_st))
    else:
        k_st, v_st = k_st.to(device), v_st.to(device)
    q_offset = case.q_offset
    if isinstance(q_offset, list):
        q_offset = torch.tensor(q_offset, dtype=torch.int32)
    kw["q_offset"] = q_offset
    q2k = _selection(case, seqlens_k)
    kw = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    expected = ref.attention(q, ref.sequences(k_deq, **loc), ref.sequences(v_deq, **loc), q2k,
                             [b * case.seqlen_q for b in range(case.batch)],
                             [case.seqlen_q] * case.batch, causal=case.causal,
                             q_offset=q_offset, out_scale=out_scale)
    return (q.to(device), k_st, v_st, q2k.to(device)), kw, expected, compute


def _tolerance(case: DecodeCase):
    if case.partial_dtype == FP8:  # e4m3 partial outputs carry ~2^-4 relative error
        return dict(atol=3e-2, rtol=6e-2, rel_l2=6e-2)
    return dict(atol=4e-3, rtol=2e-2, rel_l2=1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_sparse_decode_matches_reference(case, device):
    args, kw, (exp_out, exp_lse, _), compute = build(case, device)
    out, lse = msa_ops.msa_sparse_decode_attention(*args, **kw)
    assert out.dtype == compute and out.shape == args[0].shape
    assert lse.dtype == torch.float32 and lse.shape == out.shape[:2]
    ref.assert_close(out, exp_out, **_tolerance(case), what="out")
    ref.assert_close(lse, exp_lse, atol=2e-3, rtol=1e-4, what="lse")
    assert bool((out.cpu()[torch.isinf(exp_lse)] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_decode_schedules_agree(device):
    """Fused and split-K (every partial dtype but fp8) agree closely; the LSE -inf pattern is the
    same everywhere."""
    case = DecodeCase("c", 8, 2, 16, 2, seqlens=[3000, 128, 1, 2000, 700, 900, 4096, 256],
                      selection="random")
    args, kw, *_ = build(case, device)
    runs = []
    for fused in (True, False, None):
        for partial in (None, torch.float32, torch.bfloat16):
            runs.append(msa_ops.msa_sparse_decode_attention(
                *args, **dict(kw, force_fused=fused, partial_dtype=partial)))
    out0, lse0 = runs[0]
    for out, lse in runs[1:]:
        ref.assert_close(out, out0.float(), atol=5e-3, what="out across schedules")
        ref.assert_close(lse, lse0, atol=1e-3, what="lse across schedules")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seqlen_q,options", [(1, {}), (4, dict(mtp="per_token")),
                                              (4, dict(mtp="union")),
                                              (4, dict(mtp="union", kernel="wgmma"))],
                         ids=["sq1", "per_token", "union", "union_wgmma"])
@pytest.mark.parametrize("layout", Q2K_VIEWS)
def test_sparse_decode_strided_q2k(device, seqlen_q, options, layout):
    """A strided q2k (the transpose of a token-major buffer's row range, as vLLM passes its top-k
    buffer; a head-major buffer's row range with padded rows; an expand over the heads) gives bit
    for bit the contiguous q2k's results: per-token items and MTP union items (whose plan reads
    the tokens' rows by the q2k strides; on sm_90a also the TMA-fed MTP kernel's)."""
    case = DecodeCase("c", 5, seqlen_q, 16, 2, seqlens="multiples", selection="random", topk=8)
    args, kw, expected, _ = build(case, device)
    args = list(args)
    if layout == "expand":
        args[3] = shared_rows(args[3])
    planned = functools.partial(msa_ops._sparse_decode_planned, options=options)
    want = planned(*args, **kw)
    got = planned(*args[:3], q2k_view(args[3], layout), **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if layout != "expand":
        ref.assert_close(got[0], expected[0], **_tolerance(case))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv", ["same", "fp8"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_sparse_decode_nhd_equals_paged(device, kv, seqlen_q):
    """Separate K and V caches with NHD pages, passed as (P, H, 128, W) views
    (docs/semantics.md#packed-kv): bit for bit the contiguous caches' results."""
    case = DecodeCase("c", 5, seqlen_q, 16, 2, kv=kv, seqlens="multiples", selection="random")
    torch.manual_seed(5)
    args, kw, *_ = build(case, device)
    torch.manual_seed(5)
    nhd_args, nhd_kw, *_ = build(dataclasses.replace(case, layout="nhd"), device)
    assert not nhd_args[1].is_contiguous() and torch.equal(nhd_args[1], args[1])
    a = msa_ops.msa_sparse_decode_attention(*args, **kw)
    c = msa_ops.msa_sparse_decode_attention(*nhd_args, **nhd_kw)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_decode_nhd_views_one_page(device):
    """One page of separate NHD K and V caches whose page strides differ (a size-1 dim's stride
    is never read): accepted, and bit for bit the contiguous caches' results."""
    torch.manual_seed(6)
    hkv, hq = 2, 8
    kc = torch.randn(1, 128, hkv, 128).to(torch.bfloat16).to(device)
    vbuf = torch.randn(1, 130, hkv, 128).to(torch.bfloat16).to(device)
    k, v = kc.transpose(1, 2), vbuf[:, :128].transpose(1, 2)  # views made on the device
    assert k.stride(0) != v.stride(0) and k.stride()[1:] == v.stride()[1:]
    assert not k.is_contiguous() and not v.is_contiguous()
    q = (torch.randn(1, hq, 128) / 3).to(torch.bfloat16)
    q2k = torch.zeros(hkv, 1, 1, dtype=torch.int32)
    extra = dict(page_table=torch.zeros(1, 1, dtype=torch.int32),
                 seqused_k=torch.tensor([100], dtype=torch.int32))

    def on(*tensors, **kw):
        kw = {n: x.to(device) for n, x in kw.items()}
        return msa_ops.msa_sparse_decode_attention(*(x.to(device) for x in tensors), **kw,
                                                   return_softmax_lse=True)

    got = on(q, k, v, q2k, **extra)
    want = on(q, k.contiguous(), v.contiguous(), q2k, **extra)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_decode_return_conventions_and_workspace(device):
    case = DecodeCase("c", 4, 1, 8, 2, seqlens="multiples", selection="random")
    args, kw, *_ = build(case, device)
    kw = dict(kw, return_softmax_lse=False)
    out = msa_ops.msa_sparse_decode_attention(*args, **kw)
    assert isinstance(out, torch.Tensor)
    out2, lse = msa_ops.msa_sparse_decode_attention(*args, **dict(kw, return_softmax_lse=True))
    assert torch.equal(out, out2) and lse.shape == (4, 8)
    ws = msa_ops.MSASparseAttentionWorkspace(device)
    assert torch.equal(msa_ops.msa_sparse_decode_attention(*args, **kw, workspace=ws), out)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_decode_equals_prefill(device):
    """Decode is the prefill math with cu_seqlens_q = arange * seqlen_q (same selection)."""
    case = DecodeCase("c", 3, 2, 8, 2, layout="flat", seqlens=[700, 1500, 256],
                      selection="random")
    args, kw, (exp_out, *_), _ = build(case, device)
    q, k, v, q2k = args
    cu_q = torch.arange(0, 7, 2, dtype=torch.int32, device=device)
    prefill = msa_ops.msa_sparse_attention(q, k, v, q2k, cu_q, kw["cu_seqlens_k"], causal=True)
    decode = msa_ops.msa_sparse_decode_attention(*args, **dict(kw, return_softmax_lse=False))
    ref.assert_close(decode, prefill.float(), atol=5e-3)
    ref.assert_close(prefill, exp_out, **_tolerance(case))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_dtype,kv,fused", [(torch.bfloat16, "same", None),
                                              (torch.bfloat16, "same", False),
                                              (torch.float16, "nvfp4", None),
                                              (FP8, "fp8", None)])
def test_sparse_decode_out_is_written_in_place(device, q_dtype, kv, fused):
    """out= (FlashInfer 0.7.4, keyword-only): written in place (bf16 for fp8 q), returned, equal
    to the allocating call, fused or split."""
    case = DecodeCase("c", 5, 2, 16, 2, q_dtype=q_dtype, kv=kv, seqlens="multiples",
                      selection="random", force_fused=fused)
    args, kw, _, compute = build(case, device)
    want = msa_ops.msa_sparse_decode_attention(*args, **kw)
    out = torch.full(args[0].shape, float("nan"), dtype=compute, device=device)
    got = msa_ops.msa_sparse_decode_attention(*args, **kw, out=out)
    assert got[0] is out
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_decode_out_bad(device):
    case = DecodeCase("c", 3, 1, 8, 2, q_dtype=FP8, kv="fp8", seqlens="multiples",
                      selection="random")
    args, kw, *_ = build(case, device)
    q = args[0]
    bad = {
        "out must be bfloat16, got float8_e4m3fn": torch.empty_like(q),
        r"out must be \(total_q, num_qo_heads, 128\)": torch.empty(q.shape[0], 4, 128,
                                                                   dtype=torch.bfloat16,
                                                                   device=device),
        "out must be contiguous": torch.empty(q.shape[0], 128, q.shape[1], dtype=torch.bfloat16,
                                              device=device).transpose(1, 2),
    }
    for message, out in bad.items():
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_sparse_decode_attention(*args, **kw, out=out)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
    seqused = out.view(torch.int32).view(-1)[: kw["seqused_k"].numel()]
    seqused.copy_(kw["seqused_k"])  # seqused_k stored inside out
    with pytest.raises(ValueError, match="out must not share memory with seqused_k"):
        msa_ops.msa_sparse_decode_attention(*args, **dict(kw, seqused_k=seqused), out=out)

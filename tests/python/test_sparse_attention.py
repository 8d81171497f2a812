"""msa_sparse_attention against the float64 torch reference (docs/semantics.md#sparse-attention,
#d5, #d6, #d8): GQA groups, topk 1..64, every KV dtype and layout, index-list semantics (unsorted,
#duplicates, out of range,
-1 holes, empty rows), q_offset, scales, LSE and temperature LSE; plus layout exactness (paged ==
flat, packed views == contiguous) and the return conventions."""

import dataclasses
import functools
import math
from typing import Optional

import pytest
import torch

from flashmsa.testing import reference as ref
from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import cases, pack_kv, paginate, quantize_nvfp4

FP8 = torch.float8_e4m3fn


AttnCase = cases.AttentionCase
CASES = cases.cases(cases.ATTENTION, "reference")


# ---- inputs ------------------------------------------------------------------------------------

def make_selection(case: AttnCase) -> torch.Tensor:
    """q2k_indices (Hkv, total_q, topk) int32 of the case's selection kind."""
    total_q = sum(case.seqs_q)
    sel = torch.full((case.hkv, total_q, case.topk), -1, dtype=torch.int32)
    row = 0
    for sq, sk in zip(case.seqs_q, case.seqs_k):
        nb = math.ceil(sk / 128)
        for _ in range(sq):
            for h in range(case.hkv):
                kind = case.selection
                n = int(torch.randint(0, min(case.topk, nb) + 1, (1,))) if nb else 0
                ids = torch.randperm(nb)[:n]
                if kind == "random" or kind == "some_empty":
                    if kind == "some_empty" and torch.rand(1) < 0.35:
                        ids = ids[:0]
                    ids = ids.sort().values
                elif kind == "unsorted":
                    pass
                elif kind == "duplicates":
                    ids = torch.cat([ids, ids])[: case.topk] if n else ids
                elif kind == "out_of_range":
                    extra = torch.tensor([nb, nb + 3, 10 ** 6])[: max(case.topk - n, 0)]
                    ids = torch.cat([ids, extra])[torch.randperm(n + len(extra))]
                elif kind == "holes":
                    # Entries after the first -1 are ignored, whatever they hold.
                    k = max(n // 2, 0)
                    ids = torch.cat([ids[:k], torch.tensor([-1]), ids[k:]])[: case.topk]
                elif kind == "last_two":
                    ids = torch.tensor([nb - 2, nb - 1])
                else:
                    raise ValueError(f"{case}: selection {kind!r} is not one of this builder's")
                sel[h, row, : len(ids)] = ids.to(torch.int32)
            row += 1
    return sel


@dataclasses.dataclass
class Built:
    args: tuple
    kwargs: dict
    q: torch.Tensor
    keys: list       # per sequence float64 (seqlen_k, Hkv, 128), what the op reads
    values: list
    q2k: torch.Tensor
    out_scale: float


def build(case: AttnCase, device: str, q2k: Optional[torch.Tensor] = None) -> Built:
    if case.invalid_pages or case.extra_rows:
        raise ValueError(f"{case}: an option this builder does not implement")
    total_q, total_k = sum(case.seqs_q), sum(case.seqs_k)
    q = (torch.randn(total_q, case.hq, 128) / 3).to(case.dtype)
    k = torch.randn(total_k, case.hkv, 128) / 3
    v = torch.randn(total_k, case.hkv, 128) / 3
    q2k = make_selection(case) if q2k is None else q2k
    cu_q, cu_k = ref.cu_seqlens(case.seqs_q), ref.cu_seqlens(case.seqs_k)
    paged = case.layout != "flat"
    kw = {}
    if paged:
        cache, page_table, seqused = paginate(torch.cat([k, v], 1).to(case.dtype), case.seqs_k,
                                              extra_pages=1)
        k_st = cache[:, :case.hkv].contiguous()
        v_st = cache[:, case.hkv:].contiguous()
        kw.update(page_table=page_table, seqused_k=seqused)
    else:
        k_st, v_st = k.to(case.dtype), v.to(case.dtype)
        kw.update(cu_seqlens_k=cu_k)
    out_scale = 1.0
    if case.kv == "fp8":
        k_st, v_st = k_st.to(FP8), v_st.to(FP8)
        k_deq, v_deq = ref.f64(k_st), ref.f64(v_st)
    elif case.kv == "nvfp4":
        # Global scales from the real rows, so that a flat and a paged cache of the same values
        # quantise every row identically (garbage rows of a paged cache just saturate).
        kd, ks, kgs = quantize_nvfp4(k_st, global_scale=448 * 6 / float(k.abs().max()))
        vd, vs, vgs = quantize_nvfp4(v_st, global_scale=448 * 6 / float(v.abs().max()))
        k_deq = ref.nvfp4_dequant(kd, ks) * kgs
        v_deq = ref.nvfp4_dequant(vd, vs)
        out_scale = vgs
        k_st, v_st = kd, vd
        kw.update(k_scale=ks, v_scale=vs, k_global_scale=kgs, v_global_scale=vgs)
    else:
        k_deq, v_deq = ref.f64(k_st), ref.f64(v_st)
    if case.layout.startswith("packed"):
        _, k_st, v_st = pack_kv(k_st, v_st, nhd=case.layout == "packed_nhd")
    elif case.layout == "nhd":  # separate K and V caches, NHD pages seen as (P, H, 128, W)
        k_st, v_st = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k_st, v_st))
    if case.v_global_scale is not None:
        kw["v_global_scale"] = case.v_global_scale
        out_scale = case.v_global_scale
    q_offset = case.q_offset
    if isinstance(q_offset, list):
        q_offset = torch.tensor(q_offset, dtype=torch.int32)
    kw.update(causal=case.causal, softmax_scale=case.softmax_scale, q_offset=q_offset)
    if case.temperature is not None:
        kw.update(return_temperature_lse=True, lse_temperature_scale=case.temperature)
    else:
        kw.update(return_softmax_lse=True)
    loc = dict(page_table=kw.get("page_table"), seqused_k=kw.get("seqused_k"),
               cu_seqlens_k=None if paged else cu_k)
    keys = ref.sequences(k_deq, **loc)
    values = ref.sequences(v_deq, **loc)
    to = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
    kw = {name: to(val) for name, val in kw.items()}
    # Views must stay views of one buffer: move the cache, then re-take the views.
    if case.layout.startswith("packed"):
        k_st, v_st = _move_packed(k_st, v_st, device)
    else:
        k_st, v_st = k_st.to(device), v_st.to(device)
    args = (q.to(device), k_st, v_st, q2k.to(device), cu_q.to(device))
    return Built(args, kw, q, keys, values, q2k, out_scale)


def _move_packed(k_view, v_view, device):
    if device == "cpu":
        return k_view, v_view
    base = torch.as_strided(k_view, (k_view.untyped_storage().nbytes() // k_view.element_size(),),
                            (1,), 0).to(device)
    off = k_view.storage_offset()
    k = torch.as_strided(base, k_view.shape, k_view.stride(), off)
    v = torch.as_strided(base, v_view.shape, v_view.stride(), v_view.storage_offset())
    return k, v


def expected(case: AttnCase, b: Built):
    starts = ref.cu_seqlens(case.seqs_q).tolist()[:-1]
    return ref.attention(b.q, b.keys, b.values, b.q2k, starts, case.seqs_q, causal=case.causal,
                         softmax_scale=case.softmax_scale, q_offset=b.kwargs["q_offset"],
                         out_scale=b.out_scale, temperature=case.temperature or 1.0)


# bf16 / fp16 output: a few units of the output's last place, relative L2 well under 1%.
OUT_TOL = dict(atol=4e-3, rtol=2e-2, rel_l2=1e-2)
LSE_TOL = dict(atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_sparse_attention_matches_reference(case, device):
    b = build(case, device)
    result = msa_ops.msa_sparse_attention(*b.args, **b.kwargs)
    exp_out, exp_lse, exp_lse_t = expected(case, b)
    if case.temperature is not None:
        out, lse, lse_t = result
        ref.assert_close(lse_t, exp_lse_t, **LSE_TOL, what="lse_t")
    else:
        out, lse = result
    assert out.dtype == case.dtype and out.shape == b.args[0].shape
    assert lse.dtype == torch.float32 and lse.shape == out.shape[:2]
    ref.assert_close(out, exp_out, **OUT_TOL, what="out")
    ref.assert_close(lse, exp_lse, **LSE_TOL, what="lse")
    # D8: rows with no visible selected key are exactly 0 with LSE -inf.
    empty = torch.isinf(exp_lse)
    assert bool((out.cpu()[empty] == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_attention_return_conventions(device):
    case = AttnCase("c", [20], [600], 4, 2, causal=True)
    b = build(case, device)
    kw = {k: v for k, v in b.kwargs.items() if k != "return_softmax_lse"}
    out = msa_ops.msa_sparse_attention(*b.args, **kw)
    assert isinstance(out, torch.Tensor)
    pair = msa_ops.msa_sparse_attention(*b.args, **kw, return_softmax_lse=True)
    assert isinstance(pair, tuple) and len(pair) == 2
    for flag in (False, True):  # the temperature LSE asks for all three, whatever the LSE flag
        triple = msa_ops.msa_sparse_attention(*b.args, **kw, return_softmax_lse=flag,
                                              return_temperature_lse=True)
        assert isinstance(triple, tuple) and len(triple) == 3
        assert torch.equal(triple[0], out) and torch.equal(triple[1], pair[1])
    # T = 1: the temperature LSE is the LSE.
    assert torch.equal(triple[2], triple[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_sparse_attention_paged_equals_flat(device, kv):
    case = AttnCase("c", [150, 90], [2048, 1280], 8, 2, causal=True, kv=kv)
    q2k = make_selection(case)
    torch.manual_seed(1)
    flat = build(case, device, q2k)
    torch.manual_seed(1)
    paged = build(dataclasses.replace(case, layout="paged"), device, q2k)
    a = msa_ops.msa_sparse_attention(*flat.args, **flat.kwargs)
    c = msa_ops.msa_sparse_attention(*paged.args, **paged.kwargs)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["packed", "packed_nhd", "nhd"])
@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_sparse_attention_packed_equals_contiguous(device, layout, kv):
    case = AttnCase("c", [64, 33], [1500, 700], 8, 2, causal=True, kv=kv, layout="paged")
    q2k = make_selection(case)
    torch.manual_seed(2)
    contiguous = build(case, device, q2k)
    torch.manual_seed(2)
    packed = build(dataclasses.replace(case, layout=layout), device, q2k)
    assert not packed.args[1].is_contiguous()
    a = msa_ops.msa_sparse_attention(*contiguous.args, **contiguous.kwargs)
    c = msa_ops.msa_sparse_attention(*packed.args, **packed.kwargs)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])


Q2K_VIEWS = ["token_major", "head_major_rows", "expand"]


def shared_rows(q2k: torch.Tensor) -> torch.Tensor:
    """q2k with every KV head's rows set to head 0's (a shared selection), contiguous."""
    return q2k[:1].expand_as(q2k).contiguous()


def q2k_view(q2k: torch.Tensor, layout: str = "token_major") -> torch.Tensor:
    """q2k (Hkv, total_q, topk) as a non-contiguous view with the same values, in a layout the
    attention ops read in place (docs/semantics.md#q2k-layout):
      token_major      the transpose of a row range of a larger token-major buffer (vLLM's);
      head_major_rows  a row range of a larger head-major buffer with rows padded past topk;
      expand           head 0's rows at stride 0 over the heads (q2k must be shared_rows)."""
    hkv, total_q, topk = q2k.shape
    if layout == "expand":
        assert torch.equal(q2k, shared_rows(q2k))
        return q2k[:1].clone().expand(hkv, total_q, topk)
    if layout == "token_major":
        buf = torch.full((total_q + 5, hkv, topk), 7, dtype=torch.int32, device=q2k.device)
        view = buf.transpose(0, 1)[:, 3:3 + total_q]
        assert view.stride() == (topk, hkv * topk, 1)
    else:
        assert layout == "head_major_rows", layout
        buf = torch.full((hkv, total_q + 5, topk + 3), 7, dtype=torch.int32, device=q2k.device)
        view = buf[:, 3:3 + total_q, :topk]
    view.copy_(q2k)
    assert not view.is_contiguous() or (layout == "token_major" and hkv == 1)  # one head: alike
    return view


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("schedule", ["auto", "query_major", "kv_major", "hybrid"])
@pytest.mark.parametrize("layout", Q2K_VIEWS)
def test_sparse_attention_strided_q2k(device, schedule, layout):
    """A strided q2k (top-k's own layout transposed, a row range of a padded head-major buffer, an
    expand over the heads) gives bit for bit the contiguous q2k's results on every schedule: the
    query-major items, the KV-major work lists and the tile plan each read the rows by the q2k
    strides."""
    case = AttnCase("c", [700, 500], [2100, 900], 8, 2, causal=True, topk=8,
                    selection="random")
    q2k = make_selection(case)
    torch.manual_seed(3)
    b = build(case, device, q2k)
    args = list(b.args)
    if layout == "expand":
        args[3] = shared_rows(args[3])
    planned = functools.partial(msa_ops._sparse_attention_planned, options=dict(schedule=schedule))
    want = planned(*args, **b.kwargs)
    args[3] = q2k_view(args[3], layout)
    got = planned(*args, **b.kwargs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if schedule == "auto" and layout == "token_major":
        ref.assert_close(got[0], expected(case, b)[0], **OUT_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_attention_k_global_scale_only_for_nvfp4(device):
    case = AttnCase("c", [30], [900], 4, 2, causal=True)
    b = build(case, device)
    base = msa_ops.msa_sparse_attention(*b.args, **b.kwargs)
    scaled = msa_ops.msa_sparse_attention(*b.args, **dict(b.kwargs, k_global_scale=3.0))
    assert torch.equal(base[0], scaled[0]) and torch.equal(base[1], scaled[1])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_attention_paged_lengths_from_cu_seqlens_k(device):
    # Paged with cu_seqlens_k given: lengths (and the default offset) come from cu_seqlens_k.
    case = AttnCase("c", [40, 25], [1000, 700], 4, 2, causal=True, layout="paged")
    b = build(case, device)
    shorter = [900, 650]
    kw = dict(b.kwargs, cu_seqlens_k=ref.cu_seqlens(shorter, device))
    got = msa_ops.msa_sparse_attention(*b.args, **kw)
    want = msa_ops.msa_sparse_attention(
        *b.args, **dict(b.kwargs, seqused_k=torch.tensor(shorter, dtype=torch.int32,
                                                         device=device)))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    keys = [k[:n] for k, n in zip(b.keys, shorter)]
    values = [v[:n] for v, n in zip(b.values, shorter)]
    exp = ref.attention(b.q, keys, values, b.q2k, [0, 40], case.seqs_q, causal=True)[0]
    ref.assert_close(got[0], exp, **OUT_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_attention_workspace(device):
    case = AttnCase("c", [50, 20], [1000, 300], 4, 2, causal=True)
    b = build(case, device)
    ws = msa_ops.MSASparseAttentionWorkspace(device)
    base = msa_ops.msa_sparse_attention(*b.args, **b.kwargs)
    with_ws = msa_ops.msa_sparse_attention(*b.args, **b.kwargs, workspace=ws)
    assert torch.equal(base[0], with_ws[0]) and torch.equal(base[1], with_ws[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_sparse_attention_out_is_written_in_place(device, kv):
    """out= (FlashInfer 0.7.4): the result is written into the given tensor, which is returned,
    equal to the allocating call; lse and lse_t as before."""
    case = AttnCase("c", [70, 31], [1100, 400], 4, 2, causal=True, kv=kv)
    b = build(case, device)
    want = msa_ops.msa_sparse_attention(*b.args, **b.kwargs, return_temperature_lse=True)
    out = torch.full_like(b.args[0], float("nan"))
    got = msa_ops.msa_sparse_attention(*b.args, **b.kwargs, return_temperature_lse=True, out=out)
    assert got[0] is out
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_attention_out_bad(device):
    case = AttnCase("c", [20], [500], 4, 2, causal=True)
    b = build(case, device)
    q = b.args[0]
    bad = {
        "out must be bfloat16|out must be float16": torch.empty(q.shape, dtype=torch.float32,
                                                                device=device),
        r"out must be \(total_q, num_qo_heads, 128\)": torch.empty(q.shape[0] + 1, *q.shape[1:],
                                                                   dtype=q.dtype, device=device),
        "out must be contiguous": torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=q.dtype,
                                              device=device).transpose(1, 2),
        "out must not share memory with q": q,
    }
    for message, out in bad.items():
        with pytest.raises(ValueError, match=message):
            msa_ops.msa_sparse_attention(*b.args, **b.kwargs, out=out)
    with pytest.raises(TypeError, match="out must be a torch.Tensor or None"):
        msa_ops.msa_sparse_attention(*b.args, **b.kwargs, out=[1.0])
    with pytest.raises(ValueError, match="out must be a CPU or CUDA tensor"):
        msa_ops.msa_sparse_attention(*b.args, **b.kwargs, out=torch.empty_like(q, device="meta"))

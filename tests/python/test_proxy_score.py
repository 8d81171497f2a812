"""msa_proxy_score against the float64 torch reference (docs/semantics.md#proxy-score), plus its
exactness properties: paged == flat, fp8 == its bf16 upcast, reduce_heads == amax over heads,
explicit dims == derived."""

import dataclasses
import math

import pytest
import torch

from flashmsa.testing import reference as ref
from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import cases, paginate

FP8 = torch.float8_e4m3fn


ProxyCase = cases.ProxyCase
CASES = cases.cases(cases.PROXY, "reference")


def make_inputs(case: ProxyCase, device: str):
    if case.invalid_pages or case.extra_rows or case.nan_keys or case.max_seqlen_q is not None:
        raise ValueError(f"{case}: an option this builder does not implement")
    total_q, total_k = sum(case.seqs_q), sum(case.seqs_k)
    q = (torch.randn(total_q, case.hq, 128) / 3).to(case.q_dtype)
    k = (torch.randn(total_k, case.hkv, 128) / 3).to(case.k_dtype or case.q_dtype)
    cu_q = ref.cu_seqlens(case.seqs_q)
    cu_k = ref.cu_seqlens(case.seqs_k)
    q_offset = case.q_offset
    if isinstance(q_offset, list):
        q_offset = torch.tensor(q_offset, dtype=torch.int32, device=device)
    kwargs = dict(causal=case.causal, reduce_heads=case.reduce_heads, q_offset=q_offset,
                  max_k_tiles=case.max_k_tiles)
    if case.paged:
        cache, page_table, seqused = paginate(k, case.seqs_k, extra_pages=2)
        args = (q.to(device), cache.to(device), cu_q.to(device))
        kwargs.update(page_table=page_table.to(device), seqused_k=seqused.to(device))
    else:
        args = (q.to(device), k.to(device), cu_q.to(device), cu_k.to(device))
    keys = ref.sequences(k, cu_seqlens_k=cu_k)
    return args, kwargs, q, keys, cu_q


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_proxy_score_matches_reference(case, device):
    args, kwargs, q, keys, cu_q = make_inputs(case, device)
    out = msa_ops.msa_proxy_score(*args, **kwargs)
    max_k_tiles = case.max_k_tiles or max(math.ceil(n / 128) for n in case.seqs_k)
    expected = ref.proxy_score(q, keys, cu_q, causal=case.causal, max_k_tiles=max(max_k_tiles, 1),
                               q_offset=kwargs["q_offset"], reduce_heads=case.reduce_heads)
    assert out.dtype == torch.float32 and out.is_contiguous()
    ref.assert_close(out, expected, atol=2e-3, rtol=1e-4, what=f"proxy {case.name}")


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_score_paged_equals_flat(device):
    case = ProxyCase("p", [40, 129, 1], [1000, 300, 2500], 4, 2)
    args, kwargs, *_ = make_inputs(case, device)
    flat = msa_ops.msa_proxy_score(*args, **kwargs)
    paged_case = dataclasses.replace(case, paged=True)
    torch.manual_seed(0)
    pargs, pkwargs, *_ = make_inputs(paged_case, device)
    paged = msa_ops.msa_proxy_score(*pargs, **pkwargs)
    assert torch.equal(flat, paged)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["flat", "paged"])
def test_proxy_score_fp8_equals_bf16_upcast(device, paged):
    # e4m3 -> bf16 is exact, so the op on fp8 K must equal the op on its bf16 upcast bit for bit.
    case = ProxyCase("p", [70, 3], [900, 1200], 4, 1, k_dtype=FP8, paged=paged)
    args, kwargs, *_ = make_inputs(case, device)
    fp8 = msa_ops.msa_proxy_score(*args, **kwargs)
    args = list(args)
    args[1] = args[1].to(torch.bfloat16)
    up = msa_ops.msa_proxy_score(*args, **kwargs)
    assert torch.equal(fp8, up)


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_score_reduce_heads_is_amax(device):
    case = ProxyCase("p", [300, 2], [4096, 700], 8, 2)
    args, kwargs, *_ = make_inputs(case, device)
    per_head = msa_ops.msa_proxy_score(*args, **kwargs)
    reduced = msa_ops.msa_proxy_score(*args, **dict(kwargs, reduce_heads=True))
    assert reduced.shape == (1,) + per_head.shape[1:]
    assert torch.equal(reduced, per_head.amax(0, keepdim=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k_dtype", [torch.bfloat16, FP8])
def test_proxy_score_use_fp32_acc_accepted(device, k_dtype):
    """use_fp32_acc (FlashInfer 0.7.4): every flashmsa path accumulates in float32, so False (a
    request for at most fp16 precision) gives the same scores bit for bit, prefill and decode."""
    for seqs_q in ([70, 3], [1, 1]):
        case = ProxyCase("p", seqs_q, [900, 1200], 4, 1, k_dtype=k_dtype)
        args, kwargs, *_ = make_inputs(case, device)
        fp32 = msa_ops.msa_proxy_score(*args, **kwargs)
        assert torch.equal(msa_ops.msa_proxy_score(*args, **kwargs, use_fp32_acc=True), fp32)
        assert torch.equal(msa_ops.msa_proxy_score(*args, **kwargs, use_fp32_acc=False), fp32)


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_score_output_and_dims(device):
    case = ProxyCase("p", [17, 40], [600, 1300], 4, 2)
    args, kwargs, *_ = make_inputs(case, device)
    derived = msa_ops.msa_proxy_score(*args, **kwargs)
    assert derived.shape == (4, 11, 57)
    explicit = msa_ops.msa_proxy_score(*args, **dict(kwargs, max_seqlen_q=40, max_k_tiles=11))
    assert torch.equal(derived, explicit)
    # max_k_tiles comes from output.shape[1]; the result is written into output and returned.
    output = torch.full((4, 13, 57), 7.0, device=device)
    got = msa_ops.msa_proxy_score(*args, **dict(kwargs, output=output))
    assert got is output
    assert torch.equal(output[:, :11], derived)
    assert bool((output[:, 11:] == float("-inf")).all())


# ---- msa_proxy_score_fp4 (NVFP4 indexer; CPU reference only) --------------------------------------

def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def fp4_inputs(case: ProxyCase, q_gsf: float = 1.0, k_gsf: float = 1.0, device: str = "cpu"):
    """Packed NVFP4 q / k of a CPU case (global quantisation scales q_gsf / k_gsf) and the bf16
    tensors of their exactly dequantized values (e2m1 * e4m3 is a bf16 value), plus the rest of
    the call."""
    from flashmsa.testing import dequantize_nvfp4, quantize_nvfp4
    args, kwargs, *_ = make_inputs(dataclasses.replace(case, q_dtype=torch.bfloat16, k_dtype=None),
                                   "cpu")
    q, k = args[0], args[1]
    q_fp4, q_scale, q_gs = quantize_nvfp4(q, 1.0 / q_gsf)
    k_fp4, k_scale, k_gs = quantize_nvfp4(k, 1.0 / k_gsf)
    q_deq = dequantize_nvfp4(q_fp4, q_scale).to(torch.bfloat16)
    k_deq = dequantize_nvfp4(k_fp4, k_scale).to(torch.bfloat16)
    assert torch.equal(q_deq.float(), dequantize_nvfp4(q_fp4, q_scale)), "dequant not exact in bf16"
    rest = list(args[2:])
    return (_to((q_fp4, k_fp4, q_scale, k_scale, q_gs, k_gs), device), _to(rest, device),
            _to(kwargs, device), _to((q_deq, k_deq), device))


FP4_CASES = [
    ProxyCase("fp4_flat_gqa2", [100, 37], [2048, 700], 4, 2),
    ProxyCase("fp4_paged", [1, 33, 7], [300, 1111, 256], 2, 1, paged=True),
    ProxyCase("fp4_noncausal_q_offset", [16, 16], [512, 512], 2, 2, causal=False,
              q_offset=[-5, 400]),
    ProxyCase("fp4_reduce_heads", [50], [1000], 8, 2, reduce_heads=True),
    ProxyCase("fp4_decode_paged", [1, 1, 1], [4096, 129, 700], 4, 1, paged=True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FP4_CASES, ids=str)
def test_proxy_score_fp4_equals_proxy_of_dequantized(case, device):
    """With unit global scales the fp4 op is msa_proxy_score of the dequantized tensors, bit for
    bit (on the GPU too: the kernels dequantize exactly into the same MMAs; but the CUDA decode
    kernel, which short queries take, converts a word of 8 codes at a time by default and sums a
    k-step's dims in another order: on the GPU the default is checked for the same -inf / NaN
    pattern and values within 1e-2, and the cp.async ring's byte conversion (plan options
    nvfp4_cvt=byte, decode_nvfp4=cta) bit for bit); with global scales every logit is multiplied by q_gs * k_gs before the block max (for a
    positive product: the unit-scale result times the product, bit for bit)."""
    def same(got, want):
        if device == "cpu":
            assert torch.equal(got, want)
            return
        for fn in (torch.isneginf, torch.isposinf, torch.isnan):
            assert torch.equal(fn(got), fn(want))
        fin = torch.isfinite(want)
        assert float((got - want).abs()[fin].max()) <= 1e-2

    fp4_args, rest, kwargs, (q_deq, k_deq) = fp4_inputs(case, device=device)
    got = msa_ops.msa_proxy_score_fp4(*fp4_args, *rest, **kwargs)
    want = msa_ops.msa_proxy_score(q_deq, k_deq, *rest, **kwargs)
    same(got, want)
    if device != "cpu":
        byte = msa_ops._proxy_score_fp4_planned(*fp4_args, *rest, options=dict(
            nvfp4_cvt="byte", decode_nvfp4="cta"), **kwargs)
        assert torch.equal(byte, want)
    assert bool(torch.isfinite(got).any())

    fp4_args, rest, kwargs, (q_deq, k_deq) = fp4_inputs(case, q_gsf=0.37, k_gsf=2.5, device=device)
    q_gs, k_gs = fp4_args[4], fp4_args[5]
    got = msa_ops.msa_proxy_score_fp4(*fp4_args, *rest, **kwargs)
    unit = msa_ops.msa_proxy_score(q_deq, k_deq, *rest, **kwargs)
    product = (torch.tensor(q_gs, dtype=torch.float32) * torch.tensor(k_gs, dtype=torch.float32)
               ).to(device)
    assert torch.equal(got, unit * product)
    # A negative product flips which key wins: the block max of the scaled logits, i.e. the
    # proxy of -q (negation is exact) times |product|.
    neg = msa_ops.msa_proxy_score_fp4(*fp4_args[:4], -q_gs, k_gs, *rest, **kwargs)
    flipped = msa_ops.msa_proxy_score(-q_deq, k_deq, *rest, **kwargs)
    same(neg, flipped * product)


@pytest.mark.parametrize("device", DEVICES)
def test_proxy_score_fp4_against_float64_reference(device):
    case = ProxyCase("p", [40, 9], [900, 300], 4, 2, q_offset=[100, -3])
    fp4_args, rest, kwargs, (q_deq, k_deq) = _to(fp4_inputs(case, q_gsf=0.5, k_gsf=3.0), "cpu")
    got = msa_ops.msa_proxy_score_fp4(*_to(fp4_args, device), *_to(rest, device),
                                      **_to(kwargs, device)).cpu()
    keys = ref.sequences(k_deq, cu_seqlens_k=rest[1])
    scale = fp4_args[4] * fp4_args[5]
    expected = ref.proxy_score(q_deq, keys, rest[0], causal=True, max_k_tiles=8,
                               q_offset=kwargs["q_offset"]) * scale
    ref.assert_close(got, expected, atol=2e-3 * scale, rtol=1e-4, what="proxy fp4")


def test_proxy_score_fp4_validation():
    case = ProxyCase("p", [10], [300], 2, 1)
    (q4, k4, qs, ks, qg, kg), rest, kwargs, _ = fp4_inputs(case)
    call = msa_ops.msa_proxy_score_fp4
    with pytest.raises(ValueError, match="q_fp4 must be uint8"):
        call(q4.to(torch.int8), k4, qs, ks, qg, kg, *rest, **kwargs)
    with pytest.raises(ValueError, match=r"q_fp4 must be \(total_q, num_qo_heads, 64\)"):
        call(q4[..., :32].contiguous(), k4, qs, ks, qg, kg, *rest, **kwargs)
    with pytest.raises(ValueError, match="k_fp4 must be uint8"):
        call(q4, k4.view(torch.int8), qs, ks, qg, kg, *rest, **kwargs)
    with pytest.raises(ValueError, match="q_scale must hold"):
        call(q4, k4, qs[:100], ks, qg, kg, *rest, **kwargs)
    with pytest.raises(ValueError, match="k_scale must be uint8"):
        call(q4, k4, qs, ks.view(torch.int8), qg, kg, *rest, **kwargs)
    with pytest.raises(ValueError, match="q_global_scale must be a finite"):
        call(q4, k4, qs, ks, float("nan"), kg, *rest, **kwargs)
    with pytest.raises(ValueError, match=r"q_global_scale \* k_global_scale must be a finite"):
        call(q4, k4, qs, ks, 1e30, 1e30, *rest, **kwargs)
    with pytest.raises(TypeError, match="k_global_scale must be a float"):
        call(q4, k4, qs, ks, qg, None, *rest, **kwargs)
    with pytest.raises(ValueError, match="num_qo_heads must be a multiple of num_kv_heads"):
        call(q4, torch.cat([k4, k4, k4], dim=1), qs, ks, qg, kg, *rest, **kwargs)
    # The bf16 op refuses fp4 tensors with its own message.
    with pytest.raises(ValueError, match="q must be bf16, fp16, or fp8"):
        msa_ops.msa_proxy_score(q4, k4, *rest, **kwargs)

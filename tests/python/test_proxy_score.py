"""msa_proxy_score against the float64 torch reference (SPEC 1), plus its exactness properties:
paged == flat, fp8 == its bf16 upcast, reduce_heads == amax over heads, explicit dims == derived."""

import dataclasses
import math
from typing import List, Optional, Union

import pytest
import torch

import msa_reference as ref
from conftest import DEVICES
from flashmsa import msa_ops
from flashmsa.testing import paginate

FP8 = torch.float8_e4m3fn


@dataclasses.dataclass
class ProxyCase:
    name: str
    seqs_q: List[int]
    seqs_k: List[int]
    hq: int
    hkv: int
    causal: bool = True
    paged: bool = False
    q_dtype: torch.dtype = torch.bfloat16
    k_dtype: Optional[torch.dtype] = None  # default: q_dtype
    q_offset: Union[None, int, List[int]] = None  # list -> int32 tensor
    reduce_heads: bool = False
    max_k_tiles: Optional[int] = None  # None: derived by the op

    def __str__(self):
        return self.name


CASES = [
    ProxyCase("flat_gqa2_causal", [100, 37], [2048, 700], 4, 2),
    ProxyCase("flat_noncausal_fp16", [130, 64], [1024, 512], 2, 2, causal=False,
              q_dtype=torch.float16),
    ProxyCase("paged_three_seqs", [1, 33, 7], [300, 1111, 256], 2, 1, paged=True),
    ProxyCase("empty_kv_sequence", [5, 3, 4], [700, 0, 129], 4, 1),
    ProxyCase("empty_q_sequence", [0, 10], [256, 300], 2, 1, paged=True),
    ProxyCase("q_offset_int", [20, 20], [1000, 600], 4, 1, q_offset=300),
    ProxyCase("q_offset_tensor_negative", [16, 16], [512, 512], 2, 2, q_offset=[-5, 400]),
    ProxyCase("more_queries_than_keys", [300], [200], 2, 1),
    ProxyCase("reduce_heads", [50], [1000], 8, 2, reduce_heads=True),
    ProxyCase("padding_columns", [40], [500], 2, 1, max_k_tiles=10),
    ProxyCase("truncated_columns", [40], [1000], 2, 1, max_k_tiles=3),
    ProxyCase("decode_rows", [1, 1, 1, 1], [4096, 129, 2048, 700], 4, 1, paged=True),
    ProxyCase("group_of_3", [33, 17], [400, 900], 6, 2),
    ProxyCase("fp8_k", [64, 20], [1024, 333], 4, 1, k_dtype=FP8),
    ProxyCase("fp8_q_and_k_paged", [3, 9], [1300, 500], 4, 1, q_dtype=FP8, k_dtype=FP8,
              paged=True),
]


def make_inputs(case: ProxyCase, device: str):
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

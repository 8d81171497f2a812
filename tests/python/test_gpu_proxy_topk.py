"""CUDA kernels of stage 1 (msa_proxy_score) and stage 2 (msa_topk_select) against the C++ CPU
reference, case by case on the same data (docs/semantics.md#proxy-score, #topk-select, #d3,
#d9-#d11).

The reference is the op itself on CPU tensors (flashmsa's C++ reference, which follows semantics.h
rule for rule). Every GPU output is pre-filled with garbage (NaN / -7) through ``output=`` and the
whole tensor is compared, so an element the kernel forgets to write fails the test.

Proxy tolerance (finite entries, absolute): 1e-2. Baseline: each entry is a 128-term fp32 dot
product of exact bf16/fp16/e4m3 products; the reference sums in one fixed order, the MMA in
another. Recursive fp32 summation is off by at most n * 2^-24 * sum|q_d k_d| ~ 128 * 6e-8 * 82 ~
6e-4 for unit-variance inputs (sum|q_d k_d| ~ 82 at randn), so two orders differ by < 1.3e-3; the
max over a block is 1-Lipschitz and adds nothing. 1e-2 leaves 8x margin (inputs here are randn,
never scaled up). The -inf pattern (blocks with no visible key) and the NaN pattern must match
exactly, and fp8 / paged runs must equal their bf16 / flat GPU twins bit for bit.

Top-k: indices must be identical (ties go to the lower block index at every P, D3), for every
kernel (the plan option `kernel`: warp-per-row at 32 and 8 tokens per CTA,
the thread-per-row radix kernel, and by_size's choice between them), on the fixed cases and on
fresh random ones.

A proxy case's inputs and CPU result are memoised per xdist worker (``proxy_reference``,
conftest.Memo): its kernel variants (the last, fastest-varying parameter) build them and run the
reference once (many_sequences_64k's keys alone are ~10M tokens).

Skipped (not passed) without CUDA.
"""

from __future__ import annotations

import dataclasses
import math
import random
import zlib

import pytest
import torch

import flashmsa
from conftest import Memo

if not (torch.cuda.is_available() and flashmsa.built_with_cuda()):
    pytest.skip("needs a CUDA GPU and a flashmsa build with CUDA kernels", allow_module_level=True)

from flashmsa import msa_ops  # noqa: E402
from flashmsa.testing import cases, paginate  # noqa: E402

DEV = torch.device("cuda")
BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
BLK = 128
PROXY_ATOL = 1e-2


# ---- stage 1: proxy score ----------------------------------------------------------------------

ProxyCase = cases.ProxyCase
PROXY_CASES = cases.cases(cases.PROXY, "gpu")


def _randn(shape, dtype, gen, scale=1.0):
    x = torch.randn(shape, generator=gen)
    if scale != 1.0:  # x * 1.0 == x: skip a pass over many_sequences_64k's 1.3G-element keys
        x = x * scale
    return x.to(dtype)


def make_proxy_inputs(c: ProxyCase, seed: int):
    gen = torch.Generator().manual_seed(seed)
    k_dtype = c.k_dtype or c.q_dtype
    total_q = sum(c.seqs_q) + c.extra_rows
    total_k = sum(c.seqs_k)
    q = _randn((total_q, c.hq, 128), c.q_dtype, gen)
    k_flat = _randn((total_k, c.hkv, 128), k_dtype, gen)
    if c.nan_keys:
        nan = torch.tensor(float("nan")).to(k_dtype)
        for j in torch.randint(0, max(total_k, 1), (6,), generator=gen).tolist():
            k_flat[j, :, 5] = nan
    cu_q = torch.zeros(len(c.seqs_q) + 1, dtype=torch.int32)
    cu_q[1:] = torch.tensor(c.seqs_q).cumsum(0)
    cu_k = torch.zeros(len(c.seqs_k) + 1, dtype=torch.int32)
    cu_k[1:] = torch.tensor(c.seqs_k).cumsum(0)
    nb = [math.ceil(s / BLK) for s in c.seqs_k]
    max_k_tiles = c.max_k_tiles or max(max(nb, default=0), 1)
    inputs = dict(q=q, cu_seqlens_q=cu_q, max_k_tiles=max_k_tiles,
                  max_seqlen_q=c.max_seqlen_q or max(max(c.seqs_q, default=0), 1))
    if c.paged:
        cache, page_table, seqused = paginate(k_flat, c.seqs_k, generator=gen, extra_pages=3)
        if c.invalid_pages:
            num_pages = cache.shape[0]
            for b, n in enumerate(nb):
                if n >= 2:
                    page_table[b, 1] = -1 if b % 2 == 0 else num_pages + 7
                if n >= 5:
                    page_table[b, n - 1] = num_pages
        inputs.update(k=cache, page_table=page_table, seqused_k=seqused, cu_seqlens_k=None)
    else:
        inputs.update(k=k_flat, cu_seqlens_k=cu_k, page_table=None, seqused_k=None)
    if isinstance(c.q_offset, list):
        inputs["q_offset"] = torch.tensor(c.q_offset, dtype=torch.int32)
    else:
        inputs["q_offset"] = c.q_offset
    return inputs


def _to(x, device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _options(kernel: Optional[str], extra: Optional[dict]) -> Optional[dict]:
    """Plan options: kernel= (None: the library's own choice) and any others."""
    options = dict(extra or {}, **({} if kernel is None else dict(kernel=kernel)))
    return options or None


def run_proxy(c: ProxyCase, inputs: dict, device, fill=float("nan"),
              kernel: Optional[str] = None, options: Optional[dict] = None) -> torch.Tensor:
    """The op on `device`; `kernel`: the plan option kernel= (None: the library's own choice);
    `options`: other plan options."""
    args = {k: _to(v, device) for k, v in inputs.items()}
    total_q = args["q"].shape[0]
    out = torch.full((1 if c.reduce_heads else c.hq, args["max_k_tiles"], total_q), fill,
                     dtype=torch.float32, device=device)
    res = msa_ops._proxy_score_planned(
        args["q"], args["k"], args["cu_seqlens_q"], args["cu_seqlens_k"],
        page_table=args["page_table"], seqused_k=args["seqused_k"], causal=c.causal,
        max_seqlen_q=args["max_seqlen_q"], max_k_tiles=args["max_k_tiles"], output=out,
        reduce_heads=c.reduce_heads, q_offset=args["q_offset"], options=_options(kernel, options))
    assert res.data_ptr() == out.data_ptr()
    return out


def assert_proxy_close(got: torch.Tensor, want: torch.Tensor, what: str):
    got = got.cpu()
    assert got.shape == want.shape, what
    for name, fn in (("-inf", torch.isneginf), ("+inf", torch.isposinf), ("NaN", torch.isnan)):
        mismatch = (fn(got) != fn(want)).nonzero()
        if mismatch.numel():
            first = tuple(mismatch[0].tolist())
            raise AssertionError(
                f"{what}: {name} pattern differs at {mismatch.shape[0]} elements, first "
                f"(head, block, row) {first}: got {got[first]}, want {want[first]}")
    fin = torch.isfinite(want)
    if fin.any():
        diff = (got - want).abs().masked_fill(~fin, 0)
        worst = diff.argmax()
        idx = [int(i) for i in torch.unravel_index(worst, diff.shape)]
        assert diff.flatten()[worst] <= PROXY_ATOL, (
            f"{what}: |diff| {diff.flatten()[worst]:.3g} > {PROXY_ATOL} at (head, block, row) "
            f"{idx}: got {got[tuple(idx)]}, want {want[tuple(idx)]}")


_PROXY_REFERENCES = Memo(size=2)


def proxy_reference(case: ProxyCase):
    """(inputs, CPU result) of the case at its own seed (crc32 of its name), memoised (read
    only)."""
    def make():
        inputs = make_proxy_inputs(case, seed=zlib.crc32(case.name.encode()))
        return inputs, run_proxy(case, inputs, "cpu")
    return _PROXY_REFERENCES(repr(case), make)


# auto (the library's choice: the decode kernel for short queries, else the sm_90a kernel where it
# runs) and the portable mma.sync kernel, forced: the fallback of every other GPU and call.
@pytest.mark.parametrize("kernel", [None, "mma_sync"], ids=["auto", "mma_sync"])
@pytest.mark.parametrize("case", PROXY_CASES, ids=str)
def test_proxy_matches_reference(case: ProxyCase, kernel):
    inputs, want = proxy_reference(case)
    got = run_proxy(case, inputs, DEV, kernel=kernel)
    assert_proxy_close(got, want, case.name)


def _twin(case: ProxyCase, **changes) -> ProxyCase:
    return dataclasses.replace(case, **changes)


@pytest.mark.parametrize("case", [
    ProxyCase("fp8_k_bf16_q", [150, 90], [2048, 1280], hq=8, hkv=2, k_dtype=FP8),
    ProxyCase("fp8_k_fp16_q", [33, 1], [700, 1500], hq=4, hkv=1, q_dtype=FP16, k_dtype=FP8),
    ProxyCase("fp8_q_fp8_k", [300, 2], [512, 4000], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8,
              paged=True),
], ids=str)
def test_proxy_fp8_equals_upcast_bitwise(case: ProxyCase):
    """fp8 operands are upconverted exactly: the GPU result equals the same op on the dequantized
    tensors bit for bit (docs/semantics.md#proxy-score-math)."""
    inputs = make_proxy_inputs(case, seed=7)
    got = run_proxy(case, inputs, DEV)
    up = BF16 if case.q_dtype in (BF16, FP8) else FP16
    twin_inputs = dict(inputs, q=inputs["q"].to(up), k=inputs["k"].to(up))
    twin = _twin(case, q_dtype=up, k_dtype=up)
    want = run_proxy(twin, twin_inputs, DEV)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("case", [
    ProxyCase("paged_vs_flat_prefill", [500, 3], [1500, 4000], hq=4, hkv=1),
    ProxyCase("paged_vs_flat_decode", [1] * 6, [129, 256, 700, 1, 2000, 3333], hq=8, hkv=2),
    ProxyCase("paged_vs_flat_reduce", [77], [1000], hq=8, hkv=2, reduce_heads=True),
], ids=str)
def test_proxy_paged_equals_flat_bitwise(case: ProxyCase):
    flat = make_proxy_inputs(case, seed=11)
    paged_case = _twin(case, paged=True)
    paged = make_proxy_inputs(paged_case, seed=11)
    # Same keys: rebuild the paged cache from the flat tensor of the flat run.
    cache, page_table, seqused = paginate(flat["k"], case.seqs_k,
                                          generator=torch.Generator().manual_seed(3), extra_pages=2)
    paged.update(q=flat["q"], k=cache, page_table=page_table, seqused_k=seqused)
    got_flat = run_proxy(case, flat, DEV)
    got_paged = run_proxy(paged_case, paged, DEV)
    assert torch.equal(got_flat.view(torch.int32), got_paged.view(torch.int32))


def test_proxy_reduce_heads_equals_amax_bitwise():
    case = ProxyCase("reduce", [300, 40], [4096, 900], hq=8, hkv=2, paged=True)
    inputs = make_proxy_inputs(case, seed=5)
    per_head = run_proxy(case, inputs, DEV)
    reduced = run_proxy(_twin(case, reduce_heads=True), inputs, DEV)
    assert torch.equal(reduced.view(torch.int32), per_head.amax(0, keepdim=True).view(torch.int32))


@pytest.mark.parametrize("case", [
    ProxyCase("det_prefill", [2000, 300], [2000, 5000], hq=4, hkv=1, paged=True),
    ProxyCase("det_decode_split", [1] * 32, [8000] * 32, hq=4, hkv=1),
    ProxyCase("det_reduce", [500], [3000], hq=8, hkv=2, reduce_heads=True),
], ids=str)
def test_proxy_deterministic(case: ProxyCase):
    inputs = make_proxy_inputs(case, seed=13)
    a = run_proxy(case, inputs, DEV, fill=0.0)
    b = run_proxy(case, inputs, DEV, fill=1.0)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


# ---- stage 1 on the sm_90a TMA + wgmma prefill kernel (plan option kernel) --------------------
# sm90_only (Q in registers) and sm90_ss_only (Q in shared memory) run that kernel or raise
# NotImplementedError (never a silent fallback to mma.sync), so these cases fail if the kernel
# does not run them on an sm_90 device.

IS_SM90 = torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not IS_SM90, reason="the sm_90a kernel runs on sm_90 devices only")
SM90_VARIANTS = ["sm90_only", "sm90_ss_only"]

SM90_CASES = [
    ProxyCase("sm90_m3_prefill_4k", [4096], [4096], hq=4, hkv=1),
    ProxyCase("sm90_ragged_batch", [1000, 37, 1, 2050, 64, 65], [1000, 37, 1, 2050, 64, 65],
              hq=4, hkv=1),
    ProxyCase("sm90_chunked_prefill", [1000, 300], [5000, 333], hq=4, hkv=1),
    ProxyCase("sm90_more_queries_than_keys", [300], [200], hq=4, hkv=1),
    ProxyCase("sm90_many_tiles", [2000] * 6 + [5000], [2000] * 6 + [5000], hq=4, hkv=1),
    ProxyCase("sm90_noncausal", [300, 129], [1000, 700], hq=4, hkv=1, causal=False),
    ProxyCase("sm90_noncausal_long_keys", [100], [3001], hq=4, hkv=1, causal=False),
    ProxyCase("sm90_q_offset_int", [200, 130], [1000, 600], hq=4, hkv=1, q_offset=300),
    ProxyCase("sm90_q_offset_tensor_negative", [150, 64, 70], [512, 512, 300], hq=4, hkv=1,
              q_offset=[-5, 400, -100]),
    ProxyCase("sm90_q_offset_huge", [100], [512], hq=4, hkv=1, q_offset=2**31 - 5),
    ProxyCase("sm90_padding_columns", [200, 3], [500, 100], hq=4, hkv=1, max_k_tiles=10),
    ProxyCase("sm90_truncated_columns", [700], [2000], hq=4, hkv=1, max_k_tiles=3),
    ProxyCase("sm90_hint_too_small", [700, 5], [1000, 900], hq=4, hkv=1, max_seqlen_q=3),
    ProxyCase("sm90_g1_mha", [300, 77], [300, 500], hq=2, hkv=2),
    ProxyCase("sm90_g2", [257, 31], [800, 31], hq=4, hkv=2),
    ProxyCase("sm90_g3_odd", [190, 20], [600, 20], hq=6, hkv=2),
    ProxyCase("sm90_g8_two_slices", [300, 65], [700, 65], hq=8, hkv=1),
    ProxyCase("sm90_g16", [130, 3], [1500, 700], hq=64, hkv=4),
    ProxyCase("sm90_g20", [90, 30], [640, 1024], hq=20, hkv=1),
    ProxyCase("sm90_fp16", [500, 50], [1000, 2000], hq=4, hkv=1, q_dtype=FP16),
    ProxyCase("sm90_nan_keys", [200, 4], [600, 300], hq=4, hkv=1, nan_keys=True),
    ProxyCase("sm90_uncovered_rows", [200, 7], [300, 600], hq=4, hkv=1, extra_rows=100),
    ProxyCase("sm90_empty_sequences", [0, 100, 0, 5], [256, 300, 999, 0], hq=4, hkv=1),
    ProxyCase("sm90_decode_like", [1] * 9, [300 * i + 1 for i in range(9)], hq=4, hkv=1),
    # Paged K: one page = one 128-key block = one TMA box; permuted pages, invalid page ids.
    ProxyCase("sm90_paged_prefill", [1000, 300], [1500, 4000], hq=4, hkv=1, paged=True),
    ProxyCase("sm90_paged_invalid_pages", [60, 5, 200], [1500, 900, 700], hq=4, hkv=1, paged=True,
              invalid_pages=True),
    ProxyCase("sm90_paged_g8_chunked", [700], [5000], hq=16, hkv=2, paged=True),
    ProxyCase("sm90_paged_fp16_noncausal", [129, 64], [1000, 333], hq=4, hkv=1, paged=True,
              q_dtype=FP16, causal=False),
    ProxyCase("sm90_paged_decode_like", [1] * 9, [300 * i + 1 for i in range(9)], hq=4, hkv=1,
              paged=True, q_offset=[150 * i for i in range(9)]),
]


@needs_sm90
@pytest.mark.parametrize("variant", SM90_VARIANTS)
@pytest.mark.parametrize("case", SM90_CASES, ids=str)
def test_proxy_sm90_matches_reference(case: ProxyCase, variant: str):
    """The sm_90a kernel against the CPU reference: same -inf / NaN patterns, finite entries within
    PROXY_ATOL, every output element written (the output is poisoned with NaN first)."""
    inputs, want = proxy_reference(case)
    got = run_proxy(case, inputs, DEV, kernel=variant)
    assert_proxy_close(got, want, case.name)


@needs_sm90
@pytest.mark.parametrize("variant", SM90_VARIANTS)
@pytest.mark.parametrize("case", [
    ProxyCase("sm90_vs_mma_m3_16k", [16384], [16384], hq=4, hkv=1),
    ProxyCase("sm90_vs_mma_ragged_8k", [8192, 3000, 4999, 1], [8192, 3000, 6000, 700], hq=4, hkv=1),
    ProxyCase("sm90_vs_mma_noncausal_g8", [3000], [9000], hq=8, hkv=1, causal=False),
], ids=str)
def test_proxy_sm90_equals_mma_sync(case: ProxyCase, variant: str):
    """Prefill shapes too large for the CPU reference: the sm_90a kernel against the mma.sync
    kernel on the GPU (identical -inf / NaN patterns, finite entries within PROXY_ATOL), and
    run-to-run bit-identical over differently poisoned outputs."""
    inputs = make_proxy_inputs(case, seed=zlib.crc32(case.name.encode()))
    want = run_proxy(case, inputs, DEV, kernel="mma_sync").cpu()
    got = run_proxy(case, inputs, DEV, fill=0.0, kernel=variant)
    assert_proxy_close(got, want, case.name)
    again = run_proxy(case, inputs, DEV, fill=-7.0, kernel=variant)
    assert torch.equal(got.view(torch.int32), again.view(torch.int32))


@needs_sm90
@pytest.mark.parametrize("variant", SM90_VARIANTS)
@pytest.mark.parametrize("case", [
    ProxyCase("sm90_paged_vs_flat_prefill", [500, 3], [1500, 4000], hq=4, hkv=1),
    ProxyCase("sm90_paged_vs_flat_g8", [77, 130], [1000, 129], hq=8, hkv=1),
], ids=str)
def test_proxy_sm90_paged_equals_flat_bitwise(case: ProxyCase, variant: str):
    """The same keys flat and paged (permuted pages) give bit-identical sm_90a results: a page is
    one TMA box, and the MMAs see the same shared-memory tile either way."""
    flat = make_proxy_inputs(case, seed=17)
    paged_case = _twin(case, paged=True)
    paged = make_proxy_inputs(paged_case, seed=17)
    cache, page_table, seqused = paginate(flat["k"], case.seqs_k,
                                          generator=torch.Generator().manual_seed(4), extra_pages=2)
    paged.update(q=flat["q"], k=cache, page_table=page_table, seqused_k=seqused)
    got_flat = run_proxy(case, flat, DEV, kernel=variant)
    got_paged = run_proxy(paged_case, paged, DEV, kernel=variant)
    assert torch.equal(got_flat.view(torch.int32), got_paged.view(torch.int32))


# fp8 and NVFP4 K on the sm_90a kernel (auto's choice for prefill since the H200 run of c7709c9
# showed it correct and faster; here forced, Q from registers and from shared memory). The producer warpgroup
# converts the raw blocks exactly into the 16-bit tile the wgmmas read, so the result equals the
# same kernel on the upcast / dequantized bf16 (fp16) tensors bit for bit; against the CPU reference
# and the mma.sync kernel (other accumulation order) the usual PROXY_ATOL holds.
SM90_FP8_CASES = [
    ProxyCase("sm90_fp8_m3_prefill", [2048], [2048], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("sm90_fp8_ragged", [1000, 37, 1, 2050, 64, 65], [1000, 37, 1, 2050, 64, 65], hq=4,
              hkv=1, k_dtype=FP8),
    ProxyCase("sm90_fp8_chunked_prefill", [1000, 300], [5000, 333], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("sm90_fp8_noncausal", [300, 129], [1000, 700], hq=4, hkv=1, causal=False, k_dtype=FP8),
    ProxyCase("sm90_fp8_q_offset", [150, 64, 70], [512, 512, 300], hq=4, hkv=1,
              q_offset=[-3, 200, 0], k_dtype=FP8),
    ProxyCase("sm90_fp8_g1", [300, 77], [300, 500], hq=2, hkv=2, k_dtype=FP8),
    ProxyCase("sm90_fp8_g8", [300, 65], [700, 65], hq=8, hkv=1, k_dtype=FP8),
    ProxyCase("sm90_fp8_g16", [130, 3], [1500, 700], hq=64, hkv=4, k_dtype=FP8),
    ProxyCase("sm90_fp8_fp16_q", [500, 50], [1000, 2000], hq=4, hkv=1, q_dtype=FP16, k_dtype=FP8),
    ProxyCase("sm90_fp8_nan_keys", [200, 4], [600, 300], hq=4, hkv=1, k_dtype=FP8, nan_keys=True),
    ProxyCase("sm90_fp8_padding_columns", [200, 3], [500, 100], hq=4, hkv=1, max_k_tiles=10,
              k_dtype=FP8),
    ProxyCase("sm90_fp8_paged", [1000, 300], [1500, 4000], hq=4, hkv=1, paged=True, k_dtype=FP8),
    ProxyCase("sm90_fp8_paged_invalid_pages", [60, 5, 200], [1500, 900, 700], hq=4, hkv=1,
              paged=True, invalid_pages=True, k_dtype=FP8),
    ProxyCase("sm90_fp8_paged_g8_noncausal", [129, 64], [1000, 333], hq=16, hkv=2, paged=True,
              causal=False, k_dtype=FP8),
]


# sm90_f16_only: the same kernel with fp16 MMAs for fp8 K and bf16 q (q rows scaled into fp16 in
# registers) and for NVFP4 q and K (value x 2^-7); the upcast / dequantized twins (16-bit K of q's
# dtype) run the bf16 MMAs, so the bitwise checks below compare the two MMA types (fp16 q: the same
# kernel as sm90_only).
SM90_CONVERTED_VARIANTS = SM90_VARIANTS + ["sm90_f16_only"]


@needs_sm90
@pytest.mark.parametrize("variant", SM90_CONVERTED_VARIANTS)
@pytest.mark.parametrize("case", SM90_FP8_CASES, ids=str)
def test_proxy_sm90_fp8_k(case: ProxyCase, variant: str):
    """fp8 K on the sm_90a kernel: against the CPU reference (PROXY_ATOL, exact -inf / NaN
    patterns, every element written), and bit for bit equal to the same kernel on the upcast K."""
    inputs, want = proxy_reference(case)
    got = run_proxy(case, inputs, DEV, kernel=variant)
    assert_proxy_close(got, want, case.name)
    up = case.q_dtype
    twin_inputs = dict(inputs, k=inputs["k"].to(up))
    upcast = run_proxy(_twin(case, k_dtype=up), twin_inputs, DEV, fill=0.0, kernel=variant)
    assert torch.equal(got.view(torch.int32), upcast.view(torch.int32)), case.name


SM90_FP4_CASES = [
    ProxyCase("sm90_fp4_m3_prefill", [2048], [2048], hq=4, hkv=1),
    ProxyCase("sm90_fp4_ragged", [1000, 37, 1, 700, 64, 65], [1000, 37, 1, 700, 64, 65], hq=4,
              hkv=1),
    ProxyCase("sm90_fp4_chunked_prefill", [500, 300], [3000, 333], hq=4, hkv=1),
    ProxyCase("sm90_fp4_noncausal", [300, 129], [1000, 700], hq=4, hkv=1, causal=False),
    ProxyCase("sm90_fp4_q_offset", [150, 64, 70], [512, 512, 300], hq=4, hkv=1,
              q_offset=[-3, 200, 0]),
    ProxyCase("sm90_fp4_g1", [300, 77], [300, 500], hq=2, hkv=2),
    ProxyCase("sm90_fp4_g8", [300, 65], [700, 65], hq=8, hkv=1),
    ProxyCase("sm90_fp4_g16", [130, 3], [1500, 700], hq=64, hkv=4),
    ProxyCase("sm90_fp4_paged", [700, 300], [1500, 3000], hq=4, hkv=1, paged=True),
    ProxyCase("sm90_fp4_paged_invalid_pages", [60, 5, 200], [1500, 900, 700], hq=4, hkv=1,
              paged=True, invalid_pages=True),
    ProxyCase("sm90_fp4_paged_g8_noncausal", [129, 64], [1000, 333], hq=16, hkv=2, paged=True,
              causal=False),
]


@needs_sm90
@pytest.mark.parametrize("variant", SM90_CONVERTED_VARIANTS)
@pytest.mark.parametrize("case", SM90_FP4_CASES, ids=str)
def test_proxy_sm90_fp4(case: ProxyCase, variant: str):
    """NVFP4 q and K on the sm_90a kernel (both dequantized exactly into bf16 by the producer
    warpgroup): against the CPU reference with global scales; with unit scales bit for bit equal
    to the same kernel on the dequantized bf16 tensors; with scales, exactly that times
    q_gs * k_gs (the block maxima are scaled: equal to scaling every logit for a positive scale)."""
    q_gs, k_gs = 0.37, 2.5

    def make():
        a, deq = _fp4_decode_inputs(case, seed=zlib.crc32(case.name.encode()))
        return a, deq, _run_fp4(case, a, "cpu", q_gs, k_gs)
    a, deq, want = _PROXY_REFERENCES(("fp4", repr(case)), make)
    got = _run_fp4(case, a, DEV, q_gs, k_gs, kernel=variant)
    scale = q_gs * k_gs
    assert_proxy_close(got / scale, want / scale, case.name)
    unit = _run_fp4(case, a, DEV, 1.0, 1.0, kernel=variant)
    dequantized = run_proxy(_twin(case, q_dtype=BF16), deq, DEV, kernel=variant)
    assert torch.equal(unit.view(torch.int32), dequantized.view(torch.int32)), case.name
    product = torch.tensor(q_gs, dtype=torch.float32) * torch.tensor(k_gs, dtype=torch.float32)
    assert torch.equal(got, dequantized * product.to(DEV)), case.name


@needs_sm90
@pytest.mark.parametrize("variant", SM90_CONVERTED_VARIANTS)
@pytest.mark.parametrize("case", [
    ProxyCase("sm90_vs_mma_fp8_m3_16k", [16384], [16384], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("sm90_vs_mma_fp8_paged_ragged", [8192, 3000, 1], [8192, 6000, 700], hq=4, hkv=1,
              k_dtype=FP8, paged=True),
    ProxyCase("sm90_vs_mma_fp4_m3_8k", [8192], [8192], hq=4, hkv=1),
    ProxyCase("sm90_vs_mma_fp4_paged_g8", [3000, 500], [9000, 500], hq=8, hkv=1, paged=True),
], ids=str)
def test_proxy_sm90_converted_equals_mma_sync(case: ProxyCase, variant: str):
    """Prefill shapes too large for the CPU reference, fp8 K (bf16 q) and NVFP4 q / K: the sm_90a
    kernel against the mma.sync kernel on the GPU. Same exactly converted operands, different
    accumulation order (wgmma m64n128k16 vs mma.sync m16n8k16), so: identical -inf / NaN patterns,
    finite entries within PROXY_ATOL; and run-to-run bit-identical."""
    seed = zlib.crc32(case.name.encode())
    if "fp4" in case.name:
        a, _ = _fp4_decode_inputs(case, seed=seed)
        want = _run_fp4(case, a, DEV, 0.5, 2.0, kernel="mma_sync").cpu()
        got = _run_fp4(case, a, DEV, 0.5, 2.0, kernel=variant)
        again = _run_fp4(case, a, DEV, 0.5, 2.0, kernel=variant)
    else:
        inputs = make_proxy_inputs(case, seed=seed)
        want = run_proxy(case, inputs, DEV, kernel="mma_sync").cpu()
        got = run_proxy(case, inputs, DEV, fill=0.0, kernel=variant)
        again = run_proxy(case, inputs, DEV, fill=-7.0, kernel=variant)
    assert_proxy_close(got, want, case.name)
    assert torch.equal(got.view(torch.int32), again.view(torch.int32))


@needs_sm90
@pytest.mark.parametrize("case", [
    ProxyCase("sm90_f16_vs_bf16_fp8_m3_16k", [16384], [16384], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("sm90_f16_vs_bf16_fp8_paged_ragged", [8192, 3000, 1], [8192, 6000, 700], hq=4, hkv=1,
              k_dtype=FP8, paged=True),
], ids=str)
def test_proxy_sm90_f16_equals_bf16_mma(case: ProxyCase):
    """Prefill shapes too large for the CPU reference, fp8 K with bf16 q: the sm_90a kernel's fp16
    MMAs (sm90_f16_only) bit for bit equal to its bf16 MMAs (sm90_only): the products are exact in
    both and the row scales are powers of two; and run-to-run bit-identical."""
    inputs = make_proxy_inputs(case, seed=zlib.crc32(case.name.encode()))
    want = run_proxy(case, inputs, DEV, kernel="sm90_only")
    got = run_proxy(case, inputs, DEV, fill=0.0, kernel="sm90_f16_only")
    again = run_proxy(case, inputs, DEV, fill=-7.0, kernel="sm90_f16_only")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case.name
    assert torch.equal(got.view(torch.int32), again.view(torch.int32)), case.name


@needs_sm90
def test_proxy_sm90_f16_row_scales_equal_bf16_mma():
    """bf16 q rows of very different magnitudes (2^-60 ... 2^40 times Gaussian, one zero head) with
    fp8 K: the per-row power-of-two scaling of sm90_f16_only keeps every product exact, so the
    scores equal the bf16-MMA kernel's bit for bit, and the CPU reference's up to rounding."""
    case = ProxyCase("sm90_f16_row_scales", [300, 77], [900, 1500], hq=8, hkv=2, k_dtype=FP8)
    check_f16_row_scales(case, dict(kernel="sm90_f16_only"), dict(kernel="sm90_only"))


# fp8 q and K on the sm_90a kernel (kernel=sm90_f16 / sm90_f16_only only; auto keeps them on the
# mma.sync kernel until an H200 run shows the form correct and faster): Q's raw bytes by TMA, its
# fragments converted exactly to fp16 in registers, K as with bf16 q. Every product is exact and the
# accumulation order is the bf16-MMA kernel's, so the result equals sm90_only on the bf16 upcasts
# of q and K bit for bit; against the CPU reference the usual PROXY_ATOL.
SM90_FP8_Q_CASES = [_twin(c, name=c.name.replace("sm90_fp8", "sm90_fp8q"), q_dtype=FP8)
                    for c in SM90_FP8_CASES if c.q_dtype != FP16]


@needs_sm90
@pytest.mark.parametrize("case", SM90_FP8_Q_CASES, ids=str)
def test_proxy_sm90_fp8_q(case: ProxyCase):
    """fp8 q and K on the sm_90a kernel (sm90_f16_only): against the CPU reference (PROXY_ATOL,
    exact -inf / NaN patterns, every element written), bit for bit equal to sm90_only on the bf16
    upcasts, and run-to-run bit-identical over differently poisoned outputs."""
    inputs, want = proxy_reference(case)
    got = run_proxy(case, inputs, DEV, fill=0.0, kernel="sm90_f16_only")
    assert_proxy_close(got, want, case.name)
    twin_inputs = dict(inputs, q=inputs["q"].to(BF16), k=inputs["k"].to(BF16))
    upcast = run_proxy(_twin(case, q_dtype=BF16, k_dtype=BF16), twin_inputs, DEV, kernel="sm90_only")
    assert torch.equal(got.view(torch.int32), upcast.view(torch.int32)), case.name
    again = run_proxy(case, inputs, DEV, fill=-7.0, kernel="sm90_f16_only")
    assert torch.equal(got.view(torch.int32), again.view(torch.int32)), case.name


@needs_sm90
def test_proxy_sm90_fp8_q_is_autos():
    """auto runs fp8 q and K prefill on the sm_90a kernel's fp8-q form (since the H200 run at
    831d3e5): bit for bit sm90_f16_only; sm90 / sm90_ss keep them on the mma.sync kernel, bit for
    bit its result."""
    case = ProxyCase("sm90_fp8q_auto", [300, 2], [512, 4000], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8)
    inputs = make_proxy_inputs(case, seed=5)
    fp8_q = run_proxy(case, inputs, DEV, kernel="sm90_f16_only")
    got = run_proxy(case, inputs, DEV, kernel="auto")
    assert torch.equal(got.view(torch.int32), fp8_q.view(torch.int32)), "auto"
    want = run_proxy(case, inputs, DEV, kernel="mma_sync")
    for variant in ("sm90", "sm90_ss"):
        got = run_proxy(case, inputs, DEV, kernel=variant)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), variant


@pytest.mark.parametrize("case", [
    ProxyCase("sm90_fallback_fp8_q", [300, 2], [512, 4000], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8,
              paged=True),
    ProxyCase("sm90_fallback_reduce", [300], [4096], hq=8, hkv=2, reduce_heads=True),
    ProxyCase("sm90_fallback_reduce_fp8_k", [150, 90], [2048, 1280], hq=8, hkv=2, k_dtype=FP8,
              reduce_heads=True),
], ids=str)
def test_proxy_sm90_falls_back(case: ProxyCase):
    """Plan option kernel=sm90 / sm90_ss: calls the sm_90a kernel does not cover (fp8 q,
    reduce_heads; any call on other devices) run on the mma.sync kernel, still exact; the _only
    forms refuse them with NotImplementedError. (fp8 K with 16-bit q, and NVFP4, now run on it:
    test_proxy_sm90_fp8_k, test_proxy_sm90_fp4; fp8 q with sm90_f16 on an sm_90 device:
    test_proxy_sm90_fp8_q.)"""
    inputs = make_proxy_inputs(case, seed=zlib.crc32(case.name.encode()))
    want = run_proxy(case, inputs, "cpu")
    variants = ("sm90", "sm90_ss") + (("sm90_f16",) if case.q_dtype != FP8 or not IS_SM90 else ())
    for variant in variants:
        assert_proxy_close(run_proxy(case, inputs, DEV, kernel=variant), want,
                           f"{case.name} {variant}")
        with pytest.raises(NotImplementedError, match="sm_90a kernel"):
            run_proxy(case, inputs, DEV, kernel=variant + "_only")


@needs_sm90
def test_proxy_sm90_fp4_nonpositive_scale_refused():
    """NVFP4 with a global-scale product <= 0: the sm_90a kernel scales block maxima (exact only
    for a positive scale), so it does not run the call: sm90 falls back to mma.sync, sm90_only
    raises NotImplementedError."""
    case = ProxyCase("sm90_fp4_negative_scale", [300], [700], hq=4, hkv=1)
    a, _ = _fp4_decode_inputs(case, seed=3)
    want = _run_fp4(case, a, DEV, -0.5, 2.0, kernel="mma_sync")
    assert torch.equal(_run_fp4(case, a, DEV, -0.5, 2.0, kernel="sm90").view(torch.int32),
                       want.view(torch.int32))
    with pytest.raises(NotImplementedError, match="sm_90a kernel"):
        _run_fp4(case, a, DEV, -0.5, 2.0, kernel="sm90_only")


def test_proxy_kernel_option_rejects_unknown():
    case = ProxyCase("option", [10], [100])
    inputs = make_proxy_inputs(case, seed=1)
    with pytest.raises(ValueError, match="kernel must be auto, mma_sync, sm90"):
        run_proxy(case, inputs, DEV, kernel="wgmma")


# ---- stage 1 on the decode streaming kernel (plan option kernel=decode) ---------------------------
# decode_only runs csrc/proxy_score/proxy_decode.cuh or raises NotImplementedError (never a silent
# fallback), so every case below fails if that kernel does not run it. Fresh random inputs per
# case, outputs poisoned with NaN, every element compared (patterns exact, values within
# PROXY_ATOL of the CPU reference).

DECODE_CASES = [
    ProxyCase("dec_m3_b8", [1] * 8, [1, 129, 700, 4096, 128, 256, 3000, 2049], hq=4, hkv=1),
    ProxyCase("dec_m3_paged", [1] * 8, [1, 129, 700, 4096, 128, 256, 3000, 2049], hq=4, hkv=1,
              paged=True),
    ProxyCase("dec_paged_invalid_pages", [1] * 6, [900, 2000, 129, 700, 640, 1300], hq=4, hkv=1,
              paged=True, invalid_pages=True),
    ProxyCase("dec_ctx_zero", [1, 1, 1, 1], [0, 300, 0, 1], hq=4, hkv=1),
    ProxyCase("dec_ctx_zero_paged", [1, 1, 1], [0, 513, 0], hq=4, hkv=1, paged=True),
    ProxyCase("dec_mtp2", [2] * 5, [300, 1000, 2, 129, 4000], hq=4, hkv=1, paged=True),
    ProxyCase("dec_mtp3", [3] * 4, [3, 128, 131, 2500], hq=4, hkv=1),
    ProxyCase("dec_mtp4", [4] * 6, [4, 127, 128, 129, 1024, 3333], hq=4, hkv=1, paged=True),
    ProxyCase("dec_mixed_sq", [1, 4, 2, 3, 0, 1], [500, 1200, 64, 700, 300, 2100], hq=4, hkv=1),
    ProxyCase("dec_multi_pass", [5, 9], [700, 2000], hq=4, hkv=1),
    ProxyCase("dec_prefill_many_passes", [100, 37], [1000, 500], hq=4, hkv=1, paged=True),
    ProxyCase("dec_q_offset_int", [1, 1, 4], [1000, 600, 900], hq=4, hkv=1, q_offset=300),
    ProxyCase("dec_q_offset_tensor", [1, 2, 4, 1], [512, 512, 300, 1000], hq=4, hkv=1,
              q_offset=[-5, 400, -100, 999]),
    ProxyCase("dec_q_offset_huge", [1, 1], [512, 100], hq=4, hkv=1, q_offset=2**31 - 5),
    ProxyCase("dec_noncausal", [1, 3], [1000, 257], hq=4, hkv=1, causal=False),
    ProxyCase("dec_padding_columns", [1, 1], [500, 100], hq=4, hkv=1, max_k_tiles=10),
    # Paged, with key blocks past the page table's columns (max_k_tiles 14 > 11) and short
    # sequences whose unused columns name a valid page: the kernels read page ids ahead of the
    # lengths, and only a visible block's may be used.
    ProxyCase("dec_padding_columns_paged", [1, 1, 2], [500, 100, 1300], hq=4, hkv=1, max_k_tiles=14,
              paged=True),
    ProxyCase("dec_padding_columns_paged_fp8", [1, 3, 1], [1300, 100, 600], hq=4, hkv=1,
              max_k_tiles=14, paged=True, k_dtype=FP8),
    ProxyCase("dec_truncated_columns", [1, 2], [2000, 900], hq=4, hkv=1, max_k_tiles=3),
    ProxyCase("dec_hint_too_small", [4, 1], [1000, 900], hq=4, hkv=1, max_seqlen_q=1),
    ProxyCase("dec_reduce_heads", [1, 2, 4], [1000, 300, 2000], hq=4, hkv=1, reduce_heads=True),
    ProxyCase("dec_reduce_heads_g16", [1, 3], [700, 2000], hq=16, hkv=1, reduce_heads=True,
              paged=True),
    ProxyCase("dec_g1_mha", [1, 2], [300, 500], hq=2, hkv=2),
    ProxyCase("dec_g2", [1, 3], [800, 31], hq=4, hkv=2, paged=True),
    ProxyCase("dec_g3_odd", [1, 4, 6], [600, 20, 1000], hq=6, hkv=2),
    ProxyCase("dec_g16", [1, 2], [1500, 700], hq=64, hkv=4),
    ProxyCase("dec_fp16", [1, 4], [1000, 2000], hq=4, hkv=1, q_dtype=FP16),
    ProxyCase("dec_fp8_k", [1, 2, 1], [1000, 700, 129], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("dec_fp8_k_paged", [1, 4], [3000, 130], hq=4, hkv=1, k_dtype=FP8, paged=True,
              invalid_pages=True),
    ProxyCase("dec_fp8_k_fp16_q", [1, 3], [700, 1500], hq=4, hkv=1, q_dtype=FP16, k_dtype=FP8),
    ProxyCase("dec_fp8_q_fp8_k", [1, 2], [512, 4000], hq=4, hkv=1, q_dtype=FP8, k_dtype=FP8,
              paged=True),
    ProxyCase("dec_nan_keys", [1, 4], [600, 300], hq=4, hkv=1, nan_keys=True),
    ProxyCase("dec_nan_keys_fp8", [1, 1], [900, 300], hq=4, hkv=1, k_dtype=FP8, nan_keys=True,
              paged=True),
    ProxyCase("dec_uncovered_rows", [1, 2], [300, 600], hq=4, hkv=1, extra_rows=7),
    ProxyCase("dec_empty_sequences", [0, 1, 0, 4], [256, 300, 999, 0], hq=4, hkv=1),
    ProxyCase("dec_many_requests", [1] * 70, [37 * i + 1 for i in range(70)], hq=4, hkv=1,
              paged=True),
]


# decode_ilp=1 / 2 (one or two key blocks per loop iteration, two multiplied together where they
# belong to one single-pass request; bit-identical; auto takes 2 for fp8 K): every test below that
# forces the decode kernel runs with each, forced, on the cp.async ring (decode_fp8=cta: auto takes
# the TMA kernel for fp8 K wherever one pass fits, whose own tests follow further down; the option
# is ignored for other K kinds).
FP8_CTA = dict(decode_fp8="cta")  # the cp.async ring (auto's only where one pass does not fit)
DECODE_ILPS = [dict(decode_ilp=1, **FP8_CTA), dict(decode_ilp=2, **FP8_CTA)]
DECODE_ILP_IDS = ["ilp1", "ilp2"]


def _with(ilp: Optional[dict], **options) -> Optional[dict]:
    """The plan options `options` plus decode_ilp's (None: none at all)."""
    merged = dict(options, **(ilp or {}))
    return merged or None


# NVFP4 K converted a 32-bit word (8 codes; auto since the H200 run at 27436c2) or a byte (2 codes;
# plan option nvfp4_cvt=byte) at a time on the cp.async ring (decode_nvfp4=cta): every test below
# that forces the decode kernel with NVFP4 runs each (None: auto). The
# word conversion hands the MMAs a k-step's dims in another order (d, d + 4 | d + 1, d + 5 instead
# of d, d + 1 | d + 2, d + 3), so its sums may differ from the byte conversion's in the last bits:
# it is checked against the CPU reference and against byte with the proxy tolerance, and bit for
# bit against itself across CTAs-per-SM builds and key blocks per iteration.
NVFP4_CVTS = [None, "byte"]
NVFP4_CVT_IDS = ["cvt_auto", "cvt_byte"]


def _cvt(cvt: Optional[str]) -> dict:
    """The cp.async ring (decode_nvfp4=cta: auto takes the TMA kernel since 900266d, whose own
    tests are below) with the conversion cvt (None: auto's)."""
    return dict(decode_nvfp4="cta", **({} if cvt is None else dict(nvfp4_cvt=cvt)))


FP8_K_DECODE_CASES = [c for c in DECODE_CASES if c.k_dtype == FP8] + [
    ProxyCase("dec_f16_multi_pass_fp8", [5, 9], [700, 2000], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("dec_f16_q_offset_fp8", [1, 2, 4, 1], [512, 512, 300, 1000], hq=4, hkv=1,
              k_dtype=FP8, q_offset=[-5, 400, -100, 999]),
    ProxyCase("dec_f16_g16_fp8", [1, 2], [1500, 700], hq=64, hkv=4, k_dtype=FP8, paged=True),
    ProxyCase("dec_f16_reduce_fp8", [1, 2, 4], [1000, 300, 2000], hq=4, hkv=1, k_dtype=FP8,
              reduce_heads=True),
]


# decode_f16_only (fp16 MMAs for fp8 K, bf16 q rows scaled into fp16) on the fp8-K cases.
@pytest.mark.parametrize("case,kernel", [(c, "decode_only") for c in DECODE_CASES] +
                         [(c, "decode_f16_only") for c in FP8_K_DECODE_CASES],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_matches_reference(case: ProxyCase, kernel: str, ilp):
    """The decode kernel against the CPU reference on fresh random inputs: same -inf / NaN
    patterns, finite entries within PROXY_ATOL, every element written, deterministic."""
    _decode_matches_reference(case, kernel, ilp)


def _decode_matches_reference(case: ProxyCase, kernel: str, options: Optional[dict]):
    seed = random.getrandbits(31)
    inputs = make_proxy_inputs(case, seed=seed)
    want = run_proxy(case, inputs, "cpu", kernel="decode_only")
    got = run_proxy(case, inputs, DEV, kernel=kernel, options=options)
    assert_proxy_close(got, want, f"{case.name} seed={seed}")
    again = run_proxy(case, inputs, DEV, fill=-7.0, kernel=kernel, options=options)
    assert torch.equal(got.view(torch.int32), again.view(torch.int32)), "not deterministic"


@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_shared_pages(ilp):
    """Requests whose page tables share pages (prefix sharing), shuffled pages: each request reads
    the shared page for itself."""
    case = ProxyCase("dec_shared_pages", [1, 2, 1, 4], [1000, 1000, 700, 1300], hq=4, hkv=1,
                     paged=True)
    seed = random.getrandbits(31)
    inputs = make_proxy_inputs(case, seed=seed)
    pt = inputs["page_table"]
    pt[1, :5] = pt[0, :5]
    pt[3, :4] = pt[0, 3:7]
    pt[2, 2] = pt[0, 0]
    want = run_proxy(case, inputs, "cpu", kernel="decode_only")
    assert_proxy_close(run_proxy(case, inputs, DEV, kernel="decode_only", options=ilp), want,
                       f"{case.name} seed={seed}")


@pytest.mark.parametrize("case", [
    ProxyCase("dec_twin_fp8_k", [1, 4, 2], [2048, 1280, 3000], hq=4, hkv=1, k_dtype=FP8,
              paged=True),
    ProxyCase("dec_twin_fp8_q_fp8_k", [1, 3], [512, 4000], hq=4, hkv=1, q_dtype=FP8,
              k_dtype=FP8),
    ProxyCase("dec_twin_fp8_k_fp16_q", [2, 1], [700, 1500], hq=8, hkv=2, q_dtype=FP16,
              k_dtype=FP8),
], ids=str)
@pytest.mark.parametrize("kernel", ["decode_only", "decode_f16_only"])
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_fp8_equals_upcast_bitwise(case: ProxyCase, kernel: str, ilp):
    """fp8 K (and q) converted exactly in registers: equal bit for bit to the decode kernel on the
    upcast tensors (the same dims-to-lanes assignment for every K dtype). decode_f16_only: fp16
    MMAs, bf16 q rows scaled by a power of two: the products stay exact and the scale commutes
    with the fp32 accumulation, so the result should still equal the bf16 MMAs' bit for bit (this
    test is what shows it on a GPU)."""
    inputs = make_proxy_inputs(case, seed=random.getrandbits(31))
    got = run_proxy(case, inputs, DEV, kernel=kernel, options=ilp)
    up = BF16 if case.q_dtype in (BF16, FP8) else FP16
    twin_inputs = dict(inputs, q=inputs["q"].to(up), k=inputs["k"].to(up))
    want = run_proxy(_twin(case, q_dtype=up, k_dtype=up), twin_inputs, DEV, kernel="decode_only")
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_paged_equals_flat_bitwise(ilp):
    case = ProxyCase("dec_paged_vs_flat", [1, 4, 1, 2, 1, 3], [129, 256, 700, 1, 2000, 3333],
                     hq=8, hkv=2)
    flat = make_proxy_inputs(case, seed=11)
    paged_case = _twin(case, paged=True)
    paged = make_proxy_inputs(paged_case, seed=11)
    cache, page_table, seqused = paginate(flat["k"], case.seqs_k,
                                          generator=torch.Generator().manual_seed(3), extra_pages=2)
    paged.update(q=flat["q"], k=cache, page_table=page_table, seqused_k=seqused)
    got_flat = run_proxy(case, flat, DEV, kernel="decode_only")
    got_paged = run_proxy(paged_case, paged, DEV, kernel="decode_only", options=ilp)
    assert torch.equal(got_flat.view(torch.int32), got_paged.view(torch.int32))


@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_f16_row_scales_equal_bf16_mma(ilp):
    """bf16 q rows of very different magnitudes (2^-60 ... 2^40 times Gaussian, one zero row): the
    per-row power-of-two scaling of decode_f16_only keeps every product exact, so the scores
    equal the bf16-MMA decode kernel's bit for bit, and the CPU reference's up to rounding."""
    case = ProxyCase("dec_f16_row_scales", [1, 3, 2], [900, 1500, 300], hq=8, hkv=2, k_dtype=FP8)
    check_f16_row_scales(case, dict(kernel="decode_f16_only", options=ilp),
                         dict(kernel="decode_only", options=FP8_CTA))


def check_f16_row_scales(case: ProxyCase, f16_run: dict, bf16_run: dict):
    """A case's 8 heads scaled by 2^-60 ... 2^40 (head 6 zero) run on fp16 MMAs (f16_run: run_proxy
    keywords) and on bf16 MMAs (bf16_run): bit for bit equal, and within 1e-5 of each head's
    largest |score| of the CPU reference."""
    seed = random.getrandbits(31)
    inputs = make_proxy_inputs(case, seed=seed)
    q = inputs["q"].float()
    for h, e in enumerate([-60, -20, 0, 40, 7, -3, 0, 0]):
        q[:, h] *= 2.0 ** e
    q[:, 6] = 0.0
    inputs["q"] = q.to(inputs["q"].dtype)
    f16 = run_proxy(case, inputs, DEV, **f16_run)
    bf16 = run_proxy(case, inputs, DEV, **bf16_run)
    assert torch.equal(f16.view(torch.int32), bf16.view(torch.int32)), f"seed={seed}"
    want = run_proxy(case, inputs, "cpu")
    got = f16.cpu()
    fin = torch.isfinite(want)
    assert torch.equal(fin, torch.isfinite(got)), f"seed={seed}"
    scale = want.abs().where(fin, torch.zeros_like(want)).amax(dim=(1, 2), keepdim=True)
    err = ((got - want).abs() / scale.clamp(min=1e-38)).where(fin, torch.zeros_like(want))
    assert float(err.max()) <= 1e-5, f"seed={seed}"


@pytest.mark.parametrize("case", [
    ProxyCase("dec_vs_mma_b64_4k", [1] * 64, [4096] * 64, hq=4, hkv=1, paged=True),
    ProxyCase("dec_vs_mma_b3_32k_mtp4", [4] * 3, [32768, 20001, 129], hq=4, hkv=1),
    ProxyCase("dec_vs_mma_b1_128k", [1], [131072], hq=4, hkv=1, paged=True),
], ids=str)
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_equals_mma_sync(case: ProxyCase, ilp):
    """Long contexts (too slow for the CPU reference): the decode kernel against the mma.sync
    kernel (identical -inf / NaN patterns, finite entries within PROXY_ATOL)."""
    inputs = make_proxy_inputs(case, seed=random.getrandbits(31))
    want = run_proxy(case, inputs, DEV, kernel="mma_sync").cpu()
    assert_proxy_close(run_proxy(case, inputs, DEV, kernel="decode_only", options=ilp), want, case.name)



# decode_ctas=3 / 4: the decode kernel built for 3 or 4 CTAs per SM (fewer pipeline stages each:
# fp8 4 / 3, NVFP4 8 / 6) computes exactly what the default build (2 CTAs) does, bit for bit, with
# bf16 MMAs (decode_only) and fp16 MMAs (decode_f16_only) for fp8 K and for NVFP4 q / K.
CTAS_FP8_CASES = [c for c in FP8_K_DECODE_CASES if c.name in (
    "dec_fp8_k", "dec_fp8_k_paged", "dec_fp8_q_fp8_k", "dec_f16_multi_pass_fp8", "dec_f16_g16_fp8",
    "dec_f16_reduce_fp8")] + [
    ProxyCase("dec_ctas_many_requests_fp8", [1] * 70, [37 * i + 1 for i in range(70)], hq=4, hkv=1,
              k_dtype=FP8, paged=True)]


@pytest.mark.parametrize("ctas", [3, 4])
@pytest.mark.parametrize("case,kernel", [(c, k) for c in CTAS_FP8_CASES
                                         for k in ("decode_only", "decode_f16_only")], ids=str)
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
def test_proxy_decode_ctas_equal_default_bitwise(case: ProxyCase, kernel: str, ctas: int, ilp):
    inputs = make_proxy_inputs(case, seed=random.getrandbits(31))
    want = run_proxy(case, inputs, DEV, kernel=kernel, options=FP8_CTA)
    got = run_proxy(case, inputs, DEV, kernel=kernel, options=_with(ilp, decode_ctas=ctas))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case.name


@pytest.mark.parametrize("ctas", [3, 4])
@pytest.mark.parametrize("case", [
    ProxyCase("dec_ctas_fp4_paged", [1, 1, 3, 1, 2], [4096, 129, 700, 0, 2500], hq=4, hkv=1,
              paged=True, invalid_pages=True),
    ProxyCase("dec_ctas_fp4_many", [1] * 40, [53 * i + 7 for i in range(40)], hq=4, hkv=1),
], ids=str)
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
@pytest.mark.parametrize("cvt", NVFP4_CVTS, ids=NVFP4_CVT_IDS)
def test_proxy_decode_fp4_ctas_equal_default_bitwise(case: ProxyCase, ctas: int, ilp, cvt):
    a, _ = _fp4_decode_inputs(case, seed=random.getrandbits(31))
    want = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=_with(None, **_cvt(cvt)))
    got = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only",
                   options=_with(ilp, decode_ctas=ctas, **_cvt(cvt)))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case.name

# decode_ilp=2 against the default build bit for bit, for every K kind (bf16, fp8 with bf16 and fp16
# MMAs, NVFP4) and every CTAs-per-SM build: odd and even unit counts per CTA, pairs across request
# and KV-head boundaries, multi-pass requests (which run unit by unit), masked diagonal blocks,
# invalid pages and empty requests.
ILP_CASES = [
    ProxyCase("dec_ilp_many_requests", [1] * 70, [37 * i + 1 for i in range(70)], hq=4, hkv=1,
              paged=True),
    ProxyCase("dec_ilp_mixed", [1, 4, 0, 2, 7, 1], [4096, 1300, 900, 129, 2000, 257], hq=4, hkv=1,
              paged=True, invalid_pages=True),
    ProxyCase("dec_ilp_g2_mtp", [2, 1, 3], [3000, 128, 1500], hq=8, hkv=4, q_offset=[0, 7, -40]),
    ProxyCase("dec_ilp_reduce", [1, 2, 4], [2100, 640, 3333], hq=4, hkv=1, reduce_heads=True),
    ProxyCase("dec_ilp_long", [1] * 3, [8191, 8192, 8193], hq=4, hkv=1, paged=True),
]


@pytest.mark.parametrize("case,kernel,ctas", [(c, "decode_only", None) for c in ILP_CASES] +
                         [(_twin(c, name=c.name + "_fp8", k_dtype=FP8), k, ctas) for c in ILP_CASES
                          for k in ("decode_only", "decode_f16_only") for ctas in (None, 3, 4)],
                         ids=str)
def test_proxy_decode_ilp_equals_default_bitwise(case: ProxyCase, kernel: str, ctas):
    """decode_ilp=2 against decode_ilp=1, bit for bit; fp8 K at each CTAs-per-SM build (None:
    auto's 3), bf16 K (always 2 CTAs)."""
    inputs = make_proxy_inputs(case, seed=random.getrandbits(31))
    extra = dict(FP8_CTA, **({} if ctas is None else dict(decode_ctas=ctas)))
    want = run_proxy(case, inputs, DEV, kernel=kernel, options=dict(extra, decode_ilp=1))
    got = run_proxy(case, inputs, DEV, kernel=kernel, options=dict(extra, decode_ilp=2))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case.name


@pytest.mark.parametrize("ctas", [None, 3, 4])
@pytest.mark.parametrize("case", ILP_CASES, ids=str)
@pytest.mark.parametrize("cvt", NVFP4_CVTS, ids=NVFP4_CVT_IDS)
def test_proxy_decode_fp4_ilp_equals_default_bitwise(case: ProxyCase, ctas, cvt):
    a, _ = _fp4_decode_inputs(case, seed=random.getrandbits(31))
    extra = dict(_cvt(cvt), **({} if ctas is None else dict(decode_ctas=ctas)))
    want = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=dict(extra, decode_ilp=1))
    got = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=dict(extra, decode_ilp=2))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), case.name


def _fp4_decode_inputs(case: ProxyCase, seed: int):
    """make_proxy_inputs with q and k quantized to NVFP4, and the bf16 tensors of their exactly
    dequantized values."""
    from flashmsa.testing import dequantize_nvfp4, quantize_nvfp4
    inputs = make_proxy_inputs(_twin(case, q_dtype=BF16, k_dtype=None), seed)
    q4, qs, _ = quantize_nvfp4(inputs["q"], 1.0)
    k4, ks, _ = quantize_nvfp4(inputs["k"], 1.0)
    deq = dict(inputs, q=dequantize_nvfp4(q4, qs).to(BF16), k=dequantize_nvfp4(k4, ks).to(BF16))
    return dict(inputs, q4=q4, qs=qs, k4=k4, ks=ks), deq


def _run_fp4(c: ProxyCase, a: dict, device, q_gs: float, k_gs: float,
             kernel: Optional[str] = None, options: Optional[dict] = None) -> torch.Tensor:
    a = {k: _to(v, device) for k, v in a.items()}
    out = torch.full((1 if c.reduce_heads else c.hq, a["max_k_tiles"], a["q4"].shape[0]),
                     float("nan"), dtype=torch.float32, device=device)
    msa_ops._proxy_score_fp4_planned(
        a["q4"], a["k4"], a["qs"], a["ks"], q_gs, k_gs, a["cu_seqlens_q"], a["cu_seqlens_k"],
        page_table=a["page_table"], seqused_k=a["seqused_k"], causal=c.causal,
        max_seqlen_q=a["max_seqlen_q"], max_k_tiles=a["max_k_tiles"], output=out,
        reduce_heads=c.reduce_heads, q_offset=a["q_offset"], options=_options(kernel, options))
    return out


@pytest.mark.parametrize("case", [
    ProxyCase("dec_fp4_flat", [1, 4, 2], [1000, 2048, 129], hq=4, hkv=1),
    ProxyCase("dec_fp4_paged", [1, 1, 3, 1], [4096, 129, 700, 0], hq=4, hkv=1, paged=True,
              invalid_pages=True),
    ProxyCase("dec_fp4_gqa2", [2, 1], [700, 1300], hq=4, hkv=2),
    ProxyCase("dec_fp4_reduce", [1, 4], [1000, 300], hq=4, hkv=1, reduce_heads=True, paged=True),
    ProxyCase("dec_fp4_q_offset", [1, 2], [512, 900], hq=4, hkv=1, q_offset=[-5, 400]),
], ids=str)
@pytest.mark.parametrize("ilp", DECODE_ILPS, ids=DECODE_ILP_IDS)
@pytest.mark.parametrize("cvt", NVFP4_CVTS, ids=NVFP4_CVT_IDS)
def test_proxy_decode_fp4(case: ProxyCase, ilp, cvt):
    """NVFP4 q and k on the decode kernel (dequantized in registers into fp16 MMAs): against the
    CPU reference with global scales, and with unit scales bit for bit equal to the decode kernel
    on the dequantized bf16 tensors under nvfp4_cvt=byte (word, auto's: within the proxy tolerance
    of it, the same -inf / NaN pattern); with scales, exactly the unit-scale result times
    q_gs * k_gs."""
    seed = random.getrandbits(31)
    a, deq = _fp4_decode_inputs(case, seed=seed)
    q_gs, k_gs = 0.37, 2.5
    options = _with(ilp, **_cvt(cvt))
    want = _run_fp4(case, a, "cpu", q_gs, k_gs, kernel="decode_only")
    got = _run_fp4(case, a, DEV, q_gs, k_gs, kernel="decode_only", options=options)
    scale = q_gs * k_gs
    assert_proxy_close(got / scale, want / scale, f"{case.name} {cvt} seed={seed}")
    unit = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only", options=options)
    dequantized = run_proxy(_twin(case, q_dtype=BF16), deq, DEV, kernel="decode_only")
    if cvt != "byte":
        assert_proxy_close(unit, dequantized.cpu(), f"{case.name} word vs byte seed={seed}")
    else:
        assert torch.equal(unit.view(torch.int32), dequantized.view(torch.int32)), f"seed={seed}"
    product = torch.tensor(q_gs, dtype=torch.float32) * torch.tensor(k_gs, dtype=torch.float32)
    assert torch.equal(got, unit * product.to(DEV))


# decode_fp8=tma (sm_90a: TMA-fed ring, a warp per key block, keys on the MMA's M side; without
# reduce_heads, else the cp.async kernel runs): against the CPU reference on every fp8-K decode
# case (bf16 MMAs: decode_only, fp16 MMAs: decode_f16_only), and against the cp.async kernel
# (decode_fp8=cta) on long contexts (same dims per k-step in the same order, so bit-identical
# results are expected; asserted here only within the proxy tolerance with identical -inf / NaN
# patterns). Its passes cover 8 query columns (G heads x tokens) where G x max_seqlen_q <= 8, else
# 16 (each converted K fragment feeding two MMAs; forced only). auto takes tma at any batch where
# one pass fits.
FP8_TMA = dict(decode_fp8="tma")

# decode_tma_issue: the TMA kernel's loads by a producer warp (auto's for fp8 K, and for NVFP4 K up to
# 2048 units) or by each consumer warp for itself (warps: no producer warp; auto's for NVFP4 K above
# them, since 9738086); the TMA kernel tests run both, and warps is bit-identical to producer.
TMA_ISSUES = ["producer", "warps"]
TMA_ISSUE_IDS = ["issue_producer", "issue_warps"]


def _issue(options: dict, issue: str) -> dict:
    return dict(options, decode_tma_issue=issue)

# 16-column passes: MTP 3 and 4 tokens at G 4 (12 and 16 columns), G 8 x 2 tokens, G 6 x 2 (12 of
# 16 columns, 16 / G not whole), G 16 x 1, fp8 q and fp16 q, masked diagonal blocks, invalid pages.
FP8_TMA16_CASES = [
    ProxyCase("dec_tma16_mtp3_fp8", [3] * 4, [3, 128, 131, 2500], hq=4, hkv=1, k_dtype=FP8),
    ProxyCase("dec_tma16_mtp4_fp8", [4] * 6, [4, 127, 128, 129, 1024, 3333], hq=4, hkv=1,
              k_dtype=FP8, paged=True, invalid_pages=True),
    ProxyCase("dec_tma16_mtp34_q_offset_fp8", [3, 4, 1, 4], [512, 900, 300, 1000], hq=4, hkv=1,
              k_dtype=FP8, q_offset=[-5, 400, 7, 999]),
    ProxyCase("dec_tma16_g8_mtp2_fp8", [2, 2, 1, 2], [700, 2000, 129, 2], hq=16, hkv=2,
              k_dtype=FP8, paged=True),
    ProxyCase("dec_tma16_g6_mtp2_fp8", [2, 1, 2], [900, 300, 1500], hq=12, hkv=2, k_dtype=FP8),
    ProxyCase("dec_tma16_g16_fp8", [1, 1], [1500, 700], hq=16, hkv=1, k_dtype=FP8, paged=True),
    ProxyCase("dec_tma16_fp8_q_mtp4", [4, 3], [2000, 600], hq=8, hkv=2, q_dtype=FP8, k_dtype=FP8,
              paged=True),
    ProxyCase("dec_tma16_fp16_q_mtp3", [3, 3], [1300, 250], hq=4, hkv=1, q_dtype=FP16, k_dtype=FP8),
    ProxyCase("dec_tma16_nan_keys_mtp4", [4, 2], [900, 300], hq=4, hkv=1, k_dtype=FP8,
              nan_keys=True, paged=True),
    ProxyCase("dec_tma16_padding_columns_mtp4", [4, 1, 3], [1300, 100, 600], hq=4, hkv=1,
              k_dtype=FP8, max_k_tiles=14, paged=True),
]


@pytest.mark.parametrize("case,kernel", [(c, k) for c in FP8_K_DECODE_CASES + FP8_TMA16_CASES
                                         for k in ("decode_only", "decode_f16_only")], ids=str)
def test_proxy_decode_fp8_tma_matches_reference(case: ProxyCase, kernel: str):
    for issue in TMA_ISSUES:
        _decode_matches_reference(case, kernel, _issue(FP8_TMA, issue))


@pytest.mark.parametrize("case,kernel", [
    (_twin(c, name=c.name + "_fp8", k_dtype=FP8), k) for c in ILP_CASES + [
        ProxyCase("dec_tma_b64_4k", [1] * 64, [4096] * 64, hq=4, hkv=1, paged=True),
        ProxyCase("dec_tma_b3_32k_mtp2", [2] * 3, [32768, 20001, 129], hq=4, hkv=1),
        ProxyCase("dec_tma_b2_g8", [1, 1], [9000, 4000], hq=16, hkv=2, paged=True),
        # 16-column passes: MTP 3 / 4 at G 4, G 8 x 2 tokens.
        ProxyCase("dec_tma16_b64_4k_mtp4", [4] * 64, [4096] * 64, hq=4, hkv=1, paged=True),
        ProxyCase("dec_tma16_b3_32k_mtp3", [3] * 3, [32768, 20001, 129], hq=4, hkv=1),
        ProxyCase("dec_tma16_b2_g8_mtp2", [2, 2], [9000, 4000], hq=16, hkv=2, paged=True),
        # M3 batch 1 at 128K (~8 blocks a CTA: some consumer warps take two) and 32K (2 a CTA).
        ProxyCase("dec_tma_b1_128k", [1], [131072], hq=4, hkv=1, paged=True),
        ProxyCase("dec_tma_b1_32k_flat", [1], [32768 - 5], hq=4, hkv=1)]
    for k in ("decode_only", "decode_f16_only")], ids=str)
def test_proxy_decode_fp8_tma_close_to_default(case: ProxyCase, kernel: str):
    """decode_fp8=tma against the cp.async ring, and the same bits whoever issues its loads."""
    seed = random.getrandbits(31)
    inputs = make_proxy_inputs(case, seed=seed)
    want = run_proxy(case, inputs, DEV, kernel=kernel, options=FP8_CTA)
    got = run_proxy(case, inputs, DEV, kernel=kernel, options=FP8_TMA)
    assert_proxy_close(got, want.cpu(), f"{case.name} seed={seed}")
    for issue in TMA_ISSUES:
        forced = run_proxy(case, inputs, DEV, kernel=kernel, options=_issue(FP8_TMA, issue))
        assert torch.equal(forced.view(torch.int32), got.view(torch.int32)), f"{issue} seed={seed}"


@pytest.mark.parametrize("sq", [1, 4], ids=["sq1", "sq4"])
@pytest.mark.parametrize("issue", TMA_ISSUES, ids=TMA_ISSUE_IDS)
def test_proxy_decode_fp8_tma_b64_32k(sq: int, issue):
    """The benchmark's shapes (64 requests x 32K, paged: ~124 units per CTA, the memory system
    saturated), where the first version's shared ring let a warp pass a stage's parity wait on the
    previous phase and hung or faulted: five calls against the cp.async ring, each the same bits
    as the first. sq 1: one 8-column pass; sq 4: one 16-column pass."""
    case = ProxyCase(f"dec_tma_b64_32k_sq{sq}_fp8", [sq] * 64, [32768] * 64, hq=4, hkv=1,
                     paged=True, k_dtype=FP8)
    seed = random.getrandbits(31)
    inputs = make_proxy_inputs(case, seed=seed)
    want = run_proxy(case, inputs, DEV, kernel="decode_only", options=FP8_CTA)
    first = run_proxy(case, inputs, DEV, kernel="decode_only", options=_issue(FP8_TMA, issue))
    assert_proxy_close(first, want.cpu(), f"seed={seed}")
    for _ in range(4):
        again = run_proxy(case, inputs, DEV, kernel="decode_only", options=_issue(FP8_TMA, issue))
        assert torch.equal(again.view(torch.int32), first.view(torch.int32)), f"seed={seed}"


# decode_nvfp4=tma (auto's where one pass fits, since 900266d; sm_90a: the same TMA-fed ring and
# warp per key block as decode_fp8=tma, each
# stage the block's 64-byte e2m1 rows by TMA and its 1 KB of scales by the producer lanes' cp.async;
# without reduce_heads, else the cp.async kernel runs): against the CPU reference with global scales,
# against the decode kernel on the exactly dequantized bf16 tensors (the same products; each k-step
# sums other dims, so within the proxy tolerance with the same -inf / NaN pattern), exactly the
# unit-scale result times q_gs * k_gs, and against decode_nvfp4=cta on long contexts. Flat caches
# (strided scale rows, gathered 4 bytes at a time, partial last blocks) and paged ones (a page's
# scales one aligned 1 KB tile), invalid pages, masked diagonal blocks, 8- and 16-column passes.
FP4_TMA = dict(decode_nvfp4="tma")
FP4_CTA = dict(decode_nvfp4="cta")
FP4_TMA_CASES = [
    ProxyCase("dec_fp4tma_flat", [1, 4, 2], [1000, 2048, 129], hq=4, hkv=1),
    ProxyCase("dec_fp4tma_paged", [1, 1, 3, 1], [4096, 129, 700, 0], hq=4, hkv=1, paged=True,
              invalid_pages=True),
    ProxyCase("dec_fp4tma_gqa2_flat", [2, 1, 1], [700, 1300, 3], hq=4, hkv=2),
    ProxyCase("dec_fp4tma_gqa2_paged", [1, 2], [1500, 257], hq=8, hkv=2, paged=True),
    ProxyCase("dec_fp4tma_reduce", [1, 4], [1000, 300], hq=4, hkv=1, reduce_heads=True, paged=True),
    ProxyCase("dec_fp4tma_q_offset", [1, 2, 4, 1], [512, 900, 300, 1000], hq=4, hkv=1,
              q_offset=[-5, 400, -100, 999]),
    ProxyCase("dec_fp4tma_multi_pass", [5, 9], [700, 2000], hq=4, hkv=1),
    # 16-column passes: MTP 3 / 4 at G 4, G 8 x 2, G 6 x 2 (16 / G not whole), G 16 x 1.
    ProxyCase("dec_fp4tma16_mtp3", [3] * 4, [3, 128, 131, 2500], hq=4, hkv=1),
    ProxyCase("dec_fp4tma16_mtp4_paged", [4] * 6, [4, 127, 128, 129, 1024, 3333], hq=4, hkv=1,
              paged=True, invalid_pages=True),
    ProxyCase("dec_fp4tma16_g8_mtp2", [2, 2, 1, 2], [700, 2000, 129, 2], hq=16, hkv=2, paged=True),
    ProxyCase("dec_fp4tma16_g6_mtp2", [2, 1, 2], [900, 300, 1500], hq=12, hkv=2),
    ProxyCase("dec_fp4tma16_g16", [1, 1], [1500, 700], hq=16, hkv=1, paged=True),
    # Key blocks past the page table's columns, short sequences' unused columns a valid page.
    ProxyCase("dec_fp4tma_padding_columns_paged", [1, 3, 1], [1300, 100, 600], hq=4, hkv=1,
              max_k_tiles=14, paged=True),
]


@pytest.mark.parametrize("case", FP4_TMA_CASES, ids=str)
@pytest.mark.parametrize("issue", TMA_ISSUES, ids=TMA_ISSUE_IDS)
def test_proxy_decode_fp4_tma(case: ProxyCase, issue):
    seed = random.getrandbits(31)
    a, deq = _fp4_decode_inputs(case, seed=seed)
    q_gs, k_gs = 0.37, 2.5
    want = _run_fp4(case, a, "cpu", q_gs, k_gs, kernel="decode_only")
    got = _run_fp4(case, a, DEV, q_gs, k_gs, kernel="decode_only", options=_issue(FP4_TMA, issue))
    scale = q_gs * k_gs
    assert_proxy_close(got / scale, want / scale, f"{case.name} seed={seed}")
    unit = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only", options=_issue(FP4_TMA, issue))
    dequantized = run_proxy(_twin(case, q_dtype=BF16), deq, DEV, kernel="decode_only")
    assert_proxy_close(unit, dequantized.cpu(), f"{case.name} tma vs dequantized seed={seed}")
    other = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only",
                     options=_issue(FP4_TMA, "producer" if issue == "warps" else "warps"))
    assert torch.equal(unit.view(torch.int32), other.view(torch.int32)), f"seed={seed}"
    product = torch.tensor(q_gs, dtype=torch.float32) * torch.tensor(k_gs, dtype=torch.float32)
    assert torch.equal(got, unit * product.to(DEV))


@pytest.mark.parametrize("case", ILP_CASES + [
    ProxyCase("dec_fp4tma_b64_4k", [1] * 64, [4096] * 64, hq=4, hkv=1, paged=True),
    ProxyCase("dec_fp4tma_b3_32k_mtp2", [2] * 3, [32768, 20001, 129], hq=4, hkv=1),
    ProxyCase("dec_fp4tma16_b64_4k_mtp4", [4] * 64, [4096] * 64, hq=4, hkv=1, paged=True),
    ProxyCase("dec_fp4tma16_b2_g8_mtp2", [2, 2], [9000, 4000], hq=16, hkv=2, paged=True)], ids=str)
def test_proxy_decode_fp4_tma_close_to_cta(case: ProxyCase):
    """decode_nvfp4=tma against the cp.async ring on contexts too long for the CPU reference: the
    same -inf / NaN pattern, the values within the proxy tolerance; deterministic, and the same
    bits whoever issues the loads (decode_tma_issue=producer / warps)."""
    seed = random.getrandbits(31)
    a, _ = _fp4_decode_inputs(case, seed=seed)
    cta = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=FP4_CTA)
    tma = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=FP4_TMA)
    assert_proxy_close(tma, cta.cpu(), f"{case.name} seed={seed}")
    again = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=FP4_TMA)
    assert torch.equal(tma.view(torch.int32), again.view(torch.int32)), f"seed={seed}"
    for issue in TMA_ISSUES:
        forced = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=_issue(FP4_TMA, issue))
        assert torch.equal(forced.view(torch.int32), tma.view(torch.int32)), f"{issue} seed={seed}"


@pytest.mark.parametrize("sq", [1, 4], ids=["sq1", "sq4"])
@pytest.mark.parametrize("issue", TMA_ISSUES, ids=TMA_ISSUE_IDS)
def test_proxy_decode_fp4_tma_b64_32k(sq: int, issue):
    """The benchmark's shapes (64 requests x 32K, paged: ~124 units per CTA, memory saturated):
    five calls against the cp.async ring, each the same bits as the first."""
    case = ProxyCase(f"dec_fp4tma_b64_32k_sq{sq}", [sq] * 64, [32768] * 64, hq=4, hkv=1, paged=True)
    seed = random.getrandbits(31)
    a, _ = _fp4_decode_inputs(case, seed=seed)
    want = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only", options=FP4_CTA)
    first = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only", options=_issue(FP4_TMA, issue))
    assert_proxy_close(first, want.cpu(), f"seed={seed}")
    for _ in range(4):
        again = _run_fp4(case, a, DEV, 1.0, 1.0, kernel="decode_only", options=_issue(FP4_TMA, issue))
        assert torch.equal(again.view(torch.int32), first.view(torch.int32)), f"seed={seed}"


def test_proxy_decode_fp4_tma_unaligned_scales_fall_back():
    """k scales that are not 16-byte aligned: the TMA kernel does not launch and the cp.async ring
    runs the call (bit-identical to decode_nvfp4=cta on the same scales)."""
    case = ProxyCase("dec_fp4tma_unaligned", [1, 2], [1000, 300], hq=4, hkv=1, paged=True)
    seed = random.getrandbits(31)
    a, _ = _fp4_decode_inputs(case, seed=seed)
    ks = a["ks"].to(DEV)
    shifted = torch.empty(ks.numel() + 16, dtype=ks.dtype, device=DEV)[4:4 + ks.numel()].view(ks.shape)
    shifted.copy_(ks)
    assert shifted.data_ptr() % 16 != 0
    b = dict(a, ks=shifted)
    cta = _run_fp4(case, b, DEV, 1.0, 1.0, kernel="decode_only", options=FP4_CTA)
    tma = _run_fp4(case, b, DEV, 1.0, 1.0, kernel="decode_only", options=FP4_TMA)
    assert torch.equal(tma.view(torch.int32), cta.view(torch.int32)), f"seed={seed}"


@pytest.mark.parametrize("k_gs", [-2.5, 0.0], ids=["negative", "zero"])
def test_proxy_decode_fp4_tma_nonpositive_scale_falls_back(k_gs: float):
    """A global-scale product <= 0: the TMA kernel scales each column's block maximum (the max of
    the scaled logits only for a positive scale), so it does not launch and the cp.async ring runs
    the call: bit-identical to decode_nvfp4=cta, and against the CPU reference."""
    case = ProxyCase("dec_fp4tma_nonpositive", [1, 2, 1], [1000, 300, 2049], hq=4, hkv=1, paged=True)
    seed = random.getrandbits(31)
    a, _ = _fp4_decode_inputs(case, seed=seed)
    cta = _run_fp4(case, a, DEV, 0.37, k_gs, kernel="decode_only", options=FP4_CTA)
    for issue in TMA_ISSUES:
        tma = _run_fp4(case, a, DEV, 0.37, k_gs, kernel="decode_only", options=_issue(FP4_TMA, issue))
        assert torch.equal(tma.view(torch.int32), cta.view(torch.int32)), f"{issue} seed={seed}"
    want = _run_fp4(case, a, "cpu", 0.37, k_gs, kernel="decode_only")
    assert_proxy_close(cta, want, f"seed={seed}")


@pytest.mark.parametrize("case", ILP_CASES, ids=str)
def test_proxy_decode_fp4_word_close_to_byte(case: ProxyCase):
    """nvfp4_cvt=word against nvfp4_cvt=byte on contexts too long for the CPU reference (many
    requests, masked diagonal blocks, invalid pages, multi-pass requests, reduce_heads): the same
    -inf / NaN pattern, the values within the proxy tolerance; deterministic."""
    seed = random.getrandbits(31)
    a, _ = _fp4_decode_inputs(case, seed=seed)
    byte = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=_cvt("byte"))
    word = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=_cvt("word"))
    assert_proxy_close(word, byte.cpu(), f"{case.name} seed={seed}")
    again = _run_fp4(case, a, DEV, 0.37, 2.5, kernel="decode_only", options=_cvt("word"))
    assert torch.equal(word.view(torch.int32), again.view(torch.int32)), f"seed={seed}"


@pytest.mark.parametrize("case", [
    ProxyCase("dec_fallback_g32", [1, 2], [700, 300], hq=32, hkv=1),
    ProxyCase("dec_fallback_reduce_two_kv_heads", [1, 3], [1000, 500], hq=8, hkv=2,
              reduce_heads=True),
], ids=str)
def test_proxy_decode_falls_back(case: ProxyCase):
    """Plan option kernel=decode: calls the decode kernel does not run (more than 16 heads per
    KV head, reduce_heads over several KV heads) run on the mma.sync kernel, still exact;
    decode_only refuses them with NotImplementedError."""
    inputs = make_proxy_inputs(case, seed=zlib.crc32(case.name.encode()))
    want = run_proxy(case, inputs, "cpu")
    assert_proxy_close(run_proxy(case, inputs, DEV, kernel="decode"), want, case.name)
    with pytest.raises(NotImplementedError, match="decode kernel"):
        run_proxy(case, inputs, DEV, kernel="decode_only")


# ---- stage 2: top-k select ---------------------------------------------------------------------

TopkCase = cases.TopkCase


def make_scores(c: TopkCase) -> torch.Tensor:
    gen = torch.Generator().manual_seed(c.seed)
    shape = (c.H, c.P, c.S)
    if c.scores == "randn":
        x = torch.randn(shape, generator=gen) * 10
    elif c.scores == "ties":  # FlashInfer's tied scores: 1 + U * 2^-13 (many exact ties in fp32)
        x = 1 + torch.randint(0, 8, shape, generator=gen).float() * 2.0**-13
    elif c.scores == "few":  # a handful of distinct values: ties across chunk boundaries
        x = torch.randint(0, 3, shape, generator=gen).float()
    elif c.scores == "nan":  # +NaN ranks first, -NaN last, plus infinities and signed zeros
        x = torch.randn(shape, generator=gen)
        r = torch.rand(shape, generator=gen)
        x[r < 0.05] = float("nan")
        x[(r >= 0.05) & (r < 0.08)] = -float("nan")
        x[(r >= 0.08) & (r < 0.10)] = float("inf")
        x[(r >= 0.10) & (r < 0.20)] = -float("inf")
        x[(r >= 0.20) & (r < 0.25)] = 0.0
        x[(r >= 0.25) & (r < 0.30)] = -0.0
        bits = x.view(torch.int32)
        payload = torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32)
        nan = torch.isnan(x)
        bits[nan] = bits[nan] | payload[nan]  # varied NaN payloads (distinct order keys)
    elif c.scores == "inf":  # mostly -inf: rows with fewer finite candidates than slots
        x = torch.full(shape, -float("inf"))
        r = torch.rand(shape, generator=gen)
        x[r < 0.03] = torch.randn(shape, generator=gen)[r < 0.03]
    elif c.scores == "zeros":
        x = torch.where(torch.rand(shape, generator=gen) < 0.5, 0.0, -0.0)
    elif c.scores == "worst_forced":  # forced blocks get the worst scores
        x = torch.randn(shape, generator=gen)
        x[:, : c.fb] = -float("inf")
        x[:, c.P - 56 - c.fe: c.P - 56] = -1e30
    elif c.scores == "perm":  # distinct scores
        x = torch.stack([torch.stack([torch.randperm(c.P, generator=gen).float()
                                      for _ in range(c.S)], 1) for _ in range(c.H)])
    elif c.scores == "causal":  # proxy-like: -inf beyond each token's own block
        x = torch.randn(shape, generator=gen) * 10
        beyond = torch.arange(c.P)[:, None] > (torch.arange(c.S) // BLK)[None, :]  # (P, S)
        x[:, beyond] = -float("inf")
    else:
        raise ValueError(c.scores)
    return x.contiguous()


def make_nvp(c: TopkCase):
    if c.nvp is None or isinstance(c.nvp, int):
        return c.nvp
    gen = torch.Generator().manual_seed(c.seed + 1)
    if c.nvp == "random":
        return torch.randint(0, c.P + 1, (c.S,), generator=gen, dtype=torch.int32)
    if c.nvp == "causal":
        return (torch.arange(c.S, dtype=torch.int32) // BLK + 1).clamp(max=c.P)
    if c.nvp == "clamp":
        vals = [c.P + 1, 2 * c.P, 2**31 - 1, 0, -5, c.P, -(2**31), 1]
        return torch.tensor([vals[s % len(vals)] for s in range(c.S)], dtype=torch.int32)
    return torch.tensor(c.nvp, dtype=torch.int32)


TOPK_CASES = cases.cases(cases.TOPK, "gpu")


# Values of the plan option `kernel` (include/flashmsa/plan.h): warp-per-row at
# 32 tokens per CTA, at 8 (decode-sized calls), the thread-per-row radix kernel, by_size (the
# default: the size-based choice between warp_split, warp_per_row_8 and radix_uniform), the radix kernel's lean
# variant radix_1buf, split rows (a CTA per row, its chunks over up to 8 warps, merged by one), and
# radix_uniform (radix_1buf with branch-free passes of warp-uniform trip counts), warp_digits
# (split rows, a one-chunk row's threshold by 8-bit radix digits), and net (sorting networks over
# 32-bit words of truncated key and block offset, L lanes a row, an exact second pass on a tie), and
# net with the pivot first (a warp per row: the survivors of the lanes' minima sorted exactly,
# the networks where more than 32 survive; rows of <= 1024 blocks choosing <= 15; auto's for
# decode-sized calls) forced on and off, and on in each form (net_pivot_mode=sort: a warp a row,
# bitonic sorts; rank_cta: a CTA of 4 warps a row, counting). An entry's words after the kernel are
# further plan options.
TOPK_KERNELS = ("warp_per_row", "warp_per_row_8", "radix", "by_size", "radix_1buf", "warp_split",
                "radix_uniform", "warp_digits", "net", "net net_pivot=on", "net net_pivot=off",
                "net net_pivot=on net_pivot_mode=sort", "net net_pivot=on net_pivot_mode=rank_cta")


def topk_options(kernel: Optional[str]):
    """Plan options of a TOPK_KERNELS entry: 'net net_pivot=on' -> kernel=net, net_pivot=on."""
    if kernel is None:
        return None
    name, *rest = kernel.split()
    return dict(kernel=name, **dict(kv.split("=") for kv in rest))


def run_topk(c: TopkCase, scores: torch.Tensor, nvp, device, fill=-7,
             kernel: Optional[str] = None) -> torch.Tensor:
    out = torch.full((c.S, c.H, c.topk), fill, dtype=torch.int32, device=device)
    res = msa_ops._topk_select_planned(scores.to(device), c.topk, _to(nvp, device), output=out,
                                       force_begin_blocks=c.fb, force_end_blocks=c.fe,
                                       options=topk_options(kernel))
    assert res.data_ptr() == out.data_ptr()
    return out


def assert_topk_equal(got: torch.Tensor, want: torch.Tensor, what: str):
    mismatch = (got != want).any(-1).nonzero()
    assert mismatch.numel() == 0, (
        f"{what}: {mismatch.shape[0]} rows differ; first (token, head) "
        f"{mismatch[0].tolist()}: got {got[tuple(mismatch[0])].tolist()}, "
        f"want {want[tuple(mismatch[0])].tolist()}")


@pytest.mark.parametrize("case", TOPK_CASES, ids=str)
def test_topk_matches_reference(case: TopkCase):
    scores = make_scores(case)
    nvp = make_nvp(case)
    want = run_topk(case, scores, nvp, "cpu")
    scores_dev = scores.to(DEV)
    for kernel in TOPK_KERNELS:
        got = run_topk(case, scores_dev, nvp, DEV, kernel=kernel).cpu()
        assert_topk_equal(got, want, f"{case.name} [{kernel}]")


def test_topk_shared_memory_opt_in_never_shrinks():
    """Launches of alternating shared-memory size in one process: P > 256 (two score buffers, about
    85 KB), P <= 256 (one buffer, about 51 KB), P > 256 again; for the radix kernel the size follows
    topk - force_begin - force_end. A kernel's opt-in once followed the last size set, and the third
    launch failed with "invalid argument"."""
    for kernel in TOPK_KERNELS:
        for P, topk in ((1000, 16), (100, 64), (1000, 8), (257, 64), (64, 2), (513, 33)):
            case = TopkCase(f"alternate_p{P}_k{topk}", 2, P, 40, topk=topk, nvp="random", fe=1,
                            seed=P)
            scores, nvp = make_scores(case), make_nvp(case)
            want = run_topk(case, scores, nvp, "cpu")
            got = run_topk(case, scores, nvp, DEV, kernel=kernel).cpu()
            assert torch.equal(got, want), f"{case.name} [{kernel}]"


@pytest.mark.parametrize("kernel", TOPK_KERNELS)
@pytest.mark.parametrize("case", [
    TopkCase("det_single_chunk", 4, 256, 4096, nvp="random", fe=1, scores="ties"),
    TopkCase("det_multi_chunk", 2, 3000, 100, topk=64, scores="few", fb=1, fe=1),
], ids=str)
def test_topk_deterministic(case: TopkCase, kernel: str):
    scores = make_scores(case).to(DEV)
    nvp = _to(make_nvp(case), DEV)
    a = run_topk(case, scores, nvp, DEV, fill=0, kernel=kernel)
    b = run_topk(case, scores, nvp, DEV, fill=1, kernel=kernel)
    assert torch.equal(a, b)


def _fuzz_scores(rng: random.Random, gen: torch.Generator, H: int, P: int, S: int,
                 misaligned: bool) -> torch.Tensor:
    """A base distribution with planted special values: exact ties (few distinct values or
    FlashInfer's 1 + U * 2^-13), +-NaN with varied payloads, +-inf, +-0, whole -inf rows and
    whole -inf blocks. `misaligned`: the tensor starts 4 bytes past a 16-byte boundary."""
    shape = (H, P, S)
    base = rng.choice(("randn", "few", "ties", "wide"))
    if base == "randn":
        x = torch.randn(shape, generator=gen)
    elif base == "few":
        x = torch.randint(-2, 3, shape, generator=gen).float()
    elif base == "ties":
        x = 1 + torch.randint(0, 8, shape, generator=gen).float() * 2.0**-13
    else:  # every exponent: keys spread over all radix digits
        x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-120, 120, shape,
                                                                          generator=gen).float())
    r = torch.rand(shape, generator=gen)
    planted = rng.uniform(0.0, 0.4)  # fraction of special values
    specials = (float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0)
    for i, v in enumerate(specials):
        lo, hi = planted * i / len(specials), planted * (i + 1) / len(specials)
        x[(r >= lo) & (r < hi)] = v
    bits = x.view(torch.int32)
    nan = torch.isnan(x)
    payload = torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32)
    if rng.random() < 0.5:  # varied payloads (distinct keys), else only the canonical ones
        bits[nan] = bits[nan] | payload[nan]
    if S > 1 and rng.random() < 0.5:
        x[:, :, rng.randrange(S)] = -float("inf")  # a token whose every score is -inf
    if P > 1 and rng.random() < 0.5:
        x[:, rng.randrange(P), :] = -float("inf")  # a block -inf for every token
    if misaligned:
        flat = torch.empty(x.numel() + 1)
        flat[1:] = x.reshape(-1)
        x = flat[1:].view(shape)
    return x


@pytest.mark.parametrize("seed", range(24))
def test_topk_fuzz_all_kernels(seed: int):
    """Fresh random problems: P from 1 to 1500 (one chunk and many, for both chunk sizes), S not
    a multiple of 4 or 32, topk 1..64 with random forced blocks, nvp None / scalar / per token
    (clamped values included), special values planted; every kernel equals the C++ reference bit
    for bit, and every element of a poisoned output is written."""
    rng = random.Random(1000 + seed)
    gen = torch.Generator().manual_seed(2000 + seed)
    H = rng.choice((1, 2, 3, 4))
    P = rng.choice((1, 2, 7, 63, 64, 65, 200, 256, 257, 700, 1500, rng.randrange(1, 1500)))
    S = rng.choice((1, 5, 31, 33, 64, 96, 130, rng.randrange(1, 300)))
    topk = rng.choice((1, 2, 15, 16, 17, 33, 63, 64, rng.randrange(1, 65)))
    fb = rng.randrange(0, topk + 1) if rng.random() < 0.5 else 0
    fe = rng.randrange(0, topk - fb + 1) if rng.random() < 0.6 else 0
    form = rng.choice(("none", "scalar", "random", "clamp", "causal"))
    if form in ("none", "scalar") and fb + fe > P:  # a host-side nvp must leave room for them
        form = "random"
    if form == "none":
        nvp = None
    elif form == "scalar":
        nvp = rng.randrange(max(1, fb + fe), P + 1)
    else:
        nvp = form
    misaligned = S % 4 == 0 and rng.random() < 0.3
    scores = _fuzz_scores(rng, gen, H, P, S, misaligned)
    case = TopkCase(f"fuzz{seed}", H, P, S, topk=topk, nvp=nvp, fb=fb, fe=fe, seed=seed)
    nvp_t = make_nvp(case)
    want = run_topk(case, scores, nvp_t, "cpu")
    scores_dev = scores.to(DEV)
    if misaligned:  # keep the 4-byte offset on the device too
        flat = torch.empty(scores.numel() + 1, device=DEV)
        flat[1:] = scores_dev.reshape(-1)
        scores_dev = flat[1:].view(scores.shape)
        assert scores_dev.data_ptr() % 16 != 0
    what = f"fuzz{seed} H{H} P{P} S{S} topk{topk} fb{fb} fe{fe} nvp={form}"
    for kernel in TOPK_KERNELS:
        for fill in (-7, 2**31 - 1):
            got = run_topk(case, scores_dev, nvp_t, DEV, fill=fill, kernel=kernel).cpu()
            assert_topk_equal(got, want, f"{what} [{kernel}] fill={fill}")


@pytest.mark.parametrize("kind", ("low_bits", "mixed", "normal"))
@pytest.mark.parametrize("S,P", [(1, 1024), (2, 700), (8, 256), (33, 300), (64, 256), (600, 300),
                                 (1100, 64), (2500, 130), (5000, 40)])
def test_topk_net_lanes_and_truncated_ties(kind: str, S: int, P: int):
    """kernel=net at every lanes-per-row count (on 132 SMs: 32, 32, 16, 16, 16, 8, 4, 2, 1 for
    the shapes above) on rows whose keys differ only in their low 10 bits (low_bits: every row's cut ties on
    the truncated keys, so the exact second pass decides), on warps mixing such rows with ordinary
    ones (mixed), and on ordinary scores; per-token ranges of different lengths in one warp, 15,
    16, 17 and 31 chosen (16 and 32 words per lane). Equals the C++ reference bit for bit, every
    element of a poisoned output written."""
    gen = torch.Generator().manual_seed(S * 7919 + P)
    H = 4
    normal = torch.randn((H, P, S), generator=gen)
    low = (torch.randint(0, 1 << 10, (H, P, S), generator=gen, dtype=torch.int32)
           + 0x3F800000).view(torch.float32)
    if kind == "low_bits":
        scores = low
    elif kind == "mixed":
        pick = torch.rand((1, 1, S), generator=gen) < 0.5
        scores = torch.where(pick, low, normal)
    else:
        scores = normal
    for topk, fb, fe in ((16, 0, 1), (16, 1, 0), (17, 0, 0), (32, 0, 1)):
        case = TopkCase(f"net_{kind}_S{S}_P{P}_k{topk}", H, P, S, topk=topk, nvp="random", fb=fb,
                        fe=fe, seed=topk + S)
        nvp = make_nvp(case)
        want = run_topk(case, scores, nvp, "cpu")
        for fill in (-7, 2**31 - 1):
            for kernel in ("net net_pivot=off", "net"):  # the networks; auto's pivot where it applies
                got = run_topk(case, scores.to(DEV), nvp, DEV, fill=fill, kernel=kernel).cpu()
                assert_topk_equal(got, want, f"{case.name} [{kernel}] fill={fill}")


PIVOT_MODES = ("sort", "rank_cta")


@pytest.mark.parametrize("mode", PIVOT_MODES)
@pytest.mark.parametrize("dist", ("normal", "few", "equal", "low_bits", "neg_nan_payloads",
                                  "ascending", "descending", "specials"))
@pytest.mark.parametrize("S,P", [(1, 1024), (1, 1000), (2, 700), (4, 513), (3, 512), (8, 256),
                                 (64, 256), (33, 300), (5, 40), (7, 17)])
def test_topk_net_pivot(dist: str, S: int, P: int, mode: str):
    """net_pivot=on (8 / 16 / 32 scores a lane) in each form (net_pivot_mode: a warp a row with
    bitonic sorts, a CTA of 4 warps a row counting) on rows that take the pivot
    path (normal, low_bits, specials: at most 32 keys at or below the pivot), rows where keys
    tie at the pivot (few: 5 distinct values, some survive with equal keys and the block decides),
    and rows that fall back to the networks (equal, ascending / descending runs, full-payload
    negative NaNs whose order keys reach 0xFFFFFFFF, the value of an empty slot); per-token nvp,
    1..15 chosen. Equals the C++ reference bit for bit, every element of a poisoned output
    written."""
    gen = torch.Generator().manual_seed(S * 131 + P)
    H = 4
    shape = (H, P, S)
    if dist == "normal":
        scores = torch.randn(shape, generator=gen)
    elif dist == "few":
        scores = torch.randint(0, 5, shape, generator=gen).float()
    elif dist == "equal":
        scores = torch.full(shape, -1.5)
    elif dist == "low_bits":
        scores = (torch.randint(0, 1 << 10, shape, generator=gen, dtype=torch.int32)
                  + 0x3F800000).view(torch.float32)
    elif dist == "neg_nan_payloads":
        scores = (torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32)
                  | -(1 << 22)).view(torch.float32)
    elif dist == "specials":
        scores = torch.randn(shape, generator=gen)
        pick = torch.randint(0, 12, shape, generator=gen)
        for code, value in ((0, float("nan")), (1, float("inf")), (2, float("-inf")), (3, 0.0),
                            (4, -0.0), (5, -float("nan"))):
            scores = torch.where(pick == code, torch.tensor(value), scores)
    else:
        scores = torch.sort(torch.randn(shape, generator=gen), dim=1,
                            descending=dist == "descending").values
    for topk, fb, fe in ((16, 0, 1), (16, 1, 1), (15, 0, 0), (8, 0, 2), (1, 0, 0)):
        # Whole rows for the M3 shape (sink and local block forced), random per-token nvp else.
        case = TopkCase(f"pivot_{dist}_S{S}_P{P}_k{topk}", H, P, S, topk=topk,
                        nvp=None if (fb, fe) == (1, 1) else "random", fb=fb, fe=fe, seed=topk + S)
        nvp = make_nvp(case)
        want = run_topk(case, scores, nvp, "cpu")
        for fill in (-7, 2**31 - 1):
            got = run_topk(case, scores.to(DEV), nvp, DEV, fill=fill,
                           kernel=f"net net_pivot=on net_pivot_mode={mode}").cpu()
            assert_topk_equal(got, want, f"{case.name} [{mode}] fill={fill}")


@pytest.mark.parametrize("S,P", [(1, 1024), (64, 256), (2000, 70), (5, 3000)])
def test_topk_head_major_output_every_kernel(S: int, P: int):
    """output=q2k.transpose(0, 1) (the attention ops' head-major layout written directly) under
    every kernel: q2k equals the reference's token-major output transposed, every element of the
    poisoned q2k written."""
    gen = torch.Generator().manual_seed(S + P)
    H = 4
    scores = torch.randn((H, P, S), generator=gen)
    case = TopkCase(f"head_major_S{S}_P{P}", H, P, S, nvp="random", fe=1, seed=S)
    nvp = make_nvp(case)
    want = run_topk(case, scores, nvp, "cpu").transpose(0, 1)
    for kernel in TOPK_KERNELS:
        q2k = torch.full((H, S, 16), -7, dtype=torch.int32, device=DEV)
        msa_ops._topk_select_planned(scores.to(DEV), 16, _to(nvp, DEV), output=q2k.transpose(0, 1),
                                     force_end_blocks=1, options=topk_options(kernel))
        assert_topk_equal(q2k.cpu(), want, f"{case.name} [{kernel}] head-major")


def _carry_scores(dist: str, H: int, P: int, S: int, gen: torch.Generator) -> torch.Tensor:
    shape = (H, P, S)
    if dist == "neg_nan_payloads":  # order keys 0xFFC00000..0xFFFFFFFF: the top of the key range
        bits = torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32) | -(1 << 22)
        return bits.view(torch.float32)
    if dist == "equal":  # one key: every radix digit ties, the block order decides
        return torch.full(shape, 0.25)
    if dist == "around_two":  # keys on both sides of 0x40000000 (2.0), a few ulps apart
        return 2.0 + (torch.randint(-40, 40, shape, generator=gen).float() * 2.0**-22)
    if dist == "wide_exponents":  # a row's best keys many exponents apart: the last bin's keys
        return torch.randn(shape, generator=gen) * torch.exp2(
            torch.randint(-120, 120, shape, generator=gen).float())
    x = torch.randn(shape, generator=gen)
    order = torch.sort(x, dim=1, descending=dist == "descending").values
    return order  # ascending: every chunk beats the carry; descending: none does


@pytest.mark.parametrize("dist", ("neg_nan_payloads", "equal", "around_two", "wide_exponents",
                                  "ascending", "descending"))
def test_topk_full_carry_key_ranges(dist: str):
    """Rows of several 64-block chunks whose keys stress radix_1buf's (the lean kernel's) radix
    select, which starts at the keys' range [min, max] with bins at most one float exponent wide
    (the last taking every key above) instead of the top digit: keys at the very top of the key
    range, all equal, straddling 0x40000000, spread over 240 exponents, and sorted rows (a radix
    select per chunk, or no survivors at all); topk 1..64 with forced blocks, per-token nvp.
    Every kernel equals the C++ reference."""
    gen = torch.Generator().manual_seed(77)
    H, P, S = 2, 300, 45
    scores = _carry_scores(dist, H, P, S, gen)
    for topk, fb, fe in ((1, 0, 0), (2, 0, 1), (16, 0, 1), (17, 2, 1), (64, 1, 1)):
        case = TopkCase(f"carry_{dist}_k{topk}", H, P, S, topk=topk, nvp="random", fb=fb, fe=fe,
                        seed=topk)
        nvp = make_nvp(case)
        want = run_topk(case, scores, nvp, "cpu")
        for kernel in TOPK_KERNELS:
            got = run_topk(case, scores.to(DEV), nvp, DEV, kernel=kernel).cpu()
            assert_topk_equal(got, want, f"{case.name} [{kernel}]")


@pytest.mark.parametrize("dist", ("neg_nan_payloads", "top_bin", "equal", "around_two",
                                  "wide_exponents", "ascending", "descending"))
@pytest.mark.parametrize("P", (256, 97))
def test_topk_one_chunk_key_ranges(dist: str, P: int):
    """Rows of one chunk (P <= 256: warp_digits' one-warp CTAs and its 8-bit digit threshold) with
    the keys of test_topk_full_carry_key_ranges, and top_bin: keys 0xFFFFFFF0..0xFFFFFFFF only
    (negative NaNs; the largest equals the empty-slot key: the digit search's early exit must not
    end a bin there, and its last pass ties at 0xFFFFFFFF), all equal
    (every pass keeps the whole row, ties by block), a few ulps around 0x40000000, 240 exponents,
    sorted rows; topk 1..64 with forced blocks, per-token nvp. Equals the C++ reference."""
    gen = torch.Generator().manual_seed(78)
    H, S = 2, 45
    if dist == "top_bin":
        bits = torch.randint(-16, 0, (H, P, S), generator=gen, dtype=torch.int32)
        scores = bits.view(torch.float32)
    else:
        scores = _carry_scores(dist, H, P, S, gen)
    for topk, fb, fe in ((1, 0, 0), (2, 0, 1), (16, 0, 1), (17, 2, 1), (64, 1, 1)):
        case = TopkCase(f"one_chunk_{dist}_P{P}_k{topk}", H, P, S, topk=topk, nvp="random", fb=fb,
                        fe=fe, seed=topk)
        nvp = make_nvp(case)
        want = run_topk(case, scores, nvp, "cpu")
        for kernel in ("warp_digits", "warp_split", "by_size", "net"):
            got = run_topk(case, scores.to(DEV), nvp, DEV, kernel=kernel).cpu()
            assert_topk_equal(got, want, f"{case.name} [{kernel}]")


def test_pipeline_proxy_then_topk_matches_reference():
    """Stage 1 -> stage 2 on M3 shapes with vLLM's per-token nvp and local block. The proxy is
    checked against the reference within its tolerance; the top-k then runs on the GPU's own scores
    on both devices (the proxy's fp32 rounding may legitimately reorder blocks that are closer than
    that tolerance, which must not count as a top-k failure)."""
    case = ProxyCase("m3_pipeline", [1500, 1, 1], [1500, 3000, 700], hq=4, hkv=1, paged=True)
    inputs = make_proxy_inputs(case, seed=21)
    scores = run_proxy(case, inputs, DEV)
    assert_proxy_close(scores, run_proxy(case, inputs, "cpu"), case.name)
    total_q = scores.shape[-1]
    nvp = torch.empty(total_q, dtype=torch.int32)
    cu = inputs["cu_seqlens_q"].tolist()
    for b, sk in enumerate(case.seqs_k):
        sq = cu[b + 1] - cu[b]
        pos = torch.arange(sq) + (sk - sq)
        nvp[cu[b]:cu[b + 1]] = (pos // BLK + 1).to(torch.int32)
    tk = TopkCase("m3_pipeline_topk", 4, scores.shape[1], total_q, nvp=None, fe=1)
    got = run_topk(tk, scores, nvp, DEV).cpu()
    want = run_topk(tk, scores.cpu(), nvp, "cpu")
    assert torch.equal(got, want)


def _long_row_scores(dist: str, H: int, P: int, S: int, gen: torch.Generator) -> torch.Tensor:
    shape = (H, P, S)
    if dist == "equal":  # one key: the block order alone decides, across every slice
        return torch.full(shape, 0.25)
    x = torch.randn(shape, generator=gen)
    if dist == "specials_spread":  # +-NaN (payloads), +-inf, +-0 every few blocks, in every slice
        blk = torch.arange(P)[None, :, None].expand(shape)
        kind = (blk * 7 + torch.arange(S)[None, None, :]) % 13
        x[kind == 0] = float("nan")
        x[kind == 1] = -float("nan")
        x[kind == 2] = float("inf")
        x[kind == 3] = -float("inf")
        x[kind == 4] = 0.0
        x[kind == 5] = -0.0
        bits = x.view(torch.int32)
        nan = torch.isnan(x)
        payload = torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32)
        bits[nan] = bits[nan] | payload[nan]
    elif dist == "ties":  # 1 + U * 2^-13: many exact ties spread over the slices
        x = 1 + torch.randint(0, 8, shape, generator=gen).float() * 2.0**-13
    elif dist in ("ascending", "descending"):  # the best blocks all in the last / first slice
        x = torch.sort(x, dim=1, descending=dist == "descending").values
    return x.contiguous()


@pytest.mark.parametrize("P", (1024, 4096, 16384))
@pytest.mark.parametrize("topk", (1, 16, 64))
def test_topk_long_rows_few_tokens(P: int, topk: int):
    """Decode-sized calls with long rows (batch 1 at 128K to 2M context): 4 tokens x 2 heads, P up
    to 16384 (warp_split splits such a row over 8 warps, several chunks each, and merges their
    choices); per-token nvp with the causal -inf tail beyond it (a full row, a row ending inside a
    slice, one chunk and a single block) or none; all-equal keys, ties, NaN / inf / -0 spread across
    the slices, sorted rows; forced blocks at both ends. Every kernel equals the C++ reference."""
    gen = torch.Generator().manual_seed(P * 100 + topk)
    H, S = 2, 4
    nvp_tok = torch.tensor([P, P // 2 + 37, 257, 1], dtype=torch.int32)
    fb2 = min(2, topk // 2)
    forced = sorted({(0, 0), (0, min(1, topk)), (fb2, min(1, topk - fb2))})
    for dist in ("randn", "equal", "ties", "specials_spread", "ascending", "descending"):
        scores = _long_row_scores(dist, H, P, S, gen)
        causal = scores.clone()
        causal[:, torch.arange(P)[:, None] >= nvp_tok[None, :]] = -float("inf")
        for fb, fe in forced:
            for nvp, x in ((None, scores), (nvp_tok, causal)):
                case = TopkCase(f"long_{dist}_p{P}_k{topk}_fb{fb}_fe{fe}_"
                                f"{'tok' if nvp is not None else 'none'}", H, P, S, topk=topk,
                                fb=fb, fe=fe)
                want = run_topk(case, x, nvp, "cpu")
                x_dev = x.to(DEV)
                for kernel in TOPK_KERNELS:
                    got = run_topk(case, x_dev, nvp, DEV, kernel=kernel).cpu()
                    assert_topk_equal(got, want, f"{case.name} [{kernel}]")

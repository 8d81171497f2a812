"""msa_sparse_decode_attention on the GPU against the same op on the same data as CPU tensors (the
exact C++ reference), with the same-precision baseline tolerances of test_gpu_sparse_attention.py:
every q dtype (fp8 q computes in bf16), K/V bf16 / fp16 / fp8 / NVFP4, paged (permuted pages,
partial last page, invalid page ids, empty sequences) / flat / packed, seqlen_q 1 / 2 / 4, GQA
groups 1 / 3 / 4 / 16, topk 1..64, index-list edge cases, q_offset, global scales; the fused and the
split-K + combine paths (force_fused) with every partial dtype; determinism; a large batch
(>= 64K rows, total_q * Hq > 2^24). The same checks with each decode kernel forced
(plan option kernel=regs / smem) on poisoned outputs and workspaces, the register kernel
against the shared-memory one, and q rows of very different magnitudes (the register kernel's
per-row power-of-two scaling into fp16); MTP union items (plan option mtp=union) the same way,
with shared, partly shared and per-token selections, against per-token items; MTP union items with
fp8 / NVFP4 K/V converted in registers (plan options kernel=regs, mtp=union) against the reference
and the shared-memory union kernel, and the plan description naming that path; the split CTAs of
a row as one thread-block cluster merging through distributed shared memory (plan option
split=cluster, sm_90) against the reference and bit for bit against the combine kernel; split-K
with 8 warps per CTA (plan option split_warps=8) against the reference and the 4-warp kernel.

A case's inputs, CPU reference and baseline are memoised per xdist worker (``problem`` /
``reference``, conftest.Memo): the parametrisations of one case over options, kernels, fused /
split and partial dtypes (the last, fastest-varying parameter) build and compute them once; the
build of the large M3 inputs costs far more than the kernels.

Skipped (not passed) without a CUDA device or without a CUDA build.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import List, Optional

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashmsa  # noqa: E402
from conftest import Memo  # noqa: E402
from flashmsa import msa_ops  # noqa: E402
from flashmsa.testing import cases, nvfp4  # noqa: E402

from flashmsa.testing import reference as ref  # noqa: E402

if not flashmsa.built_with_cuda():
    pytest.skip("flashmsa was built without CUDA kernels", allow_module_level=True)

from test_gpu_sparse_attention import (  # noqa: E402
    BF16, DEV, FP8, FP16, GpuCase, Problem, baseline, bits_equal, build, check_empty_rows,
    check_lse, check_output)


DecodeCase = cases.DecodeCase
CASES = cases.cases(cases.DECODE, "gpu")


def seqlens_of(case: DecodeCase, rng: np.random.Generator) -> List[int]:
    if isinstance(case.seqlens, list):
        return list(case.seqlens)
    if case.seqlens == "multiples":  # multiples of 128 in [256, 1920], docs/semantics.md#accuracy
        return [int(x) * 128 for x in rng.integers(2, 16, case.batch)]
    # ragged: anything in [1, 4000], partial last pages
    return [int(x) for x in rng.integers(1, 4000, case.batch)]


def compute_dtype(case: DecodeCase) -> torch.dtype:
    return BF16 if case.q_dtype == FP8 else case.q_dtype


@dataclasses.dataclass
class DecodeProblem:
    gcase: GpuCase
    pb: Problem
    cpu_args: tuple
    cpu_kwargs: dict
    gpu_args: tuple
    gpu_kwargs: dict


def build_decode(case: DecodeCase, seed: int = 0, layout: Optional[str] = None) -> DecodeProblem:
    """The decode problem as a prefill problem with uniform seqlen_q (same inputs, same baseline),
    then re-expressed in msa_sparse_decode_attention's arguments."""
    rng = np.random.default_rng(seed + 1000)
    lens = seqlens_of(case, rng)
    gcase = GpuCase(case.name, [case.seqlen_q] * case.batch, lens, case.hq, case.hkv,
                    topk=case.topk, causal=case.causal, dtype=compute_dtype(case), kv=case.kv,
                    layout=layout or case.layout, selection=case.selection,
                    q_offset=case.q_offset, softmax_scale=case.softmax_scale,
                    v_global_scale=case.v_global_scale, invalid_pages=case.invalid_pages)
    pb = build(gcase, seed=seed)

    q8 = pb.q.to(FP8) if case.q_dtype == FP8 else None  # rounded once, on the CPU

    def decode_args(args, kwargs, device):
        q, k, v, q2k, _cu_q = args
        kw = {name: val for name, val in kwargs.items() if name != "return_softmax_lse"}
        kw.update(seqlen_q=case.seqlen_q, return_softmax_lse=True)
        if q8 is not None:
            q = q8.to(device)
        return (q, k, v, q2k), kw

    cpu_args, cpu_kw = decode_args(pb.cpu_args, pb.cpu_kwargs, "cpu")
    gpu_args, gpu_kw = decode_args(pb.gpu_args, pb.gpu_kwargs, DEV)
    if q8 is not None:
        pb.q = q8.to(BF16)  # what the kernels compute with (exact upconversion)
    return DecodeProblem(gcase, pb, cpu_args, cpu_kw, gpu_args, gpu_kw)


_PROBLEMS = Memo(size=4)
_REFERENCES = Memo(size=2)


def problem(case: DecodeCase, seed: int = 0, layout: Optional[str] = None) -> DecodeProblem:
    """build_decode(case, seed, layout), memoised (read only)."""
    return _PROBLEMS((repr(case), seed, layout),
                     lambda: build_decode(case, seed=seed, layout=layout))


def reference(case: DecodeCase, seed: int = 0):
    """(problem, CPU result, baseline output) of build_decode(case, seed), memoised (read only)."""
    def make():
        dp = problem(case, seed)
        base_out, _ = baseline(dp.gcase, dp.pb, dp.pb.cpu_args[3])
        return dp, run(dp, gpu=False), base_out
    return _REFERENCES((repr(case), seed), make)


def run(dp: DecodeProblem, gpu: bool, options=None, **extra):
    """options: plan options of the CUDA call (None: the library's own choice)."""
    if gpu:
        if options is not None:
            result = msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs, **extra,
                                                    options=options)
        else:
            result = msa_ops.msa_sparse_decode_attention(*dp.gpu_args, **dp.gpu_kwargs, **extra)
        torch.cuda.synchronize()
        return result
    return msa_ops.msa_sparse_decode_attention(*dp.cpu_args, **dp.cpu_kwargs)


def max_abs_value(dp: DecodeProblem) -> float:
    return max([float(v.abs().max()) for v in dp.pb.values if v.numel()] + [0.0]) * dp.pb.out_scale


def check_against_reference(dp: DecodeProblem, got, want, base_out, what: str,
                            partial_dtype: Optional[torch.dtype] = None):
    out, lse = got
    assert out.dtype == compute_dtype_of(dp) and out.shape == dp.gpu_args[0].shape
    # fp8 partials keep 3 mantissa bits of each split's normalized output: up to 2^-4 of the
    # largest |V| on top of the baseline bound; bf16 partials of an fp16 output 8 bits, up to 2^-9
    # (half an ulp; the baseline bound is the fp16 output's).
    extra = 0.0
    if partial_dtype == FP8:
        extra = 2.0 ** -4 * max_abs_value(dp)
    elif partial_dtype == BF16 and compute_dtype_of(dp) == FP16:
        extra = 2.0 ** -9 * max_abs_value(dp)
    check_output(out, want[0], base_out, f"{what} out", extra_tol=extra)
    check_lse(lse, want[1], f"{what} lse")
    check_empty_rows(out, want[1], what)


def compute_dtype_of(dp: DecodeProblem) -> torch.dtype:
    return dp.gcase.dtype


# auto (the library's choice: regs for fp8 K/V, the 8-warp kernel where a split holds one block,
# union items for MTP where they pay) and the kernels auto replaced,
# forced (the smem kernel with an item per token), which stay the fallback; and split=cluster (the
# split calls' CTAs of a row as one cluster on sm_90; elsewhere, fused calls and MTP union items as
# auto); split_warps=4 (the split calls' 16-bit K/V on 4 warps per CTA instead of auto's 8); and
# split_rule=ceil (another split count where the call splits than auto's waves).
@pytest.mark.parametrize("options", [None, dict(kernel="smem", mtp="per_token"), dict(split="cluster"),
                                     dict(split_warps=4), dict(split_rule="ceil")],
                         ids=["auto", "smem_per_token", "split_cluster", "split_warps4", "split_rule_ceil"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode_matches_cpu_reference(case, options):
    dp, want, base_out = reference(case)
    got = run(dp, gpu=True, options=options)
    check_against_reference(dp, got, want, base_out, str(case))


# Split-K decode whose combine loads the partial values with the LSEs (plan option
# combine_loads=with) beside after (the values once the weights are known), over every decode
# kernel that writes partials: the same arithmetic, so bit for bit the same outputs and LSEs.
# (other plan options, partial dtype)
COMBINE_LOADS_VARIANTS = [(dict(), None), (dict(), torch.float32), (dict(), FP8),
                          (dict(kernel="regs"), None), (dict(kernel="smem", mtp="per_token"), None),
                          (dict(split_warps=4), None), (dict(kernel="wgmma"), BF16)]


@pytest.mark.parametrize("extra,partial_dtype", COMBINE_LOADS_VARIANTS, ids=lambda v: (
    ",".join(f"{k}={o}" for k, o in v.items()) or "auto") if isinstance(v, dict) else str(v))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_combine_loads_with_is_bit_identical(case, extra, partial_dtype):
    dp, want, base_out = reference(case)
    kw = dict(force_fused=False, partial_dtype=partial_dtype)
    with_ = run(dp, gpu=True, options=dict(extra, combine_loads="with"), **kw)
    after = run(dp, gpu=True, options=dict(extra, combine_loads="after"), **kw)
    check_against_reference(dp, with_, want, base_out, f"{case} {extra} combine_loads=with",
                            partial_dtype=partial_dtype)
    assert bits_equal(with_, after), f"{case} {extra}: combine_loads=with differs from after"


FUSED_CASES = [c for c in CASES if c.name in (
    "spec_8_1_8_2_bf16_flat", "spec_4_2_16_2_bf16_paged", "spec_16_1_4_4_topk8_fp8",
    "spec_6_1_16_1_fp8", "nvfp4_flat_mtp", "g3_topk33", "g16_topk64_mtp4",
    "empty_and_tiny_sequences", "fp8_q_fp8_kv", "invalid_pages")]


@pytest.mark.parametrize("case", FUSED_CASES, ids=str)
def test_fused_and_split_paths(case):
    """force_fused=True (one CTA per token and kv head, no combine) and False (split-K + combine):
    both against the reference, and within 5e-3 of each other with the same -inf pattern."""
    dp, want, base_out = reference(case)
    fused = run(dp, gpu=True, force_fused=True)
    split = run(dp, gpu=True, force_fused=False)
    check_against_reference(dp, fused, want, base_out, f"{case} fused")
    check_against_reference(dp, split, want, base_out, f"{case} split")
    diff = float((fused[0].double() - split[0].double()).abs().max())
    assert diff < 5e-3, f"fused vs split: max |diff| {diff:.3e}"
    assert torch.equal(torch.isinf(fused[1]), torch.isinf(split[1]))


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "fp16_fp8kv_mtp4", "m3_tp4_mtp2", "g3_topk33")], ids=str)
def test_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case)
    got = run(dp, gpu=True, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} partial {partial_dtype}",
                            partial_dtype=partial_dtype)


def build_wide_v(v_kind: str, offset: float, seqlen_q: int = 2, seed: int = 21) -> DecodeProblem:
    """A flat decode problem whose V averages stay near +-offset: V rows are ``offset * (sign +
    0.1 randn)`` with a random sign per (kv head, dim), so every split's normalized output (the
    split-K partial) is as large as V. v_kind "nvfp4": NVFP4 K and V of that shape (``offset``
    unused), every block's amax near the global one: block scales of about 290..448 (e4m3's
    largest), V up to 6 x 448 and about 1800 on average before its global scale; "bf16" /
    "fp16": 16-bit K/V and q of that dtype."""
    batch, hq, hkv, topk, lens = 3, 16, 2, 32, [4096, 2500, 4096]
    cdt = FP16 if v_kind == "fp16" else BF16
    gen = torch.Generator().manual_seed(seed)
    total_k = sum(lens)
    q = (torch.randn(batch * seqlen_q, hq, 128, generator=gen) / 3).to(cdt)
    k = torch.randn(total_k, hkv, 128, generator=gen) / 3
    k_sign = torch.randint(0, 2, (1, hkv, 128), generator=gen).float() * 2 - 1
    v_sign = torch.randint(0, 2, (1, hkv, 128), generator=gen).float() * 2 - 1
    v = (v_sign + 0.1 * torch.randn(total_k, hkv, 128, generator=gen)) * offset
    kw = dict(cu_seqlens_k=ref.cu_seqlens(lens), seqlen_q=seqlen_q, return_softmax_lse=True)
    scale, out_scale = 128 ** -0.5, 1.0
    if v_kind == "nvfp4":
        k = (k_sign + 0.1 * torch.randn(total_k, hkv, 128, generator=gen)) / 3
        v = v / offset
        k_st, ks, kgs = nvfp4.quantize_nvfp4(k)
        v_st, vs, vgs = nvfp4.quantize_nvfp4(v)
        k_deq, v_deq = nvfp4.dequantize_nvfp4(k_st, ks), nvfp4.dequantize_nvfp4(v_st, vs)
        kw.update(k_scale=ks, v_scale=vs, k_global_scale=kgs, v_global_scale=vgs)
        scale, out_scale = scale * kgs, vgs
    else:
        k_st, v_st = k.to(cdt), v.to(cdt)
        k_deq, v_deq = k_st.float(), v_st.float()
    # every token selects topk distinct blocks of its sequence, all visible (causal, at the end)
    rng = np.random.default_rng(seed)
    q2k = torch.full((hkv, batch * seqlen_q, topk), -1, dtype=torch.int32)
    for b, sk in enumerate(lens):
        nb = math.ceil(sk / 128)
        for r in range(b * seqlen_q, (b + 1) * seqlen_q):
            for h in range(hkv):
                ids = rng.permutation(nb)[:topk]
                q2k[h, r, :len(ids)] = torch.from_numpy(ids.astype(np.int32))
    cpu_args = (q, k_st, v_st, q2k)
    gpu_args = tuple(t.to(DEV) for t in cpu_args)
    gpu_kw = {n: t.to(DEV) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    gcase = GpuCase(f"wide_v_{v_kind}", [seqlen_q] * batch, lens, hq, hkv, topk=topk,
                    causal=True, dtype=cdt, kv="nvfp4" if v_kind == "nvfp4" else "same")
    loc = dict(cu_seqlens_k=kw["cu_seqlens_k"])
    pb = Problem(cpu_args, kw, gpu_args, gpu_kw, q, ref.sequences(k_deq, **loc),
                 ref.sequences(v_deq, **loc), [set() for _ in lens], scale, out_scale)
    return DecodeProblem(gcase, pb, cpu_args, kw, gpu_args, gpu_kw)


# Regression (the GPU fuzzer's decode:1000144, fixed at 57ea360): split-K partials stored in a
# partial_dtype that cannot hold V's range saturate (fp8 e4m3: |x| <= 448, SATFINITE) or overflow
# (fp16). Here every split's output is near +-1800 (NVFP4 V read before its global scale), +-2000
# (16-bit V) or +-1e6 (bf16 V): such a partial_dtype must give way to the compute dtype
# (docs/semantics.md#decode), so the result meets the plain tolerance, with no fp8 allowance.
# Before 57ea360 the fp8 partials clamped every output to +-448 (times the V scale): off by a
# factor 4-5, far outside it.
@pytest.mark.parametrize("options", [None, dict(kernel="smem", mtp="per_token")],
                         ids=["auto", "smem_per_token"])
@pytest.mark.parametrize("v_kind,offset,partial_dtype", [
    ("nvfp4", 1.0, FP8), ("bf16", 2000.0, FP8), ("fp16", 2000.0, FP8), ("bf16", 1e6, FP16)],
    ids=["nvfp4-fp8_partials", "bf16-fp8_partials", "fp16-fp8_partials", "bf16_1e6-fp16_partials"])
def test_partial_dtype_that_cannot_hold_v_gives_way(v_kind, offset, partial_dtype, options):
    def make():  # memoised: the two plans of a problem share it
        dp = build_wide_v(v_kind, offset)
        base_out, _ = baseline(dp.gcase, dp.pb, dp.pb.cpu_args[3])
        return dp, run(dp, gpu=False), base_out
    dp, want, base_out = _REFERENCES(("wide_v", v_kind, offset), make)
    # the outputs (averages of V, as every split's partial) lie beyond the partial dtype
    limit = 448.0 if partial_dtype == FP8 else 65504.0
    assert float((want[0].float().abs() / dp.pb.out_scale).median()) > 2 * limit
    got = run(dp, gpu=True, options=options, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"wide V {v_kind} partial {partial_dtype}")


@pytest.mark.parametrize("force_fused", [None, True, False])
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_paged_equals_flat(kv, force_fused):
    """Same values through permuted pages (partial last pages) or a flat cache: bit-identical."""
    case = DecodeCase("c", 8, 2, 16, 2, kv=kv)
    flat = problem(case, seed=2, layout="flat")
    paged = problem(case, seed=2, layout="paged")
    assert torch.equal(flat.pb.cpu_args[3], paged.pb.cpu_args[3])
    assert bits_equal(run(flat, gpu=True, force_fused=force_fused),
                      run(paged, gpu=True, force_fused=force_fused))


@pytest.mark.parametrize("seqlen_q,options", [(1, None), (1, dict(kernel="regs")),
                                              (4, dict(mtp="union")),
                                              (4, dict(mtp="union", kernel="wgmma"))],
                         ids=["sq1", "sq1_regs", "mtp_union", "mtp_wgmma"])
@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_nhd_equals_contiguous(kv, seqlen_q, options):
    """Separate K and V caches with NHD pages, passed as (P, H, 128, W) views: bit-identical to
    the contiguous HND caches on every decode kernel, the TMA-fed MTP kernel included."""
    case = DecodeCase("c", 6, seqlen_q, 16, 2, kv=kv)
    hnd = problem(case, seed=4, layout="paged")
    nhd = problem(case, seed=4, layout="nhd")
    assert not nhd.gpu_args[1].is_contiguous()
    assert bits_equal(run(hnd, gpu=True, options=options), run(nhd, gpu=True, options=options))


# The M3 batch-64 decode shape at a 2K context: the same items, fused / split choices and combine
# as at 8K (they depend on batch x heads, not on the context), with a quarter of the 8K case's
# inputs, which the CPU builds (~1 GB per K / V tensor at 8K: over a minute per run under xdist).
M3_B64_CTX2K = dataclasses.replace(next(c for c in CASES if c.name == "m3_b64_ctx8k_fp8"),
                                   name="m3_b64_ctx2k_fp8", seqlens=[2048] * 64)


@pytest.mark.parametrize("force_fused", [None, True, False])
@pytest.mark.parametrize("case", [M3_B64_CTX2K] + [c for c in CASES if c.name in (
    "duplicates", "g16_topk64_mtp4")], ids=str)
def test_deterministic(case, force_fused):
    dp = problem(case, seed=3)
    first = run(dp, gpu=True, force_fused=force_fused)
    for _ in range(2):
        assert bits_equal(first, run(dp, gpu=True, force_fused=force_fused))


def test_workspace_object():
    dp = build_decode(CASES[0], seed=4)
    base = run(dp, gpu=True, force_fused=False)
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    assert bits_equal(base, run(dp, gpu=True, force_fused=False, workspace=ws))


@pytest.mark.parametrize("force_fused", [None, True, False])
def test_large_batch(force_fused):
    """65600 requests x 256 query heads (total_q * Hq > 2^24, >= 64K rows): 64-bit offsets and
    grid limits. Short flat sequences keep it small; a few requests at the start, middle and end
    are checked against the CPU reference run on just those requests."""
    batch, hq, hkv, klen = 65600, 256, 16, 8
    assert batch * hq > 2 ** 24
    gen = torch.Generator(device=DEV).manual_seed(5)
    q = (torch.randn(batch, hq, 128, generator=gen, device=DEV) / 3).to(BF16)
    k = (torch.randn(batch * klen, hkv, 128, generator=gen, device=DEV) / 3).to(BF16)
    v = (torch.randn(batch * klen, hkv, 128, generator=gen, device=DEV) / 3).to(BF16)
    q2k = torch.full((hkv, batch, 1), 0, dtype=torch.int32, device=DEV)
    cu_k = ref.cu_seqlens([klen] * batch, DEV)
    out, lse = msa_ops.msa_sparse_decode_attention(q, k, v, q2k, cu_seqlens_k=cu_k,
                                                   return_softmax_lse=True,
                                                   force_fused=force_fused)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and bool(torch.isfinite(lse).all())

    reqs = [0, 1, batch // 2, batch - 2, batch - 1]
    rows = torch.tensor(reqs, device=DEV)
    krows = torch.cat([torch.arange(b * klen, (b + 1) * klen) for b in reqs]).to(DEV)
    cu_sub = ref.cu_seqlens([klen] * len(reqs))
    args = (q[rows].cpu(), k[krows].cpu(), v[krows].cpu(), q2k[:, rows].contiguous().cpu())
    want = msa_ops.msa_sparse_decode_attention(*args, cu_seqlens_k=cu_sub, return_softmax_lse=True)
    sub = GpuCase("large_subset", [1] * len(reqs), [klen] * len(reqs), hq, hkv, topk=1, causal=True)
    keys = ref.sequences(args[1].float(), cu_seqlens_k=cu_sub)
    values = ref.sequences(args[2].float(), cu_seqlens_k=cu_sub)
    sub_pb = Problem(args, {}, (), {}, args[0], keys, values, [set() for _ in reqs],
                     128 ** -0.5, 1.0)
    base_out, _ = baseline(sub, sub_pb, args[3])
    check_output(out[rows], want[0], base_out, "large out")
    check_lse(lse[rows], want[1], "large lse")


# ---- the streaming decode variant (plan option kernel=regs) ---------------------------------------
# Forced through the plan options of msa_ops._sparse_decode_planned. It runs for fp8 K/V
# (converted in registers) and bf16 / fp16 K/V (3 pipeline stages) with G <= 16; NVFP4 K/V and
# larger groups run the shared-memory kernel whatever the setting (covered here too, so forcing it
# is safe everywhere). Outputs and the workspace are poisoned
# (NaN / 0xFF) before each call so that an unwritten element cannot pass.

def _fp8(name: str) -> DecodeCase:
    return dataclasses.replace(next(c for c in CASES if c.name == name), name=f"{name}_fp8kv",
                               kv="fp8")


REGS_CASES = [c for c in CASES if c.name in (
    "spec_8_1_8_2_fp8_paged", "spec_16_1_4_4_topk8_fp8", "spec_6_1_16_1_fp8", "fp16_fp8kv_mtp4",
    "fp8_q_fp8_kv", "packed_hnd_fp8")] + [
    dataclasses.replace(M3_B64_CTX2K, name="m3_b64_ctx2k_fp8_regs"),
    # M3 MTP: 4 tokens per request, each with its own selection, and with one shared selection.
    DecodeCase("m3_mtp4_distinct_fp8", 8, 4, 64, 4, kv="fp8", seqlens="ragged"),
    DecodeCase("m3_mtp4_shared_fp8", 8, 4, 64, 4, kv="fp8", seqlens="ragged",
               selection="tile_shared"),
    DecodeCase("fp16_mtp4_shared_fp8", 6, 4, 16, 1, q_dtype=FP16, kv="fp8", selection="tile_shared"),
] + [_fp8(n) for n in ("g1_topk1", "g3_topk33", "g4_topk64", "g16_topk64_mtp4",
                       "empty_and_tiny_sequences", "mtp_seqlen_gt_keys", "q_offset_tensor_negative",
                       "non_causal", "unsorted", "duplicates", "holes", "out_of_range",
                       "some_empty_rows", "invalid_pages", "scales", "packed_nhd")]

# bf16 / fp16 K/V: the same kernel with a third stage.
REGS_NATIVE_CASES = [c for c in CASES if c.name in (
    "spec_8_1_8_2_bf16_flat", "spec_4_2_16_2_bf16_paged", "m3_tp4_mtp2", "fp16", "fp8_q_bf16_kv",
    "g1_topk1", "g3_topk33", "g4_topk64", "g16_topk64_mtp4", "empty_and_tiny_sequences",
    "q_offset_tensor_negative", "non_causal", "duplicates", "holes", "out_of_range",
    "some_empty_rows", "invalid_pages", "packed_nhd", "scales")]

# NVFP4 K/V: converted in registers too (kv_regs.cuh qk_nvfp4_regs / pv_nvfp4_regs; auto since the
# H200 run at 1aad2ee).
REGS_NVFP4_CASES = [c for c in CASES if c.name in (
    "nvfp4_paged", "nvfp4_flat_mtp", "fp8_q_nvfp4_kv")] + [
    DecodeCase("m3_b8_nvfp4_regs", 8, 1, 64, 4, kv="nvfp4"),
    DecodeCase("g3_topk33_nvfp4", 5, 2, 6, 2, topk=33, kv="nvfp4")]
# Kinds the streaming variant does not take (the shared-memory kernel runs): checked as well.
REGS_FALLBACK_CASES = [
    DecodeCase("g32_fp8", 4, 2, 64, 2, kv="fp8"), DecodeCase("g32_bf16", 4, 2, 64, 2)]


def _poisoned_workspace(dp: DecodeProblem, options=None, **kw):
    """A workspace as large as the call (with these plan options) needs plus 1 MB, filled with
    0xFF bytes (NaN as f32 / bf16 / fp16 / fp8 partials and LSEs)."""
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs, workspace=ws, **kw,
                                   options=options)
    torch.cuda.synchronize()
    ws = msa_ops.MSASparseAttentionWorkspace(DEV, nbytes=ws.nbytes + (1 << 20))
    ws.buffer.fill_(0xFF)
    return ws


def _poison_allocator(dp: DecodeProblem):
    """Fills freed allocator blocks of the output sizes with NaN, so that the op's freshly
    allocated out / lse likely start as NaN rather than zeros from an earlier call."""
    q = dp.gpu_args[0]
    rows, heads = q.shape[0], q.shape[1]
    junk = [torch.full((rows, heads, 128), float("nan"), dtype=BF16, device=DEV),
            torch.full((rows, heads), float("nan"), dtype=torch.float32, device=DEV)]
    torch.cuda.synchronize()
    del junk


def run_regs(dp: DecodeProblem, kernel: str = "regs", mtp: Optional[str] = None,
             nvfp4_cvt: Optional[str] = None, **extra):
    options = dict(kernel=kernel) if mtp is None else dict(kernel=kernel, mtp=mtp)
    if nvfp4_cvt is not None:
        options["nvfp4_cvt"] = nvfp4_cvt
    return run_poisoned(dp, options, **extra)


def run_poisoned(dp: DecodeProblem, options, **extra):
    """The call with these plan options on a poisoned workspace and poisoned outputs."""
    ws = _poisoned_workspace(dp, options, **extra)
    _poison_allocator(dp)
    result = msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs, workspace=ws, **extra,
                                            options=options)
    torch.cuda.synchronize()
    return result


@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", REGS_CASES + REGS_NATIVE_CASES + REGS_NVFP4_CASES + REGS_FALLBACK_CASES,
                         ids=str)
def test_regs_kernel_matches_cpu_reference(case, force_fused):
    dp, want, base_out = reference(case, seed=11)
    got = run_regs(dp, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} regs fused={force_fused}")


# NVFP4 K/V converted a word (8 codes) at a time (plan option nvfp4_cvt=word, the default since
# f4fdc62's H200 run; kv_regs.cuh qk_nvfp4_regs / pv_nvfp4_regs with kWord; the default-option test
# above runs it) or a byte at a time (nvfp4_cvt=byte, forced here): every REGS_NVFP4_CASES case, the
# same tolerances; word against byte on the same data, the same -inf / 0 pattern and outputs
# within the bound of two summation orders (the B values are the same; Q K^T adds the dims of a
# k-step in another order), and deterministic. Kinds it does not apply to (fp8, bf16) ignore it.
@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", REGS_NVFP4_CASES + [
    c for c in REGS_CASES if c.name == "spec_8_1_8_2_fp8_paged"] + [
    c for c in REGS_NATIVE_CASES if c.name == "fp16"], ids=str)
def test_regs_nvfp4_byte_matches_cpu_reference(case, force_fused):
    dp, want, base_out = reference(case, seed=11)
    got = run_regs(dp, nvfp4_cvt="byte", force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} regs nvfp4_cvt=byte fused={force_fused}")


@pytest.mark.parametrize("partial_dtype", [torch.float32, FP8], ids=str)
@pytest.mark.parametrize("case", REGS_NVFP4_CASES[:2], ids=str)
def test_regs_nvfp4_word_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case, seed=12)
    got = run_regs(dp, nvfp4_cvt="word", force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} nvfp4_cvt=word partial {partial_dtype}",
                            partial_dtype=partial_dtype)


@pytest.mark.parametrize("case", REGS_NVFP4_CASES, ids=str)
def test_regs_nvfp4_word_against_byte(case):
    dp = build_decode(case, seed=13)
    for fused in (True, False):
        byte = run_regs(dp, nvfp4_cvt="byte", force_fused=fused)
        word = run_regs(dp, nvfp4_cvt="word", force_fused=fused)
        empty = torch.isinf(word[1])
        assert torch.equal(torch.isinf(byte[1]), empty)
        assert bool((word[0][empty] == 0).all())
        diff = float((byte[0].double() - word[0].double()).abs().max())
        assert diff < 5e-3, f"byte vs word: max |diff| {diff:.3e}"
        lse_diff = float((byte[1][~empty].double() - word[1][~empty].double()).abs().max()) \
            if bool((~empty).any()) else 0.0
        assert lse_diff < 1e-3, f"byte vs word lse: max |diff| {lse_diff:.3e}"
        assert bits_equal(word, run_regs(dp, nvfp4_cvt="word", force_fused=fused))


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in REGS_CASES if c.name in (
    "spec_8_1_8_2_fp8_paged", "fp16_fp8kv_mtp4", "m3_mtp4_distinct_fp8", "g3_topk33_fp8kv",
    "duplicates_fp8kv")], ids=str)
def test_regs_kernel_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case, seed=12)
    got = run_regs(dp, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} regs partial {partial_dtype}",
                            partial_dtype=partial_dtype)


@pytest.mark.parametrize("case", [c for c in REGS_CASES if c.name in (
    "spec_8_1_8_2_fp8_paged", "m3_b64_ctx2k_fp8_regs", "m3_mtp4_shared_fp8", "fp8_q_fp8_kv",
    "some_empty_rows_fp8kv", "invalid_pages_fp8kv")] + [c for c in REGS_NATIVE_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "fp16", "some_empty_rows")] + REGS_NVFP4_CASES[:2], ids=str)
def test_regs_kernel_against_smem_kernel(case):
    """Both kernels on the same data: the same -inf / 0 pattern, outputs within the fused vs
    split bound, and the register kernel deterministic (run == run, fused and split)."""
    dp = build_decode(case, seed=13)
    smem = run_regs(dp, kernel="smem")
    regs = run_regs(dp)
    empty = torch.isinf(regs[1])
    assert torch.equal(torch.isinf(smem[1]), empty)
    assert bool((regs[0][empty] == 0).all()) and bool((smem[0][empty] == 0).all())
    diff = float((smem[0].double() - regs[0].double()).abs().max())
    assert diff < 5e-3, f"smem vs regs: max |diff| {diff:.3e}"
    if dp.gcase.kv == "same":  # bf16 / fp16 K/V: the same arithmetic, only the pipeline differs
        # (fused: the split counts of the two may differ, their split-K targets do)
        assert bits_equal(run_regs(dp, kernel="smem", force_fused=True),
                          run_regs(dp, force_fused=True))
    for fused in (True, False):
        first = run_regs(dp, force_fused=fused)
        assert bits_equal(first, run_regs(dp, force_fused=fused))


@pytest.mark.parametrize("force_fused", [True, False])
@pytest.mark.parametrize("kv", ["fp8", "same"])
def test_regs_kernel_paged_equals_flat(force_fused, kv):
    case = DecodeCase("c", 8, 2, 16, 2, kv=kv)
    flat = problem(case, seed=14, layout="flat")
    paged = problem(case, seed=14, layout="paged")
    assert bits_equal(run_regs(flat, force_fused=force_fused),
                      run_regs(paged, force_fused=force_fused))


@pytest.mark.parametrize("q_dtype", [BF16, FP16], ids=str)
def test_regs_kernel_q_row_scales(q_dtype):
    """bf16 q goes into fp16 MMAs scaled per row by a power of two: heads whose q is scaled by
    2^-100 (the clamp), 2^-30, 1 and 2^12 (bf16; fp16 q stays within its range) still match the
    reference (fresh random inputs: the scaled q replaces the case's q on both devices)."""
    case = DecodeCase("row_scales", 6, 2, 16, 2, q_dtype=q_dtype, kv="fp8")
    dp = build_decode(case, seed=15)
    exps = [-100, -30, 0, 12] if q_dtype == BF16 else [-10, -3, 0, 3]
    mult = torch.tensor([2.0 ** exps[h % len(exps)] for h in range(case.hq)])[None, :, None]
    q = (dp.pb.q.float() * mult).to(q_dtype)
    dp.pb.q = q
    dp.cpu_args = (q,) + tuple(dp.cpu_args[1:])
    dp.gpu_args = (q.to(DEV),) + tuple(dp.gpu_args[1:])
    want = run(dp, gpu=False)
    base_out, _ = baseline(dp.gcase, dp.pb, dp.pb.cpu_args[3])
    got = run_regs(dp)
    check_against_reference(dp, got, want, base_out, f"row scales {q_dtype}")


# regs_feed=tma (kv_regs_tma.cuh, sm_90): the fp8 register kernel's stages filled by TMA. The same
# bytes at the same places in shared memory and the same arithmetic, so the outputs, LSEs and
# partials are the cp.async feed's bit for bit on every fp8 case of the register kernel (paged and
# flat, split and fused, partial blocks, empty rows, invalid pages, G < 16, topk 1 .. 64), and
# match the CPU reference. TMA reads a partial block's rows past its last visible key from the
# page (cp.async zero-fills them): the cases with NaN there check that each warp zeroes its V rows.
REGS_TMA_CASES = [c for c in REGS_CASES if c.kv == "fp8"] + [
    DecodeCase("m3_b64_fp8_regs_tma", 64, 1, 64, 4, kv="fp8"),
    DecodeCase("m3_b8_flat_fp8_regs_tma", 8, 1, 64, 4, kv="fp8", layout="flat")]


def _nan_rows_no_sequence_owns(dp: DecodeProblem) -> DecodeProblem:
    """dp with every row of its paged fp8 K and V caches (num_pages, H, 128, W) that no sequence
    owns set to NaN (0x7F): a kernel that multiplies such a V row by P = 0 returns NaN. Page
    table entries out of [0, num_pages) (the invalid-page cases) own nothing."""
    q, k, v, q2k = dp.gpu_args
    pt, used = dp.gpu_kwargs["page_table"].cpu(), dp.gpu_kwargs["seqused_k"].cpu()
    owned = torch.zeros(k.shape[0], k.shape[2], dtype=torch.bool)
    for b in range(pt.shape[0]):
        n = int(used[b])
        for j in range((n + 127) // 128):
            page = int(pt[b, j])
            if 0 <= page < k.shape[0]:  # an invalid page reads nothing (its keys are masked)
                owned[page, : min(128, n - 128 * j)] = True
    mask = (~owned).to(DEV)[:, None, :, None].expand(k.shape)
    k, v = k.clone(), v.clone()
    for t in (k, v):
        t.view(torch.uint8)[mask] = 0x7F
    return dataclasses.replace(dp, gpu_args=(q, k, v, q2k))


@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", REGS_TMA_CASES, ids=str)
def test_regs_feed_tma_is_bit_identical(case, force_fused):
    if not HAS_CLUSTERS:
        pytest.skip("the TMA feed runs on sm_90 GPUs only (elsewhere the call falls back)")
    dp, want, base_out = reference(case, seed=61)
    tma, cp = dict(kernel="regs", regs_feed="tma"), dict(kernel="regs", regs_feed="cp_async")
    if case.name == "m3_b64_fp8_regs_tma":
        text = _decode_plan_text(dp, tma, force_fused=force_fused)
        assert "; regs_feed=tma: each block's raw K and V" in text, text
    got = run_poisoned(dp, tma, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} regs_feed=tma fused={force_fused}")
    assert bits_equal(got, run_poisoned(dp, cp, force_fused=force_fused))
    if case.layout == "paged" and dp.gcase.layout == "paged" and case.kv == "fp8":
        nan = _nan_rows_no_sequence_owns(dp)
        got_nan = run_poisoned(nan, tma, force_fused=force_fused)
        assert bits_equal(got_nan, got), f"{case}: NaN rows past the sequences changed the result"


def test_regs_feed_tma_plan_names_why_not():
    """regs_feed=tma where it does not apply (bf16 K/V here) runs the cp.async feed and says why."""
    case = DecodeCase("m3_b8_bf16_regs_tma", 8, 1, 64, 4)
    dp, want, base_out = reference(case, seed=62)
    text = _decode_plan_text(dp, dict(regs_feed="tma"))
    assert "regs_feed=tma falls back to cp_async: 16-bit or NVFP4 K/V" in text, text
    check_against_reference(dp, run_poisoned(dp, dict(regs_feed="tma")), want, base_out, "bf16 regs_feed=tma")


def test_decode_kernel_option_rejects_unknown_values():
    dp = build_decode(CASES[1], seed=16)
    with pytest.raises(ValueError, match="kernel must be auto, smem, regs or wgmma, got 'fastest'"):
        msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs,
                                       options=dict(kernel="fastest"))


# ---- MTP union items (plan option mtp=union) --------------------------------------------------
# One item per (request, kv head) over the union of the request's tokens' selections, rows =
# tokens x G. Applies to seqlen_q 2..4 with seqlen_q x G <= 64 and seqlen_q x topk <= 64; other
# calls run per-token items whatever the setting (covered too). Same poisoned outputs / workspace.

MTP_CASES = [c for c in CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "nvfp4_flat_mtp", "m3_tp4_mtp2", "fp16_fp8kv_mtp4", "fp8_q_fp8_kv",
    "mtp_seqlen_gt_keys", "q_offset_int", "q_offset_tensor_negative", "non_causal", "duplicates",
    "some_empty_rows", "packed_nhd")] + [
    DecodeCase("m3_mtp4_distinct_bf16", 8, 4, 64, 4, seqlens="ragged"),
    DecodeCase("m3_mtp4_shared_bf16", 8, 4, 64, 4, seqlens="ragged", selection="tile_shared"),
    DecodeCase("m3_mtp4_distinct_fp8_union", 8, 4, 64, 4, kv="fp8", seqlens="ragged"),
    DecodeCase("m3_mtp4_shared_fp8_union", 8, 4, 64, 4, kv="fp8", selection="tile_shared"),
    DecodeCase("m3_mtp4_shared_nvfp4", 6, 4, 64, 4, kv="nvfp4", selection="tile_shared"),
    DecodeCase("m3_mtp3_mixed", 7, 3, 64, 4, seqlens=[1, 2, 3, 130, 700, 4000, 2049],
               selection="tile_mixed"),
    DecodeCase("g8_mtp4_holes_fp8", 6, 4, 16, 2, kv="fp8", selection="holes"),
    DecodeCase("g3_mtp4_out_of_range", 6, 4, 9, 3, selection="out_of_range"),
    DecodeCase("g1_mtp2_unsorted", 8, 2, 4, 4, selection="unsorted"),
    DecodeCase("mtp4_invalid_pages", 6, 4, 16, 2, invalid_pages=True, selection="full",
               seqlens=[300, 1000, 2048, 129, 5000, 700]),
    DecodeCase("mtp4_topk32_per_token", 4, 4, 16, 1, topk=32),   # 4 x 32 > 64: per-token items
    DecodeCase("g64_mtp2_per_token", 4, 2, 64, 1),               # 2 x 64 rows: per-token items
]


def run_mtp(dp: DecodeProblem, mtp: str = "union", kernel: str = "auto", **extra):
    if kernel in ("wgmma_ahead", "wgmma_inline"):  # kernel=wgmma with wgmma_pipe named
        return run_poisoned(dp, dict(kernel="wgmma", mtp=mtp, wgmma_pipe=kernel[6:]), **extra)
    if kernel == "wgmma_fp8":  # kernel=wgmma with wgmma_fp8=on (fp8 K/V converted in the kernel)
        return run_poisoned(dp, dict(kernel="wgmma", mtp=mtp, wgmma_fp8="on"), **extra)
    return run_regs(dp, kernel=kernel, mtp=mtp, **extra)


# The union items' kernels forced: auto's (the smem union kernel for 16-bit K/V, fp8 in registers),
# kernel=wgmma (bf16 / fp16 union items on the sm_90a TMA + wgmma kernel, mtp_wgmma_sm90.cuh;
# every other case, and any GPU without the sm_90a image, planned as auto: the same checks hold)
# with each feed: wgmma_inline (wgmma_pipe=inline: one producer warp plans each item between the
# blocks of the one before) and wgmma_ahead (wgmma_pipe=ahead, auto's pipe since 42bbb91: the same
# consumers fed by a planner warp ahead of a loader warp; bit-identical to inline,
# test_mtp_wgmma_ahead_is_bit_identical), and wgmma_fp8 (wgmma_fp8=on: fp8 K/V copied raw and
# converted to fp16 by the kernel's converter warps, not auto's; 16-bit K/V: wgmma_ahead's
# kernel; test_mtp_wgmma_fp8_matches_reference).
MTP_KERNELS = ["auto", "wgmma_inline", "wgmma_ahead", "wgmma_fp8"]


@pytest.mark.parametrize("kernel", MTP_KERNELS)
@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", MTP_CASES + [
    # kernel=wgmma's shapes: G = 16 at 2 / 3 tokens (32 / 48 of the 64 rows), G = 32 at 2, fp16,
    # the partial blocks (V rows past the largest count zeroed), the scale and v_global_scale.
    DecodeCase("m3_mtp2_bf16", 8, 2, 64, 4, seqlens="ragged"),
    DecodeCase("g32_mtp2_bf16", 4, 2, 64, 2),
    DecodeCase("fp16_m3_mtp4_mixed", 5, 4, 64, 4, q_dtype=FP16, kv="same", selection="tile_mixed"),
    DecodeCase("m3_mtp4_scales_bf16", 4, 4, 64, 4, softmax_scale=-0.05, v_global_scale=3.0),
    DecodeCase("g16_topk32_mtp2_bf16", 5, 2, 16, 1, topk=32, selection="full",
               seqlens=[9000, 5000, 300, 4200, 129]),
    # wgmma_fp8's shapes: B64 of M3 at 4 tokens with ragged lengths (the benchmark's items, the V
    # converter's zeroed rows), paged; fp16 q; the scales.
    DecodeCase("m3_mtp4_b64_fp8", 64, 4, 64, 4, kv="fp8", seqlens="ragged", layout="paged"),
    DecodeCase("fp16_m3_mtp4_fp8", 5, 4, 64, 4, q_dtype=FP16, kv="fp8", selection="tile_mixed"),
    DecodeCase("m3_mtp4_scales_fp8", 4, 4, 64, 4, kv="fp8", softmax_scale=-0.05, v_global_scale=3.0)],
    ids=str)
def test_mtp_union_matches_cpu_reference(case, force_fused, kernel):
    dp, want, base_out = reference(case, seed=21)
    got = run_mtp(dp, kernel=kernel, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} union {kernel} fused={force_fused}")


@pytest.mark.parametrize("kernel", MTP_KERNELS)
@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in MTP_CASES if c.name in (
    "m3_mtp4_distinct_bf16", "m3_mtp4_shared_fp8_union", "fp16_fp8kv_mtp4", "g3_mtp4_out_of_range")],
    ids=str)
def test_mtp_union_partial_dtypes(case, partial_dtype, kernel):
    dp, want, base_out = reference(case, seed=22)
    got = run_mtp(dp, kernel=kernel, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} union {kernel} partial {partial_dtype}",
                            partial_dtype=partial_dtype)


@pytest.mark.parametrize("case", [c for c in MTP_CASES if c.name in (
    "m3_mtp4_distinct_bf16", "m3_mtp4_shared_fp8_union", "some_empty_rows", "mtp4_invalid_pages",
    "m3_mtp3_mixed")], ids=str)
@pytest.mark.parametrize("kernel", MTP_KERNELS)
def test_mtp_union_against_per_token(case, kernel):
    """Union and per-token items on the same data: same -inf / 0 pattern, outputs within the
    fused vs split bound; union items deterministic, paged fused and split."""
    dp = build_decode(case, seed=23)
    per_token = run_mtp(dp, mtp="per_token")
    union = run_mtp(dp, kernel=kernel)
    empty = torch.isinf(union[1])
    assert torch.equal(torch.isinf(per_token[1]), empty)
    assert bool((union[0][empty] == 0).all())
    diff = float((per_token[0].double() - union[0].double()).abs().max())
    assert diff < 5e-3, f"per-token vs union: max |diff| {diff:.3e}"
    for fused in (True, False):
        first = run_mtp(dp, kernel=kernel, force_fused=fused)
        assert bits_equal(first, run_mtp(dp, kernel=kernel, force_fused=fused))


@pytest.mark.parametrize("kernel", MTP_KERNELS)
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_mtp_union_paged_equals_flat(kv, kernel):
    case = DecodeCase("c", 8, 4, 32, 2, kv=kv)
    flat = build_decode(case, seed=24, layout="flat")
    paged = build_decode(case, seed=24, layout="paged")
    for fused in (True, False):
        assert bits_equal(run_mtp(flat, kernel=kernel, force_fused=fused),
                          run_mtp(paged, kernel=kernel, force_fused=fused))


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16], ids=str)
@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", [
    # B64 of M3 at 4 tokens (the benchmark's items: 2 per CTA on a 132-SM GPU), ragged lengths
    # (partial blocks), items of a few blocks (the loader's V held back only while the next plan
    # is ready), split items, fp16.
    DecodeCase("m3_mtp4_b64_bf16", 64, 4, 64, 4, seqlens="ragged"),
    DecodeCase("m3_mtp2_bf16", 8, 2, 64, 4, seqlens="ragged"),
    DecodeCase("m3_mtp4_short_bf16", 40, 4, 64, 4, seqlens=[130, 1, 129, 256, 5000] * 8),
    DecodeCase("fp16_m3_mtp4_mixed", 5, 4, 64, 4, q_dtype=FP16, kv="same", selection="tile_mixed"),
    DecodeCase("g16_topk32_mtp2_bf16", 5, 2, 16, 1, topk=32, selection="full",
               seqlens=[9000, 5000, 300, 4200, 129])], ids=str)
def test_mtp_wgmma_ahead_is_bit_identical(case, force_fused, partial_dtype):
    """wgmma_pipe=ahead changes only who plans and loads: the outputs, LSEs and partials are
    wgmma_pipe=inline's bit for bit, and match the CPU reference."""
    dp, want, base_out = reference(case, seed=41)
    kw = dict(force_fused=force_fused, partial_dtype=partial_dtype)
    ahead = run_mtp(dp, kernel="wgmma_ahead", **kw)
    check_against_reference(dp, ahead, want, base_out, f"{case} wgmma_ahead fused={force_fused}",
                            partial_dtype=partial_dtype)
    assert bits_equal(ahead, run_mtp(dp, kernel="wgmma_inline", **kw))


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16], ids=str)
@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", [
    # B64 of M3 at 4 tokens (the benchmark's items), ragged (partial blocks: V rows zeroed by the
    # converter), flat and paged; short items; split items; fp16; G = 32 at 2 tokens.
    DecodeCase("m3_mtp4_b64_fp8", 64, 4, 64, 4, kv="fp8", seqlens="ragged", layout="paged"),
    DecodeCase("m3_mtp4_b64_fp8_flat", 64, 4, 64, 4, kv="fp8", seqlens="ragged", layout="flat"),
    DecodeCase("m3_mtp4_short_fp8", 40, 4, 64, 4, kv="fp8", seqlens=[130, 1, 129, 256, 5000] * 8),
    DecodeCase("m3_mtp4_fp8_split", 8, 4, 64, 4, kv="fp8", seqlens="ragged"),
    DecodeCase("fp16_m3_mtp4_fp8", 5, 4, 64, 4, q_dtype=FP16, kv="fp8", selection="tile_mixed"),
    DecodeCase("g32_mtp2_fp8", 4, 2, 64, 2, kv="fp8"),
    DecodeCase("mtp4_invalid_pages_fp8", 6, 4, 16, 2, kv="fp8", invalid_pages=True,
               selection="full", seqlens=[300, 1000, 2048, 129, 5000, 700])], ids=str)
def test_mtp_wgmma_fp8_matches_reference(case, force_fused, partial_dtype):
    """wgmma_fp8=on converts e4m3 K/V exactly into fp16 tiles (V rows past a block's visible keys
    zeroed, as the 16-bit loader does) and computes in fp16: it matches the CPU reference, and with
    fp16 q its outputs, LSEs and partials are the 16-bit wgmma kernel's on the dequantized K/V bit
    for bit (bf16 q is scaled into fp16 per item, so there only the reference holds it)."""
    if not HAS_CLUSTERS:
        pytest.skip("the wgmma kernel runs on sm_90 GPUs only (elsewhere both calls fall back)")
    dp, want, base_out = reference(case, seed=43)
    kw = dict(force_fused=force_fused, partial_dtype=partial_dtype)
    text = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_fp8="on"), force_fused=force_fused)
    assert "; wgmma_fp8=on (fp8 K/V" in text, text
    got = run_mtp(dp, kernel="wgmma_fp8", **kw)
    check_against_reference(dp, got, want, base_out, f"{case} wgmma_fp8 fused={force_fused}",
                            partial_dtype=partial_dtype)
    q, k, v, q2k = dp.gpu_args  # 16-bit q here (wgmma_fp8 does not take fp8 q)
    if q.dtype == FP16:
        dp16 = dataclasses.replace(dp, gpu_args=(q, k.to(q.dtype), v.to(q.dtype), q2k))
        assert bits_equal(got, run_mtp(dp16, kernel="wgmma_ahead", **kw))


@pytest.mark.parametrize("kv", ["same", "fp8"])
@pytest.mark.parametrize("lengths", [[0], [0, 0]], ids=["b1", "b2"])
def test_tma_kernels_with_no_key_rows_fall_back(kv, lengths):
    """Every key sequence empty with flat K/V (a tensor of 0 rows): the forced TMA kernel cannot map
    it (the fuzzer's decode:6851 / 12895 / 18265 / 19437 on the H200 raised NotSupportedError from
    the launcher); the plan takes auto's kernel and says why, and the call returns the reference
    (zero outputs, -inf LSEs) on poisoned outputs."""
    case = DecodeCase(f"empty_flat_{kv}", len(lengths), 3, 64, 4, kv=kv, layout="flat", seqlens=lengths)
    dp, want, base_out = reference(case, seed=59)
    options = dict(kernel="wgmma", mtp="union", **({"wgmma_fp8": "on"} if kv == "fp8" else {}))
    text = _decode_plan_text(dp, options)
    assert "kernel=wgmma falls back" in text and "no K/V rows" in text, text
    got = run_poisoned(dp, options)
    check_against_reference(dp, got, want, base_out, f"{case} kernel=wgmma")


@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_mtp_wgmma_plan_names_the_kernel_or_why_not(kv):
    """kernel=wgmma names the sm_90a kernel for 16-bit and fp8 union items on an sm_90 GPU with the
    sm_90a image (fp8: wgmma_fp8=auto converts them where the kernel is named); elsewhere (other
    GPUs, per-token items, fp8 with wgmma_fp8=off) the plan text says why it falls back to auto's
    kernel."""
    dp = build_decode(DecodeCase("c", 4, 4, 64, 4, kv=kv), seed=38)
    text = _decode_plan_text(dp, dict(kernel="wgmma")).split("): ", 1)[1]
    assert "mtp=union" in text, text
    runs = HAS_CLUSTERS  # an sm_90 device (the library is built for sm_90a there)
    assert ("; kernel=wgmma (sm_90a" in text) == runs, text
    assert ("kernel=wgmma falls back to auto's kernel" in text) == (not runs), text
    per_token = _decode_plan_text(dp, dict(kernel="wgmma", mtp="per_token")).split("): ", 1)[1]
    assert "kernel=wgmma falls back to auto's kernel: no MTP union items" in per_token, per_token
    ahead = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_pipe="ahead")).split("): ", 1)[1]
    assert ("; wgmma_pipe=ahead (a planner warp" in ahead) == runs, ahead
    assert ("; wgmma_pipe=ahead (a planner warp" in text) == runs, text  # auto's pipe
    inline = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_pipe="inline")).split("): ", 1)[1]
    assert "wgmma_pipe=ahead" not in inline, inline
    # wgmma_fp8=on (and auto, kernel=wgmma being named): fp8 K/V on the kernel where it runs;
    # wgmma_fp8=off: fp8 falls back.
    on = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_fp8="on")).split("): ", 1)[1]
    assert ("; kernel=wgmma (sm_90a" in on) == HAS_CLUSTERS, on
    assert ("; wgmma_fp8=on (fp8 K/V" in on) == (kv == "fp8" and HAS_CLUSTERS), on
    assert ("; wgmma_fp8=on (fp8 K/V" in text) == (kv == "fp8" and HAS_CLUSTERS), text
    if kv == "fp8":
        off = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_fp8="off"))
        assert "fp8 K/V with wgmma_fp8=off" in off, off
        # auto at B4: per-token items (fp8 union items only past one per SM), the register kernel
        assert "kernel=regs" in _decode_plan_text(dp, None).split("): ", 1)[1]
        inl = _decode_plan_text(dp, dict(kernel="wgmma", wgmma_fp8="on", wgmma_pipe="inline"))
        assert "fp8 K/V with wgmma_pipe=inline" in inl, inl


def test_decode_mtp_option_rejects_unknown_values():
    dp = build_decode(CASES[2], seed=25)
    with pytest.raises(ValueError, match="mtp must be auto, per_token or union, got 'shared'"):
        msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs, options=dict(mtp="shared"))


# ---- MTP union items converted in registers (plan options kernel=regs, mtp=union) -------------
# The union items' 64-row tiles with fp8 K/V converted into fp16 fragments in registers
# (kv_regs.cuh): the 4 warps split the keys of Q K^T and the head dims of P V over all 64 rows (row
# maxima and P exchanged through shared memory). auto takes it for fp8 since the H200 run at
# 441d02d; NVFP4 / bf16 / fp16 union items ignore kernel=regs (NVFP4's register path measured
# slower at 5b22cb3 and was removed: test_mtp_union_nvfp4_forced_regs_runs_smem_union).

def _kv(name: str, kv: str) -> DecodeCase:
    return dataclasses.replace(next(c for c in CASES if c.name == name), name=f"{name}_{kv}_uregs",
                               kv=kv)


MTP_REGS_CASES = [_kv(n, "fp8") for n in (
    "spec_4_2_16_2_bf16_paged", "m3_tp4_mtp2", "mtp_seqlen_gt_keys", "q_offset_int",
    "q_offset_tensor_negative", "non_causal", "duplicates", "some_empty_rows", "packed_nhd")] + [
    c for c in CASES if c.name in ("fp16_fp8kv_mtp4", "fp8_q_fp8_kv")] + [
    # M3 (G = 16): per-token distinct selections, one shared selection, partly shared.
    DecodeCase("m3_mtp4_distinct_fp8_uregs", 8, 4, 64, 4, kv="fp8", seqlens="ragged"),
    DecodeCase("m3_mtp4_shared_fp8_uregs", 8, 4, 64, 4, kv="fp8", selection="tile_shared"),
    DecodeCase("m3_mtp3_mixed_fp8_uregs", 7, 3, 64, 4, kv="fp8",
               seqlens=[1, 2, 3, 130, 700, 4000, 2049], selection="tile_mixed"),
    DecodeCase("m3_mtp2_fp8_uregs", 8, 2, 64, 4, kv="fp8", seqlens="ragged"),
    DecodeCase("fp16_m3_mtp4_fp8_uregs", 5, 4, 64, 4, q_dtype=FP16, kv="fp8",
               selection="tile_mixed"),
    # Smaller and larger groups: G = 8 (warps 2, 3 idle at 2 tokens), 3, 1, and G = 32 (2 warps
    # per token).
    DecodeCase("g8_mtp4_holes_fp8_uregs", 6, 4, 16, 2, kv="fp8", selection="holes"),
    DecodeCase("g3_mtp4_out_of_range_fp8_uregs", 6, 4, 9, 3, kv="fp8", selection="out_of_range"),
    DecodeCase("g1_mtp2_unsorted_fp8_uregs", 8, 2, 4, 4, kv="fp8", selection="unsorted"),
    DecodeCase("g32_mtp2_fp8_uregs", 4, 2, 64, 2, kv="fp8"),
    DecodeCase("g16_topk32_mtp2_fp8_uregs", 5, 2, 16, 1, topk=32, kv="fp8", selection="full",
               seqlens=[9000, 5000, 300, 4200, 129]),
    DecodeCase("mtp4_invalid_pages_fp8_uregs", 6, 4, 16, 2, kv="fp8", invalid_pages=True,
               selection="full", seqlens=[300, 1000, 2048, 129, 5000, 700]),
    DecodeCase("m3_mtp4_scales_fp8_uregs", 4, 4, 64, 4, kv="fp8", softmax_scale=-0.05,
               v_global_scale=3.0),
]


def run_mtp_regs(dp: DecodeProblem, **extra):
    return run_regs(dp, kernel="regs", mtp="union", **extra)


@pytest.mark.parametrize("force_fused", [None, True, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", MTP_REGS_CASES, ids=str)
def test_mtp_union_regs_matches_cpu_reference(case, force_fused):
    dp, want, base_out = reference(case, seed=31)
    got = run_mtp_regs(dp, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} union regs fused={force_fused}")


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in MTP_REGS_CASES if c.name in (
    "m3_mtp4_distinct_fp8_uregs", "fp16_fp8kv_mtp4", "g3_mtp4_out_of_range_fp8_uregs")], ids=str)
def test_mtp_union_regs_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case, seed=32)
    got = run_mtp_regs(dp, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} union regs partial {partial_dtype}",
                            partial_dtype=partial_dtype)


@pytest.mark.parametrize("case", [c for c in MTP_REGS_CASES if c.name in (
    "m3_mtp4_distinct_fp8_uregs", "m3_mtp4_shared_fp8_uregs", "m3_mtp3_mixed_fp8_uregs",
    "some_empty_rows_fp8_uregs", "mtp4_invalid_pages_fp8_uregs", "g8_mtp4_holes_fp8_uregs")],
    ids=str)
def test_mtp_union_regs_against_smem_union(case):
    """The register and the shared-memory union kernels on the same data (same items, same
    splits): the same -inf / 0 pattern, outputs within the fused vs split bound; the register
    kernel deterministic, fused and split."""
    dp = build_decode(case, seed=33)
    smem = run_mtp(dp, kernel="smem")
    regs = run_mtp_regs(dp)
    empty = torch.isinf(regs[1])
    assert torch.equal(torch.isinf(smem[1]), empty)
    assert bool((regs[0][empty] == 0).all()) and bool((smem[0][empty] == 0).all())
    assert not bool(torch.isnan(regs[0]).any()) and not bool(torch.isnan(regs[1]).any())
    diff = float((smem[0].double() - regs[0].double()).abs().max())
    assert diff < 5e-3, f"smem vs regs union: max |diff| {diff:.3e}"
    for fused in (True, False):
        first = run_mtp_regs(dp, force_fused=fused)
        assert bits_equal(first, run_mtp_regs(dp, force_fused=fused))


@pytest.mark.parametrize("case", [
    DecodeCase("m3_mtp4_distinct_nvfp4", 6, 4, 64, 4, kv="nvfp4", seqlens="ragged"),
    DecodeCase("m3_mtp4_shared_nvfp4", 6, 4, 64, 4, kv="nvfp4", selection="tile_shared"),
    DecodeCase("mtp4_invalid_pages_nvfp4", 6, 4, 16, 2, kv="nvfp4", invalid_pages=True,
               selection="full", seqlens=[300, 1000, 2048, 129, 5000, 700])], ids=str)
def test_mtp_union_nvfp4_forced_regs_runs_smem_union(case):
    """NVFP4 union items under kernel=regs run the shared-memory union kernel (their register path
    was removed): bit for bit what kernel=smem gives, fused, split and the planner's choice."""
    dp = build_decode(case, seed=33)
    for fused in (None, True, False):
        assert bits_equal(run_mtp_regs(dp, force_fused=fused),
                          run_mtp(dp, kernel="smem", force_fused=fused))


def test_mtp_union_regs_paged_equals_flat():
    case = DecodeCase("c", 8, 4, 32, 2, kv="fp8")
    flat = build_decode(case, seed=34, layout="flat")
    paged = build_decode(case, seed=34, layout="paged")
    for fused in (True, False):
        assert bits_equal(run_mtp_regs(flat, force_fused=fused),
                          run_mtp_regs(paged, force_fused=fused))


@pytest.mark.parametrize("q_dtype", [BF16, FP16], ids=str)
def test_mtp_union_regs_q_row_scales(q_dtype):
    """Each warp scales its own 16 rows (M3: one token's 16 heads) into fp16: heads and tokens of
    very different magnitudes (as test_regs_kernel_q_row_scales) still match the reference."""
    case = DecodeCase("row_scales_union", 5, 4, 64, 4, q_dtype=q_dtype, kv="fp8")
    dp = build_decode(case, seed=35)
    exps = [-100, -30, 0, 12, 5] if q_dtype == BF16 else [-10, -3, 0, 3, 1]
    rows = dp.pb.q.shape[0]
    mult = torch.tensor([[2.0 ** exps[(r + h) % len(exps)] for h in range(case.hq)]
                         for r in range(rows)])[:, :, None]
    q = (dp.pb.q.float() * mult).to(q_dtype)
    dp.pb.q = q
    dp.cpu_args = (q,) + tuple(dp.cpu_args[1:])
    dp.gpu_args = (q.to(DEV),) + tuple(dp.gpu_args[1:])
    want = run(dp, gpu=False)
    base_out, _ = baseline(dp.gcase, dp.pb, dp.pb.cpu_args[3])
    got = run_mtp_regs(dp)
    check_against_reference(dp, got, want, base_out, f"union row scales {q_dtype}")


class _Texts(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.texts: List[str] = []

    def emit(self, record):
        self.texts.append(record.getMessage())


def _decode_plan_text(dp: DecodeProblem, options, **extra) -> str:
    """The plan description (FLASHMSA_LOG=info) of one call with these plan options (and extra
    arguments of the call)."""
    from flashmsa import _log
    handler, level = _Texts(), _log.logger.level
    _log.logger.addHandler(handler)
    _log.logger.setLevel(logging.INFO)
    _log.reset_seen()
    try:
        run(dp, gpu=True, options=options, **extra)
    finally:
        _log.logger.removeHandler(handler)
        _log.logger.setLevel(level)
        _log.reset_seen()
    texts = [t for t in handler.texts if t.startswith("msa_sparse_decode_attention")]
    assert len(texts) == 1, handler.texts
    return texts[0]


@pytest.mark.parametrize("kv", ["fp8", "nvfp4", "same"])
def test_nvfp4_word_plan_names_the_conversion(kv):
    """nvfp4_cvt=word (auto's choice) is named in the plan text for NVFP4 K/V under the register
    kernel only; a forced byte conversion is not named."""
    dp = build_decode(DecodeCase("c", 4, 1, 16, 2, kv=kv), seed=37)
    forced = _decode_plan_text(dp, dict(kernel="regs", nvfp4_cvt="word")).split("): ", 1)[1]
    assert ("nvfp4_cvt=word" in forced) == (kv == "nvfp4"), forced
    auto = _decode_plan_text(dp, None).split("): ", 1)[1]
    assert ("nvfp4_cvt=word" in auto) == (kv == "nvfp4"), auto
    byte = _decode_plan_text(dp, dict(kernel="regs", nvfp4_cvt="byte")).split("): ", 1)[1]
    assert "nvfp4_cvt" not in byte, byte
    smem = _decode_plan_text(dp, dict(kernel="smem", nvfp4_cvt="word")).split("): ", 1)[1]
    assert "nvfp4_cvt=word" not in smem, smem


@pytest.mark.parametrize("kv", ["fp8", "nvfp4", "same"])
def test_mtp_union_regs_plan_names_the_path(kv):
    """kernel=regs with mtp=union names the register conversion for fp8 K/V (NVFP4 and bf16: the
    smem union kernel, no register conversion named). auto's union items past one per SM: fp8 on
    the sm_90a wgmma kernel converting in place (wgmma_fp8=auto, H200 at 831d3e5) where it runs,
    else on the union register kernel (H200 at 441d02d); NVFP4 and 16-bit K/V on the shared-memory
    union kernel (16-bit: the wgmma kernel on sm_90)."""
    dp = build_decode(DecodeCase("c", 4, 4, 64, 4, kv=kv), seed=36)
    # The text echoes the call (with its plan= options) before "): "; the plan is what follows.
    forced = _decode_plan_text(dp, dict(kernel="regs", mtp="union")).split("): ", 1)[1]
    assert "mtp=union" in forced, forced
    assert ("K/V converted in registers" in forced) == (kv == "fp8"), forced
    assert ("kernel=regs" in forced) == (kv == "fp8"), forced
    assert ("kernel=regs (the 4 warps split" in forced) == (kv == "fp8"), forced
    # auto at B4 (16 items): union items for 16-bit K/V only (heuristics.h mtp_union_pays; fp8
    # union items at 4 tokens from more items than half the SMs on the sm_90a wgmma kernel, than
    # the SMs elsewhere; NVFP4 from more than half the SMs).
    auto = _decode_plan_text(dp, None).split("): ", 1)[1]
    assert ("mtp=union" in auto) == (kv == "same"), auto
    assert "kernel=regs (the 4 warps split" not in auto, auto  # the union register kernel's text
    big = build_decode(DecodeCase("c", 64, 4, 64, 4, kv=kv, seqlens=[300] * 64), seed=36)
    auto = _decode_plan_text(big, None).split("): ", 1)[1]
    assert "mtp=union" in auto, auto
    on_wgmma = HAS_CLUSTERS and kv in ("fp8", "same")  # an sm_90 device: the sm_90a image runs
    assert ("; kernel=wgmma (sm_90a" in auto) == on_wgmma, auto
    assert ("; wgmma_fp8=on (fp8 K/V" in auto) == (kv == "fp8" and HAS_CLUSTERS), auto
    assert ("kernel=regs" in auto) == (kv == "fp8" and not HAS_CLUSTERS), auto


# ---- split=cluster (plan option split=cluster, sm_90) ---------------------------------------------
# The split CTAs of a (token, kv head) row run as one thread-block cluster and merge their partials
# through distributed shared memory with the combine kernel's own code and slot order
# (docs/design/sparse_attention.md#decode-cluster). On a GPU without clusters (or without the sm_90a
# image) the plan falls back to the blocks split (checked: the plan text says so), and the checks
# still hold. Outputs and workspaces are poisoned; the smem and regs kernels, every K/V kind,
# G 1..32 (64-row tiles), topk 1..64, MTP per-token items, -inf rows, paged / flat / packed.

HAS_CLUSTERS = torch.cuda.get_device_capability() == (9, 0)

CLUSTER_CASES = [c for c in CASES if c.name in (
    "spec_8_1_8_2_bf16_flat", "spec_4_2_16_2_bf16_paged", "spec_8_1_8_2_fp8_paged",
    "spec_16_1_4_4_topk8_fp8", "nvfp4_paged", "nvfp4_flat_mtp", "m3_tp4_mtp2", "fp16",
    "fp16_fp8kv_mtp4", "fp8_q_fp8_kv", "fp8_q_bf16_kv", "fp8_q_nvfp4_kv", "g1_topk1", "g3_topk33",
    "g4_topk64", "g16_topk64_mtp4", "empty_and_tiny_sequences", "mtp_seqlen_gt_keys",
    "q_offset_tensor_negative", "non_causal", "duplicates", "holes", "out_of_range",
    "some_empty_rows", "invalid_pages", "packed_hnd_fp8", "packed_nhd", "scales")] + [
    DecodeCase("m3_b1_cluster", 1, 1, 64, 4, seqlens=[32768]),
    DecodeCase("m3_b1_cluster_fp8", 1, 1, 64, 4, kv="fp8", seqlens=[32768]),
    DecodeCase("m3_b4_cluster_nvfp4", 4, 1, 64, 4, kv="nvfp4", seqlens="multiples"),
    DecodeCase("m3_mtp4_per_token_cluster", 2, 4, 64, 4, seqlens=[3000, 700], selection="random"),
] + REGS_FALLBACK_CASES


def run_cluster(dp: DecodeProblem, kernel: Optional[str] = None, split: str = "cluster", split_warps: int = 4,
                **extra):
    """split=cluster (or blocks) with an item per token (union items never run in clusters) on a
    poisoned workspace and poisoned outputs, on 4 warps per CTA (auto and 8 take the 8-warp kernel
    where it applies: test_split_cluster_8_warps_*)."""
    options = dict(mtp="per_token", split=split, split_warps=split_warps)
    if kernel is not None:
        options["kernel"] = kernel
    return run_poisoned(dp, options, **extra)


@pytest.mark.parametrize("force_fused", [None, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("kernel", ["smem", "regs"])
@pytest.mark.parametrize("case", CLUSTER_CASES, ids=str)
def test_split_cluster_matches_cpu_reference(case, kernel, force_fused):
    dp, want, base_out = reference(case, seed=41)
    got = run_cluster(dp, kernel=kernel, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} cluster {kernel} fused={force_fused}")


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in CLUSTER_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "fp16_fp8kv_mtp4", "g3_topk33", "m3_b1_cluster_fp8",
    "m3_b4_cluster_nvfp4")], ids=str)
def test_split_cluster_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case, seed=42)
    got = run_cluster(dp, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} cluster partial {partial_dtype}",
                            partial_dtype=partial_dtype)


def _splits_of(text: str) -> Optional[int]:
    """The split count a decode plan text names (None: fused)."""
    if "split-K: " not in text:
        return None
    return int(text.split("split-K: ", 1)[1].split(" ", 1)[0])


def _clustered(case, text: str) -> bool:
    """Whether a split=cluster plan runs clusters; the one exception allowed: rows of one split
    (topk 1), which fall back to blocks (nothing to merge, the planner's rule since 65c634d)."""
    if case.topk == 1:
        assert "split=cluster falls back to blocks: one split a row" in text, text
        return False
    assert "split=cluster (a cluster of" in text, text
    return True


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, FP8], ids=str)
@pytest.mark.parametrize("kernel", ["smem", "regs"])
@pytest.mark.parametrize("case", [c for c in CLUSTER_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "spec_8_1_8_2_fp8_paged", "nvfp4_paged", "fp16", "g1_topk1",
    "g3_topk33", "g4_topk64", "some_empty_rows", "invalid_pages", "m3_b1_cluster",
    "m3_b1_cluster_fp8", "m3_mtp4_per_token_cluster", "g32_bf16")], ids=str)
def test_split_cluster_bitwise_equals_blocks(case, kernel, partial_dtype):
    """The cluster merge is the combine's own code and slot order over the same partials: with the
    same split count the outputs and LSEs are bit-identical to split=blocks (the combine kernel).
    Where the cluster caps the split count (more than 16 splits, topk > 16 at small batches) the
    two differ within the fused vs split bound with the same -inf pattern."""
    dp = problem(case, seed=43)
    extra = dict(force_fused=False, partial_dtype=partial_dtype)
    cluster = run_cluster(dp, kernel=kernel, **extra)
    blocks = run_cluster(dp, kernel=kernel, split="blocks", **extra)
    options = dict(mtp="per_token", kernel=kernel)
    text_c = _decode_plan_text(dp, dict(options, split="cluster", split_warps=4), **extra)
    text_b = _decode_plan_text(dp, dict(options, split="blocks", split_warps=4), **extra)
    if HAS_CLUSTERS:
        _clustered(case, text_c)
    if _splits_of(text_c) == _splits_of(text_b):
        assert bits_equal(cluster, blocks), f"{case}: cluster vs blocks not bit-identical"
    else:
        assert torch.equal(torch.isinf(cluster[1]), torch.isinf(blocks[1]))
        diff = float((cluster[0].double() - blocks[0].double()).abs().max())
        assert diff < 5e-3, f"cluster vs blocks: max |diff| {diff:.3e}"
    for _ in range(2):  # deterministic
        assert bits_equal(cluster, run_cluster(dp, kernel=kernel, **extra))


@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_split_cluster_paged_equals_flat(kv):
    case = DecodeCase("c", 2, 1, 64, 4, kv=kv, seqlens=[5000, 3000])
    flat = problem(case, seed=44, layout="flat")
    paged = problem(case, seed=44, layout="paged")
    assert bits_equal(run_cluster(flat, force_fused=False), run_cluster(paged, force_fused=False))


@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_split_cluster_plan_names_the_path(kv):
    """B1 / M3: 16 splits (one block each) in one cluster of 16 per (token, kv head) on an sm_90
    GPU, no workspace; elsewhere the blocks split and the reason. MTP union items keep the
    combine kernel and say so."""
    dp = build_decode(DecodeCase("c", 1, 1, 64, 4, kv=kv, seqlens=[32768]), seed=45)
    text = _decode_plan_text(dp, dict(split="cluster")).split("): ", 1)[1]
    if HAS_CLUSTERS:
        assert "split=cluster (a cluster of 16 CTAs per row" in text, text
        assert "workspace 0 bytes" in text, text
    else:
        assert "split=cluster falls back to blocks: no thread-block clusters" in text, text
    assert "split=cluster" not in _decode_plan_text(dp, None).split("): ", 1)[1]
    mtp = build_decode(DecodeCase("c", 1, 4, 64, 4, kv=kv, seqlens=[32768]), seed=46)
    text = _decode_plan_text(mtp, dict(split="cluster", mtp="union")).split("): ", 1)[1]
    assert "mtp=union" in text and "split=cluster falls back to blocks: MTP union items" in text, text


def test_split_cluster_graph_replay():
    """A captured B1 call replays to the eager call's bits (the cluster launch inside a graph)."""
    dp = problem(DecodeCase("m3_b1_cluster", 1, 1, 64, 4, seqlens=[32768]), seed=47)
    opts = dict(split="cluster")
    want = run(dp, gpu=True, options=opts)
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    run(dp, gpu=True, options=opts, workspace=ws)  # warm-up: plan caches, workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = msa_ops._sparse_decode_planned(*dp.gpu_args, **dp.gpu_kwargs, workspace=ws, options=opts)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert bits_equal(got, want)


# ---- split_warps=8 (plan option split_warps=8) -----------------------------------------------------
# Decode with 8 warps per CTA sharing each 128-key block (query_major_wide.cuh): calls that split
# by blocks or (forced) fused calls, with 16-bit K/V, or fp8 K/V converted in registers
# (kernel=auto), and G <= 16; the rest (NVFP4 K/V, fp8 under kernel=smem / regs, MTP union items,
# G > 16) fall back to the 4-warp kernel (checked: the plan text says so) and the checks still hold.
# Partials and the combine are unchanged; the 8 warps' states are merged in warp order, so results
# are deterministic but not the 4-warp kernel's bits (each warp sums other keys): within the
# reference tolerances and within the fused vs split bound of it. Outputs and workspaces poisoned;
# M3 at batch 1 (32K and 128K context), 2, 4 (ragged, partial last blocks) and 8 (-1 holes), every
# partial dtype, paged / flat / packed, fp16 and fp8 q.

WIDE_CASES = [c for c in CLUSTER_CASES if c.name in (
    "spec_8_1_8_2_bf16_flat", "spec_4_2_16_2_bf16_paged", "m3_tp4_mtp2", "fp16", "fp8_q_bf16_kv",
    "g1_topk1", "g3_topk33", "g4_topk64", "g16_topk64_mtp4", "empty_and_tiny_sequences",
    "mtp_seqlen_gt_keys", "q_offset_tensor_negative", "non_causal", "duplicates", "holes",
    "out_of_range", "some_empty_rows", "invalid_pages", "packed_nhd", "scales", "m3_b1_cluster",
    "m3_mtp4_per_token_cluster", "spec_8_1_8_2_fp8_paged", "g32_bf16", "spec_16_1_4_4_topk8_fp8",
    "fp16_fp8kv_mtp4", "fp8_q_fp8_kv", "packed_hnd_fp8", "m3_b1_cluster_fp8")] + [
    DecodeCase("m3_b1_ctx128k_w8", 1, 1, 64, 4, seqlens=[131072]),
    DecodeCase("m3_b2_w8_ragged", 2, 1, 64, 4, seqlens="ragged"),
    DecodeCase("m3_b4_w8_partial_blocks", 4, 1, 64, 4, seqlens=[32768 + 77, 1000, 129, 5]),
    DecodeCase("m3_b8_w8_holes", 8, 1, 64, 4, selection="holes"),
    DecodeCase("m3_b8_w8_fp16", 8, 1, 64, 4, q_dtype=FP16, seqlens="multiples"),
    # fp8 K/V on the 8-warp kernel (converted in registers, permuted head dims).
    DecodeCase("m3_b1_ctx128k_w8_fp8", 1, 1, 64, 4, kv="fp8", seqlens=[131072]),
    DecodeCase("m3_b2_w8_fp8_ragged_flat", 2, 1, 64, 4, kv="fp8", layout="flat", seqlens="ragged"),
    DecodeCase("m3_b4_w8_fp8_partial_blocks", 4, 1, 64, 4, kv="fp8", seqlens=[32768 + 77, 1000, 129, 5]),
    DecodeCase("m3_b8_w8_fp8_holes", 8, 1, 64, 4, kv="fp8", selection="holes"),
    DecodeCase("m3_b8_w8_fp8_fp16", 8, 1, 64, 4, kv="fp8", q_dtype=FP16, seqlens="multiples"),
    DecodeCase("w8_fp8_scales_invalid_pages", 4, 1, 64, 4, kv="fp8", softmax_scale=0.03,
               v_global_scale=1.7, invalid_pages=True),
    DecodeCase("w8_fp8_non_causal_g4", 4, 1, 16, 4, kv="fp8", causal=False, seqlens="multiples"),
]


def run_wide(dp: DecodeProblem, warps: int = 8, **extra):
    """split_warps=<warps> with an item per token on a poisoned workspace and poisoned outputs."""
    return run_poisoned(dp, dict(mtp="per_token", split_warps=warps), **extra)


@pytest.mark.parametrize("force_fused", [None, False, True], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", WIDE_CASES, ids=str)
def test_split_warps8_matches_cpu_reference(case, force_fused):
    dp, want, base_out = reference(case, seed=51)
    got = run_wide(dp, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} split_warps=8 fused={force_fused}")


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, BF16, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in WIDE_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "g3_topk33", "m3_b1_cluster", "m3_b1_ctx128k_w8",
    "m3_b4_w8_partial_blocks", "m3_b8_w8_fp16", "m3_b1_cluster_fp8", "m3_b4_w8_fp8_partial_blocks",
    "m3_b8_w8_fp8_fp16")], ids=str)
def test_split_warps8_partial_dtypes(case, partial_dtype):
    dp, want, base_out = reference(case, seed=52)
    got = run_wide(dp, force_fused=False, partial_dtype=partial_dtype)
    check_against_reference(dp, got, want, base_out, f"{case} split_warps=8 partial {partial_dtype}",
                            partial_dtype=partial_dtype)


@pytest.mark.parametrize("partial_dtype", [None, torch.float32], ids=str)
@pytest.mark.parametrize("case", [c for c in WIDE_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "fp16", "g1_topk1", "g3_topk33", "g4_topk64", "some_empty_rows",
    "invalid_pages", "m3_b1_cluster", "m3_b1_ctx128k_w8", "m3_b8_w8_holes", "m3_b1_cluster_fp8",
    "m3_b1_ctx128k_w8_fp8", "m3_b8_w8_fp8_holes", "fp8_q_fp8_kv", "w8_fp8_scales_invalid_pages")],
    ids=str)
def test_split_warps8_deterministic_and_close_to_4_warps(case, partial_dtype):
    """Bit for bit the same on every run (the fixed merge order); the same -inf pattern as the
    4-warp kernel (fp8 K/V: the 4-warp register kernel, auto's with split_warps=4) and within the
    fused vs split bound of it (other per-warp key slices, a merge of 8 states instead of 4: not
    bit-identical). Where the plan runs the 8-warp kernel, the split count is the 4-warp kernel's
    for these (<= 16 blocks per row, a block per split at B1 .. B4)."""
    dp = problem(case, seed=53)
    extra = dict(force_fused=False, partial_dtype=partial_dtype)
    w8 = run_wide(dp, **extra)
    w4 = run_wide(dp, warps=4, **extra)
    for _ in range(2):
        assert bits_equal(w8, run_wide(dp, **extra)), f"{case}: split_warps=8 not deterministic"
    assert torch.equal(torch.isinf(w8[1]), torch.isinf(w4[1]))
    diff = float((w8[0].double() - w4[0].double()).abs().max())
    assert diff < 5e-3, f"split_warps 8 vs 4: max |diff| {diff:.3e}"


@pytest.mark.parametrize("layout", ["flat", "packed"])
def test_split_warps8_paged_equals_flat(layout):
    case = DecodeCase("w", 2, 1, 64, 4, seqlens=[5000, 3000])
    other = problem(case, seed=54, layout=layout)
    paged = problem(case, seed=54, layout="paged")
    assert bits_equal(run_wide(other, force_fused=False), run_wide(paged, force_fused=False))


@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_split_warps8_plan_names_the_path(kv):
    """B1 / M3 with 16-bit or fp8 K/V: 16 splits on the 8-warp kernel with the 4-warp kernel's
    workspace, auto's choice too (fp8: where a split holds one block; at B8, two blocks a split,
    auto keeps the 4-warp register kernel); NVFP4 K/V, fp8 under a forced kernel, fused calls and
    MTP union items fall back and say why; split_warps=4 keeps the 4-warp kernel with the same
    workspace."""
    dp = build_decode(DecodeCase("w", 1, 1, 64, 4, kv=kv, seqlens=[32768]), seed=55)
    text = _decode_plan_text(dp, dict(split_warps=8)).split("): ", 1)[1]
    auto = _decode_plan_text(dp, None).split("): ", 1)[1]
    four = _decode_plan_text(dp, dict(split_warps=4)).split("): ", 1)[1]
    assert "split_warps" not in four and "falls back to 4 warps" not in auto, (four, auto)
    smem = _decode_plan_text(dp, dict(kernel="smem", split_warps=8)).split("): ", 1)[1]
    if kv in ("same", "fp8"):
        assert "split-K: 16 chunks per row" in text and "; split_warps=8 (8 warps per CTA" in text, text
        assert text.split("workspace ")[1] == four.split("workspace ")[1], (text, four)
        assert auto == text, (auto, text)
    if kv == "same":
        assert "; split_warps=8 (8 warps per CTA" in smem, smem  # the shared-memory kernel's own
    elif kv == "fp8":
        assert "; fp8 K/V converted in registers by the 8-warp kernel" in text and "kernel=regs" not in text, text
        b8 = build_decode(DecodeCase("w", 8, 1, 64, 4, kv=kv, seqlens=[4096] * 8), seed=57)
        auto8 = _decode_plan_text(b8, None).split("): ", 1)[1]
        assert "split_warps" not in auto8 and "kernel=regs" in auto8, auto8
        assert "split_warps=8 falls back to 4 warps: fp8 K/V under kernel=smem" in smem, smem
        regs = _decode_plan_text(dp, dict(kernel="regs", split_warps=8)).split("): ", 1)[1]
        assert "split_warps=8 falls back to 4 warps: kernel=regs" in regs, regs
    else:
        assert "split_warps" not in auto, auto
        assert "split_warps=8 falls back to 4 warps: kernel=regs" in text, text
        assert "split_warps=8 falls back to 4 warps: NVFP4 K/V" in smem, smem
    fused = _decode_plan_text(dp, dict(split_warps=8), force_fused=True).split("): ", 1)[1]
    fused_auto = _decode_plan_text(dp, None, force_fused=True).split("): ", 1)[1]
    assert "fused: outputs written directly" in fused and "split_warps" not in fused_auto, (fused, fused_auto)
    if kv in ("same", "fp8"):  # a forced 8 runs fused calls too (auto keeps 4 warps there)
        assert "; split_warps=8 (8 warps per CTA" in fused and "workspace 0 bytes" in fused, fused
    mtp = build_decode(DecodeCase("w", 1, 4, 64, 4, kv=kv, seqlens=[32768]), seed=56)
    text = _decode_plan_text(mtp, dict(split_warps=8, mtp="union")).split("): ", 1)[1]
    assert "mtp=union" in text and "split_warps=8 falls back to 4 warps: MTP union items" in text, text


# split=cluster on the 8-warp kernel (query_major_wide.cuh kCluster; split_warps=8 or auto where it
# applies: per-token items of G <= 16 heads, 16-bit K/V of the compute dtype or fp8 K/V under
# kernel=auto): one CTA per SM, the merged partial of each CTA kept in its shared memory and merged
# by the cluster with the combine's code, so it equals split=blocks on 8 warps bit for bit where
# the two split alike. Cases where the 8-warp kernel does not apply fall back (the plan says why)
# and must still be right.
WIDE_CLUSTER_CASES = WIDE_CASES + [c for c in CLUSTER_CASES if c.name == "m3_b4_cluster_nvfp4"]


@pytest.mark.parametrize("force_fused", [None, False], ids=lambda f: f"fused={f}")
@pytest.mark.parametrize("case", WIDE_CLUSTER_CASES, ids=str)
def test_split_cluster_8_warps_matches_cpu_reference(case, force_fused):
    dp, want, base_out = reference(case, seed=47)
    got = run_cluster(dp, split_warps=8, force_fused=force_fused)
    check_against_reference(dp, got, want, base_out, f"{case} cluster 8 warps fused={force_fused}")


@pytest.mark.parametrize("partial_dtype", [None, torch.float32, FP16, FP8], ids=str)
@pytest.mark.parametrize("case", [c for c in WIDE_CLUSTER_CASES if c.name in (
    "spec_4_2_16_2_bf16_paged", "spec_8_1_8_2_fp8_paged", "fp16", "g1_topk1", "g3_topk33",
    "g4_topk64", "some_empty_rows", "invalid_pages", "holes", "m3_b1_cluster", "m3_b1_cluster_fp8",
    "m3_b1_ctx128k_w8_fp8", "m3_b4_w8_partial_blocks", "m3_b4_w8_fp8_partial_blocks", "m3_b8_w8_fp8_fp16",
    "w8_fp8_scales_invalid_pages", "m3_b4_cluster_nvfp4")], ids=str)
def test_split_cluster_8_warps_bitwise_equals_blocks(case, partial_dtype):
    """The 8-warp cluster kernel against split=blocks on 8 warps (partials + the combine kernel):
    bit-identical with the same split count (the cluster plans for one CTA per SM, blocks for two,
    so at some batches the counts differ: then within the fused vs split bound, the same -inf
    pattern); right against the reference with every partial dtype; deterministic."""
    dp = problem(case, seed=48)
    extra = dict(force_fused=False, partial_dtype=partial_dtype)
    cluster = run_cluster(dp, split_warps=8, **extra)
    blocks = run_cluster(dp, split="blocks", split_warps=8, **extra)
    text_c = _decode_plan_text(dp, dict(mtp="per_token", split="cluster", split_warps=8), **extra)
    text_b = _decode_plan_text(dp, dict(mtp="per_token", split="blocks", split_warps=8), **extra)
    wide = "; split_warps=8 (8 warps per CTA" in text_c
    if HAS_CLUSTERS:
        clustered = _clustered(case, text_c)
        assert wide == (case.kv != "nvfp4"), text_c  # every case here but NVFP4 K/V is on 8 warps
        assert "split_warps=8 falls back" in text_c or wide, text_c
        assert (", one per SM," in text_c) == (wide and clustered), text_c
    if _splits_of(text_c) == _splits_of(text_b) and wide == ("; split_warps=8 (8 warps per CTA" in text_b):
        assert bits_equal(cluster, blocks), f"{case}: 8-warp cluster vs blocks not bit-identical"
    else:
        assert torch.equal(torch.isinf(cluster[1]), torch.isinf(blocks[1]))
        diff = float((cluster[0].double() - blocks[0].double()).abs().max())
        assert diff < 5e-3, f"cluster vs blocks: max |diff| {diff:.3e}"
    dp_r, want, base_out = reference(case, seed=48)
    check_against_reference(dp_r, cluster, want, base_out, f"{case} cluster 8 warps partial {partial_dtype}",
                            partial_dtype=partial_dtype)
    assert bits_equal(cluster, run_cluster(dp, split_warps=8, **extra))  # deterministic


def test_split_cluster_8_warps_plan_and_graph():
    """B1 / M3 bf16 and fp8: auto's split_warps takes the 8-warp clusters under split=cluster (16
    CTAs, one per SM, no workspace); a captured call replays bit-identically on new inputs."""
    for kv in ("same", "fp8"):
        dp = build_decode(DecodeCase("c8", 1, 1, 64, 4, kv=kv, seqlens=[32768]), seed=49)
        text = _decode_plan_text(dp, dict(split="cluster")).split("): ", 1)[1]
        if not HAS_CLUSTERS:
            assert "split=cluster falls back to blocks" in text, text
            continue
        assert "split=cluster (a cluster of 16 CTAs per row, one per SM," in text, text
        assert "; split_warps=8 (8 warps per CTA" in text and "workspace 0 bytes" in text, text
        four = _decode_plan_text(dp, dict(split="cluster", split_warps=4)).split("): ", 1)[1]
        assert ", one per SM," not in four and "split_warps=8" not in four, four
        eager = run_cluster(dp, split_warps=8)
        call = functools.partial(msa_ops._sparse_decode_planned, *dp.gpu_args, **dp.gpu_kwargs,
                                 options=dict(split="cluster", split_warps=8))
        call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        graph.replay()
        torch.cuda.synchronize()
        assert bits_equal(tuple(out), eager), kv
        q = dp.gpu_args[0]
        q.copy_(torch.randn_like(q.float()).to(q.dtype))
        want = run_cluster(dp, split_warps=8)
        graph.replay()
        torch.cuda.synchronize()
        assert bits_equal(tuple(out), want), kv

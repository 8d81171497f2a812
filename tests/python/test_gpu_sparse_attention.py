"""msa_sparse_attention on the GPU against the same op on the same data as CPU tensors (the exact
C++ reference), under every prefill schedule and KV-major kernel (forced through the plan options of
msa_ops._sparse_attention_planned: query_major, kv_major with either kernel, hybrid).

Tolerances come from a same-precision baseline (STYLE habit 13): a torch implementation that
computes like a kernel does (compute-dtype inputs, fp32 scores and accumulation, P rounded to the
compute dtype, output rounded) is compared with the reference, and the kernel may be at most twice
as far from the reference plus two units in the last place of the output dtype. The -inf / zero
patterns of rows with no visible key are checked exactly, LSEs within 1e-2.

Cases are data (flashmsa.testing.cases.ATTENTION, those with the "gpu" check): the reference
cases of docs/semantics.md#accuracy, the M3 shapes, GQA groups 1/3/4/16/64, topk 1/8/16/33/64, uneven lengths, empty sequences, seqlen_q > seqlen_k, rows no
sequence covers, q_offset as int / tensor / negative, unsorted / duplicated / -1-holed /
out-of-range lists, paged caches with permuted pages, a partial last page and invalid page ids,
packed HND / NHD views, fp8 and NVFP4 K/V (flashmsa.testing.nvfp4's quantizer), global scales, LSE and
temperature LSE, fully masked rows. Plus: bit-exact equalities (paged == flat, packed == contiguous,
KV-major launch groups of any size == one group), run-to-run determinism, and a large case (>= 64K
tokens, total_q * Hq > 2^24).

A case's inputs and its CPU reference and baseline results are memoised per xdist worker
(``problem`` / ``reference``, conftest.Memo): the schedules of one case (the last, fastest-varying
parameter of each test) build and compute them once instead of once per schedule.

Skipped (not passed) without a CUDA device or without a CUDA build.
"""

from __future__ import annotations

import dataclasses
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
from flashmsa.testing import cases, nvfp4, pack_kv, paginate  # noqa: E402

from flashmsa.testing import reference as ref  # noqa: E402

if not flashmsa.built_with_cuda():
    pytest.skip("flashmsa was built without CUDA kernels", allow_module_level=True)

DEV = torch.device("cuda")
BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
BLOCK = 128
# kv_major runs the sm_90a warpgroup-MMA kernel on an sm_90 GPU (forced there, so a library without
# it fails instead of silently testing the portable one) and the mma.sync kernel elsewhere;
# kv_major_mma_sync forces the portable kernel everywhere.
# hybrid: shared-selection tiles (sm_90a) for the tiles that qualify, KV-major for the rest, with
# the default tile kernel (the TMA one where it runs; fp8 K/V take the cp.async one);
# hybrid_cp_async: the same with the cp.async tile kernel forced (tile_kernel=cp_async).
# kv_major_lists_once / hybrid_lists_once: kv_major / hybrid with the work lists of all launch
# groups built at once (lists=once, the default where it fits), in groups of 64 rows so that most
# cases run several (an explicit chunk_rows of a test replaces the 64); kv_major_per_group /
# hybrid_per_group: the same groups with each group's lists built before it (lists=per_group).
SCHEDULES = ["query_major", "kv_major", "kv_major_mma_sync", "hybrid", "hybrid_cp_async",
             "kv_major_lists_once", "hybrid_lists_once", "kv_major_per_group", "hybrid_per_group",
             "kv_major_tma", "hybrid_tma", "kv_major_tma_groups", "kv_major_stg", "hybrid_stg",
             "kv_major_precise", "hybrid_precise"]
IS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def plan_options(schedule: Optional[str], **extra) -> Optional[dict]:
    """Plan options of one schedule name of SCHEDULES (None: the library's own plan), plus extra
    options (chunk_rows, tile_max_waste)."""
    if schedule is None:
        return dict(extra) if extra else None
    options = {
        "query_major": dict(schedule="query_major"),
        "kv_major": dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto"),
        "kv_major_mma_sync": dict(schedule="kv_major", kv_major_kernel="mma_sync"),
        "hybrid": dict(schedule="hybrid", kv_major_kernel="auto"),
        "hybrid_cp_async": dict(schedule="hybrid", kv_major_kernel="auto", tile_kernel="cp_async"),
        "kv_major_lists_once": dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto",
                                    lists="once", chunk_rows=64),
        "hybrid_lists_once": dict(schedule="hybrid", kv_major_kernel="auto", lists="once", chunk_rows=64),
        "kv_major_per_group": dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto",
                                   lists="per_group", chunk_rows=64),
        "hybrid_per_group": dict(schedule="hybrid", kv_major_kernel="auto", lists="per_group", chunk_rows=64),
        # The TMA KV-major kernel (kv_major_kernel=tma; where it does not apply, e.g. fp8 / NVFP4
        # K/V, G = 4, or off sm_90, the plan falls back to the kernel auto takes): alone, under
        # the tiles, and in launch groups of 64 rows.
        "kv_major_tma": dict(schedule="kv_major", kv_major_kernel="tma"),
        "hybrid_tma": dict(schedule="hybrid", kv_major_kernel="tma"),
        "kv_major_tma_groups": dict(schedule="kv_major", kv_major_kernel="tma", chunk_rows=64),
        # The warpgroup-MMA KV-major kernel writing its partials by each lane's 16-byte stores
        # (kv_major_store=stg; auto's TMA stores where G is a multiple of 16 since 73ba220's H200
        # run), in launch groups of 64 rows, and under the tiles.
        "kv_major_stg": dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto",
                             kv_major_store="stg", chunk_rows=64),
        "hybrid_stg": dict(schedule="hybrid", kv_major_kernel="auto", kv_major_store="stg"),
        # ... its row LSEs' log2 and 1 / l correctly rounded (kv_major_math=precise; auto's are
        # MUFU approximations on that kernel since 0b8aa64's H200 run).
        "kv_major_precise": dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto",
                                 kv_major_math="precise", chunk_rows=64),
        "hybrid_precise": dict(schedule="hybrid", kv_major_kernel="auto", kv_major_math="precise"),
    }[schedule]
    return {**options, **extra}


# ---- cases -------------------------------------------------------------------------------------

GpuCase = cases.AttentionCase
CASES = cases.cases(cases.ATTENTION, "gpu")


# ---- inputs ------------------------------------------------------------------------------------

def q_offsets_of(case: GpuCase) -> List[int]:
    if case.q_offset is None:
        return [k - q for q, k in zip(case.seqs_q, case.seqs_k)]
    if isinstance(case.q_offset, int):
        return [case.q_offset] * len(case.seqs_q)
    return list(case.q_offset)


def make_q2k(case: GpuCase, rng: np.random.Generator) -> torch.Tensor:
    """(Hkv, total_q + extra_rows, topk) int32 of the case's selection kind."""
    total_q = sum(case.seqs_q) + case.extra_rows
    sel = np.full((case.hkv, total_q, case.topk), -1, dtype=np.int32)
    offs = q_offsets_of(case)
    row = 0
    # tile_shared / tile_mixed: a token reuses the list of the first token of its group of
    # `share` rows (global rows, as the tiles are cut; groups restart with each sequence); in
    # tile_mixed every other group draws per-token lists instead.
    group = case.hq // case.hkv
    share = 128 // group if group >= 16 and 128 % group == 0 else 8
    shared = {}
    for b, (sq, sk) in enumerate(zip(case.seqs_q, case.seqs_k)):
        nb = math.ceil(sk / BLOCK)
        for i in range(sq):
            for h in range(case.hkv):
                kind = case.selection
                if kind in ("tile_shared", "tile_mixed"):
                    gstart = row // share
                    if kind == "tile_mixed" and gstart % 2 == 1:
                        kind = "causal_local"
                    elif (h, gstart, b) in shared:
                        ids = shared[(h, gstart, b)]
                        sel[h, row, :len(ids)] = ids
                        continue
                    else:
                        kind = "causal_local"
                if kind == "causal_local" and case.selection in ("tile_shared", "tile_mixed") \
                        and not case.causal:
                    kind = "full"
                n = int(rng.integers(0, min(case.topk, nb) + 1)) if nb else 0
                ids = np.sort(rng.permutation(nb)[:n])
                if kind == "full":
                    ids = np.sort(rng.permutation(nb)[:min(case.topk, nb)])
                elif kind == "some_empty" and rng.random() < 0.35:
                    ids = ids[:0]
                elif kind == "unsorted":
                    ids = rng.permutation(ids)
                elif kind == "duplicates":
                    ids = rng.permutation(np.concatenate([ids, ids]))[:case.topk]
                elif kind == "out_of_range":
                    extra = np.array([nb, nb + 3, 10 ** 6])[:max(case.topk - n, 0)]
                    ids = rng.permutation(np.concatenate([ids, extra]))
                elif kind == "holes":  # entries after the first -1 are ignored, whatever they hold
                    k = n // 2
                    ids = np.concatenate([ids[:k], [-1], ids[k:]])[:case.topk]
                elif kind == "sink_local":
                    local = min(max(offs[b] + i, 0) // BLOCK, nb - 1)
                    ids = np.array([0, local // 2, local])[:case.topk]
                elif kind == "last_two":
                    ids = np.array([nb - 2, nb - 1]) if i < 64 else ids
                elif kind == "causal_local":
                    local = min(max(offs[b] + i, 0) // BLOCK, nb - 1)
                    earlier = rng.permutation(local)[:case.topk - 1]
                    ids = np.sort(np.concatenate([earlier, [local]]))
                if case.selection in ("tile_shared", "tile_mixed") and kind in ("causal_local", "full"):
                    shared.setdefault((h, row // share, b), ids)
                sel[h, row, :len(ids)] = ids
            row += 1
    # Rows of no sequence carry ordinary lists: the kernels must still write 0 / -inf there.
    sel[:, row:, :min(2, case.topk)] = 0
    return torch.from_numpy(sel)


def quantize_nvfp4(x: torch.Tensor, gsf: float):
    """x (..., 128) float -> (data (..., 64) uint8, scales uint8, e2m1 * e4m3 values float32):
    flashmsa.testing.nvfp4's quantizer at global scale gsf, and the values the kernels dequantize
    (no global scale); the op receives 1 / gsf as its global scale."""
    data, scales, _ = nvfp4.quantize_nvfp4(x, global_scale=gsf)
    return data, scales, nvfp4.dequantize_nvfp4(data, scales)


@dataclasses.dataclass
class Problem:
    """One case's inputs on CPU and on the GPU, plus what the baseline needs."""
    cpu_args: tuple
    cpu_kwargs: dict
    gpu_args: tuple
    gpu_kwargs: dict
    q: torch.Tensor                 # CPU, compute dtype
    keys: List[torch.Tensor]        # per sequence (seqlen_k, Hkv, 128) float32, dequantized
    values: List[torch.Tensor]
    dropped: List[set]              # per sequence: blocks whose page id is invalid
    scale: float                    # effective softmax scale
    out_scale: float


def _to_device(t, device):
    return t.to(device) if isinstance(t, torch.Tensor) else t


def _views_on(cache: torch.Tensor, k_view: torch.Tensor, v_view: torch.Tensor, device):
    """The packed views re-taken on a copy of their cache on `device` (views of one buffer)."""
    base = cache.to(device)
    k = torch.as_strided(base, k_view.shape, k_view.stride(), k_view.storage_offset())
    v = torch.as_strided(base, v_view.shape, v_view.stride(), v_view.storage_offset())
    return k, v


def build(case: GpuCase, seed: int = 0, q2k: Optional[torch.Tensor] = None) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    total_q = sum(case.seqs_q) + case.extra_rows
    total_k = sum(case.seqs_k)
    q = (torch.randn(total_q, case.hq, 128, generator=gen) / 3).to(case.dtype)
    k = torch.randn(total_k, case.hkv, 128, generator=gen) / 3
    v = torch.randn(total_k, case.hkv, 128, generator=gen) / 3
    q2k = make_q2k(case, rng) if q2k is None else q2k
    cu_q = ref.cu_seqlens(case.seqs_q)
    cu_k = ref.cu_seqlens(case.seqs_k)
    kw = dict(causal=case.causal, softmax_scale=case.softmax_scale)
    scale = case.softmax_scale if case.softmax_scale is not None else 128 ** -0.5
    out_scale = 1.0
    paged = case.layout != "flat"
    storage_dtype = FP8 if case.kv == "fp8" else case.dtype
    dropped = [set() for _ in case.seqs_k]
    if paged:
        cache, page_table, seqused = paginate(torch.cat([k, v], 1).to(case.dtype), case.seqs_k,
                                              generator=gen, extra_pages=2)
        k_st, v_st = cache[:, :case.hkv].contiguous(), cache[:, case.hkv:].contiguous()
        kw.update(page_table=page_table, seqused_k=seqused)
    else:
        k_st, v_st = k.to(case.dtype), v.to(case.dtype)
        kw.update(cu_seqlens_k=cu_k)
    if case.kv == "nvfp4":
        # One global scale per tensor from the real rows, so flat and paged caches quantize every
        # real row identically. The kernels dequantize e2m1 * e4m3 and fold k_global_scale into
        # the softmax scale and v_global_scale into the output: so does the baseline.
        kgs, vgs = float(k.abs().max()) / (448 * 6), float(v.abs().max()) / (448 * 6)
        k_st, ks, k_deq = quantize_nvfp4(k_st, 1.0 / kgs)
        v_st, vs, v_deq = quantize_nvfp4(v_st, 1.0 / vgs)
        scale *= kgs
        out_scale = vgs
        kw.update(k_scale=ks, v_scale=vs, k_global_scale=kgs, v_global_scale=vgs)
    else:
        k_st, v_st = k_st.to(storage_dtype), v_st.to(storage_dtype)
        k_deq, v_deq = k_st.float(), v_st.float()
    if case.v_global_scale is not None:
        kw["v_global_scale"] = case.v_global_scale
        out_scale = case.v_global_scale
    if case.temperature is not None:
        kw.update(return_temperature_lse=True, lse_temperature_scale=case.temperature)
    else:
        kw.update(return_softmax_lse=True)
    if isinstance(case.q_offset, list):
        kw["q_offset"] = torch.tensor(case.q_offset, dtype=torch.int32)
    elif case.q_offset is not None:
        kw["q_offset"] = case.q_offset

    loc = dict(page_table=kw.get("page_table"), seqused_k=kw.get("seqused_k"),
               cu_seqlens_k=None if paged else cu_k)
    keys = ref.sequences(k_deq, **loc)
    values = ref.sequences(v_deq, **loc)
    if case.invalid_pages:
        # Selected blocks whose page id lies outside the cache contribute no key (semantics.h
        # kv_page): -3, num_pages + 5 and num_pages, one per sequence. Values were read above.
        table = kw["page_table"].clone()
        num_pages = k_st.shape[0]
        for b, sk in enumerate(case.seqs_k):
            nb = math.ceil(sk / BLOCK)
            if nb > 1:
                t = 1 + b % (nb - 1)
                table[b, t] = [-3, num_pages + 5, num_pages][b % 3]
                dropped[b].add(t)
        kw["page_table"] = table

    cpu_kv = (k_st, v_st)
    if case.layout.startswith("packed"):
        cache, kv_k, kv_v = pack_kv(k_st, v_st, nhd=case.layout == "packed_nhd")
        cpu_kv = (kv_k, kv_v)
        gpu_kv = _views_on(cache, kv_k, kv_v, DEV)
        assert not gpu_kv[0].is_contiguous()
    elif case.layout == "nhd":  # separate K and V caches, NHD pages seen as (P, H, 128, W)
        cpu_kv = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k_st, v_st))
        gpu_kv = tuple(x.transpose(1, 2).contiguous().to(DEV).transpose(1, 2) for x in (k_st, v_st))
        assert not gpu_kv[0].is_contiguous() or case.hkv == 1  # one head: the same layout
    else:
        gpu_kv = (k_st.to(DEV), v_st.to(DEV))
    cpu_args = (q, *cpu_kv, q2k, cu_q)
    gpu_args = (q.to(DEV), *gpu_kv, q2k.to(DEV), cu_q.to(DEV))
    gpu_kw = {name: _to_device(val, DEV) for name, val in kw.items()}
    return Problem(cpu_args, kw, gpu_args, gpu_kw, q, keys, values, dropped, scale, out_scale)


# ---- same-precision baseline -------------------------------------------------------------------

def baseline(case: GpuCase, pb: Problem, q2k: torch.Tensor, rows: Optional[range] = None):
    """Attention computed the way a kernel does it, on the GPU: compute-dtype Q / K / V (the
    dequantized fp8 / NVFP4 values are exact there), fp32 scores, softmax and accumulation, P rounded
    to the compute dtype before P V, output rounded to q's dtype. Returns (out, lse) on the CPU."""
    total_q = pb.q.shape[0]
    g = case.hq // case.hkv
    out = torch.zeros(total_q, case.hq, 128, dtype=torch.float32)
    lse = torch.full((total_q, case.hq), float("-inf"), dtype=torch.float32)
    lists = q2k.tolist()
    offs = q_offsets_of(case)
    start = 0
    cdt = case.dtype
    for b, (sq, sk) in enumerate(zip(case.seqs_q, case.seqs_k)):
        if sq == 0 or sk == 0:
            start += sq
            continue
        nb = math.ceil(sk / BLOCK)
        kb = pb.keys[b].to(cdt).float().to(DEV)    # (sk, Hkv, 128)
        vb = pb.values[b].to(cdt).float().to(DEV)
        i = torch.arange(sq, device=DEV)[:, None]
        j = torch.arange(sk, device=DEV)[None, :]
        visible = (j <= offs[b] + i) if case.causal else torch.ones(sq, sk, dtype=torch.bool,
                                                                     device=DEV)
        for kh in range(case.hkv):
            block_mask = torch.zeros(sq, nb, dtype=torch.bool)
            for r in range(sq):
                for t in ref.selected_blocks(lists[kh][start + r], nb):
                    if t not in pb.dropped[b]:
                        block_mask[r, t] = True
            mask = block_mask.to(DEV).repeat_interleave(BLOCK, dim=1)[:, :sk] & visible
            qh = pb.q[start:start + sq, kh * g:(kh + 1) * g].to(DEV).float()   # (sq, G, 128)
            s = torch.einsum("igd,jd->gij", qh, kb[:, kh]) * pb.scale          # (G, sq, sk)
            s = s.masked_fill(~mask, float("-inf"))
            m = s.amax(-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            p = torch.exp(s - m)
            l = p.sum(-1)                                                       # (G, sq)
            o = torch.einsum("gij,jd->igd", p.to(cdt).float(), vb[:, kh])
            o = o / torch.where(l > 0, l, 1.0).T[..., None] * pb.out_scale
            out[start:start + sq, kh * g:(kh + 1) * g] = o.cpu()
            lse[start:start + sq, kh * g:(kh + 1) * g] = (m.squeeze(-1) + torch.log(l)).T.cpu()
        start += sq
    return out.to(cdt), lse


# ---- comparisons -------------------------------------------------------------------------------

def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of `dtype` values at `magnitude`."""
    mant = {BF16: 7, FP16: 10}[dtype]
    return 2.0 ** (math.floor(math.log2(max(magnitude, 2.0 ** -14))) - mant)


def check_output(gpu: torch.Tensor, cpu: torch.Tensor, base: torch.Tensor, what: str,
                 extra_tol: float = 0.0):
    """|gpu - ref| <= 2 |base - ref| + 2 ulp (+ extra_tol), max over the tensor; no NaN."""
    g = gpu.detach().cpu().double()
    c = cpu.detach().cpu().double()
    bb = base.detach().cpu().double()
    assert not torch.isnan(g).any(), f"{what}: {int(torch.isnan(g).sum())} NaN elements"
    err = float((g - c).abs().max()) if g.numel() else 0.0
    base_err = float((bb - c).abs().max()) if g.numel() else 0.0
    mag = float(c.abs().max()) if g.numel() else 0.0
    tol = 2 * base_err + 2 * ulp(gpu.dtype, mag) + extra_tol
    assert err <= tol, f"{what}: max |gpu - ref| {err:.3e} > {tol:.3e} (baseline {base_err:.3e})"


def check_lse(gpu: torch.Tensor, cpu: torch.Tensor, what: str, atol: float = 1e-2):
    g, c = gpu.detach().cpu().double(), cpu.detach().cpu().double()
    assert not torch.isnan(g).any(), f"{what}: NaN"
    assert torch.equal(torch.isinf(g), torch.isinf(c)), f"{what}: -inf pattern differs"
    assert bool((g[torch.isinf(g)] < 0).all()), f"{what}: +inf"
    fin = torch.isfinite(c)
    if fin.any():
        err = float((g[fin] - c[fin]).abs().max())
        assert err <= atol, f"{what}: max |gpu - ref| {err:.3e} > {atol}"


def check_empty_rows(out: torch.Tensor, lse_ref: torch.Tensor, what: str):
    """D8: rows whose reference LSE is -inf are exactly 0."""
    empty = torch.isinf(lse_ref)
    assert bool((out.detach().cpu()[empty] == 0).all()), f"{what}: empty rows are not exactly 0"


def run(pb: Problem, gpu: bool, schedule: Optional[str] = None, **options):
    """The op on the GPU (under a schedule of SCHEDULES and extra plan options, or the library's
    own plan) or on the CPU (the reference, which has no plan)."""
    if gpu:
        result = msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs,
                                                   options=plan_options(schedule, **options))
        torch.cuda.synchronize()
        return result
    return msa_ops.msa_sparse_attention(*pb.cpu_args, **pb.cpu_kwargs)


_PROBLEMS = Memo(size=4)
_REFERENCES = Memo(size=2)


def problem(case: GpuCase, seed: int = 0, q2k_seed: Optional[int] = None) -> Problem:
    """build(case, seed), memoised (read only). q2k_seed: the selection of make_q2k with that seed
    instead of the case's own (twins that must share their selections)."""
    def make():
        q2k = None if q2k_seed is None else make_q2k(case, np.random.default_rng(q2k_seed))
        return build(case, seed=seed, q2k=q2k)
    return _PROBLEMS((repr(case), seed, q2k_seed), make)


def reference(case: GpuCase, seed: int = 0):
    """(problem, CPU result, baseline output) of build(case, seed), memoised (read only)."""
    def make():
        pb = problem(case, seed)
        base_out, _ = baseline(case, pb, pb.cpu_args[3])
        return pb, run(pb, gpu=False), base_out
    return _REFERENCES((repr(case), seed), make)


def bits_equal(a, b) -> bool:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return all(x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8),
                                                  y.contiguous().view(torch.uint8))
               for x, y in zip(a, b))


# The last (fastest-varying) parameter of the tests that run every schedule: a case's schedules are
# adjacent and share its memoised problem.
each_schedule = pytest.mark.parametrize("schedule", SCHEDULES)


# ---- tests -------------------------------------------------------------------------------------

@each_schedule
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gpu_matches_cpu_reference(case, schedule):
    pb, cpu, base_out = reference(case)
    gpu = run(pb, gpu=True, schedule=schedule)
    out, lse = gpu[0], gpu[1]
    assert out.dtype == case.dtype and out.shape == pb.gpu_args[0].shape and out.is_cuda
    assert lse.dtype == torch.float32 and lse.shape == out.shape[:2]
    check_output(out, cpu[0], base_out, f"{case}/{schedule} out")
    check_lse(lse, cpu[1], f"{case}/{schedule} lse")
    check_empty_rows(out, cpu[1], f"{case}/{schedule}")
    if case.temperature is not None:
        check_lse(gpu[2], cpu[2], f"{case}/{schedule} lse_t")


@pytest.mark.parametrize("selection", ["random", "causal_local"])
def test_schedules_agree(selection):
    """Both schedules on the same M3-shaped input: each within the baseline bound of the reference,
    and within 2 ulp-scale of each other."""
    case = GpuCase("m3", [700], [1500], 64, 4, causal=True, selection=selection)
    pb = build(case, seed=3)
    got = {}
    for name in SCHEDULES:
        got[name] = run(pb, gpu=True, schedule=name)
    base_out, _ = baseline(case, pb, pb.cpu_args[3])
    cpu = run(pb, gpu=False)
    for name, res in got.items():
        check_output(res[0], cpu[0], base_out, f"{name} out")
        check_lse(res[1], cpu[1], f"{name} lse")
        check_lse(got["query_major"][1], res[1], f"query_major vs {name} lse", atol=1e-3)


@pytest.mark.parametrize("kernel", ["kv_major", "kv_major_mma_sync", "kv_major_tma", "kv_major_stg"])
@pytest.mark.parametrize("chunk_rows", [1, 37, 500])
def test_kv_major_launch_groups_are_exact(chunk_rows, kernel):
    """A KV-major partial depends only on its (row, block): any split of the rows into launch
    groups gives bit-identical results (also exercises list rebuilding between groups)."""
    case = GpuCase("groups", [300, 5, 211], [2000, 100, 3000], 16, 2, causal=True,
                   temperature=0.9, selection="causal_local")
    pb = build(case, seed=4)
    whole = run(pb, gpu=True, schedule=kernel)
    grouped = run(pb, gpu=True, schedule=kernel, chunk_rows=chunk_rows)
    assert bits_equal(whole, grouped)
    cpu = run(pb, gpu=False)
    check_lse(grouped[1], cpu[1], "lse")
    check_lse(grouped[2], cpu[2], "lse_t")


@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
@pytest.mark.parametrize("hq,hkv", [(64, 4), (8, 2)])
def test_kv_major_approx_math_is_close_to_precise(hq, hkv, kv):
    """kv_major_math=approx (auto's): the partial LSEs' log2 and 1 / l by MUFU.LG2 / MUFU.RCP.
    Not the same bits as precise: the same -inf LSEs, empty rows exactly 0 (D8), LSEs within 1e-5
    and outputs within two roundings of the compute dtype (relative to the output's largest
    magnitude) of precise's, run-to-run bit-identical and the same as auto's; against the CPU
    reference. (Elementwise zero patterns may differ: NVFP4 V's few values cancel exactly in one
    and not in the other, as seen on the H200 at 0b8aa64.)"""
    case = GpuCase("approx_math", [300, 5, 211], [2000, 100, 3000], hq, hkv, causal=True,
                   temperature=0.9, selection="causal_local", kv=kv)
    pb = build(case, seed=13)
    base = dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto")
    precise = run(pb, gpu=True, kv_major_math="precise", **base)
    approx = run(pb, gpu=True, kv_major_math="approx", **base)
    assert bits_equal(approx, run(pb, gpu=True, kv_major_math="approx", **base))
    assert bits_equal(approx, run(pb, gpu=True, **base))
    out_p, out_a = precise[0].detach().cpu().double(), approx[0].detach().cpu().double()
    assert not torch.isnan(out_a).any()
    cpu = run(pb, gpu=False)
    check_empty_rows(approx[0], cpu[1], "approx")
    eps = 2.0 ** -8 if case.dtype == BF16 else 2.0 ** -11
    err = float((out_a - out_p).abs().max())
    assert err <= 2 * eps * float(out_p.abs().max()), f"max |approx - precise| {err:.3e}"
    for i, what in ((1, "lse"), (2, "lse_t")):
        check_lse(approx[i], precise[i], what, atol=1e-5)
    check_lse(approx[1], cpu[1], "lse")
    check_lse(approx[2], cpu[2], "lse_t")


@pytest.mark.parametrize("chunk_rows", [None, 1, 37])
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
@pytest.mark.parametrize("hq,hkv", [(64, 4), (64, 2), (128, 1), (8, 2)])
def test_kv_major_store_tma_is_bitwise(hq, hkv, kv, chunk_rows):
    """kv_major_store=tma (auto's where G % 16 == 0) stores the warpgroup-MMA kernel's staged
    partials by TMA instead of each lane's 16-byte stores: the same bytes at the same rows, so bit-identical to stg, with G = 16,
    32 and 64 (where it runs), whole and in launch groups (partial tiles, padding warps), every
    K/V kind (fp8 / NVFP4 stage through the query area the stores read from), temperature LSE;
    G = 4 falls back to stg. Run twice: the same bits."""
    case = GpuCase("tma_store", [300, 5, 211], [2000, 100, 3000], hq, hkv, causal=True,
                   temperature=0.9, selection="causal_local", kv=kv)
    pb = build(case, seed=11)
    base = dict(schedule="kv_major", kv_major_kernel="wgmma" if IS_SM90 else "auto")
    if chunk_rows is not None:
        base["chunk_rows"] = chunk_rows
    stg = run(pb, gpu=True, kv_major_store="stg", **base)
    tma = run(pb, gpu=True, kv_major_store="tma", **base)
    assert bits_equal(stg, tma)
    assert bits_equal(tma, run(pb, gpu=True, kv_major_store="tma", **base))
    assert bits_equal(tma, run(pb, gpu=True, **base))  # auto: the same kernel (or the same fallback)
    if chunk_rows is None:
        cpu = run(pb, gpu=False)
        check_lse(tma[1], cpu[1], "lse")
        check_lse(tma[2], cpu[2], "lse_t")


@pytest.mark.parametrize("kernel", ["kv_major", "kv_major_mma_sync", "hybrid", "kv_major_tma", "hybrid_tma"])
@pytest.mark.parametrize("chunk_rows", [1, 37, 500])
def test_lists_once_is_bitwise_per_group(chunk_rows, kernel):
    """lists=once builds the same lists as per_group (per group, in another order) and the partials
    at the same addresses: bit-identical results, with tiles (hybrid: union_done rows) too; run twice
    on the same workspace-sized call (the combine's LSE reset leaves no state behind)."""
    case = GpuCase("lists", [300, 5, 0, 211], [2000, 100, 50, 3000], 16, 2, topk=33, causal=True,
                   temperature=0.9, selection="causal_local")
    pb = build(case, seed=6)
    per_group = run(pb, gpu=True, schedule=kernel, chunk_rows=chunk_rows, lists="per_group")
    once = run(pb, gpu=True, schedule=kernel, chunk_rows=chunk_rows, lists="once")
    assert bits_equal(per_group, once)
    assert bits_equal(once, run(pb, gpu=True, schedule=kernel, chunk_rows=chunk_rows, lists="once"))
    cpu = run(pb, gpu=False)
    check_lse(once[1], cpu[1], "lse")
    check_lse(once[2], cpu[2], "lse_t")


@pytest.mark.parametrize("tile_kernel", ["cp_async", "tma"])
@pytest.mark.parametrize("chunk_rows", [37, 500])
def test_lists_once_is_bitwise_per_group_with_tiles(chunk_rows, tile_kernel):
    """The same with shared-selection tiles on an M3-shaped call (sm_90: the list builder and the
    combine skip the tiles' rows; lists=once marks their slots -inf in the first group)."""
    case = next(c for c in CASES if c.name == "m3_tile_shared")
    pb = build(case, seed=7)
    opts = dict(schedule="hybrid", chunk_rows=chunk_rows, tile_kernel=tile_kernel)
    per_group = run(pb, gpu=True, lists="per_group", **opts)
    once = run(pb, gpu=True, lists="once", **opts)
    assert bits_equal(per_group, once)


@each_schedule
@pytest.mark.parametrize("kv", ["same", "fp8", "nvfp4"])
def test_paged_equals_flat(kv, schedule):
    """Same values read through permuted pages (partial last page) or a flat cache: bit-identical.
    NVFP4 scales are per row, so both caches dequantize every real row to the same values."""
    case = GpuCase("c", [150, 90], [2048, 1280 - 13], 8, 2, causal=True, kv=kv)
    flat = problem(case, seed=6, q2k_seed=5)
    paged = problem(dataclasses.replace(case, layout="paged"), seed=6, q2k_seed=5)
    assert bits_equal(run(flat, gpu=True, schedule=schedule), run(paged, gpu=True, schedule=schedule))


@each_schedule
@pytest.mark.parametrize("layout", ["packed", "packed_nhd", "nhd"])
@pytest.mark.parametrize("kv", ["same", "fp8"])
def test_packed_equals_contiguous(layout, kv, schedule):
    case = GpuCase("c", [64, 33], [1500, 700], 8, 2, causal=True, kv=kv, layout="paged")
    contiguous = problem(case, seed=8, q2k_seed=7)
    packed = problem(dataclasses.replace(case, layout=layout), seed=8, q2k_seed=7)
    assert bits_equal(run(contiguous, gpu=True, schedule=schedule),
                      run(packed, gpu=True, schedule=schedule))


@pytest.mark.parametrize("schedule", ["hybrid", "hybrid_cp_async", "hybrid_tma", "kv_major_tma"])
@pytest.mark.parametrize("selection", ["tile_shared", "tile_mixed"])
@pytest.mark.parametrize("hq,hkv,topk,kv", [(32, 2, 16, "same"), (64, 4, 3, "same"),
                                            (16, 1, 64, "same"), (128, 2, 1, "same"),
                                            (32, 2, 16, "fp8"), (64, 4, 33, "fp8")])
def test_token_major_q2k_and_nhd_on_tiles(hq, hkv, topk, kv, selection, schedule):
    """The shared-selection tiles (planned where G is 16 to 128, so the other layout tests, G <= 8,
    never reach them) read a token-major q2k (union_plan_kernel, by the q2k strides) and NHD K / V
    views bit for bit as the contiguous ones."""
    from test_sparse_attention import q2k_view

    case = GpuCase("c", [700, 300], [9000, 4000], hq, hkv, topk=topk, causal=True,
                   layout="paged", selection=selection, kv=kv)
    base = problem(case, seed=12, q2k_seed=13)
    views = problem(dataclasses.replace(case, layout="nhd"), seed=12, q2k_seed=13)
    args = list(views.gpu_args)
    args[3] = q2k_view(args[3], "token_major")
    options = plan_options(schedule)
    want = msa_ops._sparse_attention_planned(*base.gpu_args, **base.gpu_kwargs, options=options)
    got = msa_ops._sparse_attention_planned(*args, **views.gpu_kwargs, options=options)
    assert bits_equal(want, got)


@each_schedule
@pytest.mark.parametrize("selection", ["random", "causal_local", "unsorted", "duplicates"])
def test_deterministic(selection, schedule):
    """D11: two runs on identical inputs are bit-identical (the KV-major lists are built with
    atomics, in a different order every run)."""
    case = GpuCase("det", [1024, 300], [1024, 2000], 64, 4, causal=True, selection=selection,
                   temperature=0.8)
    pb = problem(case, seed=9)
    first = run(pb, gpu=True, schedule=schedule)
    for _ in range(2):
        assert bits_equal(first, run(pb, gpu=True, schedule=schedule))


@each_schedule
def test_workspace_object(schedule):
    """A caller-owned workspace gives the same bits as the allocator-backed scratch."""
    case = GpuCase("ws", [500, 30], [1000, 300], 16, 2, causal=True)
    pb = build(case, seed=10)
    base = run(pb, gpu=True, schedule=schedule)
    ws = msa_ops.MSASparseAttentionWorkspace(DEV)
    with_ws = msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs, workspace=ws,
                                                options=plan_options(schedule))
    assert bits_equal(base, with_ws)


@each_schedule
@pytest.mark.parametrize("hq,hkv", [(256, 16), (4, 4)])
def test_large(hq, hkv, schedule):
    """>= 64K query rows and (first shape) total_q * Hq > 2^24: 64-bit offsets and grid limits.
    Sequences of 16 tokens keep the reference cheap; rows of a few sequences at the start, middle
    and end are checked against the CPU reference run on just those sequences."""
    n_seq, seq = 4100, 16
    total_q = seq * n_seq
    assert total_q >= 65536 and (hq < 256 or total_q * hq > 2 ** 24)
    gen = torch.Generator(device=DEV).manual_seed(11)
    q = (torch.randn(total_q, hq, 128, generator=gen, device=DEV) / 3).to(BF16)
    k = (torch.randn(total_q, hkv, 128, generator=gen, device=DEV) / 3).to(BF16)
    v = (torch.randn(total_q, hkv, 128, generator=gen, device=DEV) / 3).to(BF16)
    q2k = torch.full((hkv, total_q, 2), -1, dtype=torch.int32, device=DEV)
    q2k[:, :, 0] = 0
    cu = ref.cu_seqlens([seq] * n_seq, DEV)
    out, lse = msa_ops._sparse_attention_planned(q, k, v, q2k, cu, cu, causal=True,
                                                 return_softmax_lse=True,
                                                 options=plan_options(schedule))
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and bool(torch.isfinite(lse).all())

    seqs = [0, 1, n_seq // 2, n_seq - 2, n_seq - 1]
    rows = torch.cat([torch.arange(b * seq, (b + 1) * seq) for b in seqs]).to(DEV)
    sub = GpuCase("large_subset", [seq] * len(seqs), [seq] * len(seqs), hq, hkv, topk=2,
                  causal=True)
    cu_sub = ref.cu_seqlens(sub.seqs_q)
    args = (q[rows].cpu(), k[rows].cpu(), v[rows].cpu(), q2k[:, rows].contiguous().cpu(), cu_sub)
    kw = dict(causal=True, cu_seqlens_k=cu_sub, return_softmax_lse=True)
    want = msa_ops.msa_sparse_attention(*args, **kw)
    keys = ref.sequences(args[1].float(), cu_seqlens_k=cu_sub)
    values = ref.sequences(args[2].float(), cu_seqlens_k=cu_sub)
    sub_pb = Problem(args, kw, (), {}, args[0], keys, values, [set() for _ in seqs],
                     128 ** -0.5, 1.0)
    base_out, _ = baseline(sub, sub_pb, args[3])
    check_output(out[rows], want[0], base_out, "large out")
    check_lse(lse[rows], want[1], "large lse")


TILE_KERNELS = pytest.mark.parametrize("tile_kernel", ["cp_async", "tma"])


@TILE_KERNELS
def test_hybrid_runs_shared_tiles(tile_kernel):
    """On sm_90 the hybrid schedule computes the qualifying tiles with the shared-selection tile
    kernel (either of them): its bits differ from the KV-major schedule's (another summation
    order), both match the reference, and repeated runs are bit-identical."""
    if not IS_SM90:
        pytest.skip("the shared-selection tile kernel is sm_90a only (hybrid = kv_major elsewhere)")
    case = next(c for c in CASES if c.name == "m3_tile_shared")
    pb = build(case, seed=5)
    res = {"kv_major": run(pb, gpu=True, schedule="kv_major"),
           "hybrid": run(pb, gpu=True, schedule="hybrid", tile_kernel=tile_kernel)}
    again = run(pb, gpu=True, schedule="hybrid", tile_kernel=tile_kernel)
    assert not bits_equal(res["kv_major"], res["hybrid"]), "hybrid did not run the tile kernel"
    assert bits_equal(res["hybrid"], again)
    base_out, _ = baseline(case, pb, pb.cpu_args[3])
    cpu = run(pb, gpu=False)
    for name, got in res.items():
        check_output(got[0], cpu[0], base_out, f"{name} out")
        check_lse(got[1], cpu[1], f"{name} lse")
        check_empty_rows(got[0], cpu[1], name)


@pytest.mark.parametrize("name", ["spec_16_1", "m3_1x1024", "m3_tile_mixed_temp",
                                  "g32_tile_shared_paged", "g64_tile_mixed_nocausal",
                                  "m3_tile_shared_fp8", "g32_tile_mixed_fp8_paged_fp16"])
@TILE_KERNELS
def test_tile_kernel_on_unrelated_selections(name, tile_kernel):
    """Plan option tile_max_waste=8 sends every tile whose union fits the plan to the shared-selection
    tile kernel, also tiles of unrelated (random) selections, where a consumer warpgroup often skips
    blocks that none of its tokens selected: the results still match the reference, differ in their
    bits from the KV-major schedule's (so the tile kernel ran), and repeat bit for bit."""
    if not IS_SM90:
        pytest.skip("the shared-selection tile kernel is sm_90a only (hybrid = kv_major elsewhere)")
    case = next(c for c in CASES if c.name == name)
    pb = build(case, seed=11)
    kvm = run(pb, gpu=True, schedule="kv_major")
    got = run(pb, gpu=True, schedule="hybrid", tile_max_waste=8, tile_kernel=tile_kernel)
    again = run(pb, gpu=True, schedule="hybrid", tile_max_waste=8, tile_kernel=tile_kernel)
    assert not bits_equal(kvm, got), "tile_max_waste=8: the tile kernel did not run"
    assert bits_equal(got, again)
    base_out, _ = baseline(case, pb, pb.cpu_args[3])
    cpu = run(pb, gpu=False)
    check_output(got[0], cpu[0], base_out, f"{name} out")
    check_lse(got[1], cpu[1], f"{name} lse")
    check_empty_rows(got[0], cpu[1], name)
    if case.temperature is not None:
        check_lse(got[2], cpu[2], f"{name} lse_t")


def adaptive_q2k(case: GpuCase, mixed: bool, seed: int) -> torch.Tensor:
    """Selections whose tiles (8 tokens at G = 16) all share one list of 12 blocks, every other
    token without its last block (waste 96 / 92 ~ 1.04: over a bound of 1.0, within 3.0); with
    `mixed`, every other tile instead of unrelated lists of 16 blocks (a union of ~100 blocks: over
    3.0 and the planner's 96), so the tiles within 3.0 hold ~40 % of the pairs."""
    rng = np.random.default_rng(seed)
    total_q = sum(case.seqs_q)
    nb = math.ceil(case.seqs_k[0] / BLOCK)
    t = 128 // (case.hq // case.hkv)
    sel = np.full((case.hkv, total_q, case.topk), -1, dtype=np.int32)
    for h in range(case.hkv):
        for tile in range(total_q // t):
            shared = np.sort(rng.permutation(nb)[:12])
            for e in range(t):
                r = tile * t + e
                if mixed and tile % 2 == 1:
                    sel[h, r] = np.sort(rng.permutation(nb)[:case.topk])
                else:
                    sel[h, r, :12] = shared
                    if e % 2 == 1:
                        sel[h, r, 11] = -1
    return torch.from_numpy(sel)


@pytest.mark.parametrize("mixed", [False, True])
def test_tile_bound_adaptive_takes_the_wide_bound_only_when_it_holds_the_pairs(mixed):
    """tile_bound=adaptive with tile_max_waste=1: the tiles within 3.0 hold every pair (the wide
    bound is taken: bit for bit tile_max_waste=3) or ~40 % of them (it is not: bit for bit
    tile_max_waste=1), and the results match the reference either way."""
    if not IS_SM90:
        pytest.skip("the shared-selection tile kernel is sm_90a only (hybrid = kv_major elsewhere)")
    case = GpuCase("adaptive", [512], [16384], 64, 4, causal=False)
    pb = build(case, seed=13, q2k=adaptive_q2k(case, mixed, seed=14))
    narrow = run(pb, gpu=True, schedule="hybrid", tile_max_waste=1)
    wide = run(pb, gpu=True, schedule="hybrid", tile_max_waste=3)
    got = run(pb, gpu=True, schedule="hybrid", tile_max_waste=1, tile_bound="adaptive")
    assert not bits_equal(narrow, wide), "the bounds 1 and 3 chose the same tiles"
    assert bits_equal(got, narrow if mixed else wide)
    assert bits_equal(got, run(pb, gpu=True, schedule="hybrid", tile_max_waste=1, tile_bound="adaptive"))
    base_out, _ = baseline(case, pb, pb.cpu_args[3])
    cpu = run(pb, gpu=False)
    check_output(got[0], cpu[0], base_out, "adaptive out")
    check_lse(got[1], cpu[1], "adaptive lse")
    check_empty_rows(got[0], cpu[1], "adaptive")


@pytest.mark.parametrize("value", ["abc", "0.5", "9", "nan", "1.5x"])
def test_tile_max_waste_option_rejects_bad_values(value):
    pb = build(next(c for c in CASES if c.name == "m3_tile_shared"))
    with pytest.raises(ValueError, match="tile_max_waste must be a number from 1 to 8"):
        run(pb, gpu=True, schedule="hybrid", tile_max_waste=value)


def test_forced_wgmma_runs_only_on_sm90():
    """kv_major_kernel=wgmma runs the warpgroup-MMA kernel on an sm_90 GPU and is a clear
    NotImplementedError elsewhere (never a silent fallback to the portable kernel)."""
    case = next(c for c in CASES if c.name == "m3_1x1024")
    pb = build(case, seed=12)
    options = dict(schedule="kv_major", kv_major_kernel="wgmma")
    if not IS_SM90:
        with pytest.raises(NotImplementedError, match="kv_major_kernel=wgmma"):
            msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs, options=options)
        return
    got = msa_ops._sparse_attention_planned(*pb.gpu_args, **pb.gpu_kwargs, options=options)
    base_out, _ = baseline(case, pb, pb.cpu_args[3])
    cpu = run(pb, gpu=False)
    check_output(got[0], cpu[0], base_out, "wgmma out")
    check_lse(got[1], cpu[1], "wgmma lse")

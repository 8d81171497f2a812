"""Seeded random fuzzing of the five MSA ops: the op on the device against the same op on the same
data as CPU tensors (flashmsa's exact C++ reference), case after case, until a time budget or a
case count runs out.

    python benchmarks/fuzz_msa.py --seconds 420                  # all ops, one worker per core
    python benchmarks/fuzz_msa.py --replay attention:1234        # rerun one case, verbose
    python benchmarks/fuzz_msa.py --device cpu --cases 200       # harness self-check (no GPU)

Case ``i`` of a run is op ``OPS[i % 5]`` with case seed ``--seed + i``; every parameter of the case
(shapes, dtypes, layout, options, the selection kinds, the data) follows from ``(op, seed)`` alone,
so a failure prints as one line ending in ``--replay op:seed``, which rebuilds exactly that case.

What a case may draw (docs/testing.md lists it in full):

* msa_proxy_score: bf16 / fp16 / fp8 q and K, flat or paged K (shuffled pages, pages shared by
  several sequences, invalid page ids), G, causal, q_offset None / int / tensor (negative, beyond
  the keys), max_k_tiles (padding or truncating columns), reduce_heads, output=, max_seqlen_q
  hints that are too small, rows of no sequence, NaN keys, empty sequences;
* msa_proxy_score_fp4: the same over NVFP4 q and K with global scales;
* msa_topk_select: topk 1..64, forced begin / end blocks, nvp None / scalar / per-token tensor
  (clamped values), NaN (varied payloads) / +-inf / +-0 / tied scores, output= (contiguous or a
  head-major view, also a padded row range of a larger buffer);
* msa_sparse_attention: bf16 / fp16 q; bf16 / fp16 / fp8 / NVFP4 K and V; flat / paged / packed
  HND / packed NHD; G 1..64; causal; LSE; temperature LSE; softmax and V global scales from 1e-3
  to 1e4; workspace; out= (a caller's poisoned tensor, which must be the one returned); index
  lists mixing sorted / unsorted / duplicated / out-of-range / -1-holed / empty rows, handed over
  contiguous, token-major or as a padded row range of a head-major buffer; empty and full-page
  lengths; CUDA-graph replay;
* msa_sparse_decode_attention: seqlen_q 1..4, bf16 / fp16 / fp8 q, the same K/V forms, partial
  dtype, force_fused, workspace, out=, CUDA-graph replay;
* value ranges (attention, decode): V around large offsets (16-bit V past fp8's 448, bf16 V past
  fp16's 65504, fp8 V at 448, NVFP4 V with block scales near 448: what each partial dtype must
  hold), q and K near the top of their dtype with a compensating softmax scale; proxy inputs near
  the top of theirs (_value_ranges).

Checks, as the GPU tests make them (tests/python/test_gpu_*.py): proxy scores within 1e-2 with
exact -inf / +inf / NaN patterns; top-k indices identical; attention outputs within twice the
error of a same-precision torch baseline plus 2 ulp (plus half an ulp of max |V| in a reduced
partial dtype: fp8 partials, used with fp8 V only, and bf16 / fp16 partials), an output inf on one
side only read as the overflow threshold, LSE -inf patterns exact and finite values within 1e-2, rows without keys exactly 0, no NaN. Device outputs are
poisoned (NaN / INT32_MIN) before each call, so unwritten elements fail.

Building the inputs and the CPU reference are the cost: problems stay small (log-uniform lengths,
a few long ones), and ``--workers`` processes (default: one a CPU core, one thread each) each run
whole cases. The run stops cleanly at ``--seconds`` and prints the counts per op with the time per
case split into its phases; the exit status is 1 when any case failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

OPS = ("proxy", "proxy_fp4", "topk", "attention", "decode")
BLOCK = 128

# --plant-fault (the harness self-test): plant_fault corrupts each device result, to prove that a
# wrong result is reported.
_PLANT: Optional[Callable] = None
_WORKSPACES: dict = {}  # device -> the MSASparseAttentionWorkspace the cases of a process share


# ---- case parameters ----------------------------------------------------------------------------

def _logu(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniform: each octave as likely as the next, so most draws stay
    small (cheap to build and to check) while the top of the range is still drawn."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _long(rng: random.Random, seqs: List[int], lo: int, hi: int) -> List[int]:
    """A long-sequence case: one sequence (and each other one at even odds) gets a length up to
    ``hi`` (uniform, or log-uniform from ``lo``); the rest keep theirs."""
    first = rng.randrange(len(seqs))
    return [rng.choice((rng.randint(1, hi), _logu(rng, lo, hi)))
            if b == first or rng.random() < 0.5 else sk for b, sk in enumerate(seqs)]


def _lengths(rng: random.Random, n: int, choices) -> List[int]:
    out = []
    for _ in range(n):
        c = rng.choice(choices)
        out.append(c() if callable(c) else c)
    return out


def _q_offset(rng: random.Random, seqs_k: List[int]):
    form = rng.choice(("none", "none", "int", "tensor"))
    if form == "none":
        return None
    pick = lambda sk: rng.choice((0, -rng.randint(1, 300), rng.randint(0, sk + 1),  # noqa: E731
                                  sk + rng.randint(0, 500), rng.randint(0, 2000)))
    if form == "int":
        return pick(max(seqs_k, default=0))
    return [pick(sk) for sk in seqs_k]


# The kernel choices a case may force on the device, as plan options of flashmsa's private planned
# twins of the ops (msa_ops._*_planned; the CPU reference has no plan): the proxy kernel (decode_f16:
# the decode kernel's fp16 MMAs for fp8 K; sm90_f16, drawn last in gen_proxy: the sm_90a kernel's) and its fp8 (decode_fp8) and NVFP4 (nvfp4_cvt, decode_nvfp4) variants,
# the top-k and decode kernel (regs: fp8 and NVFP4 K/V in registers; wgmma: MTP union items on
# sm_90a; wgmma_fp8, drawn last: LATE_DECODE_OPTIONS), decode's MTP items, the prefill schedule (auto is query-major at these sizes), the
# KV-major kernel (tma: the sm_90a TMA kernel) and the sm_90a KV-major kernel's non-default
# partial stores (stg) and row math (precise), chunk_rows (launch groups) and tile_max_waste (8:
# every tile whose union fits goes to the shared-selection tile kernel). A forced kernel that cannot
# run a case falls back as the plan says.
SCHEDULES = {
    "auto": {},
    "query_major": {"schedule": "query_major"},
    "kv_major": {"schedule": "kv_major", "kv_major_kernel": "auto"},
    "kv_major_mma_sync": {"schedule": "kv_major", "kv_major_kernel": "mma_sync"},
    "hybrid": {"schedule": "hybrid", "kv_major_kernel": "auto"},
    "hybrid_waste8": {"schedule": "hybrid", "kv_major_kernel": "auto", "tile_max_waste": "8"},
    "kv_major_tma": {"schedule": "kv_major", "kv_major_kernel": "tma"},
    "hybrid_tma": {"schedule": "hybrid", "kv_major_kernel": "tma"},
    "kv_major_stg": {"schedule": "kv_major", "kv_major_kernel": "auto", "kv_major_store": "stg"},
    "kv_major_precise": {"schedule": "kv_major", "kv_major_kernel": "auto", "kv_major_math": "precise"},
}


# op -> [(plan option, the values a case picks from besides the default), ...], each drawn on its own
KERNELS = {
    "proxy": [("kernel", ("mma_sync", "sm90", "sm90_ss", "decode", "decode_f16")),
              ("decode_fp8", ("cta", "tma")), ("decode_tma_issue", ("producer", "warps"))],
    "proxy_fp4": [("kernel", ("mma_sync", "sm90", "sm90_ss", "decode")), ("nvfp4_cvt", ("byte", "word")),
                  ("decode_nvfp4", ("cta", "tma")), ("decode_tma_issue", ("producer", "warps"))],
    "topk": [("kernel", ("warp_per_row", "warp_per_row_8", "radix", "by_size", "radix_1buf",
                         "warp_split", "radix_uniform", "warp_digits", "net"))],
    "decode": [("kernel", ("smem", "regs", "wgmma")), ("mtp", ("per_token", "union"))],
}


# Decode options drawn after every other parameter of a case, each on its own, in this order
# (gen_decode; added after the seeds' cases were in use, so that a seed's other parameters stay
# what they were): fp8 K/V on the MTP wgmma kernel, the warps per decode CTA (8: the 8-warp kernel,
# split or fused), the splits of a row as one cluster, the split-count rule, when the combine
# loads the partial values, and how the fp8 register kernel fills its stages (tma: sm_90a).
LATE_DECODE_OPTIONS = [("wgmma_fp8", ("off", "on")), ("split_warps", ("4", "8")),
                       ("split", ("blocks", "cluster")), ("split_rule", ("ceil", "waves")),
                       ("combine_loads", ("after", "with")), ("regs_feed", ("cp_async", "tma"))]


# Top-k options drawn after every other parameter of a case, each on its own (gen_topk, as above):
# the pivot forced on (any call whose rows it can run, not only decode-sized ones) and its form.
LATE_TOPK_OPTIONS = [("net_pivot", ("on",)), ("net_pivot_mode", ("sort", "rank_cta"))]


def _late(rng: random.Random, p: dict, late_options) -> None:
    """Draws each late option on its own into p["options"] (None: the default)."""
    for name, values in late_options:
        late = rng.choice(values + (None,))
        if late is not None:
            p["options"][name] = late


def _options(rng: random.Random, op: str) -> Dict[str, str]:
    if op == "attention":
        options = dict(SCHEDULES[rng.choice(sorted(SCHEDULES))])
        if options.get("schedule") in ("kv_major", "hybrid") and rng.random() < 0.3:
            options["chunk_rows"] = str(rng.choice((1, 7, 37)))
        return options
    options = {}
    for name, values in KERNELS[op]:
        kernel = rng.choice((None,) + values)
        if kernel:
            options[name] = kernel
    return options


def _planned(public, options):
    """The op ``public`` (a msa_ops function name) with the case's plan options."""
    from flashmsa import msa_ops
    private = {"msa_proxy_score": "_proxy_score_planned",
               "msa_proxy_score_fp4": "_proxy_score_fp4_planned",
               "msa_topk_select": "_topk_select_planned",
               "msa_sparse_attention": "_sparse_attention_planned",
               "msa_sparse_decode_attention": "_sparse_decode_planned"}[public]
    return functools.partial(getattr(msa_ops, private), options=options)


def _paged_lengths(rng: random.Random, p: dict, paged: bool, huge: bool) -> None:
    """Page-table width and, for some paged cases, declared key lengths beyond it: those sequences
    fill every page of their row (their true length is the table's capacity, to which the ops
    clamp) and declare more (by 1, 777 keys, or up to INT32_MAX with ``huge``)."""
    nb = [math.ceil(s / BLOCK) for s in p["seqs_k"]]
    p["max_pages"] = max(max(nb, default=0), 1) + rng.choice((0, 0, 1))
    p["declared_k"] = None
    if not paged or rng.random() >= 0.15:
        return
    cap = p["max_pages"] * BLOCK
    declared = list(p["seqs_k"])
    for b in range(len(declared)):
        if rng.random() < 0.6:
            p["seqs_k"][b] = cap
            declared[b] = cap + rng.choice((1, 777, 2 ** 31 - 1 - cap if huge else 100000))
    p["declared_k"] = declared


def gen_proxy(rng: random.Random, fp4: bool) -> dict:
    b = rng.randint(1, 3)
    big = rng.random() < 0.04  # a few long key sequences (many blocks) over a few rows
    seqs_q = _lengths(rng, b, (0, 1, 2, lambda: rng.randint(1, 40), lambda: _logu(rng, 1, 130)))
    seqs_k = _lengths(rng, b, (0, 1, 127, 128, 129, lambda: _logu(rng, 1, 1300),
                               lambda: 128 * _logu(rng, 1, 8)))
    if big:
        seqs_q = [min(q, 4) for q in seqs_q]
        seqs_k = _long(rng, seqs_k, 1300, 20000)
    hkv = rng.choice((1, 1, 2, 3))
    g = rng.choice((1, 2, 3, 4, 8, 16))
    if fp4:
        q_dtype = k_dtype = "nvfp4"
    else:
        q_dtype = rng.choice(("bf16", "fp16", "fp8"))
        # fp8 q needs fp8 K; bf16 / fp16 q take K of q's dtype or fp8
        k_dtype = "fp8" if q_dtype == "fp8" else rng.choice((q_dtype, q_dtype, "fp8"))
    nb = [math.ceil(s / BLOCK) for s in seqs_k]
    default_tiles = max(max(nb, default=0), 1)
    tiles = rng.choice((None, None, default_tiles, max(1, default_tiles - rng.randint(1, 3)),
                        default_tiles + rng.randint(1, 4), 1))
    p = dict(
        seqs_q=seqs_q, seqs_k=seqs_k, hq=hkv * g, hkv=hkv, q_dtype=q_dtype, k_dtype=k_dtype,
        paged=rng.random() < 0.5, shared_pages=rng.random() < 0.3,
        invalid_pages=rng.random() < 0.25, causal=rng.random() < 0.7,
        q_offset=_q_offset(rng, seqs_k), max_k_tiles=tiles,
        max_seqlen_q=rng.choice((None, None, None, 1, 3)),
        reduce_heads=rng.random() < 0.3, output=rng.random() < 0.5,
        extra_rows=rng.choice((0, 0, 0, 1, 7)), nan_keys=(not fp4) and rng.random() < 0.15,
        data_scale=rng.choice((1.0, 1.0, 0.1, 4.0)),
        options=_options(rng, "proxy_fp4" if fp4 else "proxy"))
    if not fp4 and rng.random() < 0.1:
        # q and K near the top of the narrower dtype (clamped there): fp8 448, fp16 65504, bf16
        # beyond fp16's range
        narrow = "fp8" if "fp8" in (q_dtype, k_dtype) else q_dtype
        p["data_scale"] = {"fp8": 100.0, "fp16": 5000.0, "bf16": 2.5e5}[narrow]
    _paged_lengths(rng, p, p["paged"], huge=True)
    # Drawn last (the seeds' other parameters as before): the sm_90a kernel's fp16 MMAs for fp8 K
    # with bf16 q and for NVFP4 q and K (kernel=sm90_f16), in one case of five with those pairs.
    if (fp4 or (q_dtype, k_dtype) == ("bf16", "fp8")) and rng.random() < 0.2:
        p["options"]["kernel"] = "sm90_f16"
    return p


def gen_topk(rng: random.Random) -> dict:
    h = rng.choice((1, 2, 3, 4))
    p = rng.choice((1, 2, 7, 16, 63, 64, 65, 200, 256, 257, 700, rng.randint(1, 1100),
                    rng.randint(1, 20000) if rng.random() < 0.2 else 511))
    s = rng.choice((1, 5, 31, 33, 64, rng.randint(1, 200)))
    topk = rng.choice((1, 2, 15, 16, 17, 33, 63, 64, rng.randint(1, 64)))
    fb = rng.randint(0, topk) if rng.random() < 0.5 else 0
    fe = rng.randint(0, topk - fb) if rng.random() < 0.5 else 0
    form = rng.choice(("none", "scalar", "tensor", "clamp"))
    if form in ("none", "scalar") and fb + fe > p:
        form = "tensor"
    nvp = None
    if form == "scalar":
        nvp = rng.randint(max(1, fb + fe), p)
    params = dict(h=h, p=p, s=s, topk=topk, fb=fb, fe=fe, nvp_form=form, nvp=nvp,
                  base=rng.choice(("randn", "few", "ties", "wide")),
                  specials=rng.choice((0.0, 0.05, 0.2, 0.4)), payloads=rng.random() < 0.5,
                  row_inf=rng.random() < 0.3, col_inf=rng.random() < 0.3,
                  output=rng.random() < 0.5, misaligned=rng.random() < 0.2,
                  options=_options(rng, "topk"))
    _late(rng, params, LATE_TOPK_OPTIONS)  # drawn last: the seeds' other parameters as before
    # Drawn after them: output= as a head-major view (the transpose of (H, S, topk), or of a row
    # range of a larger buffer with rows padded past topk: docs/semantics.md#topk-output).
    params["output_layout"] = rng.choice(("contiguous", "contiguous", "head_major", "head_rows"))
    return params


def _selection_mix(rng: random.Random) -> Dict[str, float]:
    kinds = ("sorted", "unsorted", "duplicates", "out_of_range", "holes", "empty", "causal_local",
             "full")
    weights = [rng.random() ** 2 for _ in kinds]
    weights[0] += 0.5
    total = sum(weights)
    mix = {k: w / total for k, w in zip(kinds, weights)}
    # probability that a row reuses the previous row's list (runs of tokens sharing their
    # selections: the shared-selection tiles)
    mix["share"] = rng.choice((0.0, 0.0, 0.5, 0.9, 1.0))
    return mix


def _kv_params(rng: random.Random, layouts) -> dict:
    kv = rng.choice(("same", "same", "fp8", "nvfp4"))
    layout = rng.choice(layouts)
    if layout.startswith("packed") and kv == "nvfp4":
        layout = "paged"
    return dict(kv=kv, layout=layout, shared_pages=rng.random() < 0.3,
                invalid_pages=rng.random() < 0.2)


def _scales(rng: random.Random) -> dict:
    return dict(
        softmax_scale=rng.choice((None, None, 0.01, 0.2, 1.0, -0.1)),
        v_global_scale=rng.choice((None, None, 1e-3, 0.37, 3.0, 1e4)),
        data_scale=rng.choice((1 / 3, 1 / 3, 0.02, 1.0, 3.0)))


# Largest finite values: fp16 and fp8 data are clamped there before the cast (torch turns fp16
# overflow into inf); the partial dtypes of decode must hold V's range (docs/semantics.md#decode).
FINITE_MAX = {"fp16": 65504.0, "fp8": 448.0}


def _value_ranges(rng: random.Random, p: dict, cdt: str) -> None:
    """Values far from unit scale, for attention and decode.

    ``v_offset``: V rows are ``v_offset * (sign + v_noise * randn)`` with a random sign per head
    dimension, so averages of V rows (the output, and decode's split-K partials) stay near
    ``v_offset`` instead of shrinking to 0: past fp8's 448 (fp8 partials must give way) and, for
    bf16 V, past fp16's 65504 (fp16 partials must give way); fp16 V up to its largest values, fp8
    V at 448. NVFP4 V: every block's amax is near the global one, so every block scale is near
    e4m3's 448 and V reads up to 6 x 448 before its global scale. Not with the 1e35 V scale.

    ``q_mag`` / ``k_mag``: q and K are ``randn * mag`` (instead of ``data_scale``) near the top of
    their dtype (bf16 beyond fp16's range), with the softmax scale divided by ``q_mag * k_mag`` so
    that the scores keep their usual size."""
    kind = p["kv"] if p["kv"] != "same" else cdt
    p["v_offset"] = p["v_noise"] = None
    if p["v_global_scale"] != 1e35 and rng.random() < 0.3:
        p["v_offset"] = rng.choice({"fp8": (100.0, 400.0), "nvfp4": (1.0, 3000.0),
                                    "fp16": (500.0, 3000.0, 30000.0),
                                    "bf16": (500.0, 3000.0, 30000.0, 1e6, 1e6)}[kind])
        # NVFP4: little noise keeps every block's amax near the global one (scales near 448)
        p["v_noise"] = rng.choice((0.02, 0.1) if kind == "nvfp4" else (0.02, 0.3, 1.0))
    p["q_mag"] = p["k_mag"] = None
    if rng.random() < 0.15:
        top = {"fp8": 100.0, "fp16": 5000.0, "bf16": 2.5e5, "nvfp4": 2.5e5}
        q_kind = p.get("q_dtype", cdt)
        p["q_mag"], p["k_mag"] = top[q_kind], top[kind]
        base = p["softmax_scale"] if p["softmax_scale"] is not None else 128 ** -0.5
        p["softmax_scale"] = base / (p["q_mag"] * p["k_mag"])


def gen_attention(rng: random.Random) -> dict:
    b = rng.randint(1, 3)
    big = rng.random() < 0.04
    seqs_q = _lengths(rng, b, (0, 1, lambda: rng.randint(1, 24), lambda: _logu(rng, 1, 64)))
    seqs_k = _lengths(rng, b, (0, 1, 128, 129, lambda: _logu(rng, 1, 1000),
                               lambda: 128 * _logu(rng, 1, 6)))
    if big:
        seqs_q = [min(q, 6) for q in seqs_q]
        seqs_k = _long(rng, seqs_k, 1000, 12000)
    hkv = rng.choice((1, 1, 2, 3))
    g = rng.choice((1, 2, 3, 4, 5, 8, 16, 16, 32, 64))
    if g >= 32:
        hkv = 1
    p = dict(seqs_q=seqs_q, seqs_k=seqs_k, hq=hkv * g, hkv=hkv,
             topk=rng.choice((1, 2, 3, 8, 16, 16, 33, 64, rng.randint(1, 64))),
             dtype=rng.choice(("bf16", "fp16")), causal=rng.random() < 0.6,
             q_offset=_q_offset(rng, seqs_k), selection=_selection_mix(rng),
             lse=rng.random() < 0.5,
             temperature=rng.choice((None, None, None, 0.3, 0.8, 1.3)),
             workspace=rng.random() < 0.3, graph=rng.random() < 0.1,
             extra_rows=rng.choice((0, 0, 0, 3)), options=_options(rng, "attention"))
    p.update(_kv_params(rng, ("flat", "flat", "paged", "packed", "packed_nhd")))
    p.update(_scales(rng))
    paged = p["layout"] != "flat"
    # Paged key lengths from seqused_k or from cu_seqlens_k (whose differences then win; seqused_k
    # holds other values). cu_seqlens_k is a prefix sum, so its declared lengths stay small.
    p["k_lengths"] = "cu_seqlens_k" if paged and rng.random() < 0.3 else "seqused_k"
    _paged_lengths(rng, p, paged, huge=p["k_lengths"] == "seqused_k")
    if p["dtype"] == "bf16" and rng.random() < 0.05:
        p["v_global_scale"] = 1e35  # outputs near 1e35, far inside bfloat16's range
    _value_ranges(rng, p, p["dtype"])
    p["out"] = rng.random() < 0.3  # drawn last: out= (a caller's output tensor, poisoned first)
    # Drawn after it: q2k handed over token-major (the transpose of a contiguous (total_q, Hkv,
    # topk) row range of a larger buffer, docs/semantics.md#q2k-layout) instead of contiguous.
    p["q2k_token_major"] = rng.random() < 0.3
    # Drawn after that: a paged non-NVFP4 cache as separate K and V caches with NHD pages, passed
    # as (P, H, 128, W) views (docs/semantics.md#packed-kv).
    p["nhd_views"] = rng.random() < 0.3
    # Drawn after that: a head-major q2k as a row range of a larger buffer, rows padded past topk.
    p["q2k_head_rows"] = rng.random() < 0.2
    return p


def gen_decode(rng: random.Random) -> dict:
    batch = rng.randint(1, 6)
    seqlen_q = rng.randint(1, 4)
    seqs_k = _lengths(rng, batch, (0, 1, 128, 129, lambda: _logu(rng, 1, 1500),
                                   lambda: 128 * _logu(rng, 1, 10)))
    if rng.random() < 0.04:
        seqs_k = _long(rng, seqs_k, 1500, 12000)
    hkv = rng.choice((1, 2, 4))
    g = rng.choice((1, 2, 3, 4, 8, 16, 16))
    p = dict(batch=batch, seqlen_q=seqlen_q, seqs_k=seqs_k, hq=hkv * g, hkv=hkv,
             topk=rng.choice((1, 4, 16, 16, 33, 64, rng.randint(1, 64))),
             q_dtype=rng.choice(("bf16", "bf16", "fp16", "fp8")), causal=rng.random() < 0.8,
             q_offset=_q_offset(rng, seqs_k), selection=_selection_mix(rng),
             lse=rng.random() < 0.7,
             partial_dtype=rng.choice((None, None, "fp32", "bf16", "fp16", "fp8")),
             force_fused=rng.choice((None, True, False)),
             workspace=rng.random() < 0.3, graph=rng.random() < 0.15,
             options=_options(rng, "decode"))
    p.update(_kv_params(rng, ("paged", "paged", "flat", "packed", "packed_nhd")))
    p.update(_scales(rng))
    _paged_lengths(rng, p, p["layout"] != "flat", huge=True)
    if p["q_dtype"] != "fp16" and rng.random() < 0.05:
        p["v_global_scale"] = 1e35
    _value_ranges(rng, p, "bf16" if p["q_dtype"] == "fp8" else p["q_dtype"])
    # Drawn last, so that the seeds' other parameters are what they were before them (a forced
    # option that cannot apply falls back and the plan says why).
    _late(rng, p, LATE_DECODE_OPTIONS)
    p["out"] = rng.random() < 0.3  # drawn last: out= (a caller's output tensor, poisoned first)
    # Drawn after it: q2k handed over token-major (the transpose of a contiguous (total_q, Hkv,
    # topk) row range of a larger buffer, docs/semantics.md#q2k-layout) instead of contiguous.
    p["q2k_token_major"] = rng.random() < 0.3
    # Drawn after that: a paged non-NVFP4 cache as separate K and V caches with NHD pages, passed
    # as (P, H, 128, W) views (docs/semantics.md#packed-kv).
    p["nhd_views"] = rng.random() < 0.3
    # Drawn after that: a head-major q2k as a row range of a larger buffer, rows padded past topk.
    p["q2k_head_rows"] = rng.random() < 0.2
    return p


def case_params(op: str, seed: int) -> dict:
    """The parameters of case ``(op, seed)``: a pure function of both."""
    rng = random.Random(f"{op}:{seed}")
    if op == "proxy":
        return gen_proxy(rng, fp4=False)
    if op == "proxy_fp4":
        return gen_proxy(rng, fp4=True)
    if op == "topk":
        return gen_topk(rng)
    if op == "attention":
        return gen_attention(rng)
    if op == "decode":
        return gen_decode(rng)
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


# ---- inputs -------------------------------------------------------------------------------------

def _torch():
    import torch
    return torch


def _dtype(name: str):
    torch = _torch()
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn,
            "fp32": torch.float32}[name]


def _cu(lengths):
    torch = _torch()
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out


def _q_offset_arg(p: dict):
    torch = _torch()
    if isinstance(p["q_offset"], list):
        return torch.tensor(p["q_offset"], dtype=torch.int32)
    return p["q_offset"]


def _positions_offsets(p: dict, seqs_q: List[int], seqs_k: List[int]) -> List[int]:
    if p["q_offset"] is None:
        return [k - q for q, k in zip(seqs_q, seqs_k)]
    if isinstance(p["q_offset"], int):
        return [p["q_offset"]] * len(seqs_q)
    return list(p["q_offset"])


class Cache:
    """A K (and V) cache in one layout plus, per sequence, the dequantized key rows it holds
    (float32 ``(seqlen_k, Hkv, 128)``) and the blocks whose page id is invalid."""

    def __init__(self):
        self.args: dict = {}          # the op's layout arguments (k / v / page_table / ...)
        self.keys: List = []
        self.values: List = []
        self.dropped: List[set] = []


def _quantize(x, kind: str, gen):
    """x float32 -> (stored tensor, scales or None, global scale or None, dequantized float32)."""
    torch = _torch()
    from flashmsa.testing import nvfp4
    if kind == "nvfp4":
        amax = float(x.abs().max()) if x.numel() else 1.0
        gs = 448.0 * 6.0 / amax if amax > 0 else 1.0
        data, scales, deq_gs = nvfp4.quantize_nvfp4(x, global_scale=gs)
        if scales.numel() == 0:
            # An empty cache's scale buffer is empty too, which the ops read as "no k_scale"
            # (reported, not fuzzed): give it one (unused) row tile.
            scales = torch.zeros(nvfp4.nvfp4_scale_bytes(1), dtype=torch.uint8)
        return data, scales, deq_gs, nvfp4.dequantize_nvfp4(data, scales, deq_gs)
    if kind in FINITE_MAX:
        x = x.clamp(-FINITE_MAX[kind], FINITE_MAX[kind])
    stored = x.to(_dtype(kind))
    return stored, None, None, stored.float()


def _kv_data(gen, shape, hkv_dim: int, data_scale: float, ranges: Optional[dict], name: str):
    """Random K or V rows of ``shape`` (head axis ``hkv_dim``): ``randn * data_scale``, or as
    ``ranges`` (the case's v_offset / v_noise / k_mag, see _value_ranges) says."""
    torch = _torch()
    ranges = ranges or {}
    x = torch.randn(shape, generator=gen)
    if name == "v" and ranges.get("v_offset"):
        sign_shape = [1] * len(shape)
        sign_shape[hkv_dim], sign_shape[-1] = shape[hkv_dim], 128
        sign = torch.randint(0, 2, sign_shape, generator=gen).float() * 2 - 1
        return (x * ranges["v_noise"] + sign) * ranges["v_offset"]
    if name == "k" and ranges.get("k_mag"):
        return x * ranges["k_mag"]
    return x * data_scale


def build_cache(rng: random.Random, gen, seqs_k: List[int], hkv: int, kind: str, layout: str,
                shared: bool, invalid: bool, with_v: bool, data_scale: float,
                nan_keys: bool = False, max_pages: Optional[int] = None,
                ranges: Optional[dict] = None) -> Cache:
    """Flat (``cu_seqlens_k``) or paged cache (pages shuffled; with ``shared`` some page-table
    entries of later sequences point at pages of earlier ones; with ``invalid`` some entries lie
    outside the cache), K and optionally V, stored as ``kind`` (bf16 / fp16 / fp8 / nvfp4), values
    as _kv_data makes them."""
    torch = _torch()
    c = Cache()
    b = len(seqs_k)
    nb = [math.ceil(s / BLOCK) for s in seqs_k]
    names = ("k", "v") if with_v else ("k",)
    if layout == "flat":
        total = sum(seqs_k)
        cu = _cu(seqs_k).tolist()
        for name in names:
            x = _kv_data(gen, (total, hkv, 128), 1, data_scale, ranges, name)
            if name == "k" and nan_keys and total:
                for j in torch.randint(0, total, (4,), generator=gen).tolist():
                    x[j, :, 5] = float("nan")
            st, sc, gs, deq = _quantize(x, kind, gen)
            c.args[name] = st
            if sc is not None:
                c.args[f"{name}_scale"], c.args[f"{name}_global_scale"] = sc, gs
            seqs = [deq[cu[i]:cu[i + 1]] for i in range(b)]
            (c.keys if name == "k" else c.values).extend(seqs)
        c.args["cu_seqlens_k"] = _cu(seqs_k)
        c.dropped = [set() for _ in range(b)]
        return c
    # paged
    if max_pages is None:
        max_pages = max(max(nb, default=0), 1) + rng.choice((0, 0, 1))
    needed = sum(nb)
    num_pages = max(1, needed + rng.choice((0, 1, 3)))
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.tensor([[rng.randrange(num_pages) for _ in range(max_pages)] for _ in range(b)],
                         dtype=torch.int32).reshape(b, max_pages)
    used = 0
    for i in range(b):
        for t in range(nb[i]):
            other = rng.randrange(i) if i else 0
            if shared and i > 0 and nb[other] > t and rng.random() < 0.5:
                table[i, t] = int(table[other, t])  # a page shared with an earlier sequence
            else:
                table[i, t] = perm[used % num_pages]
                used += 1
    dropped = [set() for _ in range(b)]
    if invalid:
        for i in range(b):
            for t in range(nb[i]):
                if rng.random() < 0.2:
                    table[i, t] = rng.choice((-1, -7, num_pages, num_pages + 5, 2 ** 31 - 1))
                    dropped[i].add(t)
    pools = {}
    for name in names:
        x = _kv_data(gen, (num_pages, hkv, BLOCK, 128), 1, data_scale, ranges, name)
        if name == "k" and nan_keys:
            for pg in torch.randint(0, num_pages, (3,), generator=gen).tolist():
                x[pg, :, rng.randrange(BLOCK), 7] = float("nan")
        st, sc, gs, deq = _quantize(x, kind, gen)
        pools[name] = (st, deq)
        if sc is not None:
            c.args[f"{name}_scale"], c.args[f"{name}_global_scale"] = sc, gs
    for name in names:
        deq = pools[name][1]
        seqs = []
        for i in range(b):
            # the sequence's pages gathered in table order, dropped (invalid) ones as zeros
            keep = torch.ones(nb[i], dtype=torch.bool)
            keep[sorted(dropped[i])] = False
            pages = deq[torch.where(keep, table[i, :nb[i]].long(), 0)]
            pages[~keep] = 0
            seqs.append(pages.transpose(1, 2).reshape(nb[i] * BLOCK, hkv, 128)[:seqs_k[i]])
        (c.keys if name == "k" else c.values).extend(seqs)
    if layout.startswith("packed"):
        from flashmsa.testing import pack_kv
        cache, kview, vview = pack_kv(pools["k"][0], pools["v"][0], nhd=layout == "packed_nhd")
        c.args["packed"] = (cache, kview, vview)
    else:
        for name in names:
            c.args[name] = pools[name][0]
    c.args["page_table"] = table
    c.args["seqused_k"] = torch.tensor(seqs_k, dtype=torch.int32)
    c.dropped = dropped
    return c


def _to(x, device):
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x.to(device)
    return x


def _packed_on(packed, device):
    """The packed K / V views re-taken on a copy of their cache on ``device``."""
    torch = _torch()
    cache, kview, vview = packed
    base = cache.to(device)
    k = torch.as_strided(base, kview.shape, kview.stride(), kview.storage_offset())
    v = torch.as_strided(base, vview.shape, vview.stride(), vview.storage_offset())
    return k, v


# ---- the ops on one device ----------------------------------------------------------------------

class Problem:
    """One case: ``run(device)`` calls the op there; ``check(got, want)`` returns None or the
    first discrepancy, as text."""

    def __init__(self, op: str, params: dict, seed: int):
        self.op, self.p, self.seed = op, params, seed
        torch = _torch()
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(f"data:{op}:{seed}")
        getattr(self, f"_build_{op}")()

    # -- proxy ----------------------------------------------------------------------------------

    def _build_proxy(self, fp4: bool = False):
        torch = _torch()
        p, gen = self.p, self.gen
        total_q = sum(p["seqs_q"]) + p["extra_rows"]
        q = torch.randn((total_q, p["hq"], 128), generator=gen) * p["data_scale"]
        cache = build_cache(self.rng, gen, p["seqs_k"], p["hkv"], p["k_dtype"],
                            "paged" if p["paged"] else "flat", p["shared_pages"],
                            p["invalid_pages"] and p["paged"], False, p["data_scale"],
                            nan_keys=p["nan_keys"], max_pages=p.get("max_pages"))
        if p.get("declared_k"):
            cache.args["seqused_k"] = torch.tensor(p["declared_k"], dtype=torch.int32)
        nb = [math.ceil(s / BLOCK) for s in p["seqs_k"]]
        tiles = p["max_k_tiles"] or max(max(nb, default=0), 1)
        self.tiles = tiles
        kw = dict(causal=p["causal"], max_k_tiles=p["max_k_tiles"],
                  max_seqlen_q=p["max_seqlen_q"], reduce_heads=p["reduce_heads"],
                  q_offset=_q_offset_arg(p))
        if p["paged"]:
            kw.update(page_table=cache.args["page_table"], seqused_k=cache.args["seqused_k"])
            cu_k = None
        else:
            cu_k = cache.args["cu_seqlens_k"]
        cu_q = _cu(p["seqs_q"])
        if fp4:
            q_st, q_sc, q_gs, _ = _quantize(q, "nvfp4", gen)
            self.args = (q_st, cache.args["k"], q_sc, cache.args["k_scale"], q_gs,
                         cache.args["k_global_scale"], cu_q, cu_k)
        else:
            q_st, _, _, _ = _quantize(q, p["q_dtype"], gen)  # clamped to the dtype's range
            self.args = (q_st, cache.args["k"], cu_q, cu_k)
        self.kwargs = kw
        self.out_shape = (1 if p["reduce_heads"] else p["hq"], tiles, total_q)

    def _build_proxy_fp4(self):
        self._build_proxy(fp4=True)

    def _run_proxy(self, device, reference: bool = False):
        torch = _torch()
        from flashmsa import msa_ops
        fn = _planned("msa_proxy_score_fp4" if self.op == "proxy_fp4" else "msa_proxy_score",
                      self.p.get("options"))
        args = [_to(a, device) for a in self.args]
        kw = {k: _to(v, device) for k, v in self.kwargs.items()}
        out = None
        if self.p["output"]:
            out = torch.full(self.out_shape, float("nan"), dtype=torch.float32, device=device)
            kw["output"] = out
        res = fn(*args, **kw)
        if out is not None and res.data_ptr() != out.data_ptr():
            raise AssertionError("output= was not returned")
        return res

    def _check_proxy(self, got, want) -> Optional[str]:
        torch = _torch()
        got = got.cpu()
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        for name, fn in (("-inf", torch.isneginf), ("+inf", torch.isposinf), ("NaN", torch.isnan)):
            bad = (fn(got) != fn(want)).nonzero()
            if bad.numel():
                i = tuple(bad[0].tolist())
                return (f"{name} pattern differs at {bad.shape[0]} elements, first (head, block, "
                        f"row) {i}: got {got[i].item()}, want {want[i].item()}")
        fin = torch.isfinite(want)
        if fin.any():
            diff = (got.double() - want.double()).abs().masked_fill(~fin, 0)
            # 1e-2 absolute at unit-variance inputs (test_gpu_proxy_topk.py); the fp32 summation
            # error grows with the products' magnitude, so larger data scales the bound.
            tol = 1e-2 * max(1.0, self.p["data_scale"] ** 2)
            worst = int(diff.argmax())
            if diff.view(-1)[worst] > tol:
                i = tuple(int(x) for x in torch.unravel_index(torch.tensor(worst), diff.shape))
                return (f"|diff| {float(diff.view(-1)[worst]):.3g} > {tol:.3g} at (head, block, "
                        f"row) {i}: got {got[i].item()}, want {want[i].item()}")
        return None

    # -- topk -----------------------------------------------------------------------------------

    def _build_topk(self):
        torch = _torch()
        p, gen, rng = self.p, self.gen, self.rng
        shape = (p["h"], p["p"], p["s"])
        base = p["base"]
        if base == "randn":
            x = torch.randn(shape, generator=gen)
        elif base == "few":
            x = torch.randint(-2, 3, shape, generator=gen).float()
        elif base == "ties":
            x = 1 + torch.randint(0, 8, shape, generator=gen).float() * 2.0 ** -13
        else:
            x = torch.randn(shape, generator=gen) * torch.exp2(
                torch.randint(-120, 120, shape, generator=gen).float())
        r = torch.rand(shape, generator=gen)
        specials = (float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0)
        for i, v in enumerate(specials):
            lo, hi = p["specials"] * i / 6, p["specials"] * (i + 1) / 6
            x[(r >= lo) & (r < hi)] = v
        if p["payloads"]:
            bits = x.view(torch.int32)
            nan = torch.isnan(x)
            payload = torch.randint(0, 1 << 22, shape, generator=gen, dtype=torch.int32)
            bits[nan] = bits[nan] | payload[nan]
        if p["row_inf"]:
            x[:, :, rng.randrange(p["s"])] = -float("inf")
        if p["col_inf"]:
            x[:, rng.randrange(p["p"]), :] = -float("inf")
        nvp = p["nvp"]
        if p["nvp_form"] == "tensor":
            nvp = torch.randint(0, p["p"] + 1, (p["s"],), generator=gen, dtype=torch.int32)
        elif p["nvp_form"] == "clamp":
            vals = [p["p"] + 1, 2 * p["p"], 2 ** 31 - 1, 0, -5, p["p"], -(2 ** 31), 1]
            nvp = torch.tensor([vals[rng.randrange(len(vals))] for _ in range(p["s"])],
                               dtype=torch.int32)
        self.args = (x.contiguous(), p["topk"])
        self.kwargs = dict(num_valid_pages=nvp, force_begin_blocks=p["fb"],
                           force_end_blocks=p["fe"])

    def _run_topk(self, device, reference: bool = False):
        torch = _torch()
        from flashmsa import msa_ops
        kw = {k: _to(v, device) for k, v in self.kwargs.items()}
        out = buf = None
        if self.p["output"]:
            s, h, topk = self.p["s"], self.p["h"], self.p["topk"]
            layout = self.p.get("output_layout", "contiguous")
            if layout == "contiguous":
                out = torch.full((s, h, topk), -7, dtype=torch.int32, device=device)
            else:
                pad = 3 if layout == "head_rows" else 0
                buf = torch.full((h, s + pad, topk + pad), -7, dtype=torch.int32, device=device)
                out = buf[:, pad:, :topk].transpose(0, 1)
            kw["output"] = out
        score = self.args[0].to(device)
        if self.p["misaligned"]:
            # the scores start 4 bytes past a 16-byte boundary (the radix kernel's narrow loads)
            flat = torch.empty(score.numel() + 1, device=device)
            flat[1:] = score.reshape(-1)
            score = flat[1:].view(score.shape)
        res = _planned("msa_topk_select", self.p.get("options"))(score, self.args[1], **kw)
        if out is not None and res.data_ptr() != out.data_ptr():
            raise AssertionError("output= was not returned")
        if buf is not None and self.p["s"]:
            outside = buf.clone()
            outside[:, -self.p["s"]:, :self.p["topk"]] = -7  # the rows: (H, S, topk) at the end
            if not bool((outside == -7).all()):
                raise AssertionError("output= written outside its rows")
        return res

    def _check_topk(self, got, want) -> Optional[str]:
        got = got.cpu()
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        bad = (got != want).any(-1).nonzero()
        if bad.numel():
            i = tuple(bad[0].tolist())
            return (f"{bad.shape[0]} rows differ; first (token, head) {list(i)}: got "
                    f"{got[i].tolist()}, want {want[i].tolist()}")
        return None

    # -- attention and decode -------------------------------------------------------------------

    def _make_q2k(self, rows_of: List[Tuple[int, int]], hkv: int, topk: int, nbs: List[int],
                  offs: List[int], total_rows: int):
        """(Hkv, total_rows, topk) int32; rows_of[r] = (sequence, index in sequence), rows past
        len(rows_of) belong to no sequence."""
        torch = _torch()
        rng = self.rng
        kinds = [(k, w) for k, w in self.p["selection"].items() if k != "share"]
        share = self.p["selection"].get("share", 0.0)
        names = [k for k, _ in kinds]
        weights = [w for _, w in kinds]
        sel = torch.full((hkv, total_rows, topk), -1, dtype=torch.int32)
        for r, (b, i) in enumerate(rows_of):
            nb = nbs[b]
            if i > 0 and share and rng.random() < share:
                sel[:, r] = sel[:, r - 1]  # the previous token's lists (same sequence)
                continue
            for h in range(hkv):
                kind = rng.choices(names, weights)[0]
                n = rng.randint(0, min(topk, nb)) if nb else 0
                ids = sorted(rng.sample(range(nb), n)) if n else []
                if kind == "unsorted":
                    rng.shuffle(ids)
                elif kind == "duplicates" and ids:
                    ids = ids + [rng.choice(ids) for _ in range(topk)]
                    rng.shuffle(ids)
                elif kind == "out_of_range":
                    ids = ids + [rng.choice((nb, nb + 1, nb + 3, 10 ** 6, 2 ** 31 - 1))
                                 for _ in range(rng.randint(1, 3))]
                    rng.shuffle(ids)
                elif kind == "holes":
                    k = len(ids) // 2
                    ids = ids[:k] + [rng.choice((-1, -5))] + [rng.randrange(max(nb, 1) + 2)
                                                             for _ in range(topk)]
                elif kind == "empty":
                    ids = []
                elif kind == "causal_local" and nb:
                    local = min(max(offs[b] + i, 0) // BLOCK, nb - 1)
                    earlier = rng.sample(range(local), min(local, topk - 1))
                    ids = sorted(earlier + [local])
                elif kind == "full" and nb:
                    ids = sorted(rng.sample(range(nb), min(topk, nb)))
                ids = ids[:topk]
                if ids:
                    sel[h, r, :len(ids)] = torch.tensor(ids, dtype=torch.int64).clamp(
                        max=2 ** 31 - 1).to(torch.int32)
        # rows of no sequence carry ordinary lists
        sel[:, len(rows_of):, :min(2, topk)] = 0
        return sel

    def _build_attention(self, decode: bool = False):
        torch = _torch()
        p, gen, rng = self.p, self.gen, self.rng
        if decode:
            seqs_q = [p["seqlen_q"]] * p["batch"]
            extra = 0
            cdt = "bf16" if p["q_dtype"] == "fp8" else p["q_dtype"]
        else:
            seqs_q = p["seqs_q"]
            extra = p["extra_rows"]
            cdt = p["dtype"]
        seqs_k = p["seqs_k"]
        self.seqs_q, self.cdt = seqs_q, _dtype(cdt)
        kind = p["kv"] if p["kv"] != "same" else cdt
        cache = build_cache(rng, gen, seqs_k, p["hkv"], kind, p["layout"], p["shared_pages"],
                            p["invalid_pages"] and p["layout"] != "flat", True, p["data_scale"],
                            max_pages=p.get("max_pages"), ranges=p)
        declared = p.get("declared_k") or seqs_k
        if p["layout"] != "flat":
            if p.get("k_lengths") == "cu_seqlens_k":
                # the differences give the lengths; seqused_k only has to be well-formed
                cache.args["cu_seqlens_k"] = _cu(declared)
                cache.args["seqused_k"] = torch.randint(0, 10 ** 6, (len(seqs_k),),
                                                        generator=gen, dtype=torch.int32)
            else:
                cache.args["seqused_k"] = torch.tensor(declared, dtype=torch.int32)
        total_q = sum(seqs_q) + extra
        q = torch.randn((total_q, p["hq"], 128), generator=gen) * (p.get("q_mag") or
                                                                    p["data_scale"])
        q_kind = p["q_dtype"] if decode else cdt
        if q_kind in FINITE_MAX:
            q = q.clamp(-FINITE_MAX[q_kind], FINITE_MAX[q_kind])
        q = q.to(self.cdt)
        if decode and p["q_dtype"] == "fp8":
            q = q.float().to(torch.float8_e4m3fn)
        self.q_compute = q.to(self.cdt).float()
        offs = _positions_offsets(p, seqs_q, seqs_k)
        rows_of = [(b, i) for b, sq in enumerate(seqs_q) for i in range(sq)]
        nbs = [math.ceil(s / BLOCK) for s in seqs_k]
        q2k = self._make_q2k(rows_of, p["hkv"], p["topk"], nbs, offs, total_q)
        self.cache, self.offs, self.q2k = cache, offs, q2k
        kw = dict(causal=p["causal"], softmax_scale=p["softmax_scale"], q_offset=_q_offset_arg(p))
        for name in ("page_table", "seqused_k", "cu_seqlens_k", "k_scale", "v_scale",
                     "k_global_scale", "v_global_scale"):
            if name in cache.args:
                kw[name] = cache.args[name]
        if p["v_global_scale"] is not None:
            # NVFP4: the case's scale multiplies the quantizer's (a V descale on top)
            kw["v_global_scale"] = p["v_global_scale"] * kw.get("v_global_scale", 1.0)
        if decode:
            kw.update(seqlen_q=p["seqlen_q"], return_softmax_lse=p["lse"],
                      partial_dtype=_dtype(p["partial_dtype"]) if p["partial_dtype"] else None,
                      force_fused=p["force_fused"])
        else:
            kw.update(cu_seqlens_q=_cu(seqs_q), return_softmax_lse=p["lse"])
            if p["temperature"] is not None:
                kw.update(return_temperature_lse=True, lse_temperature_scale=p["temperature"])
        self.kwargs = kw
        self.q = q

    def _build_decode(self):
        self._build_attention(decode=True)

    def _attention_args(self, device, reference: bool):
        torch = _torch()
        from flashmsa import msa_ops
        if "packed" in self.cache.args:
            k, v = _packed_on(self.cache.args["packed"], device)
        else:
            k, v = self.cache.args["k"].to(device), self.cache.args["v"].to(device)
            if (self.p.get("nhd_views") and not reference and self.p["layout"] == "paged"
                    and self.p["kv"] != "nvfp4"):
                k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        kw = {n: _to(x, device) for n, x in self.kwargs.items()}
        if self.p["workspace"] and not reference:
            # one workspace per process, reused by every case: it grows and is reused across
            # calls of any size and layout
            if _WORKSPACES.get(str(device)) is None:
                _WORKSPACES[str(device)] = msa_ops.MSASparseAttentionWorkspace(device)
            kw["workspace"] = _WORKSPACES[str(device)]
        q2k = self.q2k.to(device)
        if self.p.get("q2k_token_major") and not reference:
            torch = _torch()
            hkv, total_q, topk = q2k.shape
            buf = torch.full((total_q + 2, hkv, topk), 2**30, dtype=torch.int32, device=device)
            view = buf.transpose(0, 1)[:, 1:1 + total_q]
            view.copy_(q2k)
            q2k = view
        elif self.p.get("q2k_head_rows") and not reference:
            torch = _torch()
            hkv, total_q, topk = q2k.shape
            buf = torch.full((hkv, total_q + 3, topk + 2), 2**30, dtype=torch.int32,
                             device=device)
            view = buf[:, 2:2 + total_q, :topk]
            view.copy_(q2k)
            q2k = view
        return (self.q.to(device), k, v, q2k), kw

    def _run_attention(self, device, reference: bool = False):
        torch = _torch()
        from flashmsa import msa_ops
        fn = _planned("msa_sparse_decode_attention" if self.op == "decode"
                      else "msa_sparse_attention", self.p.get("options"))
        args, kw = self._attention_args(device, reference)
        if self.op == "attention":
            cu_q = kw.pop("cu_seqlens_q")
            args = args + (cu_q,)
        out = None
        if self.p.get("out") and not reference:
            # out=: the caller's tensor, NaN-poisoned, is written in place and returned
            dtype = torch.bfloat16 if args[0].dtype == torch.float8_e4m3fn else args[0].dtype
            out = kw["out"] = torch.full(args[0].shape, float("nan"), dtype=dtype, device=device)
        if not (self.p["graph"] and torch.device(device).type == "cuda"):
            res = fn(*args, **kw)
            res = res if isinstance(res, tuple) else (res,)
            if out is not None and res[0] is not out:
                raise AssertionError("out= given: the op returned another tensor")
            return res
        # CUDA graph: capture with a workspace (warm-up on a side stream), poison the outputs,
        # replay, return the replayed outputs.
        kw["workspace"] = msa_ops.MSASparseAttentionWorkspace(device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args, **kw)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            res = fn(*args, **kw)
        res = res if isinstance(res, tuple) else (res,)
        for t in res:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return tuple(t.clone() for t in res)

    _run_decode = _run_attention
    _run_proxy_fp4 = _run_proxy

    def baseline(self):
        """(out, lse, vmax) computed as a kernel computes: compute-dtype Q / K / V (dequantized
        fp8 / NVFP4 values are exact there), fp32 scores, softmax and accumulation, P rounded to
        the compute dtype before P V, output rounded to the output dtype; ``vmax`` is out's shape,
        each element the largest |V| (times the V scale) over the keys its row attends to (0 for a
        row without keys): what bounds a split's partial output there."""
        torch = _torch()
        p = self.p
        cdt = self.cdt
        total_q, hq = self.q.shape[0], p["hq"]
        g = hq // p["hkv"]
        out = torch.zeros((total_q, hq, 128))
        lse = torch.full((total_q, hq), float("-inf"))
        vmax = torch.zeros((total_q, hq, 128))
        scale = self.kwargs.get("softmax_scale")
        scale = 128 ** -0.5 if scale is None else scale
        out_scale = self.value_scale()
        start = 0
        for b, (sq, sk) in enumerate(zip(self.seqs_q, p["seqs_k"])):
            if sq == 0 or sk == 0:
                start += sq
                continue
            nb = math.ceil(sk / BLOCK)
            kb = self.cache.keys[b].to(cdt).float()
            if "k_global_scale" in self.cache.args:
                # dequantized with the global scale already; the kernels fold it into the softmax
                # scale, the baseline keeps it in the keys (rounding differs by far less than the
                # tolerance's own baseline error)
                kb = self.cache.keys[b].float()
            vb = self.cache.values[b].float()
            if "v_global_scale" not in self.cache.args:
                vb = vb.to(cdt).float()
            i = torch.arange(sq)[:, None]
            j = torch.arange(sk)[None, :]
            visible = (j <= self.offs[b] + i) if p["causal"] \
                else torch.ones(sq, sk, dtype=torch.bool)
            for kh in range(p["hkv"]):
                sel = self.q2k[kh, start:start + sq].to(torch.int64)
                valid = torch.cumprod((sel >= 0).to(torch.int64), dim=1).bool() & (sel < nb)
                bm = torch.zeros((sq, nb + 1), dtype=torch.bool)
                bm.scatter_(1, torch.where(valid, sel, torch.full_like(sel, nb)), True)
                bm = bm[:, :nb]
                for t in self.cache.dropped[b]:
                    bm[:, t] = False
                mask = bm.repeat_interleave(BLOCK, dim=1)[:, :sk] & visible
                qh = self.q_compute[start:start + sq, kh * g:(kh + 1) * g]
                s = torch.einsum("igd,jd->gij", qh, kb[:, kh]) * scale
                s = s.masked_fill(~mask, float("-inf"))
                m = s.amax(-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                pr = torch.exp(s - m)
                den = pr.sum(-1)
                o = torch.einsum("gij,jd->igd", pr.to(cdt).float(), vb[:, kh])
                o = o / torch.where(den > 0, den, 1.0).T[..., None] * out_scale
                out[start:start + sq, kh * g:(kh + 1) * g] = o
                seen = (mask[:, :, None] * vb[None, :, kh].abs()).amax(1) * abs(out_scale)
                vmax[start:start + sq, kh * g:(kh + 1) * g] = seen[:, None, :]
                lse[start:start + sq, kh * g:(kh + 1) * g] = (m.squeeze(-1) + torch.log(den)).T
            start += sq
        return out.to(cdt), lse, vmax

    def value_scale(self) -> float:
        """What multiplies the (dequantized) values: the case's V scale; NVFP4 values carry their
        global scale already."""
        if "v_global_scale" in self.cache.args:
            return self.p["v_global_scale"] or 1.0
        return self.kwargs.get("v_global_scale") or 1.0

    def _check_attention(self, got, want) -> Optional[str]:
        torch = _torch()
        got = tuple(t.cpu() for t in got)
        if len(got) != len(want):
            return f"{len(got)} outputs, want {len(want)}"
        out, ref_out = got[0], want[0]
        if out.dtype != ref_out.dtype or out.shape != ref_out.shape:
            return f"out {out.dtype} {tuple(out.shape)} != {ref_out.dtype} {tuple(ref_out.shape)}"
        if torch.isnan(out).any():
            return f"out: {int(torch.isnan(out).sum())} NaN elements"
        g, c = out.double(), ref_out.double()
        # Outputs that overflow the output dtype (extreme V scales): the same +-inf on both sides,
        # or, where one side rounded to inf and the other to a finite value (results within the
        # tolerance of the overflow threshold), the inf read as that threshold (the largest
        # finite value plus half its ulp) and compared as a number below.
        if bool((torch.isinf(g) & torch.isinf(c) & (g != c)).any()):
            i = tuple((torch.isinf(g) & (g != c)).nonzero()[0].tolist())
            return f"out: inf of the other sign at {i}: got {g[i].item()}, want {c[i].item()}"
        fmax = torch.finfo(out.dtype).max
        edge = fmax + _ulp(out.dtype, fmax) / 2
        both = torch.isinf(g) & torch.isinf(c)
        g, c = (torch.where(torch.isinf(x) & ~both, x.sign() * edge, x) for x in (g, c))
        fin = ~both & ~torch.isnan(c)
        bb, _, seen = self.baseline()
        bb = bb.double()
        bb = torch.where(torch.isfinite(bb), bb, c)
        g, c, bb = (torch.where(fin, x, torch.zeros_like(x)) for x in (g, c, bb))
        err = (g - c).abs()
        base_err = float((bb - c).abs().max()) if g.numel() else 0.0
        mag = float(c.abs().max()) if g.numel() else 0.0
        tol = torch.full_like(err, 2 * base_err + 2 * _ulp(out.dtype, mag))
        # The partials' dtype where the call splits: decode's partial_dtype, else (None, and
        # prefill's split paths) the compute dtype; fp8 partials are used with fp8 V only (NVFP4
        # reads up to 6 x 448, 16-bit V is unbounded) and fp16 partials not with bf16 V: the
        # compute dtype replaces them (docs/semantics.md#decode). A compute-dtype partial's
        # rounding needs the allowance too where the output is a small average of large V rows
        # (attention:548829: fp16, fp8 V x 1e4 of both signs, an output of -25504 112 off).
        compute = "bf16" if self.cdt == torch.bfloat16 else "fp16"
        partial = self.p["partial_dtype"] if self.op == "decode" else None
        if partial == "fp8" and self.p["kv"] != "fp8":
            partial = None
        if partial == "fp16" and self.p["kv"] == "same" and compute == "bf16":
            partial = None
        if partial is None:
            partial = compute
        if partial in ("fp8", "bf16", "fp16"):
            # A split's output (a convex combination of the V rows it read) rounded to the partial
            # dtype: at most half an ulp of the largest |V| its row attends to, 2^-(mantissa bits
            # + 1) of it (e4m3 3, bf16 7, fp16 10 bits); the combine is convex again. bf16
            # partials under fp16 output need it (decode:1000134: V near 500 x 0.37, the partials'
            # half-ulp 2 x 0.37 = 0.74 against a 0.5 tolerance), as fp8 partials do. Capped at the
            # output's range (past it the outputs are inf, compared as the overflow threshold);
            # rows without keys get none. Below the partial dtype's smallest normal the spacing
            # is its subnormal step (e4m3 2^-9: decode:2034134, V near 0.01, a partial of 2^-10
            # rounded to 2^-9), so the half-ulp is at least half that step; partials hold V's own
            # units (the V scale multiplies the merged row), so that step counts times the V
            # scale (decode:6527: V scale 3, a partial of 0.0013 stored as 2^-9, 1.95e-3 off).
            bits, step = {"fp8": (3, 2.0 ** -9), "bf16": (7, 2.0 ** -133),
                          "fp16": (10, 2.0 ** -24)}[partial]
            # The allowance, not |V|, is capped at the output's range: a V scale can make the
            # partials' rounding larger than any output the row could still hold finitely
            # (attention:523215: fp16 V near 1500 x 1e4, an output of 36224 off by 1024).
            seen = seen.double()
            half_ulp = torch.clamp(2.0 ** -(bits + 1) * seen, min=step / 2 * abs(self.value_scale()))
            half_ulp = half_ulp.clamp(max=fmax)
            tol += torch.where(seen > 0, half_ulp, torch.zeros_like(half_ulp))
        if bool((err > tol).any()):
            worst = int((err - tol).argmax())
            i = tuple(int(x) for x in torch.unravel_index(torch.tensor(worst), g.shape))
            return (f"out: |dev - ref| {err[i].item():.3e} > {tol[i].item():.3e} (baseline "
                    f"{base_err:.3e}) at (row, head, dim) {i}: got {g[i].item():.6g}, want "
                    f"{c[i].item():.6g}")
        names = ["lse", "lse_t"]
        for name, x, y in zip(names, got[1:], want[1:]):
            if torch.isnan(x).any():
                return f"{name}: NaN"
            if not torch.equal(torch.isinf(x), torch.isinf(y)):
                bad = (torch.isinf(x) != torch.isinf(y)).nonzero()[0].tolist()
                return (f"{name}: -inf pattern differs, first (row, head) {bad}: got "
                        f"{x[tuple(bad)].item()}, want {y[tuple(bad)].item()}")
            if bool((x[torch.isinf(x)] > 0).any()):
                return f"{name}: +inf"
            fin = torch.isfinite(y)
            if fin.any():
                e = float((x[fin].double() - y[fin].double()).abs().max())
                if e > 1e-2:
                    return f"{name}: max |dev - ref| {e:.3e} > 1e-2"
        if len(want) > 1:
            empty = torch.isinf(want[1])
            if not bool((out[empty] == 0).all()):
                return "rows without a visible key are not exactly 0"
        return None

    _check_decode = _check_attention

    # -- dispatch -------------------------------------------------------------------------------

    def run(self, device, reference: bool = False):
        """The op on ``device``; ``reference``: the plain call the device is compared with (no
        shared workspace, no graph)."""
        return getattr(self, f"_run_{self.op}")(device, reference)

    def check(self, got, want) -> Optional[str]:
        if self.op in ("proxy", "proxy_fp4"):
            return self._check_proxy(got, want)
        return getattr(self, f"_check_{self.op}")(got, want)


def _ulp(dtype, magnitude: float) -> float:
    torch = _torch()
    mant = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    return 2.0 ** (math.floor(math.log2(max(magnitude, 2.0 ** -14))) - mant)


# ---- one case -----------------------------------------------------------------------------------

def plant_fault(op: str, params: dict, got):
    """The device result with one element made wrong by far more than any tolerance (an index
    off by one, a score or an output value moved, a -inf score made finite). Returns
    ``(result, planted)``; nothing is planted in an empty result."""
    torch = _torch()
    if op in ("proxy", "proxy_fp4", "topk"):
        x = got.clone(memory_format=torch.contiguous_format)  # top-k's output= may be a view
        flat = x.view(-1)
        if flat.numel() == 0:
            return got, False
        if op == "topk":
            flat[0] = flat[0] + 1
        else:
            fin = torch.isfinite(flat).nonzero()
            if fin.numel():
                flat[int(fin[0])] += 10.0 * max(1.0, params["data_scale"] ** 2)
            else:
                flat[0] = 0.0
        return x, True
    out = got[0].clone()
    flat = out.view(-1)
    if flat.numel() == 0:
        return got, False
    fin = torch.isfinite(flat.float())
    i = int(fin.nonzero()[0]) if fin.any() else 0
    big = float(flat.float()[fin].abs().max()) if fin.any() else 0.0
    # moved towards 0 and past it (away from the overflow threshold: an inf on one side counts as
    # that threshold, see _check_attention)
    x = float(flat[i].float()) if fin.any() else 0.0
    flat[i] = (x - 1.0 - 2 * big if x > 0 else x + 1.0 + 2 * big) if fin.any() else 0.0
    return (out,) + tuple(got[1:]), True


def reproducer(op: str, seed: int, params: dict, message: str) -> str:
    return (f"FUZZ FAIL {op}:{seed} {message} | params {json.dumps(params, sort_keys=True)} | "
            f"rerun: python benchmarks/fuzz_msa.py --replay {op}:{seed}")


PHASES = ("build", "device", "reference", "check")


def run_case(op: str, seed: int, device: str,
             timings: Optional[Dict[str, float]] = None) -> Tuple[Optional[str], bool]:
    """Runs case ``(op, seed)`` on ``device`` and on the CPU. Returns (None when they agree, else
    the one-line reproducer; whether a fault was planted). ``timings``, when given, receives the
    wall seconds of each of PHASES (inputs and parameters, the device call, the CPU reference,
    the comparison) and ``cpu``: this process's CPU seconds for the case."""
    clock, cpu0 = time.perf_counter, time.process_time()
    marks = [clock()]
    params = case_params(op, seed)
    planted = False
    try:
        import flashmsa.testing as ft
        pb = Problem(op, params, seed)
        marks.append(clock())
        with ft.poison_outputs(True):
            got = pb.run(device)
            if device != "cpu":
                _torch().cuda.synchronize()
        marks.append(clock())
        if _PLANT is not None:
            got, planted = _PLANT(op, params, got)
        want = pb.run("cpu", reference=True)
        marks.append(clock())
        msg = pb.check(got, want)
        marks.append(clock())
    except Exception as exc:  # an exception on either side is a failure of the case
        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
    if timings is not None:
        timings.update({name: (marks[i + 1] - marks[i]) if i + 1 < len(marks) else 0.0
                        for i, name in enumerate(PHASES)})
        timings["cpu"] = time.process_time() - cpu0
    return (None if msg is None else reproducer(op, seed, params, msg)), planted


# ---- the run ------------------------------------------------------------------------------------

def _context_lost(msg: str) -> bool:
    torch = _torch()
    if not any(w in msg for w in ("CUDA error", "illegal", "cudaError", "unspecified launch")):
        return False
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return False
    except Exception:
        return True


def _worker(wid: int, nworkers: int, args, deadline: float, results):
    # One thread each for the CPU reference (it reads FLASHMSA_NUM_THREADS at every call; unset,
    # it starts one thread a core) and for torch: the workers already fill the cores.
    os.environ["FLASHMSA_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    global _PLANT
    if args.plant_fault:
        _PLANT = plant_fault
    ops = args.ops
    i = wid
    try:
        import flashmsa.msa_ops  # noqa: F401
        if args.device != "cpu":  # the CUDA context, made before the first case's clock starts
            torch.zeros(1, device=args.device).add_(1).item()
        results.put(("ready", wid, None, None, time.time()))
        while i < args.cases and time.time() < deadline:
            op = ops[i % len(ops)]
            seed = args.seed + i
            timings: Dict[str, float] = {}
            t0 = time.time()
            msg, planted = run_case(op, seed, args.device, timings)
            timings["wall"] = time.time() - t0
            results.put(("case", op, seed, (msg, planted), timings))
            i += nworkers
            if msg is not None and args.device != "cpu" and _context_lost(msg):
                results.put(("crash", wid, f"stopped after {op}:{seed}: the CUDA context is "
                             "unusable (every later case of this worker would fail)", 0, 0))
                break
    except BaseException:  # report, then stop this worker
        results.put(("crash", wid, traceback.format_exc(), 0, 0))
    results.put(("done", wid, None, None, 0))


def fuzz(args) -> dict:
    """Runs the fuzzing loop; returns dict(counts={op: [passed, failed]}, failures=[lines],
    cost={op: {"wall" / "cpu" / phase: seconds summed over its cases}}, planted=cases with a
    planted fault, startup=seconds until the last worker was ready for its first case)."""
    t_start = time.time()
    deadline = t_start + args.seconds
    counts = {op: [0, 0] for op in args.ops}
    planted = 0
    failures: List[str] = []
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(w, args.workers, args, deadline, results),
                         daemon=True) for w in range(args.workers)]
    for pr in procs:
        pr.start()
    alive = len(procs)
    cost = {op: dict.fromkeys(("wall", "cpu") + PHASES, 0.0) for op in args.ops}
    startup = 0.0
    while alive:
        try:
            kind, a, b, c, dt = results.get(timeout=5)
        except queue_mod.Empty:
            if not any(pr.is_alive() for pr in procs):
                failures.append("FUZZ ERROR: a worker died without reporting")
                break
            continue
        if kind == "done":
            alive -= 1
        elif kind == "ready":
            startup = max(startup, dt - t_start)
        elif kind == "crash":
            failures.append(f"FUZZ ERROR: worker {a} crashed: {b}")
        else:
            op, seed, (msg, was_planted) = a, b, c
            planted += was_planted
            for key, secs in dt.items():
                cost[op][key] += secs
            if msg is None:
                counts[op][0] += 1
            else:
                counts[op][1] += 1
                failures.append(msg)
                print(msg, flush=True)
    for pr in procs:
        pr.join(timeout=30)
    return dict(counts=counts, failures=failures, cost=cost, planted=planted, startup=startup)


def usable_cpus() -> int:
    """CPU cores this process may use (flashmsa.testing.usable_cpus), at most 32."""
    from flashmsa.testing import usable_cpus as cores
    return min(cores(), 32)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="device under test (cuda, or cpu for the "
                    "harness self-check: both sides on the CPU)")
    ap.add_argument("--seconds", type=float, default=420.0, help="time budget (stops cleanly)")
    ap.add_argument("--cases", type=int, default=10 ** 9, help="at most this many cases")
    ap.add_argument("--seed", type=int, default=0, help="case seeds are seed + case index")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    ap.add_argument("--workers", type=int, default=usable_cpus(),
                    help="processes, each running whole cases (default: one per CPU core this "
                         "process may use, at most 32)")
    ap.add_argument("--replay", metavar="OP:SEED", help="run this one case, print its parameters")
    ap.add_argument("--plant-fault", action="store_true",
                    help="harness self-test: corrupt one element of every device result; every "
                         "case with a non-empty result must then fail")
    args = ap.parse_args(argv)
    args.ops = tuple(o for o in args.ops.split(",") if o)
    for o in args.ops:
        if o not in OPS:
            ap.error(f"--ops: unknown op {o!r} (choose from {OPS})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replay:
        op, _, seed = args.replay.partition(":")
        params = case_params(op, int(seed))
        print(f"{op}:{seed} params {json.dumps(params, sort_keys=True)}")
        global _PLANT
        if args.plant_fault:
            _PLANT = plant_fault
        msg, _ = run_case(op, int(seed), args.device)
        print(msg or "PASS")
        return 0 if msg is None else 1
    t0 = time.time()
    res = fuzz(args)
    wall = time.time() - t0
    total = sum(p + f for p, f in res["counts"].values())
    failed = sum(f for _, f in res["counts"].values())
    name = args.device
    if args.device != "cpu":
        import torch
        name = f"{args.device} ({torch.cuda.get_device_name(torch.device(args.device))})"
    print(f"fuzz_msa: device={name} seed={args.seed} workers={args.workers} "
          f"wall={wall:.1f}s startup={res['startup']:.1f}s cases={total} failed={failed}"
          + (f" planted={res['planted']}" if args.plant_fault else ""))
    # Per op: wall ms per case per worker, split into the phases of run_case, and the worker's CPU
    # ms per case (wall well above build + reference + check, or cpu well below wall on the CPU,
    # says that the workers waited: for the GPU, or for cores other processes held).
    for op, (ok, bad) in res["counts"].items():
        per = {k: v / max(ok + bad, 1) * 1e3 for k, v in res["cost"][op].items()}
        phases = ", ".join(f"{k} {per[k]:.1f}" for k in PHASES)
        print(f"  {op:<10} {ok + bad:>7} cases  {bad:>4} failed  {per['wall']:7.1f} ms/case "
              f"({phases}; cpu {per['cpu']:.1f})")
    for line in res["failures"]:
        if line.startswith("FUZZ ERROR"):
            print(line)
    return 1 if failed or any(x.startswith("FUZZ ERROR") for x in res["failures"]) else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""flashmsa benchmark: every stage of MSA on one GPU, one table.

    python benchmarks/bench_msa.py [--quick] [--out results.json] [--stages proxy,topk,...]

Shapes, selection patterns, FLOP/byte formulas and the timing method are written down in
docs/benchmarks.md; this file implements exactly that. In short: CUDA events around each op, after
warm-up, with L2 flushed by a 256 MB memset before every repetition and a GPU-side sleep queued
ahead of the op so that host launch time is not timed; median of the repetitions. Useful TFLOP/s and
GB/s are compared with a bf16 8192^3 matmul and a device-to-device copy measured in the same run.
The decode step (stage step) is timed as the replay of one CUDA graph holding proxy, top-k and
sparse decode, beside the same step run eagerly, against its byte floor.
An op that raises NotImplementedError is skipped with its message; any other exception is an error
row, and the exit status is 1 if any case errored.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from flashmsa import testing as ft
from flashmsa.testing import inputs as mi
from flashmsa.testing.timing import Timer, capture_graph

TABLE_MARKER = "### flashmsa benchmark table"
KB = 1024
K = 1024

# Numbers from the issue brief (same H200, bf16): Triton kernels of vLLM's MiniMax-M3 path and
# cuDNN dense attention. Printed beside ours; the speedup column is reference time / our time.
REF_PROXY_32K = (1.32, "Triton 1.32 ms (418 TF)")
REF_TOPK_32K = (0.48, "Triton 0.48 ms")
REF_SPARSE_32K = (17.0, "Triton 17.0 ms (122 TF)")
REF_DENSE_32K = (28.7, "cuDNN 28.7 ms (613 TF)")
REF_PIPELINE = {8 * K: (4.0, "Triton 4.0 ms"), 32 * K: (18.7, "Triton 18.7 ms"),
                128 * K: (100.0, "Triton 100 ms")}
REF_DECODE_INDEX = (0.145, "Triton 0.145 ms")
REF_DECODE_ATTN = (0.083, "Triton 0.083 ms")
REF_STEP = (0.469, "Triton 0.469 ms (eager)")  # proxy -> top-k -> decode, B64 ctx 32K, bf16

# M3 geometry (docs/semantics.md#pipeline): TP1 64 q / 4 kv heads, indexer 4 q heads over 1 k head;
# TP4 16 / 1 / 1.
TOPK = 16
M3 = dict(hq=64, hkv=4, idx_hq=4, idx_hk=1)
M3_TP4 = dict(hq=16, hkv=1, idx_hq=1, idx_hk=1)

FULL = dict(
    prefill_s=[8 * K, 32 * K, 128 * K],
    decode=[(b, c, sq) for b in (1, 8, 64, 128) for c in (8 * K, 32 * K, 128 * K) for sq in (1, 4)],
    sparse=[(s, kv, lay, pat) for s in (8 * K, 32 * K, 128 * K) for kv in ("bf16", "fp8")
            for lay in ("flat", "paged") for pat in ("random", "clustered", "pipeline")],
    decode_attn=[(b, c, sq, kv) for kv in ("bf16", "fp8", "nvfp4") for b in (1, 8, 32, 64, 128)
                 for c in (8 * K, 32 * K, 128 * K) for sq in (1, 4)],
    pipeline_s=[4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K],  # the report's 4K..128K curves
    topk_s=[8 * K, 32 * K, 128 * K],
    # The captured decode step: (batch, ctx, tokens per request, index-K dtype, K/V dtype).
    step=[(b, c, 1, d, d) for d in ("bf16", "fp8") for b in (1, 8, 64) for c in (32 * K, 128 * K)]
    + [(64, c, 1, "bf16", "fp8") for c in (32 * K, 128 * K)]
    + [(64, c, 4, d, d) for d in ("bf16", "fp8") for c in (32 * K, 128 * K)]
    # the NVFP4 indexer with fp8 K/V
    + [(b, c, 1, "nvfp4", "fp8") for b in (1, 8, 64) for c in (32 * K, 128 * K)],
    budget_s=0.3, max_reps=100,
)
QUICK = dict(
    prefill_s=[8 * K, 32 * K],
    decode=[(1, 32 * K, 1), (64, 32 * K, 1), (64, 32 * K, 4)],
    sparse=[(32 * K, "bf16", "flat", "random"), (32 * K, "bf16", "flat", "clustered"),
            (32 * K, "bf16", "paged", "clustered"),
            (32 * K, "bf16", "flat", "pipeline"), (32 * K, "fp8", "paged", "clustered"),
            (8 * K, "bf16", "flat", "pipeline")],
    decode_attn=[(1, 32 * K, 1, "bf16"), (64, 32 * K, 1, "bf16"), (32, 32 * K, 4, "bf16"),
                 (64, 32 * K, 4, "bf16"),
                 (1, 32 * K, 1, "fp8"), (64, 32 * K, 1, "fp8"), (64, 32 * K, 4, "fp8"),
                 (1, 32 * K, 1, "nvfp4"), (64, 32 * K, 1, "nvfp4"), (64, 32 * K, 4, "nvfp4")],
    pipeline_s=[8 * K, 32 * K],
    topk_s=[32 * K, 128 * K],
    step=[(b, 32 * K, 1, d, d) for d in ("bf16", "fp8") for b in (1, 64)]
    + [(b, 32 * K, 1, "nvfp4", "fp8") for b in (1, 64)],
    budget_s=0.15, max_reps=50,
)
STAGES = ("proxy", "topk", "sparse", "decode", "pipeline", "step", "flashinfer", "vllm", "sglang")
# The default run's stages: flashinfer (FlashInfer's own ops beside flashmsa's, benchmarks/
# flashinfer_ref.py) runs where --flashinfer names a prepared FlashInfer, vllm (vLLM's Triton
# MiniMax-M3 ops beside flashmsa's vLLM adapter, benchmarks/vllm_ref.py) where --vllm names
# prepared vLLM ops, sglang (SGLang's Triton MiniMax-M3 kernels beside flashmsa's SGLang adapter,
# benchmarks/sglang_ref.py) where --sglang names prepared SGLang kernels.
DEFAULT_STAGES = STAGES[:-3]
# The flashinfer stage's cases, where FlashInfer 0.7.4's SM90 backend serves M3's shapes: its
# attention ops take paged fp8 K|V interleaved in one cache (vLLM's layout), bf16 q, no LSE, topk
# 16; its proxy score a paged one-head index cache (bf16 in decode, fp8 q and K in prefill).
FI_DECODE = ((1, 32 * K, 1), (1, 128 * K, 1), (64, 32 * K, 1), (64, 128 * K, 1), (64, 32 * K, 4))
FI_PROXY_DECODE = ((1, 128 * K, 1), (64, 32 * K, 1), (64, 32 * K, 4))
FI_PROXY_PREFILL = (8 * K, 32 * K)
FI_TOPK = (("prefill", 32 * K, 4, 256), ("decode", 64, 4, 256), ("decode", 1, 4, 1024))
FI_SPARSE = ((32 * K, "random"), (32 * K, "clustered"), (128 * K, "random"))
# The vllm stage's cases (vLLM 0.34's ops in its layouts: one packed bf16 K|V cache, the index-K
# cache, its transposed token-major top-k buffer), each timed as vLLM calls it and through
# flashmsa.integrations.vllm: index scores and the prefill top-k at 8K / 32K; prefill attention;
# decode indexer (scores + top-k) and decode attention as (batch, context, tokens per request).
VL_INDEX_PREFILL = (8 * K, 32 * K)
VL_SPARSE = ((32 * K, "random"), (32 * K, "clustered"))
VL_DECODE = ((64, 32 * K, 1), (1, 128 * K, 1), (64, 32 * K, 4))
# ... and the decode step as vLLM runs it inside its CUDA graph (indexer into the shared top-k
# buffer, then the attention reading it), bf16 index-K and K/V: (batch, context, tokens).
VL_STEP = ((1, 128 * K, 1), (64, 32 * K, 1), (64, 32 * K, 4))
# The sglang stage's cases (SGLang 0.5.23's kernels in its layouts: slot-major K / V and index-K
# caches of 128-slot pages, req_to_token, [Hkv, tokens, topk] selections), each timed as SGLang
# calls it and through flashmsa.integrations.sglang: the prefill indexer (scores + top-k) at
# 8K / 32K; prefill attention; the decode indexer and decode attention as (batch, context); the
# decode step of one layer (indexer, then attention), eager and graphed.
SG_INDEX_PREFILL = (8 * K, 32 * K)
SG_SPARSE = ((32 * K, "random"), (32 * K, "clustered"))
SG_DECODE = ((64, 32 * K), (1, 128 * K))
SG_STEP = ((1, 128 * K), (64, 32 * K))
# The top-k kernels each top-k case runs under: the library's choice, then forced ones: the
# warp-per-row kernel, by_size, the radix kernel's lean variant radix_1buf (by_size's prefill
# kernel until a1af6c4), radix_uniform (radix_1buf with branch-free passes of warp-uniform trip
# counts; by_size's prefill kernel since), split rows, and split rows with one-chunk rows'
# thresholds by 8-bit digits (warp_digits), and sorting networks over truncated-key words (net,
# also with 2 lanes a row on the prefill shapes: net_lanes=2,
# docs/design/topk_select.md, "Sorting networks"), and net without the pivot that auto's net runs
# before the networks on decode-sized calls (net_pivot=off, "Pivot before the networks"; auto since
# dda49c5) and that pivot in each form forced (net_pivot_mode=sort: a warp a row sorting;
# rank_cta: a CTA of 4 warps a row counting; auto's from rows of 257 blocks since 0e3ed29; "Counting
# instead of sorting") on the decode shapes.
TOPK_KERNELS = ("auto", "warp_per_row", "by_size", "radix_1buf", "radix_uniform", "warp_split",
                "warp_digits", "net", "net net_lanes=2", "net net_pivot=off",
                "net net_pivot_mode=sort", "net net_pivot_mode=rank_cta")
TOPK_DECODE = (64, 4, 256)  # tokens, heads, blocks: a decode batch of 64 at 32K context
# The decode shapes timed (tokens, heads, blocks): batch 64 at 32K, batch 1 at 128K (rows of
# 1024 blocks: the M3 decode step's largest kernel under warp_per_row_8) and at 64K and 32K (512
# and 256 blocks: the pivot's 16 and 8 scores a lane, where auto's pivot form changes).
TOPK_DECODE_SHAPES = (TOPK_DECODE, (1, 4, 1024), (1, 4, 512), (1, 4, 256))
# Kernels for decode-sized calls only (a CTA per row): not timed on the prefill shapes.
TOPK_DECODE_ONLY = ("warp_split", "warp_digits", "net net_pivot=off", "net net_pivot_mode=sort",
                    "net net_pivot_mode=rank_cta")
# Tuning rows of the prefill shapes only: not timed on the decode shapes.
TOPK_PREFILL_ONLY = ("net net_lanes=2",)


def size_name(n: int) -> str:
    return f"{n // K}K" if n % K == 0 else str(n)


def paged_one_sequence(flat: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """flat (S, H, D), S a multiple of 128 -> paged (S/128, H, 128, D) with logical block t in
    physical page perm[t]; on the device (flashmsa.testing.paginate builds ragged caches on the
    host, too slowly for 128K-token benchmark inputs)."""
    s, h, d = flat.shape
    logical = flat.view(s // mi.BLOCK, mi.BLOCK, h, d).permute(0, 2, 1, 3)
    paged = torch.empty(logical.shape, dtype=flat.dtype, device=flat.device)
    paged[perm] = logical
    return paged


def accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---- the captured decode step (stage step) -----------------------------------------------------

STEP_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
# The step's index-K also as the NVFP4 indexer (msa_proxy_score_fp4: index q and index-K both
# NVFP4; DecodeStep takes the name where it takes a dtype for the others). K/V: STEP_DTYPES.
NVFP4 = "nvfp4"
STEP_INDEX_DTYPES = {**STEP_DTYPES, NVFP4: NVFP4}
# The sparse-decode stage's K/V kinds (--decode-attn).
DECODE_KV_DTYPES = ("bf16", "fp8", "nvfp4")
HEAD_DIM = 128
# Index-K bytes a token and index-K head of the NVFP4 indexer: 64 of e2m1 codes + 8 e4m3 scales.
NVFP4_TOKEN_BYTES = HEAD_DIM // 2 + HEAD_DIM // 16


def step_case_name(b: int, ctx: int, sq: int, idx: str, kv: str) -> str:
    return f"B{b} ctx={size_name(ctx)} sq{sq} idx-K {idx} K/V {kv} graph"


# Step rows also timed with sparse-decode plan options: (suffix of the case name, options), for
# batches up to STEP_VARIANT_MAX_BATCH (the split-K calls: at batch 64 the decode is fused and
# split=cluster changes nothing).
STEP_VARIANTS = ((" [split=cluster]", dict(split="cluster")),
                 (" [combine_loads=after]", dict(combine_loads="after")))
# ... and those of bf16 K/V and one token per request also with split-K decode on 4 warps per CTA
# (split_warps=4: auto's 8-warp kernel's predecessor), those of fp8 K/V on 4 and on 8 warps per CTA
# (the 4-warp register kernel, and the 8-warp one converting in registers: auto takes the 8-warp
# kernel where a split holds one block, B1 here, and the 4-warp one at B8).
# The forced 8-warp kernel also runs the larger batches' fp8 steps (fused there).
STEP_BF16_VARIANTS = ((" [split_warps=4]", dict(split_warps=4)),)
STEP_FP8_WIDE_VARIANTS = ((" [split_warps=8]", dict(split_warps=8)),)
STEP_FP8_VARIANTS = ((" [split_warps=4]", dict(split_warps=4)),) + STEP_FP8_WIDE_VARIANTS
STEP_VARIANT_MAX_BATCH = 8
# ... and one token per request with top-k plan options (suffix, options): the networks without
# the pivot auto runs first on these calls (docs/design/topk_select.md, "Pivot before the
# networks"), whatever the K/V dtype.
STEP_TOPK_VARIANTS = ((" [net_pivot=off]", dict(net_pivot="off")),
                      # the pivot path's two forms forced: a warp a row sorting, a CTA of 4 warps
                      # a row counting (auto's from 16 scores a lane; "Counting instead of sorting").
                      (" [net_pivot_mode=sort]", dict(net_pivot_mode="sort")),
                      (" [net_pivot_mode=rank_cta]", dict(net_pivot_mode="rank_cta")))
# ... and, fp8 or NVFP4 index-K, one token per request, with proxy-score plan options: the TMA
# kernel's loads issued by each consumer warp for itself (auto at these batches: a producer warp).
# An NVFP4 index row runs these only: its top-k and decode are those of the fp8 index row beside
# it, whose variants measure them.
STEP_PROXY_VARIANTS = ((" [decode_tma_issue=warps]", dict(decode_tma_issue="warps")),)
# ... and one token per request with the selection copied (FlashInfer's token-major top-k output,
# then q2k = its transpose, contiguous) instead of written head-major by top-k.
STEP_COPY_SUFFIX = " [q2k copy]"
# Decode batches whose M3 calls split by blocks on an H200 (B x 4 kv heads < 132 SMs): their bf16
# sq 1 rows also run split-K on 4 warps per CTA (split_warps=4) beside auto's 8.
SPLIT_K_MAX_BATCH = 32


def step_decode_variants(b: int, sq: int, kv: str) -> list:
    """The sparse-decode plan options a step row of batch `b`, `sq` tokens a request and K/V `kv`
    also runs with: (suffix of the case name, options)."""
    # MTP steps of 16-bit K/V also with their union items on the sm_90a TMA + wgmma kernel
    # (decode plan option kernel=wgmma), whatever the batch.
    variants = [(" [wgmma]", dict(kernel="wgmma"))] if sq > 1 and kv == "bf16" else []
    if b <= STEP_VARIANT_MAX_BATCH:
        variants += list(STEP_VARIANTS)
        if sq == 1 and kv == "bf16":
            variants += list(STEP_BF16_VARIANTS)
        if sq == 1 and kv == "fp8":
            variants += list(STEP_FP8_VARIANTS)
    elif sq == 1 and kv == "fp8":
        variants += list(STEP_FP8_WIDE_VARIANTS)
    return variants


def randn_pages(shape, gen, device, dtype, rows: int = 4096) -> torch.Tensor:
    """Gaussian pages of a cache (flashmsa.testing.inputs.randn), `rows` pages at a time: the K/V
    of a batch of 64 at 128K context are 17 GB in bf16, and a float32 temporary of the whole would
    double that."""
    out = torch.empty(shape, dtype=dtype, device=device)
    for i in range(0, shape[0], rows):
        n = min(rows, shape[0] - i)
        out[i:i + n] = mi.randn((n, *shape[1:]), gen, device, dtype)
    return out


def distinct_selected_blocks(q2k: torch.Tensor, seqlen_q: int) -> int:
    """Sum over (kv head, request) of the distinct block ids >= 0 that the request's `seqlen_q`
    tokens select: the K/V blocks a decode step must read at least once. `q2k` is the decode's
    (Hkv, B * seqlen_q, topk) selection, the rows of a request adjacent; a block selected by
    several tokens of a request (MTP) counts once, -1 padding not at all."""
    hkv, rows, topk = q2k.shape
    if seqlen_q < 1 or rows % seqlen_q:
        raise ValueError(f"{rows} rows are not requests of seqlen_q = {seqlen_q} tokens")
    ids = q2k.reshape(hkv, rows // seqlen_q, seqlen_q * topk).to(torch.int64)
    ids = ids.sort(dim=-1).values
    first = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    first[..., 1:] = ids[..., 1:] != ids[..., :-1]
    return int(((ids >= 0) & first).sum().item())


def step_floor(q2k: torch.Tensor, seqlen_q: int, index_k_bytes: int, kv_elt: int,
               kv_scale_bytes_per_block: int = 0) -> dict:
    """The byte floor of a decode step (docs/benchmarks.md): the index-K history read once
    (`index_k_bytes`) + K and V of every distinct selected block read once: per (request, kv head,
    block) 128 tokens x 128 dims x `kv_elt` bytes, twice (K and V), plus `kv_scale_bytes_per_block`
    of block scales for each of K and V (0 for bf16 and fp8 e4m3, which flashmsa reads without
    per-block scales: an fp8 descale is a per-tensor float)."""
    blocks = distinct_selected_blocks(q2k, seqlen_q)
    kv_bytes = blocks * 2 * (mi.BLOCK * HEAD_DIM * kv_elt + kv_scale_bytes_per_block)
    return dict(index_k_bytes=int(index_k_bytes), distinct_blocks=blocks, kv_bytes=kv_bytes,
                bytes=int(index_k_bytes) + kv_bytes)


class DecodeStep:
    """One layer's M3 decode step as a serving engine runs it: proxy scores of the index queries
    over the paged index-K history (max_seqlen_q and max_k_tiles given, output preallocated) ->
    per-token top-k (per-token num_valid_pages, the local block forced) written through a
    transposed view straight into the decode's (Hkv, tokens, topk) q2k (q2k_copy: into a
    token-major selection, then its transposed copy) -> sparse decode over the paged K/V with a
    caller-owned workspace. Every buffer is static and no call reads a device value on the host,
    so that the step can be captured in one CUDA graph. Per-head selection: index head h selects
    for KV head h (M3: 4 and 4). `index_dtype` NVFP4 (the name) is the NVFP4 indexer: the index
    q and the index-K cache quantized (flashmsa.testing.quantize_nvfp4) once here, the proxy by
    msa_proxy_score_fp4; the index q's quantization is not part of the step (an engine fuses it
    into the op that produces the index q, as it produces the bf16 one).

    `batch` requests of `ctx` tokens (a multiple of 128), `seqlen_q` query tokens each (1, or more
    for MTP) at positions ctx - seqlen_q .. ctx - 1. One shuffled page table serves the index-K
    cache (pages, 1, 128, 128) and the K/V caches (pages, 4, 128, 128): a page id names the same
    128 tokens in each. `num_valid_pages` (position // 128 + 1 per token) is step metadata an
    engine prepares once for all layers, so it is an input here, not part of the step.
    Works on CPU tensors too (the ops' reference), which the CPU tests use."""

    def __init__(self, ops, batch: int, ctx: int, seqlen_q: int, index_dtype, kv_dtype, gen,
                 device, geo=M3, topk: int = TOPK, decode_options=None, topk_options=None,
                 q2k_copy: bool = False, proxy_options=None):
        if ctx % mi.BLOCK or ctx < seqlen_q or seqlen_q < 1 or batch < 1:
            raise ValueError(f"decode step: batch {batch}, ctx {ctx} (a multiple of "
                             f"{mi.BLOCK}), seqlen_q {seqlen_q} (1..ctx)")
        if geo["idx_hq"] != geo["hkv"]:
            raise ValueError("per-head selection needs as many index heads as KV heads")
        self.ops, self.geo, self.topk = ops, geo, topk
        # Sparse-decode plan options (flashmsa's private planned twin), None: the public op.
        self.decode = ops.msa_sparse_decode_attention if decode_options is None else \
            functools.partial(ops._sparse_decode_planned, options=decode_options)
        # Top-k and proxy-score plan options likewise.
        self.topk_select = ops.msa_topk_select if topk_options is None else \
            functools.partial(ops._topk_select_planned, options=topk_options)
        self.index_fp4 = index_dtype == NVFP4
        public, planned = ((ops.msa_proxy_score_fp4, ops._proxy_score_fp4_planned) if self.index_fp4
                           else (ops.msa_proxy_score, ops._proxy_score_planned))
        self.proxy_score = public if proxy_options is None else \
            functools.partial(planned, options=proxy_options)
        self.batch, self.ctx, self.seqlen_q = batch, ctx, seqlen_q
        self.nb = nb = ctx // mi.BLOCK
        rows, pages = batch * seqlen_q, batch * nb
        i32 = dict(dtype=torch.int32, device=device)
        self.page_table = torch.randperm(pages, generator=gen, device=device).view(batch, nb)
        self.page_table = self.page_table.to(torch.int32).contiguous()
        self.seqused = torch.full((batch,), ctx, **i32)
        self.cu_q = torch.arange(0, rows + 1, seqlen_q, **i32)
        self.positions = (ctx - seqlen_q + torch.arange(seqlen_q, device=device)).repeat(batch)
        self.nvp = (self.positions // mi.BLOCK + 1).to(torch.int32)
        self.index_q = mi.randn((rows, geo["idx_hq"], HEAD_DIM), gen, device)
        index_k_shape = (pages, geo["idx_hk"], mi.BLOCK, HEAD_DIM)
        if self.index_fp4:  # (pages, 1, 128, 64) codes, the paged cache's 128x4 scales, a float
            self.index_k, self.index_k_scale, self.index_k_gs = ft.quantize_nvfp4(
                randn_pages(index_k_shape, gen, device, torch.bfloat16))
            self.index_q4, self.index_q_scale, self.index_q_gs = ft.quantize_nvfp4(self.index_q)
        else:
            self.index_k = randn_pages(index_k_shape, gen, device, index_dtype)
        self.q = mi.randn((rows, geo["hq"], HEAD_DIM), gen, device)
        self.k = randn_pages((pages, geo["hkv"], mi.BLOCK, HEAD_DIM), gen, device, kv_dtype)
        self.v = randn_pages((pages, geo["hkv"], mi.BLOCK, HEAD_DIM), gen, device, kv_dtype)
        self.scores = torch.empty((geo["idx_hq"], nb, rows), dtype=torch.float32, device=device)
        self.q2k = torch.empty((geo["hkv"], rows, topk), **i32)
        # Top-k writes the decode's head-major q2k through a transposed view (no copy kernel;
        # docs/semantics.md#topk-output); q2k_copy: FlashInfer's way, a token-major selection and
        # its transposed copy.
        self.q2k_copy = q2k_copy
        self.sel = torch.empty((rows, geo["idx_hq"], topk), **i32) if q2k_copy else \
            self.q2k.transpose(0, 1)
        self.workspace = ops.MSASparseAttentionWorkspace(device)

    def __call__(self):
        """The step: returns (attention output, top-k selection (tokens, heads, topk))."""
        kw = dict(page_table=self.page_table, seqused_k=self.seqused, causal=True,
                  max_seqlen_q=self.seqlen_q, max_k_tiles=self.nb, output=self.scores)
        if self.index_fp4:
            self.proxy_score(self.index_q4, self.index_k, self.index_q_scale, self.index_k_scale,
                             self.index_q_gs, self.index_k_gs, self.cu_q, None, **kw)
        else:
            self.proxy_score(self.index_q, self.index_k, self.cu_q, None, **kw)
        self.topk_select(self.scores, self.topk, num_valid_pages=self.nvp, output=self.sel,
                         force_end_blocks=1)
        if self.q2k_copy:
            self.q2k.copy_(self.sel.transpose(0, 1))
        out = self.decode(self.q, self.k, self.v, self.q2k, page_table=self.page_table,
                          seqused_k=self.seqused, seqlen_q=self.seqlen_q, causal=True,
                          workspace=self.workspace)
        return out, self.sel

    def index_k_bytes(self) -> int:
        """Bytes of the index-K history: every request's seqused_k tokens (host read); NVFP4:
        codes and block scales."""
        per_token = self.geo["idx_hk"] * (NVFP4_TOKEN_BYTES if self.index_fp4 else
                                          HEAD_DIM * self.index_k.element_size())
        return int(self.seqused.sum().item()) * per_token

    def floor(self) -> dict:
        """step_floor of the selection the last step wrote (host reads: never during capture)."""
        return step_floor(self.q2k, self.seqlen_q, self.index_k_bytes(), self.k.element_size())

    def flop(self) -> int:
        """Useful FLOPs: the proxy's visible logits and the attention's visible selected keys."""
        g = self.geo
        proxy = 2 * HEAD_DIM * g["idx_hq"] * int((self.positions + 1).sum().item())
        keys = mi.visible_keys(self.q2k, self.positions, self.ctx)
        return proxy + 4 * HEAD_DIM * (g["hq"] // g["hkv"]) * keys


def clone_outputs(outputs):
    return tuple(t.clone() for t in outputs)


def poison_outputs(outputs) -> None:
    """NaN (floating point) or -7 (integers) into static outputs, so that a replay that does not
    write them cannot pass the comparison by luck."""
    for t in outputs:
        t.fill_(float("nan") if t.is_floating_point() else -7)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def replay_mismatch(eager, first, second, names=("output", "selection")):
    """None when two replays' outputs (`first`, `second`) and the eager step's (`eager`) are
    bit-identical, else a sentence saying which output differs and how."""
    for name, e, r1, r2 in zip(names, eager, first, second, strict=True):
        for what, a, b in (("the second replay differs from the first", r2, r1),
                           ("a replay differs from the eager step", r1, e)):
            if not same_bits(a, b):
                if a.shape != b.shape or a.dtype != b.dtype:
                    return (f"{name}: {what} ({tuple(a.shape)} {a.dtype} vs "
                            f"{tuple(b.shape)} {b.dtype})")
                differ = int((a.contiguous().view(torch.uint8)
                              != b.contiguous().view(torch.uint8)).sum().item())
                return f"{name}: {what} in {differ} bytes"
    return None


class GraphedStep:
    """graph.replay() as a call returning the static outputs. It holds the captured step alive:
    the graph reads and writes the step's buffers by address, which must not return to the
    allocator while the graph can replay."""

    def __init__(self, graph, step, static):
        self.graph, self.step, self.static = graph, step, static

    def __call__(self):
        self.graph.replay()
        return self.static


# ---- the run ---------------------------------------------------------------------------------

def plan_options(schedule: str):
    """Plan options of a schedule label of stage_sparse: "auto" (the library's own plan: None),
    or "<schedule>" followed by any of "<kv-major kernel>", "waste=<x>" (tile_max_waste) and
    "<option>=<value>", space-separated; a label that starts with "<option>=<value>" keeps the
    auto schedule (e.g. "tile_kernel=tma")."""
    if schedule == "auto":
        return None
    sched, *rest = schedule.split(" ")
    if "=" in sched:
        sched, rest = "auto", [sched] + rest
    options = dict(schedule=sched, kv_major_kernel="auto")
    for word in rest:
        name, eq, value = word.partition("=")
        if not eq:
            options["kv_major_kernel"] = word
        else:
            options[{"waste": "tile_max_waste"}.get(name, name)] = value
    return options


class Bench:
    def __init__(self, args, ops, device):
        self.args = args
        self.ops = ops
        self.device = device
        self.cfg = dict(QUICK if args.quick else FULL)
        if args.pipeline_sizes:
            self.cfg["pipeline_s"] = args.pipeline_sizes
        if args.decodes:
            self.cfg["decode"] = args.decodes
        if args.steps:
            self.cfg["step"] = args.steps
        if args.decode_attn:
            self.cfg["decode_attn"] = args.decode_attn
        self.timer = Timer(device, self.cfg["budget_s"], self.cfg["max_reps"], flush=args.l2_flush)
        self.rows: list[dict] = []
        self.ceil: dict = {}
        self.dense_us: dict = {}
        self.selection_cache: dict = {}
        self.dead = False
        self.seed = 1234
        self.flashinfer = None  # (flashinfer.msa_ops, version) with --flashinfer
        self.vllm = None  # vLLM's op modules (benchmarks/vllm_ref.py load) with --vllm
        self.sglang = None  # SGLang's kernel modules (benchmarks/sglang_ref.py load) with --sglang

    # -- helpers --
    def gen(self):
        self.seed += 1
        return mi.cuda_generator(self.seed, self.device)

    def rnd(self, shape, gen, dtype=torch.bfloat16):
        return mi.randn(shape, gen, self.device, dtype)

    def planned(self, name: str, options):
        """ops.<name>, or with plan options flashmsa's private planned twin of it (a forced
        schedule or kernel: msa_ops._<op>_planned)."""
        if options is None:
            return getattr(self.ops, name)
        private = {"msa_sparse_decode_attention": "_sparse_decode_planned"}.get(
            name, f"_{name[len('msa_'):]}_planned")
        return functools.partial(getattr(self.ops, private), options=options)

    def kw_attention(self, fn, total_q_max: int | None = None) -> dict:
        """Optional capture-friendly arguments the binding may accept beyond FlashInfer's."""
        kw = {}
        if total_q_max is not None and accepts(fn, "max_seqlen_q"):
            kw["max_seqlen_q"] = total_q_max
        return kw

    def run_case(self, stage: str, case: str, build, bound: str, ref=None, extra=None):
        """build() -> (fn, info) with info: flop, bytes, notes. Times fn and records one row."""
        row = dict(stage=stage, case=case, status="ok", bound=bound, notes="", **(extra or {}))
        if ref:
            row["ref_ms"], row["ref_label"] = ref
        if self.dead:
            row.update(status="error", notes="not run: the CUDA context failed earlier")
            self._record(row)
            return row
        fn = info = None
        try:
            fn, info = build()
            result = fn()  # warm-up (compilation, plans, allocator) and a NaN check
            torch.cuda.synchronize()
            for t in result if isinstance(result, (tuple, list)) else [result]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() <= 2**31:
                    if bool(torch.isnan(t.float() if t.dtype.itemsize == 1 else t).any()):
                        raise RuntimeError("output contains NaN")
            del result
            row.update(self.timer.time(fn))
            sec = row["median_us"] * 1e-6
            if info.get("flop"):
                row["flop"] = info["flop"]
                row["tflops"] = info["flop"] / sec / 1e12
            if info.get("bytes"):
                row["bytes"] = info["bytes"]
                row["gbs"] = info["bytes"] / sec / 1e9
            if bound == "compute" and "tflops" in row and self.ceil.get("matmul_tflops"):
                row["pct_ceiling"] = 100.0 * row["tflops"] / self.ceil["matmul_tflops"]
            if bound == "memory" and "gbs" in row and self.ceil.get("copy_gbs"):
                row["pct_ceiling"] = 100.0 * row["gbs"] / self.ceil["copy_gbs"]
            if ref:
                row["speedup_vs_ref"] = ref[0] * 1000.0 / row["median_us"]
            notes = list(info.get("notes", []))
            if info.get("show_host") and row.get("host_us") is not None:
                notes.append(f"host {row['host_us']:.0f} us a call")
            if row["host_sync"]:
                notes.append("op synchronizes with the host")
            eager = info.get("eager")  # the timing of the same work run eagerly (stage step)
            if eager:
                row.update(eager_us=eager["median_us"], eager_host_us=eager["host_us"],
                           eager_over_graph=eager["median_us"] / row["median_us"])
                host = f", host {eager['host_us']:.0f} us" if eager["host_us"] else ""
                notes.append(f"eager {eager['median_us']:.1f} us = "
                             f"{row['eager_over_graph']:.2f}x the graph{host}")
                if eager["host_sync"]:
                    notes.append("the eager step synchronizes with the host")
            row.update(info.get("fields", {}))
            row["notes"] = "; ".join(notes)
        except NotImplementedError as e:
            row.update(status="skip", notes=f"NotImplementedError: {e}")
        except Exception as e:  # an error row, never a silent gap
            row.update(status="error", notes=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            traceback.print_exc(file=sys.stderr)
        finally:
            del fn, info
            gc.collect()
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as e:
                self.dead = True
                print(f"CUDA context unusable after {stage} {case}: {e}", file=sys.stderr)
        self._record(row)
        return row

    def _record(self, row):
        self.rows.append(row)
        t = f"{row['median_us']:.1f} us" if "median_us" in row else row["status"]
        print(f"[bench] {row['stage']:<9} {row['case']:<38} {t:>14}  {row['notes']}",
              file=sys.stderr, flush=True)

    # -- ceilings --
    def measure_ceilings(self):
        g = self.gen()
        n = 8192
        a, b = self.rnd((n, n), g), self.rnd((n, n), g)
        c = torch.empty_like(a)
        t = self.timer.time(lambda: torch.mm(a, b, out=c))
        self.ceil["matmul_tflops"] = 2 * n**3 / (t["median_us"] * 1e-6) / 1e12
        self.ceil["matmul_us"] = t["median_us"]
        del a, b, c
        numel = 512 * KB * KB  # 2 GiB of float32
        src = torch.rand(numel, generator=g, device=self.device)
        dst = torch.empty_like(src)
        t = self.timer.time(lambda: dst.copy_(src))
        self.ceil["copy_gbs"] = 2 * src.nbytes / (t["median_us"] * 1e-6) / 1e9
        self.ceil["copy_us"] = t["median_us"]
        del src, dst
        torch.cuda.empty_cache()
        print(f"[bench] ceilings: bf16 matmul {self.ceil['matmul_tflops']:.0f} TFLOP/s, "
              f"copy {self.ceil['copy_gbs']:.0f} GB/s", file=sys.stderr, flush=True)

    # -- selections --
    def selection(self, s: int, pattern: str, hkv: int):
        key = (s, pattern, hkv)
        if key in self.selection_cache:
            return self.selection_cache[key]
        if len(self.selection_cache) > 3:
            self.selection_cache.clear()
        pos = torch.arange(s, device=self.device)
        if pattern == "random":
            sel = mi.random_selection(pos, hkv, TOPK, self.gen())
        elif pattern == "clustered":
            sel = mi.clustered_selection(s, hkv, TOPK, self.seed, self.device)
            self.seed += 1
        elif pattern == "pipeline":
            sel = self.pipeline_selection(s, M3 if hkv == 4 else M3_TP4)
        else:
            raise ValueError(pattern)
        try:
            mi.check_selection(sel, pos, TOPK)
        except AssertionError as e:
            raise RuntimeError(f"{pattern} selection violates its contract: {e}") from e
        self.selection_cache[key] = sel
        return sel

    def index_inputs(self, s: int, geo: dict):
        iq, ik = mi.smooth_index_data(s, geo["idx_hq"], geo["idx_hk"], self.gen(), self.device)
        cu = ft.cu_seqlens([s], self.device)
        nvp = (torch.arange(s, device=self.device) // mi.BLOCK + 1).to(torch.int32)
        return iq, ik, cu, nvp

    def pipeline_selection(self, s: int, geo: dict):
        iq, ik, cu, nvp = self.index_inputs(s, geo)
        p = math.ceil(s / mi.BLOCK)
        scores = self.ops.msa_proxy_score(iq, ik, cu, cu, causal=True, max_seqlen_q=s,
                                          max_k_tiles=p)
        sel = self.ops.msa_topk_select(scores, TOPK, num_valid_pages=nvp, force_end_blocks=1)
        return sel.transpose(0, 1).contiguous()

    # -- stages --
    def stage_proxy(self):
        for s in self.cfg["prefill_s"]:
            self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k", lambda s=s:
                          self.build_proxy_prefill(s), "compute",
                          REF_PROXY_32K if s == 32 * K else None)
            # The portable mma.sync kernel (the fallback off sm_90a) and the sm_90a TMA + wgmma
            # kernel, forced, with Q in registers (sm90) and in shared memory (sm90_ss); _only: a
            # skip row, never a silent fallback, on other devices.
            self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k mma_sync",
                          lambda s=s: self.build_proxy_prefill(s, dict(kernel="mma_sync")),
                          "compute", REF_PROXY_32K if s == 32 * K else None)
            for variant in ("sm90", "sm90_ss"):
                self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k {variant}",
                              lambda s=s, o=dict(kernel=variant + "_only"):
                              self.build_proxy_prefill(s, o), "compute",
                              REF_PROXY_32K if s == 32 * K else None)
            if s == 32 * K:
                # fp8 index-K (bf16 q) and the NVFP4 indexer: the default (auto: mma.sync for
                # these, since the sm_90a kernel converts them only when forced) against the
                # sm_90a kernel with its producer warpgroup converting K (and NVFP4 Q), forced.
                for fmt in ("fp8", "nvfp4"):
                    self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k {fmt}",
                                  lambda s=s, f=fmt: self.build_proxy_prefill(s, fmt=f), "compute")
                    # (sm90_f16: fp16 MMAs: fp8 K with bf16 q rows scaled into fp16; NVFP4 q and K
                    # as value x 2^-7.)
                    for variant in ("sm90", "sm90_ss", "sm90_f16"):
                        self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k {fmt} {variant}",
                                      lambda s=s, f=fmt, o=dict(kernel=variant + "_only"):
                                      self.build_proxy_prefill(s, o, fmt=f), "compute")
                # fp8 q and K (vLLM's indexer with an fp8 index cache): auto (the mma.sync kernel)
                # against the sm_90a kernel's fp8-q form (sm90_f16_only; not auto's until measured).
                self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k fp8q",
                              lambda s=s: self.build_proxy_prefill(s, fmt="fp8q"), "compute")
                self.run_case("proxy", f"prefill S={size_name(s)} idx 4q/1k fp8q sm90_f16",
                              lambda s=s: self.build_proxy_prefill(s, dict(kernel="sm90_f16_only"), fmt="fp8q"),
                              "compute")
        for b, ctx, sq in self.cfg["decode"]:
            name = f"decode B{b} ctx={size_name(ctx)} sq{sq}"
            ref = REF_DECODE_INDEX if (b, ctx, sq) == (64, 32 * K, 1) else None
            self.run_case("proxy", name, lambda b=b, c=ctx, q=sq: self.build_proxy_decode(b, c, q),
                          "memory")
            self.run_case("index", name + " +topk", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, with_topk=True), "memory", ref)
            if sq == 1:  # the NVFP4 indexer (msa_proxy_score_fp4): a quarter of the K bytes
                self.run_case("proxy", name + " nvfp4", lambda b=b, c=ctx, q=sq:
                              self.build_proxy_decode(b, c, q, fp4=True), "memory")
            self.run_case("proxy", name + " fp8", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True), "memory")
            # (The fp8 variant rows below pin the cp.async ring, decode_fp8=cta: auto takes the TMA
            # kernel wherever one pass fits, where those options do not apply; fp8 [decode_ilp=1]
            # is that ring as auto ran it below 16 requests until the run after af3764f.)
            # Key blocks per decode-kernel iteration (plan option decode_ilp; bit-identical; auto
            # takes 2 for fp8 K since f4fdc62, 1 otherwise): the other value, under auto's choices
            # otherwise: bf16, fp8 and NVFP4 index-K.
            ilp = dict(decode_ilp=2)
            self.run_case("proxy", name + " [decode_ilp=2]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, options=ilp), "memory")
            self.run_case("proxy", name + " fp8 [decode_ilp=1]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True, options=dict(decode_ilp=1, decode_fp8="cta")),
                          "memory")
            # fp8 index-K through TMA, a warp per key block (plan option decode_fp8=tma, sm_90a;
            # auto takes it at any batch where one pass of 8 or 16 columns fits), forced: against the
            # fp8 row (auto's). sq 4 (G 4 x 4 = 16 columns) runs its 16-column pass.
            self.run_case("proxy", name + " fp8 [decode_fp8=tma]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True, options=dict(decode_fp8="tma")),
                          "memory")
            # The TMA kernels' other load issue (plan option decode_tma_issue; auto: each consumer
            # warp for itself for NVFP4 K since 9738086, a producer warp for fp8 K): fp8 with warps
            # (TMA forced, as its row above), NVFP4 with the producer warp: against the fp8
            # [decode_fp8=tma] / nvfp4 rows.
            self.run_case("proxy", name + " fp8 [decode_fp8=tma,decode_tma_issue=warps]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True,
                                                  options=dict(decode_tma_issue="warps", decode_fp8="tma")),
                          "memory")
            self.run_case("proxy", name + " nvfp4 [decode_tma_issue=producer]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, fp4=True, options=dict(decode_tma_issue="producer")),
                          "memory")
            # NVFP4 index-K on the cp.async ring (plan option decode_nvfp4=cta; auto takes the TMA
            # kernel, a warp per key block, since 900266d where one pass fits: sq 1 and sq 4 here):
            # against the nvfp4 row (sq 4: the sq 4 nvfp4 row below). The NVFP4 variants after it
            # (decode_ilp, nvfp4_cvt, decode_ctas, [decode]) are the cp.async ring's, so they run
            # it too.
            cta4 = dict(decode_nvfp4="cta")
            self.run_case("proxy", name + " nvfp4 [decode_nvfp4=cta]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, fp4=True, options=cta4), "memory")
            if sq != 1:
                self.run_case("proxy", name + " nvfp4", lambda b=b, c=ctx, q=sq:
                              self.build_proxy_decode(b, c, q, fp4=True), "memory")
            if sq == 1:
                self.run_case("proxy", name + " nvfp4 [decode_ilp=2]", lambda b=b, c=ctx, q=sq:
                              self.build_proxy_decode(b, c, q, fp4=True, options=dict(ilp, **cta4)),
                              "memory")
                # NVFP4 index-K converted a byte (2 codes) at a time (plan option nvfp4_cvt=byte;
                # auto: a word of 8 codes since 27436c2), auto otherwise: against the cta row.
                byte = dict(nvfp4_cvt="byte", **cta4)
                self.run_case("proxy", name + " nvfp4 [nvfp4_cvt=byte]", lambda b=b, c=ctx, q=sq:
                              self.build_proxy_decode(b, c, q, fp4=True, options=byte), "memory")
            # The decode streaming kernel (csrc/proxy_score/proxy_decode.cuh), forced: decode_only
            # gives a skip row, never a silent fallback. bf16, fp8 and NVFP4 index-K.
            # The portable mma.sync kernel, forced (auto takes the decode kernel for short queries).
            mma = dict(kernel="mma_sync")
            self.run_case("proxy", name + " [mma_sync]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, options=mma), "memory")
            self.run_case("proxy", name + " fp8 [mma_sync]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True, options=mma), "memory")
            dec = dict(kernel="decode_only")
            self.run_case("proxy", name + " [decode]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, options=dec), "memory")
            self.run_case("proxy", name + " fp8 [decode]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True, options=dict(dec, decode_fp8="cta")),
                          "memory")
            # The same kernel with fp16 MMAs for fp8 K (bf16 q rows scaled into fp16): auto's
            # choice for fp8 K since 1aad2ee; `[decode]` above is the bf16-MMA form.
            self.run_case("proxy", name + " fp8 [decode_f16]", lambda b=b, c=ctx, q=sq:
                          self.build_proxy_decode(b, c, q, k_fp8=True,
                                                  options=dict(kernel="decode_f16_only", decode_fp8="cta")),
                          "memory")
            if sq == 1:
                self.run_case("proxy", name + " nvfp4 [decode]", lambda b=b, c=ctx, q=sq:
                              self.build_proxy_decode(b, c, q, fp4=True, options=dict(dec, **cta4)),
                              "memory")
                # The decode kernel built for 2 / 3 / 4 CTAs per SM (plan option decode_ctas;
                # fewer stages each) for fp8 and NVFP4 index-K (auto: fp8 3, NVFP4 4 since
                # b1fafdd), under auto's kernel choice otherwise.
                for ctas in (2, 3, 4):
                    o = dict(decode_ctas=ctas)
                    self.run_case("proxy", name + f" fp8 [decode_ctas={ctas}]",
                                  lambda b=b, c=ctx, q=sq, o=o:
                                  self.build_proxy_decode(b, c, q, k_fp8=True, options=dict(o, decode_fp8="cta")),
                                  "memory")
                    self.run_case("proxy", name + f" nvfp4 [decode_ctas={ctas}]",
                                  lambda b=b, c=ctx, q=sq, o=o:
                                  self.build_proxy_decode(b, c, q, fp4=True, options=dict(o, **cta4)),
                                  "memory")

    def build_proxy_prefill(self, s, options=None, fmt="bf16"):
        """fmt: bf16 q and k; fp8 (bf16 q, e4m3 k); fp8q (e4m3 q and k: vLLM's indexer with an
        fp8 index cache); nvfp4 (msa_proxy_score_fp4: q and k)."""
        g = self.gen()
        hq, hk = M3["idx_hq"], M3["idx_hk"]
        q, k = self.rnd((s, hq, 128), g), self.rnd((s, hk, 128), g)
        cu = ft.cu_seqlens([s], self.device)
        p = math.ceil(s / mi.BLOCK)
        out = torch.empty((hq, p, s), dtype=torch.float32, device=self.device)
        visible = s * (s + 1) // 2
        if fmt == "nvfp4":
            proxy_score_fp4 = self.planned("msa_proxy_score_fp4", options)
            k4, k_sc, k_gs = ft.quantize_nvfp4(k)
            q4, q_sc, q_gs = ft.quantize_nvfp4(q)

            def fn4():
                return proxy_score_fp4(q4, k4, q_sc, k_sc, q_gs, k_gs, cu, cu, causal=True,
                                       max_seqlen_q=s, max_k_tiles=p, output=out)
            nbytes = q4.nbytes + q_sc.nbytes + k4.nbytes + k_sc.nbytes + out.nbytes
            return fn4, dict(flop=2 * 128 * hq * visible, bytes=nbytes)
        if fmt in ("fp8", "fp8q"):
            k = k.to(torch.float8_e4m3fn)
        if fmt == "fp8q":
            q = q.to(torch.float8_e4m3fn)
        proxy_score = self.planned("msa_proxy_score", options)

        def fn():
            return proxy_score(q, k, cu, cu, causal=True, max_seqlen_q=s, max_k_tiles=p, output=out)
        return fn, dict(flop=2 * 128 * hq * visible, bytes=q.nbytes + k.nbytes + out.nbytes)

    def proxy_decode_inputs(self, b, ctx, sq):
        """M3's indexer at decode: q (b * sq, 4, 128), a paged one-head index cache of b requests
        of ctx keys on shuffled pages; (q, k, page_table, cu_q, seqused, nb)."""
        g = self.gen()
        nb = ctx // mi.BLOCK
        k = self.rnd((b * nb, M3["idx_hk"], mi.BLOCK, 128), g)
        page_table = torch.randperm(b * nb, generator=g, device=self.device).view(b, nb)
        page_table = page_table.to(torch.int32).contiguous()
        q = self.rnd((b * sq, M3["idx_hq"], 128), g)
        cu_q = torch.arange(0, b * sq + 1, sq, dtype=torch.int32, device=self.device)
        seqused = torch.full((b,), ctx, dtype=torch.int32, device=self.device)
        return q, k, page_table, cu_q, seqused, nb

    def build_proxy_decode(self, b, ctx, sq, with_topk=False, fp4=False, k_fp8=False,
                           options=None):
        hq = M3["idx_hq"]
        q, k, page_table, cu_q, seqused, nb = self.proxy_decode_inputs(b, ctx, sq)
        out = torch.empty((hq, nb, b * sq), dtype=torch.float32, device=self.device)
        pos = (ctx - sq + torch.arange(sq, device=self.device)).repeat(b)
        nvp = (pos // mi.BLOCK + 1).to(torch.int32)
        sel = torch.empty((b * sq, hq, TOPK), dtype=torch.int32, device=self.device)
        ops = self.ops
        proxy_score = self.planned("msa_proxy_score", options)
        proxy_score_fp4 = self.planned("msa_proxy_score_fp4", options)

        if fp4:  # the NVFP4 indexer: the same problem, q and k quantized
            k4, k_sc, k_gs = ft.quantize_nvfp4(k)
            q4, q_sc, q_gs = ft.quantize_nvfp4(q)
            nbytes = q4.nbytes + q_sc.nbytes + k4.nbytes + k_sc.nbytes + out.nbytes

            def proxy():
                return proxy_score_fp4(q4, k4, q_sc, k_sc, q_gs, k_gs, cu_q, None,
                                       page_table=page_table, seqused_k=seqused,
                                       causal=True, max_seqlen_q=sq, max_k_tiles=nb,
                                       output=out)
        else:
            if k_fp8:  # fp8 index-K (e4m3), bf16 q
                k = k.to(torch.float8_e4m3fn)
            nbytes = q.nbytes + k.nbytes + out.nbytes

            def proxy():
                return proxy_score(q, k, cu_q, None, page_table=page_table,
                                   seqused_k=seqused, causal=True, max_seqlen_q=sq,
                                   max_k_tiles=nb, output=out)

        def index():
            proxy()
            return ops.msa_topk_select(out, TOPK, num_valid_pages=nvp, force_end_blocks=1,
                                       output=sel)
        visible = int((pos + 1).sum().item())
        if with_topk:
            nbytes += out.nbytes + sel.nbytes
        return (index if with_topk else proxy), dict(flop=2 * 128 * hq * visible, bytes=nbytes)

    def stage_topk(self):
        for kernel in TOPK_KERNELS:
            tag = "" if kernel == "auto" else f" [{kernel}]"
            # "name option=value ...": the kernel and further plan options (e.g. "net net_lanes=2").
            name, *extra = kernel.split()
            options = None if kernel == "auto" else dict(kernel=name, **dict(
                e.split("=", 1) for e in extra))
            for s in self.cfg["topk_s"] if kernel not in TOPK_DECODE_ONLY else ():
                self.run_case("topk", f"prefill S={size_name(s)} H4 P={math.ceil(s / 128)}{tag}",
                              lambda s=s, o=options: self.build_topk(s, o), "memory",
                              REF_TOPK_32K if s == 32 * K else None)
            for s, h, p in TOPK_DECODE_SHAPES if kernel not in TOPK_PREFILL_ONLY else ():
                self.run_case("topk", f"decode S={s} H{h} P={p}{tag}",
                              lambda s=s, h=h, p=p, o=options: self.build_topk_decode(s, h, p, o),
                              "memory")

    def build_topk_decode(self, s, h, p, options=None):
        """A decode batch's top-k: every token sees all P blocks (nvp = P per token), Gaussian
        scores, topk 16 with the local block forced."""
        g = self.gen()
        scores = torch.randn((h, p, s), generator=g, device=self.device)
        nvp = torch.full((s,), p, dtype=torch.int32, device=self.device)
        out = torch.empty((s, h, TOPK), dtype=torch.int32, device=self.device)
        topk_select = self.planned("msa_topk_select", options)

        def fn():
            return topk_select(scores, TOPK, num_valid_pages=nvp, output=out, force_end_blocks=1)
        return fn, dict(bytes=h * p * s * 4 + s * h * TOPK * 4)

    def build_topk(self, s, options=None):
        g = self.gen()
        h, p = M3["idx_hq"], math.ceil(s / mi.BLOCK)
        scores = torch.randn((h, p, s), generator=g, device=self.device)
        # Like the proxy's output: -inf for blocks past each token's causal limit.
        blk = torch.arange(p, device=self.device).view(1, p, 1)
        tok_blk = (torch.arange(s, device=self.device) // mi.BLOCK).view(1, 1, s)
        scores.masked_fill_(blk > tok_blk, float("-inf"))
        nvp = (torch.arange(s, device=self.device) // mi.BLOCK + 1).to(torch.int32)
        out = torch.empty((s, h, TOPK), dtype=torch.int32, device=self.device)
        topk_select = self.planned("msa_topk_select", options)

        def fn():
            return topk_select(scores, TOPK, num_valid_pages=nvp, output=out, force_end_blocks=1)
        return fn, dict(bytes=h * p * s * 4 + s * h * TOPK * 4)

    def stage_sparse(self):
        done_dense = set()
        for s, kv, layout, pattern in self.cfg["sparse"]:
            if s not in done_dense:
                done_dense.add(s)
                self.dense_case(s, M3)
            ref = REF_SPARSE_32K if (s == 32 * K and kv == "bf16") else None
            # The schedule the library picks (auto), and for bf16 flat both forced schedules, so
            # that the table shows what the choice costs.
            schedules = ["auto"] + (["query_major", "kv_major", "kv_major mma_sync"]
                                    if (kv, layout) == ("bf16", "flat") else [])
            # The KV-major TMA kernel (plan option kv_major_kernel=tma, off by default): alone
            # beside [kv_major], and under the hybrid schedule (what auto would run with it).
            if (kv, layout) == ("bf16", "flat") and s in (8 * K, 32 * K):
                schedules += ["kv_major tma", "hybrid tma"]
            # The warpgroup-MMA KV-major kernel's partials by each lane's stores (plan option
            # kv_major_store=stg; auto's are TMA stores since 73ba220's H200 run): alone beside
            # [kv_major], and under auto's schedule.
            if (kv, layout) == ("bf16", "flat") and s in (8 * K, 32 * K):
                schedules += ["kv_major kv_major_store=stg", "kv_major_store=stg"]
            # Its row LSEs' log2 and 1 / l correctly rounded (plan option kv_major_math=precise;
            # auto's are MUFU approximations since 0b8aa64's H200 run): alone and under auto's.
            if (kv, layout) == ("bf16", "flat"):
                schedules += ["kv_major kv_major_math=precise", "kv_major_math=precise"]
            # --tile-waste: the hybrid schedule under other shared-selection tile bounds (tuning).
            schedules += [f"hybrid waste={w}" for w in self.args.tile_waste
                          if (kv, layout) == ("bf16", "flat")]
            # Small prefills: the whole prefill in one KV-major launch group (chunk_rows = S)
            # against the planner's partial budget (1 GiB: 3 groups at 8K), what the fixed
            # per-group costs (lists, the tail) are worth there.
            if s <= 16 * K and (kv, layout) == ("bf16", "flat"):
                schedules.append(f"hybrid chunk_rows={s}")
            # The cp.async tile kernel (plan option tile_kernel=cp_async; the TMA one is the
            # default where it runs since d865e57): the 32K clustered cases, where nearly every
            # tile qualifies, and the 8K pipeline.
            if kv == "bf16" and ((s, pattern) == (32 * K, "clustered") or
                                 ((s, layout, pattern) == (8 * K, "flat", "pipeline"))):
                schedules.append("tile_kernel=cp_async")
            # Each KV-major launch group's work lists built before it (plan option
            # lists=per_group; the default builds all groups' lists at once since 7cbcfcc): 32K
            # random (9 groups, every row KV-major) and the 8K pipeline (3 groups).
            if kv == "bf16" and layout == "flat" and (s, pattern) in ((32 * K, "random"), (8 * K, "pipeline")):
                schedules.append("lists=per_group")
            # The tiles' bound fixed at 2.0 (plan option tile_bound=fixed), against auto's adaptive
            # one from 8193 to 40960 rows (3.0 where the tiles within it hold nearly all pairs,
            # else 2.0; since the H200 run at b5b8409): 32K random (adaptive takes 2.0) and
            # pipeline (3.0).
            if (kv, layout) == ("bf16", "flat") and (s, pattern) in ((32 * K, "random"), (32 * K, "pipeline")):
                schedules.append("tile_bound=fixed")
            for schedule in schedules:
                tag = "" if schedule == "auto" else f" [{schedule}]"
                self.run_case("sparse", f"S={size_name(s)} {kv} {layout} {pattern}{tag}",
                              lambda s=s, kv=kv, lay=layout, pat=pattern, o=plan_options(schedule):
                              self.build_sparse(s, kv, lay, pat, M3, o), "compute", ref)

    # -- FlashInfer's ops on the same inputs (--flashinfer) --
    def stage_flashinfer(self):
        """Head-to-head with FlashInfer's own msa_ops on the cases of FI_*: each case's tensors
        built once, FlashInfer's row first, then flashmsa's with FlashInfer's time as its reference
        (speedup = FlashInfer's time / flashmsa's) and, in its notes, how far the two outputs are
        apart. A FlashInfer route that needs a backend that is not installed is its row's SKIP."""
        if self.flashinfer is None:
            print("[bench] flashinfer: not run (no --flashinfer)", file=sys.stderr)
            return
        _, version = self.flashinfer
        ref = ("flashinfer", "FlashInfer", f"flashinfer {version}")
        for b, ctx, sq in FI_DECODE:
            self.head_to_head(ref, f"decode B{b} ctx={size_name(ctx)} sq{sq} fp8 packed",
                              lambda b=b, c=ctx, q=sq: self.fi_decode(b, c, q), "memory")
        for b, ctx, sq in FI_PROXY_DECODE:
            self.head_to_head(ref, f"proxy decode B{b} ctx={size_name(ctx)} sq{sq} bf16",
                              lambda b=b, c=ctx, q=sq: self.fi_proxy_decode(b, c, q), "memory")
        for s in FI_PROXY_PREFILL:
            self.head_to_head(ref, f"proxy prefill S={size_name(s)} fp8 q+K paged",
                              lambda s=s: self.fi_proxy_prefill(s), "compute")
        for kind, s, h, p in FI_TOPK:
            self.head_to_head(ref, f"topk {kind} S={s} H{h} P={p}",
                              lambda kind=kind, s=s, h=h, p=p: self.fi_topk(kind, s, h, p), "memory")
        for s, pattern in FI_SPARSE:
            self.head_to_head(ref, f"sparse S={size_name(s)} fp8 packed {pattern}",
                              lambda s=s, pat=pattern: self.fi_sparse(s, pat), "compute")

    def head_to_head(self, ref, name, builder, bound):
        """ref = (stage, label, tag) of the other library; builder() -> dict(theirs=fn, fm=fn,
        flop=, bytes=, agree=fn(their result, flashmsa's) -> str, and optionally theirs_out=fn:
        the result to compare where ``theirs`` returns nothing to check). Its row first, then
        flashmsa's with its time as the reference and, in the notes, how far the outputs are
        apart. A route of theirs whose backend is not installed (ImportError) is a SKIP."""
        stage, label, tag = ref
        case = {}

        def build(which):
            def b():
                if not case:
                    case.update(builder())
                    their_call = case["theirs"]

                    def theirs():  # a route whose backend is not installed: a SKIP
                        try:
                            return their_call()
                        except ImportError as e:
                            raise NotImplementedError(
                                f"{label} takes a backend here that is not installed ({e.name})") from e
                    case["theirs"] = theirs
                notes = []
                if which == "fm" and "their_result" in case:
                    notes.append(f"vs {label}: " + case["agree"](case.pop("their_result"),
                                                                 case["fm"]()))
                return case[which], dict(flop=case.get("flop"), bytes=case.get("bytes"), notes=notes,
                                         show_host=case.get("show_host", False))
            return b
        their_row = self.run_case(stage, f"{name} [{tag}]", build("theirs"), bound)
        timing_ref = None
        if their_row["status"] == "ok":
            timing_ref = (their_row["median_us"] / 1000.0, f"{label} {their_row['median_us']:.1f} us")
            try:
                case["their_result"] = case.get("theirs_out", case["theirs"])()
            except Exception as e:  # the comparison only; their row already has its time
                print(f"[bench] {stage} {name}: {type(e).__name__}: {e}", file=sys.stderr)
        self.run_case(stage, f"{name} [flashmsa]", build("fm"), bound, timing_ref)
        case.clear()

    @staticmethod
    def agree_close(fi_out, fm_out) -> str:
        a, b = fi_out.float(), fm_out.float()
        finite = torch.isfinite(a) & torch.isfinite(b)
        same_inf = bool(torch.equal(torch.isfinite(a), torch.isfinite(b)))
        diff = (a[finite] - b[finite]).abs()
        rel = float(diff.norm() / b[finite].norm().clamp_min(1e-30))
        return (f"max |d| {float(diff.max()) if diff.numel() else 0.0:.2e}, "
                f"rel L2 {rel:.1e}" + ("" if same_inf else ", -inf patterns differ"))

    @staticmethod
    def agree_sets(fi_out, fm_out) -> str:
        a, b = fi_out.sort(-1).values, fm_out.sort(-1).values
        rows = a.reshape(-1, a.shape[-1])
        same = (rows == b.reshape(-1, b.shape[-1])).all(-1).float().mean()
        return f"{100 * float(same):.2f} % of rows select the same blocks"

    def fi_packed_kv(self, pages, hkv, g):
        """K|V interleaved in one fp8 cache (pages, hkv, 128, 256): the layout FlashInfer's SM90
        attention reads; flashmsa reads the same views."""
        kv = self.rnd((pages, hkv, mi.BLOCK, 256), g).to(torch.float8_e4m3fn)
        return kv[..., :128], kv[..., 128:]

    def fi_decode(self, b, ctx, sq):
        fi_ops, _ = self.flashinfer
        g = self.gen()
        hq, hkv = M3["hq"], M3["hkv"]
        nb = ctx // mi.BLOCK
        req_pos = torch.full((b,), ctx - 1, device=self.device)
        sel_req = mi.random_selection(req_pos, hkv, TOPK, g)  # shared by a request's sq tokens
        sel = sel_req.repeat_interleave(sq, dim=1).contiguous()
        page_table, pages, unique_blocks = mi.decode_pages(sel_req, b, 1, nb)
        k, v = self.fi_packed_kv(pages, hkv, g)
        q = self.rnd((b * sq, hq, 128), g)
        seqused = torch.full((b,), ctx, dtype=torch.int32, device=self.device)

        def call(ops):
            return lambda: ops.msa_sparse_decode_attention(q, k, v, sel, page_table=page_table,
                                                           seqused_k=seqused, seqlen_q=sq,
                                                           causal=True)
        pos = (ctx - sq + torch.arange(sq, device=self.device)).repeat(b)
        keys = mi.visible_keys(sel, pos, ctx)
        return dict(theirs=call(fi_ops), fm=call(self.ops), agree=self.agree_close,
                    flop=4 * 128 * (hq // hkv) * keys,
                    bytes=unique_blocks * 2 * mi.BLOCK * 128 + 2 * q.nbytes)

    def fi_proxy_decode(self, b, ctx, sq):
        fi_ops, _ = self.flashinfer
        hq = M3["idx_hq"]
        q, k, page_table, cu_q, seqused, nb = self.proxy_decode_inputs(b, ctx, sq)
        outs = [torch.empty((hq, nb, b * sq), dtype=torch.float32, device=self.device)
                for _ in range(2)]

        def call(ops, out):
            return lambda: ops.msa_proxy_score(q, k, cu_q, None, page_table=page_table,
                                               seqused_k=seqused, causal=True, max_seqlen_q=sq,
                                               max_k_tiles=nb, output=out)
        pos = (ctx - sq + torch.arange(sq, device=self.device)).repeat(b)
        visible = int((pos + 1).sum().item())
        return dict(theirs=call(fi_ops, outs[0]), fm=call(self.ops, outs[1]),
                    agree=lambda a, c: self.agree_close(a.clone(), c),
                    flop=2 * 128 * hq * visible, bytes=q.nbytes + k.nbytes + outs[0].nbytes)

    def fi_proxy_prefill(self, s):
        fi_ops, _ = self.flashinfer
        g = self.gen()
        hq, hk = M3["idx_hq"], M3["idx_hk"]
        p = s // mi.BLOCK
        q = self.rnd((s, hq, 128), g).to(torch.float8_e4m3fn)
        perm = torch.randperm(p, generator=g, device=self.device)
        k = paged_one_sequence(self.rnd((s, hk, 128), g), perm).to(torch.float8_e4m3fn)
        page_table = perm.to(torch.int32).view(1, -1).contiguous()
        seqused = torch.tensor([s], dtype=torch.int32, device=self.device)
        cu = ft.cu_seqlens([s], self.device)
        outs = [torch.empty((hq, p, s), dtype=torch.float32, device=self.device) for _ in range(2)]

        def call(ops, out):
            return lambda: ops.msa_proxy_score(q, k, cu, None, page_table=page_table,
                                               seqused_k=seqused, causal=True, max_seqlen_q=s,
                                               max_k_tiles=p, output=out)
        return dict(theirs=call(fi_ops, outs[0]), fm=call(self.ops, outs[1]),
                    agree=lambda a, c: self.agree_close(a.clone(), c),
                    flop=2 * 128 * hq * (s * (s + 1) // 2),
                    bytes=q.nbytes + k.nbytes + outs[0].nbytes)

    def fi_topk(self, kind, s, h, p):
        fi_ops, _ = self.flashinfer
        g = self.gen()
        scores = torch.randn((h, p, s), generator=g, device=self.device)
        if kind == "prefill":  # the proxy's -inf past each token's causal block
            blk = torch.arange(p, device=self.device).view(1, p, 1)
            tok_blk = (torch.arange(s, device=self.device) // mi.BLOCK).view(1, 1, s)
            scores.masked_fill_(blk > tok_blk, float("-inf"))
            nvp = (torch.arange(s, device=self.device) // mi.BLOCK + 1).to(torch.int32)
        else:
            nvp = torch.full((s,), p, dtype=torch.int32, device=self.device)
        outs = [torch.empty((s, h, TOPK), dtype=torch.int32, device=self.device) for _ in range(2)]

        def call(ops, out):
            return lambda: ops.msa_topk_select(scores, TOPK, num_valid_pages=nvp, output=out,
                                               force_end_blocks=1)
        return dict(theirs=call(fi_ops, outs[0]), fm=call(self.ops, outs[1]),
                    agree=lambda a, c: self.agree_sets(a.clone(), c),
                    bytes=h * p * s * 4 + s * h * TOPK * 4)

    def fi_sparse(self, s, pattern):
        fi_ops, _ = self.flashinfer
        hq, hkv = M3["hq"], M3["hkv"]
        sel = self.selection(s, pattern, hkv)
        g = self.gen()
        q = self.rnd((s, hq, 128), g)
        k, v = self.fi_packed_kv(s // mi.BLOCK, hkv, g)
        page_table = torch.randperm(s // mi.BLOCK, generator=g, device=self.device)
        page_table = page_table.to(torch.int32).view(1, -1).contiguous()
        seqused = torch.tensor([s], dtype=torch.int32, device=self.device)
        cu = ft.cu_seqlens([s], self.device)

        def call(ops):
            return lambda: ops.msa_sparse_attention(q, k, v, sel, cu, None, causal=True,
                                                    page_table=page_table, seqused_k=seqused)
        keys = mi.visible_keys(sel, torch.arange(s, device=self.device), s)
        return dict(theirs=call(fi_ops), fm=call(self.ops), agree=self.agree_close,
                    flop=4 * 128 * (hq // hkv) * keys)

    # -- vLLM's Triton ops on the same inputs (--vllm) --
    def stage_vllm(self):
        """Head-to-head with vLLM's own MiniMax-M3 Triton ops (benchmarks/vllm_ref.py), each case
        in vLLM's layouts and called as vLLM 0.34 calls it (the top-k into the transposed view of
        its token-major buffer, the attention reading that view), against the same call through
        flashmsa.integrations.vllm: what a vLLM user gets from either. vLLM's row first, then
        flashmsa's with vLLM's time as its reference."""
        if self.vllm is None:
            print("[bench] vllm: not run (no --vllm)", file=sys.stderr)
            return
        ref = ("vllm", "vLLM", f"vllm {self.vllm.version}")
        for s in VL_INDEX_PREFILL:
            self.head_to_head(ref, f"index score S={size_name(s)} bf16 paged",
                              lambda s=s: self.vl_index_score(s), "compute")
            self.head_to_head(ref, f"index topk S={size_name(s)}",
                              lambda s=s: self.vl_index_topk(s), "memory")
        for s, pattern in VL_SPARSE:
            self.head_to_head(ref, f"sparse S={size_name(s)} bf16 packed {pattern}",
                              lambda s=s, pat=pattern: self.vl_sparse(s, pat), "compute")
        for b, ctx, sq in VL_DECODE:
            self.head_to_head(ref, f"index decode B{b} ctx={size_name(ctx)} sq{sq} bf16",
                              lambda b=b, c=ctx, q=sq: self.vl_index_decode(b, c, q), "memory")
            self.head_to_head(ref, f"decode B{b} ctx={size_name(ctx)} sq{sq} bf16 packed",
                              lambda b=b, c=ctx, q=sq: self.vl_decode(b, c, q), "memory")
        for b, ctx, sq in VL_STEP:
            for graph in (False, True):
                self.head_to_head(ref, f"step {'graph' if graph else 'eager'} B{b} "
                                       f"ctx={size_name(ctx)} sq{sq} bf16",
                                  lambda b=b, c=ctx, q=sq, gr=graph: self.vl_step(b, c, q, gr),
                                  "memory")

    def vl_prefill_indexer(self, s):
        """One s-token prompt in vLLM's indexer layouts: idx_q (s, 4, 128), the index-K cache
        (pages, 128, 128) on shuffled pages, its block table, cu_seqlens, seq_lens, prefix_lens."""
        g = self.gen()
        p = s // mi.BLOCK
        idx_q = self.rnd((s, M3["idx_hq"], 128), g)
        perm = torch.randperm(p, generator=g, device=self.device)
        cache = paged_one_sequence(self.rnd((s, 1, 128), g), perm).view(p, mi.BLOCK, 128)
        table = perm.to(torch.int32).view(1, -1).contiguous()
        lens = torch.tensor([s], dtype=torch.int32, device=self.device)
        return idx_q, cache, table, ft.cu_seqlens([s], self.device), lens, torch.zeros_like(lens)

    def vl_index_score(self, s):
        from flashmsa.integrations import vllm as fv
        args = self.vl_prefill_indexer(s) + (s, s, M3["idx_hq"])
        mod = self.vllm.index_topk

        def finite_where_ours(theirs, ours):  # vLLM leaves blocks no query of a tile sees unwritten
            seen = torch.isfinite(ours)
            return self.agree_close(theirs[:, :, :ours.shape[2]][seen], ours[seen])
        return dict(theirs=lambda: mod.minimax_m3_index_score(*args) is None,
                    theirs_out=lambda: mod.minimax_m3_index_score(*args),
                    fm=lambda: fv.minimax_m3_index_score(*args), agree=finite_where_ours,
                    flop=2 * 128 * M3["idx_hq"] * (s * (s + 1) // 2))

    def vl_topk_buffer(self, rows, heads):
        """vLLM 0.34's shared top-k buffer (rows, H, topk) int32 and the view its indexer passes
        as ``out`` (the transpose, (H, rows, topk))."""
        buf = torch.full((rows, heads, TOPK), -1, dtype=torch.int32, device=self.device)
        return buf, buf.transpose(0, 1)

    def vl_index_topk(self, s):
        from flashmsa.integrations import vllm as fv
        idx_q, cache, table, cu, lens, pre = self.vl_prefill_indexer(s)
        score = fv.minimax_m3_index_score(idx_q, cache, table, cu, lens, pre, s, s, M3["idx_hq"])
        bufs = [self.vl_topk_buffer(s, M3["idx_hq"]) for _ in range(2)]

        def call(mod, out):
            return lambda: mod.minimax_m3_index_topk(score, cu, pre, s, TOPK, 1, 1, out=out)
        return dict(theirs=call(self.vllm.index_topk, bufs[0][1]), fm=call(fv, bufs[1][1]),
                    agree=lambda a, c: self.agree_sets(a.clone(), c),
                    bytes=M3["idx_hq"] * (s // mi.BLOCK) * s * 4 + s * M3["idx_hq"] * TOPK * 4)

    def vl_sparse(self, s, pattern):
        from flashmsa.integrations import vllm as fv
        hq, hkv = M3["hq"], M3["hkv"]
        sel = self.selection(s, pattern, hkv)
        topk_view = sel.transpose(0, 1).contiguous().transpose(0, 1)  # vLLM's buffer view
        g = self.gen()
        q = self.rnd((s, hq, 128), g)
        kv = self.rnd((s // mi.BLOCK, hkv, mi.BLOCK, 256), g)
        table = torch.randperm(s // mi.BLOCK, generator=g, device=self.device)
        table = table.to(torch.int32).view(1, -1).contiguous()
        lens = torch.tensor([s], dtype=torch.int32, device=self.device)
        cu = ft.cu_seqlens([s], self.device)
        outs = [torch.empty_like(q) for _ in range(2)]
        # Hopper: vLLM 0.34 binds its query-tiled prefill kernel there (the common op elsewhere).
        hopper = (torch.device(self.device).type == "cuda"
                  and torch.cuda.get_device_capability(self.device)[0] == 9)
        mod = self.vllm.sparse_prefill if hopper else self.vllm.sparse_attn

        def call(m, out):
            return lambda: m.minimax_m3_sparse_attn(q, kv, topk_view, table, cu, lens,
                                                    torch.zeros_like(lens), s, hkv,
                                                    128 ** -0.5, out) or out
        keys = mi.visible_keys(sel, torch.arange(s, device=self.device), s)
        return dict(theirs=call(mod, outs[0]), fm=call(fv, outs[1]),
                    agree=lambda a, c: self.agree_close(a.clone(), c),
                    flop=4 * 128 * (hq // hkv) * keys)

    def vl_index_decode(self, b, ctx, sq):
        from flashmsa.integrations import vllm as fv
        hq = M3["idx_hq"]
        q, k, page_table, _, seqused, nb = self.proxy_decode_inputs(b, ctx, sq)
        cache = k.view(-1, mi.BLOCK, 128)
        bufs = [self.vl_topk_buffer(b * sq, hq) for _ in range(2)]

        def call(mod, out):
            return lambda: mod.minimax_m3_index_decode(q, cache, page_table, seqused, ctx, TOPK, 1,
                                                       1, hq, sq, sq, out=out)
        return dict(theirs=call(self.vllm.index_topk, bufs[0][1]), fm=call(fv, bufs[1][1]),
                    agree=lambda a, c: self.agree_sets(a.clone(), c),
                    bytes=b * nb * mi.BLOCK * 128 * 2 + q.nbytes)

    def vl_decode(self, b, ctx, sq):
        from flashmsa.integrations import vllm as fv
        g = self.gen()
        hq, hkv = M3["hq"], M3["hkv"]
        nb = ctx // mi.BLOCK
        req_pos = torch.full((b,), ctx - 1, device=self.device)
        sel_req = mi.random_selection(req_pos, hkv, TOPK, g)  # shared by a request's sq tokens
        sel = sel_req.repeat_interleave(sq, dim=1)
        page_table, pages, unique_blocks = mi.decode_pages(sel_req, b, 1, nb)
        topk_view = sel.transpose(0, 1).contiguous().transpose(0, 1)  # vLLM's buffer view
        kv = self.rnd((pages, hkv, mi.BLOCK, 256), g)
        q = self.rnd((b * sq, hq, 128), g)
        seqused = torch.full((b,), ctx, dtype=torch.int32, device=self.device)
        outs = [torch.empty_like(q) for _ in range(2)]

        def call(mod, out):
            return lambda: mod.minimax_m3_sparse_attn_decode(q, kv, topk_view, page_table, seqused,
                                                             hkv, 128 ** -0.5, out, sq) or out
        return dict(theirs=call(self.vllm.sparse_attn, outs[0]), fm=call(fv, outs[1]),
                    agree=lambda a, c: self.agree_close(a.clone(), c),
                    bytes=unique_blocks * 2 * mi.BLOCK * 128 * 2 + 2 * q.nbytes)

    @staticmethod
    def step_call(step, graph):
        """An engine's decode step as the timed call: ``step`` itself after one warm-up call
        (compilation, plans, constants made outside any capture), or with ``graph`` the replay of
        its CUDA graph."""
        step()
        torch.cuda.synchronize()
        if not graph:
            return step
        captured, static = capture_graph(step)
        return GraphedStep(captured, step, static)

    def vl_step(self, b, ctx, sq, graph):
        """vLLM 0.34's decode step of one sparse layer: minimax_m3_index_decode into the shared
        token-major top-k buffer (its transposed view as out=), then minimax_m3_sparse_attn_decode
        reading that view, one page table for the index-K and the K|V cache (as vLLM's). Eager, as
        vLLM 0.34 runs it (its model breaks the piecewise CUDA graph around the indexer and the
        attention: the row's notes give the host time of a call), or captured into a CUDA graph
        per side (the timed call is the replay)."""
        from flashmsa.integrations import vllm as fv
        hq, hkv = M3["hq"], M3["hkv"]
        q_idx, k, page_table, _, seqused, nb = self.proxy_decode_inputs(b, ctx, sq)
        index_cache = k.view(-1, mi.BLOCK, 128)
        g = self.gen()
        kv = self.rnd((index_cache.shape[0], hkv, mi.BLOCK, 256), g)
        q = self.rnd((b * sq, hq, 128), g)
        total = b * sq

        def graphed(index_mod, attn_mod):
            buf = torch.full((total, hkv, TOPK), -1, dtype=torch.int32, device=self.device)
            out = torch.empty_like(q)

            def step():
                index_mod.minimax_m3_index_decode(q_idx, index_cache, page_table, seqused, ctx, TOPK,
                                                  1, 1, hkv, sq, sq, out=buf.transpose(0, 1))
                attn_mod.minimax_m3_sparse_attn_decode(q, kv, buf.transpose(0, 1), page_table,
                                                       seqused, hkv, 128 ** -0.5, out, sq)
                return out, buf
            return self.step_call(step, graph)

        def agree(theirs, ours):
            return (self.agree_close(theirs[0].clone(), ours[0]) + "; "
                    + self.agree_sets(theirs[1].clone(), ours[1]))
        selected = b * hkv * min(TOPK, nb) * mi.BLOCK * 256 * 2  # at most: distinct blocks
        return dict(theirs=graphed(self.vllm.index_topk, self.vllm.sparse_attn),
                    fm=graphed(fv, fv), agree=agree, show_host=not graph,
                    bytes=index_cache[:b * nb].nbytes + selected)

    # -- SGLang's Triton kernels on the same inputs (--sglang) --
    def stage_sglang(self):
        """Head-to-head with SGLang's own MiniMax-M3 Triton kernels (benchmarks/sglang_ref.py),
        each case in SGLang's layouts and called as SGLang calls it, against the same call through
        flashmsa.integrations.sglang: what an SGLang user gets from either. SGLang's decode top-k
        runs its Triton kernels: its default, a JIT-compiled CUDA radix select, needs SGLang's JIT
        toolchain, which the prepared kernels do not carry."""
        if self.sglang is None:
            print("[bench] sglang: not run (no --sglang)", file=sys.stderr)
            return
        os.environ["SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX"] = "0"
        ref = ("sglang", "SGLang", f"sglang {self.sglang.version}")
        for s in SG_INDEX_PREFILL:
            self.head_to_head(ref, f"index prefill S={size_name(s)} bf16",
                              lambda s=s: self.sg_index_prefill(s), "compute")
        for s, pattern in SG_SPARSE:
            self.head_to_head(ref, f"sparse S={size_name(s)} bf16 {pattern}",
                              lambda s=s, pat=pattern: self.sg_sparse(s, pat), "compute")
        for b, ctx in SG_DECODE:
            for plan in (False, True):
                self.head_to_head(ref, f"index decode B{b} ctx={size_name(ctx)} bf16"
                                       + (", forward plan" if plan else ""),
                                  lambda b=b, c=ctx, p=plan: self.sg_index_decode(b, c, p),
                                  "memory")
            self.head_to_head(ref, f"decode B{b} ctx={size_name(ctx)} bf16",
                              lambda b=b, c=ctx: self.sg_decode(b, c), "memory")
        for b, ctx in SG_STEP:
            for graph in (False, True):
                self.head_to_head(ref, f"step {'graph' if graph else 'eager'} B{b} "
                                       f"ctx={size_name(ctx)} bf16",
                                  lambda b=b, c=ctx, gr=graph: self.sg_step(b, c, gr), "memory")

    def sg_pool(self, b, ctx, heads, g):
        """b requests of ctx tokens in SGLang's slot pool: req_to_token (b, ctx) int32 onto
        shuffled 128-slot pages, the request slots (int64, as SGLang's), slot-major caches of
        ``heads`` (name -> count) random bf16 tensors (slots, count, 128)."""
        nb = ctx // mi.BLOCK
        pages = torch.randperm(b * nb, generator=g, device=self.device).view(b, nb, 1)
        r2t = (pages * mi.BLOCK + torch.arange(mi.BLOCK, device=self.device)).view(b, ctx)
        caches = {name: self.rnd((b * ctx, n, 128), g) for name, n in heads.items()}
        return r2t.to(torch.int32).contiguous(), torch.arange(b, device=self.device), caches

    def sg_index_prefill(self, s):
        from flashmsa.integrations import sglang as fs
        g = self.gen()
        r2t, slots, caches = self.sg_pool(1, s, dict(idx_k=M3["idx_hk"]), g)
        idx_q = self.rnd((s, M3["idx_hq"], 128), g)
        lens = torch.tensor([s], dtype=torch.int32, device=self.device)
        args = (idx_q, caches["idx_k"], None, None, r2t, slots, ft.cu_seqlens([s], self.device),
                lens, torch.zeros_like(lens), s, s, 1, mi.BLOCK, TOPK)
        kw = dict(init_blocks=1, local_blocks=1, sm_scale=128 ** -0.5, disable_index_value=True,
                  page_size=mi.BLOCK)
        mod = self.sglang.prefill_index
        return dict(theirs=lambda: mod.flash_prefill_with_topk_index(*args, **kw)[1],
                    fm=lambda: fs.flash_prefill_with_topk_index(*args, **kw)[1],
                    agree=lambda a, c: self.agree_sets(a.clone(), c),
                    flop=2 * 128 * M3["idx_hq"] * (s * (s + 1) // 2))

    def sg_sparse(self, s, pattern):
        from flashmsa.integrations import sglang as fs
        hq, hkv = M3["hq"], M3["hkv"]
        sel = self.selection(s, pattern, hkv)
        g = self.gen()
        r2t, slots, caches = self.sg_pool(1, s, dict(k=hkv, v=hkv), g)
        q = self.rnd((s, hq, 128), g)
        lens = torch.tensor([s], dtype=torch.int32, device=self.device)
        cu, pre = ft.cu_seqlens([s], self.device), torch.zeros_like(lens)
        mod = self.sglang.prefill_attn
        keys = mi.visible_keys(sel, torch.arange(s, device=self.device), s)
        return dict(
            theirs=lambda: mod.flash_prefill_with_gqa_share_sparse(
                q, caches["k"], caches["v"], None, r2t, slots, sel, 1, mi.BLOCK, cu, lens, pre, s,
                sm_scale=128 ** -0.5),
            fm=lambda: fs.msa_sparse_prefill_main(q, caches["k"], caches["v"], sel, r2t, slots, cu,
                                                  lens, pre, mi.BLOCK, sm_scale=128 ** -0.5),
            agree=lambda a, c: self.agree_close(a.clone(), c), flop=4 * 128 * (hq // hkv) * keys)

    def sg_decode_inputs(self, b, ctx, g):
        """A decode batch in SGLang's layouts: index queries, queries, the pool, the selections
        (Hkv, b, topk) and the distinct selected (request, head, block) count."""
        hkv = M3["hkv"]
        r2t, slots, caches = self.sg_pool(b, ctx, dict(idx_k=M3["idx_hk"], k=hkv, v=hkv), g)
        idx_q = self.rnd((b, M3["idx_hq"], 128), g)
        q = self.rnd((b, M3["hq"], 128), g)
        lens = torch.full((b,), ctx, dtype=torch.int64, device=self.device)  # SGLang's int64
        sel = mi.random_selection(torch.full((b,), ctx - 1, device=self.device), hkv, TOPK, g)
        unique = mi.decode_pages(sel, b, 1, ctx // mi.BLOCK)[2]
        return idx_q, q, r2t, slots, caches, lens, sel.contiguous(), unique

    def sg_decode_plan(self, b, ctx, r2t, slots, lens):
        """SGLang's per-forward decode metadata through the adapter (built once per forward for
        all layers, outside the CUDA graph): (kv_indices, plan)."""
        from flashmsa.integrations import sglang as fs
        plan = fs.build_msa_decode_cg_plan(M3["hq"], M3["hkv"], mi.BLOCK, TOPK, b,
                                           device=self.device)
        buf = torch.zeros(b * (ctx // mi.BLOCK), dtype=torch.int32, device=self.device)
        fs.update_msa_decode_cg_meta(plan, buf, r2t, slots, lens, mi.BLOCK, TOPK, M3["hq"],
                                     M3["hkv"])
        return buf, plan

    def sg_index_decode(self, b, ctx, plan=False):
        """The decode indexer alone; with ``plan`` after SGLang's per-forward decode metadata was
        built from the same tensors (its MSA backend's serving path: the adapter then reads the
        page table, lengths and block counts from it), else building its own per call."""
        from flashmsa.integrations import sglang as fs
        idx_q, _, r2t, slots, caches, lens, _, _ = self.sg_decode_inputs(b, ctx, self.gen())
        if plan:
            self.sg_decode_plan(b, ctx, r2t, slots, lens)
        args = (idx_q, None, caches["idx_k"], None, r2t, lens, ctx, slots, mi.BLOCK, TOPK, 1, 1)
        kw = dict(sm_scale=128 ** -0.5, disable_index_value=True, page_size=mi.BLOCK)
        mod = self.sglang.decode_index
        return dict(theirs=lambda: mod.flash_decode_with_topk_idx(*args, **kw)[1],
                    fm=lambda: fs.flash_decode_with_topk_idx(*args, **kw)[1],
                    agree=lambda a, c: self.agree_sets(a.clone(), c),
                    bytes=caches["idx_k"].nbytes + idx_q.nbytes)

    def sg_decode(self, b, ctx):
        from flashmsa.integrations import sglang as fs
        _, q, r2t, slots, caches, lens, sel, unique = self.sg_decode_inputs(b, ctx, self.gen())
        buf, plan = self.sg_decode_plan(b, ctx, r2t, slots, lens)
        mod = self.sglang.decode_attn
        return dict(
            theirs=lambda: mod.flash_decode_with_gqa_share_sparse(
                q, None, caches["k"], caches["v"], r2t, lens, slots, mi.BLOCK, sel,
                sm_scale=128 ** -0.5, page_size=mi.BLOCK),
            fm=lambda: fs.msa_sparse_decode_main(q, caches["k"], caches["v"], sel, r2t, slots,
                                                 lens, mi.BLOCK, sm_scale=128 ** -0.5,
                                                 kv_indices=buf, plan=plan),
            agree=lambda a, c: self.agree_close(a.clone(), c),
            bytes=unique * 2 * mi.BLOCK * 128 * 2 + 2 * q.nbytes)

    def sg_step(self, b, ctx, graph):
        """SGLang's decode step of one sparse layer on its MSA path: the indexer, then the
        attention over its selection (the flashmsa side with the per-forward plan, made outside
        the step as SGLang makes it); eager with the host time in the notes, or graphed."""
        from flashmsa.integrations import sglang as fs
        idx_q, q, r2t, slots, caches, lens, _, _ = self.sg_decode_inputs(b, ctx, self.gen())
        buf, plan = self.sg_decode_plan(b, ctx, r2t, slots, lens)
        index = (idx_q, None, caches["idx_k"], None, r2t, lens, ctx, slots, mi.BLOCK, TOPK, 1, 1)
        index_kw = dict(sm_scale=128 ** -0.5, disable_index_value=True, page_size=mi.BLOCK)
        ref_index, ref_attn = self.sglang.decode_index, self.sglang.decode_attn

        def theirs():
            sel = ref_index.flash_decode_with_topk_idx(*index, **index_kw)[1]
            return ref_attn.flash_decode_with_gqa_share_sparse(
                q, None, caches["k"], caches["v"], r2t, lens, slots, mi.BLOCK, sel,
                sm_scale=128 ** -0.5, page_size=mi.BLOCK), sel

        def ours():
            sel = fs.flash_decode_with_topk_idx(*index, **index_kw)[1]
            return fs.msa_sparse_decode_main(q, caches["k"], caches["v"], sel, r2t, slots, lens,
                                             mi.BLOCK, sm_scale=128 ** -0.5, kv_indices=buf,
                                             plan=plan), sel

        def agree(a, c):
            return (self.agree_close(a[0].clone(), c[0]) + "; "
                    + self.agree_sets(a[1].clone(), c[1]))
        selected = b * M3["hkv"] * min(TOPK, ctx // mi.BLOCK) * mi.BLOCK * 256 * 2
        return dict(theirs=self.step_call(theirs, graph), fm=self.step_call(ours, graph),
                    agree=agree, show_host=not graph,
                    bytes=caches["idx_k"].nbytes + selected)

    def build_sparse(self, s, kv, layout, pattern, geo, options=None):
        """options: plan options of flashmsa's private msa_ops._sparse_attention_planned (a forced
        schedule or kernel); None runs the public op (the library's own plan)."""
        sel = self.selection(s, pattern, geo["hkv"])
        g = self.gen()
        hq, hkv = geo["hq"], geo["hkv"]
        q = self.rnd((s, hq, 128), g)
        k, v = self.rnd((s, hkv, 128), g), self.rnd((s, hkv, 128), g)
        cu = ft.cu_seqlens([s], self.device)
        kw = {}
        if layout == "paged":
            perm = torch.randperm(s // mi.BLOCK, generator=g, device=self.device)
            k, v = paged_one_sequence(k, perm), paged_one_sequence(v, perm)
            kw.update(page_table=perm.to(torch.int32).view(1, -1).contiguous(),
                      seqused_k=torch.tensor([s], dtype=torch.int32, device=self.device))
            cu_k = None
        else:
            cu_k = cu
        if kv == "fp8":
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        ops = self.ops
        kw.update(self.kw_attention(ops.msa_sparse_attention, s))

        attention = self.planned("msa_sparse_attention", options)

        def fn():
            return attention(q, k, v, sel, cu, cu_k, causal=True, **kw)
        pos = torch.arange(s, device=self.device)
        keys = mi.visible_keys(sel, pos, s)
        notes = [f"{keys / (hkv * s):.0f} keys/token/kv-head",
                 f"union/8 tokens {mi.mean_union_per_tile(sel):.1f} blocks"]
        if s in self.dense_us.get(hq, {}):
            notes.append(f"{self.dense_us[hq][s] / 1000:.2f} ms dense")
        return fn, dict(flop=4 * 128 * (hq // hkv) * keys, notes=notes)

    def dense_case(self, s, geo):
        hq = geo["hq"]
        ref = REF_DENSE_32K if (s == 32 * K and hq == 64) else None
        row = self.run_case("dense", f"S={size_name(s)} SDPA causal {hq} heads",
                            lambda: self.build_dense(s, geo), "compute", ref)
        if row["status"] == "ok":
            self.dense_us.setdefault(hq, {})[s] = row["median_us"]

    def build_dense(self, s, geo):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        g = self.gen()
        hq, hkv = geo["hq"], geo["hkv"]
        q = self.rnd((1, hq, s, 128), g)
        # GQA expanded once, outside the timing: the same FLOPs as attention over Hkv heads.
        k = self.rnd((1, hkv, s, 128), g).repeat_interleave(hq // hkv, dim=1).contiguous()
        v = self.rnd((1, hkv, s, 128), g).repeat_interleave(hq // hkv, dim=1).contiguous()
        notes = []
        backend = SDPBackend.CUDNN_ATTENTION
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q[:, :, :256], k[:, :, :256], v[:, :, :256],
                                               is_causal=True)
            torch.cuda.synchronize()
            notes.append("cuDNN")
        except RuntimeError as e:
            backend = SDPBackend.FLASH_ATTENTION
            notes.append(f"FLASH (cuDNN unavailable: {str(e).splitlines()[0][:80]})")

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return fn, dict(flop=4 * 128 * hq * s * s // 2, notes=notes)

    def stage_decode(self):
        dense_done = set()
        for b, ctx, sq, kv in self.cfg["decode_attn"]:
            if sq == 1 and (b, ctx) not in dense_done:  # dense decode over the whole context
                dense_done.add((b, ctx))
                self.run_case("dense", f"decode B{b} ctx={size_name(ctx)} sq1 SDPA 64 heads",
                              lambda b=b, c=ctx: self.build_dense_decode(b, c), "memory")
            ref = REF_DECODE_ATTN if (b, ctx, sq, kv) == (64, 32 * K, 1, "bf16") else None
            # The default choices, then (sq 1) each decode kernel and (sq > 1) each MTP item kind
            # forced by name (plan options); fp8 union items also with their K/V converted in
            # registers (kernel=regs, mtp=union; auto since ffe265b); NVFP4 sq 1 also with the
            # register kernel's byte conversion (nvfp4_cvt=byte; auto takes word since f4fdc62).
            variants = [("", None)]
            if sq == 1:
                variants += [(f" [{k}]", dict(kernel=k)) for k in ("smem", "regs")]
                if kv == "nvfp4":
                    variants.append((" [nvfp4_cvt=byte]", dict(kernel="regs", nvfp4_cvt="byte")))
                # fp8: the register kernel's stages filled by TMA (regs_feed=tma; off by default).
                if kv == "fp8":
                    variants.append((" [regs_feed=tma]", dict(kernel="regs", regs_feed="tma")))
            # Split-K batches (<= 8) of 16-bit and fp8 K/V: the splits of a row as one cluster
            # merging in distributed shared memory instead of partials + combine.
            if sq == 1 and b <= STEP_VARIANT_MAX_BATCH and kv in ("bf16", "fp8"):
                variants.append((" [split=cluster]", dict(split="cluster")))
            # ... and split-K batches of 16-bit K/V on 4 warps per CTA (split_warps=4) instead of
            # auto's 8 sharing each block.
            if sq == 1 and b <= SPLIT_K_MAX_BATCH and kv == "bf16":
                variants.append((" [split_warps=4]", dict(split_warps=4)))
            # ... and fused batches of 16-bit K/V on the 8-warp kernel (forced; auto: 4 warps).
            if sq == 1 and b > SPLIT_K_MAX_BATCH and kv == "bf16":
                variants.append((" [split_warps=8]", dict(split_warps=8)))
            # ... and those of fp8 K/V on 4 and on 8 warps per CTA (auto: the 8-warp kernel
            # converting in registers where a split holds one block, B1 at M3, else the 4-warp
            # register kernel; a forced 8 at larger batches runs fused).
            if sq == 1 and kv == "fp8":
                variants += list(STEP_FP8_VARIANTS if b <= SPLIT_K_MAX_BATCH else STEP_FP8_WIDE_VARIANTS)
            # ... and split-K batches with the split count ceil(resident CTAs / items)
            # (split_rule=ceil) instead of auto's fewest waves x blocks per split.
            if 1 < b <= SPLIT_K_MAX_BATCH and kv in ("bf16", "fp8"):
                variants.append((" [split_rule=ceil]", dict(split_rule="ceil")))
            # ... and split-K batches forced fused (force_fused=True: one CTA a (request, kv
            # head), no combine; auto splits below one item per SM), the question of the B32
            # target (docs/design/sparse_attention.md#decode-b32).
            if sq == 1 and b <= SPLIT_K_MAX_BATCH and kv in ("bf16", "fp8"):
                variants.append((" [fused]", dict(force_fused=True)))
            # ... and fused batches (one item per SM or more) forced to split (force_fused=False:
            # the fewest waves x blocks per split, at least 2 splits, then the combine): where the
            # items overrun a wave of resident CTAs by a fraction (B96 / M3: 384 items for 264
            # slots of the register kernel), the split may beat the fused call's second wave.
            if b > SPLIT_K_MAX_BATCH and (sq == 1 or kv == "fp8"):
                variants.append((" [split]", dict(force_fused=False)))
            # ... and split-K batches whose combine loads the partial values after the LSEs
            # (combine_loads=after) instead of with them (auto since dda49c5).
            if sq == 1 and b <= SPLIT_K_MAX_BATCH:
                variants.append((" [combine_loads=after]", dict(combine_loads="after")))
            if sq > 1:
                variants += [(f" [{m}]", dict(mtp=m)) for m in ("per_token", "union")]
                if kv == "fp8":
                    variants.append((" [union regs]", dict(kernel="regs", mtp="union")))
                    # fp8 K/V on the wgmma kernel: raw copies converted to fp16 in place by its
                    # converter warps (wgmma_fp8=on; auto's where the union items outnumber the
                    # SMs since 831d3e5's run, half the SMs since 455afa9's).
                    variants.append((" [wgmma_fp8=on]", dict(kernel="wgmma", wgmma_fp8="on")))
                # 16-bit union items on the sm_90a TMA + wgmma kernel (kernel=wgmma; planned as
                # auto where it cannot run: the plan text says why).
                if kv == "bf16":
                    variants.append((" [wgmma]", dict(kernel="wgmma")))
                    # ... against the shared-memory union kernel, forced (auto takes wgmma from
                    # more items than half the SMs since 37fd6f5: B32 54.9 vs 74.1 us).
                    variants.append((" [smem]", dict(kernel="smem", mtp="union")))
                    # ... fed by one producer warp that plans each item between the blocks of the
                    # one before (wgmma_pipe=inline; auto's pipe is ahead since 42bbb91).
                    variants.append((" [wgmma_pipe=inline]", dict(kernel="wgmma", wgmma_pipe="inline")))
            for suffix, options in variants:
                self.run_case("decode", f"B{b} ctx={size_name(ctx)} sq{sq} {kv} paged{suffix}",
                              lambda b=b, c=ctx, q=sq, kv=kv, o=options:
                              self.build_decode(b, c, q, kv, o),
                              "memory", ref if not suffix else None)

    def build_dense_decode(self, b, ctx):
        """Dense bf16 decode of one token per request over all ctx keys: the baseline the sparse
        decode replaces. With one query token nothing is masked, so the G = Hq / Hkv query heads
        of a KV head are the rows of one attention over that head's keys (q (b, Hkv, G, 128),
        K/V (b, Hkv, ctx, 128)): the FLOPs and K/V bytes of 64-head GQA decode."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        g = self.gen()
        hq, hkv = M3["hq"], M3["hkv"]
        q = self.rnd((b, hkv, hq // hkv, 128), g)
        # Gaussian keys / values of 8K tokens repeated along the context (dense attention's time
        # does not depend on the values; full-size float32 temporaries would need ~70 GB).
        piece = min(ctx, 8 * K)
        k, v = (self.rnd((b, hkv, piece, 128), g).repeat(1, 1, ctx // piece, 1) for _ in "kv")
        backend, notes = SDPBackend.CUDNN_ATTENTION, ["cuDNN"]
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q[:1], k[:1, :, :256], v[:1, :, :256])
            torch.cuda.synchronize()
        except RuntimeError as e:
            backend = SDPBackend.FLASH_ATTENTION
            notes = [f"FLASH (cuDNN unavailable: {str(e).splitlines()[0][:80]})"]

        def fn():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return fn, dict(flop=4 * 128 * hq * b * ctx, bytes=k.nbytes + v.nbytes + 2 * q.nbytes,
                        notes=notes)

    def build_decode(self, b, ctx, sq, kv, options=None):
        """options: plan options; its key force_fused (not a plan option) goes to the op."""
        options = dict(options or {})
        force_fused = options.pop("force_fused", None)
        g = self.gen()
        hq, hkv = M3["hq"], M3["hkv"]
        nb = ctx // mi.BLOCK
        # One selection per (request, kv head), shared by the request's sq adjacent tokens.
        req_pos = torch.full((b,), ctx - 1, device=self.device)
        sel_req = mi.random_selection(req_pos, hkv, TOPK, g)
        sel = sel_req.repeat_interleave(sq, dim=1).contiguous()
        page_table, pages, unique_blocks = mi.decode_pages(sel_req, b, 1, nb)
        k = self.rnd((pages, hkv, mi.BLOCK, 128), g)
        v = self.rnd((pages, hkv, mi.BLOCK, 128), g)
        scales = {}
        row_bytes = 128 * k.element_size()  # bytes of one key row of K (or V)
        if kv == "fp8":
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
            row_bytes = 128
        elif kv == "nvfp4":
            (k, ks, kgs), (v, vs, vgs) = ft.quantize_nvfp4(k), ft.quantize_nvfp4(v)
            scales = dict(k_scale=ks, v_scale=vs, k_global_scale=kgs, v_global_scale=vgs)
            row_bytes = 64 + 8  # e2m1 pairs and one e4m3 scale per 16 values
        q = self.rnd((b * sq, hq, 128), g)
        seqused = torch.full((b,), ctx, dtype=torch.int32, device=self.device)
        decode = self.planned("msa_sparse_decode_attention", options or None)

        def fn():
            return decode(q, k, v, sel, page_table=page_table, seqused_k=seqused, seqlen_q=sq,
                          causal=True, force_fused=force_fused, **scales)
        pos = (ctx - sq + torch.arange(sq, device=self.device)).repeat(b)
        keys = mi.visible_keys(sel, pos, ctx)
        nbytes = unique_blocks * 2 * mi.BLOCK * row_bytes + 2 * q.nbytes  # K+V, q, out (bf16)
        return fn, dict(flop=4 * 128 * (hq // hkv) * keys, bytes=nbytes)

    def stage_pipeline(self):
        for geo, label in ((M3, "64q/4kv/4idx"), (M3_TP4, "TP4 16q/1kv/1idx")):
            for s in self.cfg["pipeline_s"]:
                if s not in self.dense_us.get(geo["hq"], {}):
                    self.dense_case(s, geo)
                ref = REF_PIPELINE.get(s) if geo is M3 else None
                self.run_case("pipeline", f"S={size_name(s)} {label} bf16 flat",
                              lambda s=s, geo=geo: self.build_pipeline(s, geo), "compute", ref,
                              extra=dict(seq_len=s, num_heads=geo["hq"]))

    def build_pipeline(self, s, geo, attention_options=None):
        """attention_options: plan options of the sparse attention (None: the library's own plan)."""
        iq, ik, cu, nvp = self.index_inputs(s, geo)
        g = self.gen()
        hq, hkv = geo["hq"], geo["hkv"]
        q = self.rnd((s, hq, 128), g)
        k, v = self.rnd((s, hkv, 128), g), self.rnd((s, hkv, 128), g)
        p = math.ceil(s / mi.BLOCK)
        scores = torch.empty((geo["idx_hq"], p, s), dtype=torch.float32, device=self.device)
        sel = torch.empty((s, geo["idx_hq"], TOPK), dtype=torch.int32, device=self.device)
        ops = self.ops
        kw = self.kw_attention(ops.msa_sparse_attention, s)
        attention = self.planned("msa_sparse_attention", attention_options)

        def fn():
            ops.msa_proxy_score(iq, ik, cu, cu, causal=True, max_seqlen_q=s, max_k_tiles=p,
                                output=scores)
            ops.msa_topk_select(scores, TOPK, num_valid_pages=nvp, force_end_blocks=1, output=sel)
            q2k = sel.transpose(0, 1).contiguous()
            return attention(q, k, v, q2k, cu, cu, causal=True, **kw)
        fn()
        torch.cuda.synchronize()
        q2k = sel.transpose(0, 1).contiguous()
        pos = torch.arange(s, device=self.device)
        mi.check_selection(q2k, pos, TOPK)
        keys = mi.visible_keys(q2k, pos, s)
        flop = 2 * 128 * geo["idx_hq"] * s * (s + 1) // 2 + 4 * 128 * (hq // hkv) * keys
        union = mi.mean_union_per_tile(q2k)
        return fn, dict(flop=flop, notes=[f"union/8 tokens {union:.1f} blocks"])

    def stage_step(self):
        for b, ctx, sq, idx, kv in self.cfg["step"]:
            ref = REF_STEP if (b, ctx, sq, idx, kv) == (64, 32 * K, 1, "bf16", "bf16") else None
            self.run_case("step", step_case_name(b, ctx, sq, idx, kv),
                          lambda b=b, c=ctx, q=sq, i=idx, v=kv: self.build_step(b, c, q, i, v),
                          "memory", ref,
                          extra=dict(batch=b, ctx=ctx, seqlen_q=sq, index_k_dtype=idx,
                                     kv_dtype=kv))
            # (suffix, build_step's keyword arguments)
            small = b <= STEP_VARIANT_MAX_BATCH and sq == 1
            proxy = [(suffix, dict(proxy_options=options)) for suffix, options in STEP_PROXY_VARIANTS]
            if idx == NVFP4:  # the proxy's options only (see STEP_PROXY_VARIANTS)
                variants = proxy if small else []
            else:
                variants = [(suffix, dict(decode_options=options))
                            for suffix, options in step_decode_variants(b, sq, kv)]
                if small:
                    variants += [(suffix, dict(topk_options=options))
                                 for suffix, options in STEP_TOPK_VARIANTS]
                    variants += proxy if idx == "fp8" else []
                    variants.append((STEP_COPY_SUFFIX, dict(q2k_copy=True)))
            for suffix, kwargs in variants:
                self.run_case("step", step_case_name(b, ctx, sq, idx, kv) + suffix,
                              lambda b=b, c=ctx, q=sq, i=idx, v=kv, kw=kwargs:
                              self.build_step(b, c, q, i, v, **kw),
                              "memory", None,
                              extra=dict(batch=b, ctx=ctx, seqlen_q=sq, index_k_dtype=idx,
                                         kv_dtype=kv, **kwargs))

    def build_step(self, b, ctx, sq, idx="bf16", kv="bf16", decode_options=None,
                   topk_options=None, q2k_copy=False, proxy_options=None):
        """The decode step (DecodeStep) captured in one CUDA graph; the timed call is
        graph.replay(). Before returning: the eager step timed the same way (info "eager"), two
        replays checked bit-identical with each other and with the eager step (else an error
        row), the selection checked, and the byte floor taken from it."""
        step = DecodeStep(self.ops, b, ctx, sq, STEP_INDEX_DTYPES[idx], STEP_DTYPES[kv], self.gen(),
                          self.device, decode_options=decode_options, topk_options=topk_options,
                          q2k_copy=q2k_copy, proxy_options=proxy_options)
        step()  # warm-up: plans, kernels, the workspace grown to this shape before capture
        torch.cuda.synchronize()
        eager_timing = self.timer.time(step)
        eager = clone_outputs(step())
        graph, static = capture_graph(step)
        graph.replay()
        first = clone_outputs(static)
        poison_outputs(static)
        graph.replay()
        torch.cuda.synchronize()
        bad = replay_mismatch(eager, first, static)
        if bad:
            raise RuntimeError(f"CUDA graph replay not bit-identical: {bad}")
        try:
            mi.check_selection(step.q2k, step.positions, step.topk)
        except AssertionError as e:
            raise RuntimeError(f"the step's selection violates its contract: {e}") from e
        floor = step.floor()
        fields = dict(floor, bit_identical=True)
        notes = [f"index-K {floor['index_k_bytes'] / 1e6:.0f} MB + K/V "
                 f"{floor['kv_bytes'] / 1e6:.0f} MB ({floor['distinct_blocks']} distinct blocks)"]
        if self.ceil.get("copy_gbs"):
            fields["floor_us"] = floor["bytes"] / (self.ceil["copy_gbs"] * 1e9) * 1e6
            notes[0] = f"floor {fields['floor_us']:.1f} us: " + notes[0]
        notes.append("2 replays = eager, bit for bit")
        info = dict(flop=step.flop(), bytes=floor["bytes"], eager=eager_timing, fields=fields,
                    notes=notes)
        return GraphedStep(graph, step, static), info

    # -- output --
    def finish_pipeline_speedups(self):
        for row in self.rows:
            if row["stage"] == "pipeline" and row["status"] == "ok":
                dense = self.dense_us.get(row["num_heads"], {}).get(row["seq_len"])
                if dense:
                    row["speedup_vs_dense"] = dense / row["median_us"]
                    row["notes"] += (f"; dense {dense / 1000:.2f} ms, "
                                     f"speedup {row['speedup_vs_dense']:.2f}x")

    def table(self) -> str:
        head = ("| stage | case | median µs | TFLOP/s | GB/s | % ceiling | reference (speedup) "
                "| notes |")
        lines = [TABLE_MARKER, "",
                 f"ceilings (same run): bf16 matmul 8192^3 "
                 f"{self.ceil.get('matmul_tflops', float('nan')):.0f} TFLOP/s, "
                 f"device copy {self.ceil.get('copy_gbs', float('nan')):.0f} GB/s "
                 f"(read+write); {'quick' if self.args.quick else 'full'} run", "",
                 head, "|" + "---|" * 8]
        for r in self.rows:
            def f(key, fmt):
                return format(r[key], fmt) if key in r else ""
            ref = ""
            if "ref_ms" in r:
                ref = r["ref_label"] + (f" ({r['speedup_vs_ref']:.2f}x)"
                                        if "speedup_vs_ref" in r else "")
            med = f("median_us", ".1f") if r["status"] == "ok" else r["status"].upper()
            pct = ""
            if "pct_ceiling" in r:
                pct = f"{r['pct_ceiling']:.0f}% {'mm' if r['bound'] == 'compute' else 'copy'}"
            lines.append(f"| {r['stage']} | {r['case']} | {med} | {f('tflops', '.0f')} | "
                         f"{f('gbs', '.0f')} | {pct} | {ref} | {r['notes']} |")
        return "\n".join(lines)


def git_commit(cwd):
    """Short HEAD, with "-dirty" when tracked files differ from it (a copied working tree whose
    .git is older than its files says so instead of naming a commit it does not hold)."""
    def git(*argv):
        return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=cwd,
                              timeout=20).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        if not head:
            return None
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def meta(args, ops_module) -> dict:
    prop = torch.cuda.get_device_properties(0)
    commit = os.environ.get("FLASHMSA_COMMIT") or git_commit(os.path.dirname(os.path.abspath(__file__)))
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=prop.name, sm_count=prop.multi_processor_count,
        l2_bytes=getattr(prop, "L2_cache_size", None), gpu_mem_bytes=prop.total_memory,
        torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        flashmsa=getattr(ops_module, "__file__", None), commit=commit or "unknown",
        mode="quick" if args.quick else "full", argv=sys.argv,
        timing=(f"CUDA events around each call, L2 flushed by a 256 MB "
                f"{'read' if args.l2_flush == 'read' else 'memset'} and a GPU sleep queued before "
                f"each repetition, median of the repetitions"),
    )


def parse_sizes(text: str) -> list:
    """"8K,128K" / "8192" -> [8192, 131072]."""
    sizes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        sizes.append(_size(part))
    return sizes


def _size(part: str) -> int:
    n = int(part[:-1]) * K if part[-1] in "kK" else int(part)
    if n <= 0 or n % mi.BLOCK:
        raise argparse.ArgumentTypeError(f"a size must be a positive multiple of {mi.BLOCK}: {part}")
    return n


def parse_cases(text: str, dtypes: bool) -> list:
    """Decode cases "B/CTX[/SQ]" (dtypes: step cases "B/CTX[/SQ[/IDX[/KV]]]", IDX bf16, fp8 or
    nvfp4, KV bf16 or fp8, defaulting to IDX, fp8 for an nvfp4 IDX), comma-separated: "1/128K,64/32K/4" -> [(1, 131072, 1), (64, 32768,
    4)] (with dtypes: [(1, 131072, 1, "bf16", "bf16"), ...])."""
    cases = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        f = part.split("/")
        if len(f) < 2 or len(f) > (5 if dtypes else 3):
            raise argparse.ArgumentTypeError(f"expected B/CTX[/SQ{'[/IDX[/KV]]' if dtypes else ''}]: {part}")
        try:
            b, sq = int(f[0]), int(f[2]) if len(f) > 2 else 1
        except ValueError:
            raise argparse.ArgumentTypeError(f"batch and tokens must be integers: {part}") from None
        if b <= 0 or sq <= 0:
            raise argparse.ArgumentTypeError(f"batch and tokens must be positive: {part}")
        case = (b, _size(f[1]), sq)
        if dtypes:
            idx = f[3] if len(f) > 3 else "bf16"
            kv = f[4] if len(f) > 4 else "fp8" if idx == NVFP4 else idx
            if idx not in STEP_INDEX_DTYPES or kv not in STEP_DTYPES:
                raise argparse.ArgumentTypeError(f"index-K dtypes are one of {tuple(STEP_INDEX_DTYPES)}, "
                                                 f"K/V dtypes one of {tuple(STEP_DTYPES)}: {part}")
            case += (idx, kv)
        cases.append(case)
    return cases


def parse_decode_attn(text: str) -> list:
    """Sparse-decode cases "B/CTX[/SQ[/KV]]" (KV bf16, fp8 or nvfp4; default bf16),
    comma-separated: "1/128K/1/fp8,64/32K" -> [(1, 131072, 1, "fp8"), (64, 32768, 1, "bf16")]."""
    cases = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        f = part.split("/")
        if len(f) > 4:
            raise argparse.ArgumentTypeError(f"expected B/CTX[/SQ[/KV]]: {part}")
        kv = f[3] if len(f) > 3 else "bf16"
        if kv not in DECODE_KV_DTYPES:
            raise argparse.ArgumentTypeError(f"K/V dtype is one of {DECODE_KV_DTYPES}: {part}")
        cases += [c + (kv,) for c in parse_cases("/".join(f[:3]), False)]
    return cases


def parser() -> argparse.ArgumentParser:
    """bench_msa's command line (profile_msa and the tests take its defaults: parser().parse_args([...]))."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="subset that runs in < 2 minutes")
    ap.add_argument("--l2-flush", choices=("read", "write"), default="read",
                    help="how L2 is flushed before each repetition: read a 256 MB buffer (clean "
                         "lines; the default) or write it (a memset, the method before 2026-12-02: "
                         "the dirty lines' write-back lands in the timed op)")
    ap.add_argument("--out", help="write every row and the ceilings as JSON here")
    ap.add_argument("--tile-waste", default="", type=lambda v: [w for w in v.split(",") if w],
                    help="comma-separated values of the tile_max_waste plan option (1 to 8; the "
                         "library's bound is 2 with the TMA tiles, 1.5 with cp.async): bf16 flat sparse cases also run under the "
                         "hybrid schedule with each (tuning)")
    ap.add_argument("--pipeline-sizes", default=[], type=parse_sizes,
                    help="comma-separated prefill lengths of the pipeline stage (e.g. 8K,128K), "
                         "instead of the quick / full run's")
    ap.add_argument("--decodes", default=[], type=lambda v: parse_cases(v, False),
                    help="comma-separated proxy-decode cases B/CTX[/SQ] (e.g. 1/128K,64/32K/4) of "
                         "the proxy stage, instead of the quick / full run's")
    ap.add_argument("--steps", default=[], type=lambda v: parse_cases(v, True),
                    help="comma-separated decode-step cases B/CTX[/SQ[/IDX[/KV]]] (IDX: bf16, fp8 "
                         "or nvfp4, KV: bf16 or fp8; KV defaults to IDX, to fp8 for nvfp4; e.g. "
                         "1/128K,64/32K/1/fp8,1/128K/1/nvfp4) of the step stage, instead of the "
                         "quick / full run's")
    ap.add_argument("--decode-attn", default=[], type=parse_decode_attn,
                    help="comma-separated sparse-decode cases B/CTX[/SQ[/KV]] (KV: bf16, fp8 or "
                         "nvfp4; e.g. 64/32K/1/fp8) of the decode stage, instead of the quick / full "
                         "run's")
    ap.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                    help=f"comma-separated subset of {','.join(STAGES)} (default: all but "
                         "flashinfer, vllm and sglang)")
    ap.add_argument("--flashinfer", metavar="DIR",
                    help="a FlashInfer prepared by benchmarks/flashinfer_ref.py: adds the "
                         "flashinfer stage, FlashInfer's own ops beside flashmsa's")
    ap.add_argument("--vllm", metavar="DIR",
                    help="vLLM ops prepared by benchmarks/vllm_ref.py: adds the vllm stage, vLLM's "
                         "Triton MiniMax-M3 ops beside flashmsa's vLLM adapter")
    ap.add_argument("--sglang", metavar="DIR",
                    help="SGLang kernels prepared by benchmarks/sglang_ref.py: adds the sglang "
                         "stage, SGLang's Triton MiniMax-M3 kernels beside flashmsa's SGLang "
                         "adapter")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    if not torch.cuda.is_available():
        print("bench_msa: no CUDA device; nothing to time", file=sys.stderr)
        return 2
    from flashmsa import msa_ops

    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    bench = Bench(args, msa_ops, device)
    if args.flashinfer:
        from flashinfer_ref import load
        bench.flashinfer = load(args.flashinfer)
        stages.append("flashinfer")
    if args.vllm:
        import vllm_ref
        bench.vllm = vllm_ref.load(args.vllm)
        stages.append("vllm")
    if args.sglang:
        import sglang_ref
        bench.sglang = sglang_ref.load(args.sglang)
        stages.append("sglang")
    bench.measure_ceilings()
    for stage in STAGES:  # fixed order: sparse fills the dense results the pipeline compares with
        if stage in stages:
            getattr(bench, f"stage_{stage}")()
    bench.finish_pipeline_speedups()
    table = bench.table()
    print(table, flush=True)
    elapsed = time.time() - t0
    print(f"\n{len(bench.rows)} cases in {elapsed:.0f} s: "
          f"{sum(r['status'] == 'ok' for r in bench.rows)} ok, "
          f"{sum(r['status'] == 'skip' for r in bench.rows)} skipped, "
          f"{sum(r['status'] == 'error' for r in bench.rows)} errors", flush=True)
    if args.out:
        report = dict(meta=meta(args, msa_ops), ceilings=bench.ceil, rows=bench.rows,
                      elapsed_s=elapsed)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return 1 if any(r["status"] == "error" for r in bench.rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m flashmsa demo``: the whole MSA pipeline on a synthetic needle-in-a-haystack problem.

MiniMax-M3 geometry by default: 64 query heads over 4 KV heads (head dim 128), an indexer with 4
index heads over 1 index-K head, top-16 blocks of 128 tokens per query and KV head, the query's own
block always selected (``force_end_blocks=1``). The pipeline is vLLM's:

    scores = msa_proxy_score(index_q, index_k, ...)               # (4, P, T) block maxima
    sel    = msa_topk_select(scores, 16, pos // 128 + 1, force_end_blocks=1)
    out    = msa_sparse_attention(q, k, v, sel.transpose(0, 1).contiguous(), ..., causal=True)

A few "needle" keys are planted: index-K rows aligned with the index queries of chosen later
tokens, far from them, so those tokens must select the needle's block. The demo reports the recall
of those blocks, the error of the sparse output against an fp32 torch attention over exactly the
selected keys, the density (keys attended / keys dense causal attention reads), the time per stage
(on the CPU: the exact C++ reference's, not the CUDA kernels') and, on CUDA at 32K tokens and more,
dense attention (torch SDPA) time and the speedup. It warns when top-k covers every block of the
sequence (at most topk * 128 tokens), which makes the run dense attention.
"""

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import threading
from typing import Callable, List, Optional, Tuple

import torch
from tqdm import tqdm

from . import msa_ops, testing
from ._library import built_with_cuda

BLOCK = 128
HEAD_DIM = 128
DENSE_MIN_TOKENS = 32768  # dense SDPA timing is shown from this size up (CUDA)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_KV_DTYPES = ("bf16", "fp16", "fp8", "nvfp4")
_LAYOUTS = ("flat", "paged", "packed")


@dataclasses.dataclass
class DemoConfig:
    device: str = "cpu"
    seqlen: int = 4096            # keys (context) per sequence
    qlen: Optional[int] = None    # queries per sequence, the last qlen tokens (default: seqlen)
    batch: int = 1
    heads: int = 64               # query heads
    kv_heads: int = 4
    index_heads: int = 4          # index query heads over one index-K head
    topk: int = 16
    local_blocks: int = 1         # force_end_blocks: the query's own block
    sink_blocks: int = 0          # force_begin_blocks
    dtype: str = "bf16"           # q / compute dtype
    kv_dtype: Optional[str] = None  # default: dtype
    layout: str = "flat"
    needles: int = 8
    seed: int = 0
    iters: Optional[int] = None   # timed repetitions per stage (default: 20 on CUDA, 1 on CPU)
    dense: Optional[bool] = None  # time dense SDPA (default: CUDA and seqlen >= 32768)
    check: bool = True            # compare with the fp32 reference
    check_rows: Optional[int] = None  # rows compared (default: all on CUDA, 512 on CPU)

    def resolved(self) -> "DemoConfig":
        c = dataclasses.replace(self)
        c.qlen = c.seqlen if c.qlen is None else c.qlen
        c.kv_dtype = c.kv_dtype or c.dtype
        if c.iters is None:
            c.iters = 20 if c.device.startswith("cuda") else 1
        if c.check_rows is None and not c.device.startswith("cuda"):
            c.check_rows = 512
        if c.dense is None:
            c.dense = c.device.startswith("cuda") and c.seqlen >= DENSE_MIN_TOKENS
        return c


def config_error(cfg: DemoConfig) -> Optional[str]:
    """Why ``cfg`` cannot run, in the user's terms, or None."""
    if cfg.dtype not in _DTYPES:
        return f"--dtype must be one of {sorted(_DTYPES)}, got {cfg.dtype}"
    if cfg.kv_dtype not in _KV_DTYPES:
        return f"--kv-dtype must be one of {_KV_DTYPES}, got {cfg.kv_dtype}"
    if cfg.kv_dtype in _DTYPES and cfg.kv_dtype != cfg.dtype:
        return f"--kv-dtype {cfg.kv_dtype} needs --dtype {cfg.kv_dtype} (16-bit K/V match q)"
    if cfg.layout not in _LAYOUTS:
        return f"--layout must be one of {_LAYOUTS}, got {cfg.layout}"
    if cfg.layout == "packed" and cfg.kv_dtype == "nvfp4":
        return "--layout packed reads K|V views of one cache, which NVFP4 caches are not"
    if cfg.seqlen < 1 or cfg.batch < 1 or not 1 <= cfg.qlen <= cfg.seqlen:
        return "need --seqlen >= 1, --batch >= 1 and 1 <= --qlen <= --seqlen"
    if cfg.heads % cfg.kv_heads or cfg.index_heads < 1:
        return "--heads must be a multiple of --kv-heads, and --index-heads >= 1"
    if not 1 <= cfg.topk <= 64 or cfg.local_blocks + cfg.sink_blocks > cfg.topk:
        return "need 1 <= --topk <= 64 and --local-blocks + --sink-blocks <= --topk"
    if cfg.device.startswith("cuda") and not (torch.cuda.is_available() and built_with_cuda()):
        return "--device cuda needs a GPU and a flashmsa build with CUDA kernels"
    return None


# ---- progress ----------------------------------------------------------------------------------

def progress_bar(total: float, enabled: Optional[bool] = None, delay: float = 1.0,
                 stream=None) -> tqdm:
    """The run's tqdm bar on stderr: one step per stage, fractions for the reference check.

    It appears only once a run has taken longer than ``delay`` seconds, only on a terminal unless
    ``enabled`` forces it, and is cleared when closed. :func:`ticking` keeps its elapsed time moving
    while one long native call runs (the ops release the GIL).
    """
    return tqdm(total=total, disable=None if enabled is None else not enabled, delay=delay,
                file=stream or sys.stderr, leave=False, miniters=0, mininterval=0.0, unit="step",
                bar_format="{desc:<28} {percentage:5.1f}%|{bar:30}| {elapsed}")


@contextlib.contextmanager
def ticking(bar: tqdm, interval: float = 0.25):
    """Redraw ``bar`` every ``interval`` seconds from a thread while the block runs."""
    stop = threading.Event()

    def tick():
        while not stop.wait(interval):
            bar.update(0)

    thread = threading.Thread(target=tick, daemon=True)
    if not bar.disable:
        thread.start()
    try:
        yield bar
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        bar.close()


# ---- problem -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    q: torch.Tensor                 # (B*qlen, Hq, 128)
    index_q: torch.Tensor           # (B*qlen, Hidx, 128)
    k_ref: torch.Tensor             # (B*seqlen, Hkv, 128) float32: the values the op reads
    v_ref: torch.Tensor
    proxy_kwargs: dict              # k / cu_seqlens / paging arguments of msa_proxy_score
    attn_kwargs: dict               # k, v and the rest of msa_sparse_attention's arguments
    cu_q: torch.Tensor
    positions: torch.Tensor         # (B*qlen,) int32 global position of each query row
    needles: List[Tuple[int, int]]  # (query row, needle block)
    dense_kv: Tuple[torch.Tensor, torch.Tensor]  # compute-dtype K/V for dense SDPA


def build_problem(cfg: DemoConfig) -> Problem:
    device = torch.device(cfg.device)
    gen = torch.Generator().manual_seed(cfg.seed)  # small host-side draws: needles, page order
    # Bulk data is drawn on the device itself (a 32K-token M3 problem is ~1.5 GB of fp32 draws).
    dev_gen = torch.Generator(device=device).manual_seed(cfg.seed)
    dt = _DTYPES[cfg.dtype]
    B, S, Sq = cfg.batch, cfg.seqlen, cfg.qlen
    offset = S - Sq  # right-aligned: the queries are the last qlen tokens

    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=dev_gen, device=device) * scale

    q = randn(B * Sq, cfg.heads, HEAD_DIM, scale=1 / 3)
    k = randn(B * S, cfg.kv_heads, HEAD_DIM, scale=1 / 3)
    v = randn(B * S, cfg.kv_heads, HEAD_DIM, scale=1 / 3)
    index_q = randn(B * Sq, cfg.index_heads, HEAD_DIM)
    index_k = randn(B * S, 1, HEAD_DIM)

    # Needles: a late query token whose index heads all point along one direction u, and one key,
    # at least two blocks before it, equal to u. Its logit |u|^2 ~ 128 stands far above the block
    # maxima of random keys (~4 sigma ~ 45), so the needle's block must be among the selected.
    needles: List[Tuple[int, int]] = []
    for n in range(cfg.needles):
        b = n % B
        lo = max(2 * BLOCK, offset + Sq // 2)
        if S <= lo or lo - offset >= Sq:
            break
        pos = int(torch.randint(lo, S, (1,), generator=gen))
        block = int(torch.randint(0, pos // BLOCK - 1, (1,), generator=gen))
        token = block * BLOCK + int(torch.randint(0, BLOCK, (1,), generator=gen))
        row = b * Sq + (pos - offset)
        u = randn(HEAD_DIM)
        index_q[row] = u
        index_k[b * S + token, 0] = u
        needles.append((row, block))

    q, k, v, index_q, index_k = (t.to(dt) for t in (q, k, v, index_q, index_k))
    cu_q = testing.cu_seqlens([Sq] * B, device)
    cu_k = testing.cu_seqlens([S] * B, device)
    positions = (torch.arange(Sq, device=device) + offset).repeat(B).to(torch.int32)

    # Index K in fp8 when the cache is fp8 (as M3 serves it); NVFP4 keeps a 16-bit index cache.
    ik_dtype = torch.float8_e4m3fn if cfg.kv_dtype == "fp8" else dt
    attn = {"cu_seqlens_q": cu_q}
    if cfg.layout == "flat":
        k_store, v_store, ik_store = k, v, index_k.to(ik_dtype)
        proxy = {"k": ik_store, "cu_seqlens_k": cu_k}
        attn["cu_seqlens_k"] = cu_k
    else:
        # One page table for the main and index caches (vLLM's block ids), pages permuted.
        both = torch.cat([k, v, index_k], dim=1)
        cache, page_table, seqused = testing.paginate(both, [S] * B, generator=gen)
        H = cfg.kv_heads
        k_store = cache[:, :H].contiguous()
        v_store = cache[:, H:2 * H].contiguous()
        ik_store = cache[:, 2 * H:].contiguous().to(ik_dtype)
        proxy = {"k": ik_store, "page_table": page_table, "seqused_k": seqused}
        attn.update(page_table=page_table, seqused_k=seqused)

    # Quantise the stored K/V; the reference reads back exactly what the op reads.
    if cfg.kv_dtype == "fp8":
        k_store, v_store = k_store.to(torch.float8_e4m3fn), v_store.to(torch.float8_e4m3fn)
        k_ref, v_ref = k.to(torch.float8_e4m3fn).float(), v.to(torch.float8_e4m3fn).float()
    elif cfg.kv_dtype == "nvfp4":
        k_data, k_scale, k_gs = testing.quantize_nvfp4(k_store)
        v_data, v_scale, v_gs = testing.quantize_nvfp4(v_store)
        attn.update(k_scale=k_scale, v_scale=v_scale, k_global_scale=k_gs, v_global_scale=v_gs)
        k_deq = testing.dequantize_nvfp4(k_data, k_scale, k_gs)
        v_deq = testing.dequantize_nvfp4(v_data, v_scale, v_gs)
        k_ref, v_ref = _unpage(k_deq, cfg, attn), _unpage(v_deq, cfg, attn)
        k_store, v_store = k_data, v_data
    else:
        k_ref, v_ref = k.float(), v.float()
    if cfg.layout == "packed":
        _, k_store, v_store = testing.pack_kv(k_store, v_store)
    attn.update(k=k_store, v=v_store)
    return Problem(q=q, index_q=index_q, k_ref=k_ref, v_ref=v_ref, proxy_kwargs=proxy,
                   attn_kwargs=attn, cu_q=cu_q, positions=positions, needles=needles,
                   dense_kv=(k, v))


def _unpage(x: torch.Tensor, cfg: DemoConfig, attn: dict) -> torch.Tensor:
    """Flat (B*S, H, 128) rows of a cache (paged or flat) holding dequantised values."""
    if "page_table" not in attn:
        return x
    S = cfg.seqlen
    rows = []
    for b in range(cfg.batch):
        pages = attn["page_table"][b, : math.ceil(S / BLOCK)].long()
        rows.append(x[pages].transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])[:S])
    return torch.cat(rows)


# ---- the pipeline ------------------------------------------------------------------------------

def _timed(fn: Callable[[], object], timer: testing.timing.Timer):
    """Median time of fn in ms and the result of its last run: flashmsa.testing.timing's method
    (on CUDA after a warm-up run, each repetition with a cold L2; on the CPU every run timed)."""
    timing, result = timer.time(fn, return_result=True)
    return result, timing["median_us"] / 1000.0


def make_timer(cfg: DemoConfig) -> testing.timing.Timer:
    """Exactly ``cfg.iters`` timed repetitions per stage."""
    reps = max(cfg.iters, 1)
    return testing.timing.Timer(cfg.device, budget_s=0.0, max_reps=reps, min_reps=reps)


def run_pipeline(cfg: DemoConfig, prob: Problem, progress: tqdm, timer: testing.timing.Timer):
    """The three stages, timed. Returns (q2k, out, timings_ms)."""
    Sq, S = cfg.qlen, cfg.seqlen
    max_k_tiles = math.ceil(S / BLOCK)
    per_head = cfg.index_heads == cfg.kv_heads
    nvp = (prob.positions // BLOCK + 1).to(torch.int32)

    def proxy():
        return msa_ops.msa_proxy_score(
            prob.index_q, cu_seqlens_q=prob.cu_q, causal=True, max_seqlen_q=Sq,
            max_k_tiles=max_k_tiles, reduce_heads=not per_head, **prob.proxy_kwargs)

    progress.set_description_str("proxy score", refresh=False)
    scores, t_proxy = _timed(proxy, timer)
    progress.update()

    def topk():
        sel = msa_ops.msa_topk_select(scores, cfg.topk, nvp, force_begin_blocks=cfg.sink_blocks,
                                      force_end_blocks=cfg.local_blocks)
        # (T, Hidx, topk) -> (Hkv, T, topk): one index head per KV head (M3 / vLLM), or one
        # shared selection broadcast to every KV head when the index heads were reduced.
        if per_head:
            return sel.transpose(0, 1).contiguous()
        return sel.permute(1, 0, 2).expand(cfg.kv_heads, -1, -1).contiguous()

    progress.set_description_str("top-k select", refresh=False)
    q2k, t_topk = _timed(topk, timer)
    progress.update()

    def attend():
        return msa_ops.msa_sparse_attention(prob.q, q2k_indices=q2k, causal=True,
                                            **prob.attn_kwargs)

    progress.set_description_str("sparse attention", refresh=False)
    out, t_attn = _timed(attend, timer)
    progress.update()
    timings = {"proxy_score": t_proxy, "topk_select": t_topk, "sparse_attention": t_attn,
               "pipeline": t_proxy + t_topk + t_attn}
    return q2k, out, timings


def needle_recall(cfg: DemoConfig, prob: Problem, q2k: torch.Tensor) -> dict:
    """Whether each needle's block is selected, per KV head, for the query it was planted for."""
    details = []
    hits = 0
    for row, block in prob.needles:
        found = [bool((q2k[h, row] == block).any()) for h in range(cfg.kv_heads)]
        hits += sum(found)
        details.append({"query_row": row, "position": int(prob.positions[row]), "block": block,
                        "selected_by_kv_heads": sum(found)})
    pairs = len(prob.needles) * cfg.kv_heads
    return {"planted": len(prob.needles), "pairs": pairs, "selected": hits,
            "recall": hits / pairs if pairs else float("nan"), "details": details}


def check_rows(cfg: DemoConfig, prob: Problem) -> torch.Tensor:
    """Query rows compared with the reference: all, or ``check_rows`` of them spread evenly over
    every sequence plus every needle row."""
    total = cfg.batch * cfg.qlen
    if cfg.check_rows is None or cfg.check_rows >= total:
        return torch.arange(total)
    picked = torch.linspace(0, total - 1, max(cfg.check_rows, 1)).round().long()
    needles = torch.tensor([row for row, _ in prob.needles], dtype=torch.long)
    return torch.unique(torch.cat([picked, needles]))


def reference_error(cfg: DemoConfig, prob: Problem, q2k: torch.Tensor, out: torch.Tensor,
                    progress: tqdm) -> dict:
    """Error of ``out`` against an fp32 torch attention over exactly the keys of the selected
    blocks (the list semantics of docs/semantics.md#d5: entries before the first negative, ids
    inside the sequence, a set), causal. Dense per row chunk: logits against every causally visible
    key, with the keys of unselected blocks masked out: the work is large matrix products only."""
    device = torch.device(cfg.device)
    S, Sq = cfg.seqlen, cfg.qlen
    Hkv, G = cfg.kv_heads, cfg.heads // cfg.kv_heads
    nb = math.ceil(S / BLOCK)
    scale = HEAD_DIM ** -0.5
    rows_all = check_rows(cfg, prob).to(device)
    # Logits of one chunk take rows * G * S fp32 values: bound them.
    budget = (2 << 30) if device.type == "cuda" else (64 << 20)
    chunk = max(1, budget // (G * S * 4))
    err_sq = ref_sq = 0.0
    max_err = 0.0
    keys = causal_keys = 0
    for b in range(cfg.batch):
        seq_rows = rows_all[(rows_all >= b * Sq) & (rows_all < (b + 1) * Sq)]
        for c0 in range(0, seq_rows.numel(), chunk):
            rows = seq_rows[c0:c0 + chunk]
            pos = prob.positions[rows].long()
            kmax = min(S, int(pos.max()) + 1)  # no row of the chunk sees a key past its position
            key = torch.arange(kmax, device=device)
            causal = key[None, :] <= pos[:, None]  # (C, kmax)
            sel = q2k[:, rows].long()  # (Hkv, C, topk)
            listed = (sel >= 0).long().cumprod(-1).bool() & (sel < nb)
            blocks = torch.zeros(Hkv, rows.numel(), nb + 1, dtype=torch.bool, device=device)
            blocks.scatter_(2, torch.where(listed, sel, nb), True)  # unlisted -> spare column nb
            selected = blocks[..., :nb].repeat_interleave(BLOCK, dim=-1)[..., :kmax] & causal
            ref = torch.empty(rows.numel(), Hkv, G, HEAD_DIM, device=device)
            for h in range(Hkv):
                kh = prob.k_ref[b * S:b * S + kmax, h]  # (kmax, 128)
                vh = prob.v_ref[b * S:b * S + kmax, h]
                qh = prob.q[rows, h * G:(h + 1) * G].float()  # (C, G, 128)
                logits = (qh @ kh.T) * scale  # (C, G, kmax)
                logits.masked_fill_(~selected[h, :, None, :], float("-inf"))
                m = logits.amax(-1, keepdim=True)
                p = torch.exp(logits - torch.where(torch.isfinite(m), m, 0.0))
                denom = p.sum(-1, keepdim=True)
                ref[:, h] = (p @ vh) / torch.where(denom > 0, denom, 1.0)  # no key: 0 (D8)
            diff = out[rows].float() - ref.reshape(rows.numel(), Hkv * G, HEAD_DIM)
            err_sq += float((diff * diff).sum())
            ref_sq += float((ref * ref).sum())
            max_err = max(max_err, float(diff.abs().max()))
            keys += int(selected.sum())
            causal_keys += Hkv * int(causal.sum())
            progress.update(rows.numel() / rows_all.numel())
    return {"max_abs_err": max_err, "rel_l2_err": math.sqrt(err_sq / max(ref_sq, 1e-30)),
            "rows_checked": int(rows_all.numel()),
            "reference": "fp32 torch attention over the selected blocks' keys",
            "keys_per_query": keys / max(Hkv * rows_all.numel(), 1),
            # density: attended keys / causally visible keys (1.0 = dense causal attention)
            "density": keys / max(causal_keys, 1)}


def dense_attention_time(cfg: DemoConfig, prob: Problem, timer: testing.timing.Timer) -> dict:
    """Causal dense attention with torch SDPA on the same (16-bit) q/K/V."""
    if cfg.qlen != cfg.seqlen:
        return {"skipped": "dense timing needs --qlen == --seqlen (SDPA's causal mask is "
                           "top-left aligned)"}
    B, S, Hq = cfg.batch, cfg.seqlen, cfg.heads
    q = prob.q.view(B, S, Hq, HEAD_DIM).transpose(1, 2)
    k, v = (t.view(B, S, cfg.kv_heads, HEAD_DIM).transpose(1, 2) for t in prob.dense_kv)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # Only the fused kernels: the math fallback would materialise Hq * S * S scores.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION]

    def dense():
        with sdpa_kernel(fused):
            return sdpa(q, k, v, is_causal=True, enable_gqa=True)
    try:
        dense()
    except RuntimeError:
        # No fused kernel with grouped K/V here: give every query head its own K/V copy.
        G = Hq // cfg.kv_heads
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)

        def dense():
            with sdpa_kernel(fused):
                return sdpa(q, k, v, is_causal=True)
    _, ms = _timed(dense, timer)
    return {"sdpa_ms": ms}


# ---- driver ------------------------------------------------------------------------------------

def selection_warnings(cfg: DemoConfig) -> List[str]:
    """What makes the run say little about sparse attention: a top-k that covers every block."""
    nb = math.ceil(cfg.seqlen / BLOCK)
    if cfg.topk >= nb:
        return [f"top-{cfg.topk} covers all {nb} blocks of {BLOCK} tokens of a {cfg.seqlen}-token "
                f"sequence: every query attends to every key it can see (density 100%), which is "
                f"dense causal attention; use --seqlen above {cfg.topk * BLOCK} (--topk x "
                f"{BLOCK}) or a smaller --topk to measure sparse attention"]
    return []


def run_demo(cfg: DemoConfig, progress_enabled: Optional[bool] = None) -> dict:
    cfg = cfg.resolved()
    err = config_error(cfg)
    if err:
        raise ValueError(err)
    device = torch.device(cfg.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    steps = 4 + (1 if cfg.check else 0) + (1 if cfg.dense else 0)
    timer = make_timer(cfg)
    with ticking(progress_bar(steps, enabled=progress_enabled)) as progress:
        progress.set_description_str("building inputs", refresh=False)
        prob = build_problem(cfg)
        progress.update()
        q2k, out, timings = run_pipeline(cfg, prob, progress, timer)
        result = {"config": dataclasses.asdict(cfg), "device_name": _device_name(device),
                  "needles": needle_recall(cfg, prob, q2k), "timing_ms": timings,
                  # On the CPU the ops run the exact C++ reference: its times are not those of
                  # flashmsa's kernels.
                  "timing_of": ("CUDA kernels" if device.type == "cuda" else
                                "CPU reference (exact C++ implementation, not the CUDA kernels)"),
                  "warnings": selection_warnings(cfg)}
        if cfg.check:
            progress.set_description_str("checking vs reference", refresh=False)
            precision = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("highest")  # a true fp32 reference, never TF32
            try:
                result["accuracy"] = reference_error(cfg, prob, q2k, out, progress)
            finally:
                torch.set_float32_matmul_precision(precision)
        if cfg.dense:
            progress.set_description_str("dense attention (SDPA)", refresh=False)
            dense = dense_attention_time(cfg, prob, timer)
            progress.update()
            if "sdpa_ms" in dense:
                timings["dense_sdpa"] = dense["sdpa_ms"]
                timings["speedup_vs_pipeline"] = dense["sdpa_ms"] / timings["pipeline"]
                timings["speedup_vs_sparse_attention"] = (dense["sdpa_ms"] /
                                                          timings["sparse_attention"])
            else:
                result["dense_skipped"] = dense["skipped"]
    tol = 1e-2
    result["passed"] = bool(result["needles"]["recall"] == 1.0 or not prob.needles) and (
        not cfg.check or result["accuracy"]["rel_l2_err"] <= tol)
    result["tolerance_rel_l2"] = tol
    return result


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = os.environ.get("FLASHMSA_NUM_THREADS") or str(os.cpu_count())
    return f"CPU (C++ reference, up to {threads} threads)"


def format_report(r: dict) -> str:
    c = r["config"]
    nb = math.ceil(c["seqlen"] / BLOCK)
    lines = [
        "flashmsa demo: MiniMax Sparse Attention pipeline "
        "(proxy score -> top-k -> sparse attention)",
        f"  device   {c['device']} - {r['device_name']}",
        f"  problem  batch {c['batch']} x {c['qlen']} queries over {c['seqlen']} tokens; "
        f"{c['heads']} q heads / {c['kv_heads']} KV heads, indexer {c['index_heads']} heads over "
        f"1 K head, head dim {HEAD_DIM}",
        f"  select   top-{c['topk']} of {nb} blocks of {BLOCK} tokens, "
        f"{c['local_blocks']} local + {c['sink_blocks']} sink block(s) forced; "
        f"q {c['dtype']}, KV {c['kv_dtype']}, {c['layout']} layout",
        "",
    ]
    n = r["needles"]
    if n["planted"]:
        lines.append(f"needles   {n['planted']} planted; {n['selected']}/{n['pairs']} "
                     f"(needle, KV head) pairs selected -> recall {100 * n['recall']:.1f}%")
    else:
        lines.append("needles   none planted (sequence too short)")
    if "accuracy" in r:
        a = r["accuracy"]
        total = c["batch"] * c["qlen"]
        scope = "all" if a["rows_checked"] == total else f"{a['rows_checked']} of {total}"
        lines.append(f"accuracy  vs {a['reference']} ({scope} query rows): "
                     f"max |err| {a['max_abs_err']:.2e}, rel L2 {a['rel_l2_err']:.2e} "
                     f"(tolerance {r['tolerance_rel_l2']:.0e})")
        lines.append(f"density   {a['keys_per_query']:.0f} keys per query and KV head: "
                     f"{100 * a['density']:.1f}% of the keys dense causal attention reads")
    t = r["timing_ms"]
    reps = c["iters"]
    runs = "median of " + str(reps) if reps > 1 else "one run"
    if c["device"].startswith("cuda"):
        lines.append(f"time per stage ({runs}):")
    else:
        lines.append(f"time per stage of the CPU reference ({runs}; the exact C++ reference, not "
                     "the CUDA kernels: not flashmsa's GPU performance):")
    for key, label in (("proxy_score", "proxy score"), ("topk_select", "top-k select"),
                       ("sparse_attention", "sparse attention"), ("pipeline", "pipeline total")):
        lines.append(f"  {label:<18}{t[key]:12.3f} ms")
    if "dense_sdpa" in t:
        lines.append(f"  {'dense SDPA':<18}{t['dense_sdpa']:12.3f} ms   -> speedup "
                     f"{t['speedup_vs_pipeline']:.2f}x (pipeline), "
                     f"{t['speedup_vs_sparse_attention']:.2f}x (sparse attention alone)")
    elif "dense_skipped" in r:
        lines.append(f"  dense SDPA skipped: {r['dense_skipped']}")
    for w in r.get("warnings", []):
        lines.append(f"warning   {w}")
    lines.append("")
    lines.append("PASS" if r["passed"] else "FAIL")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser):
    """The demo's options; every help text names the default."""
    d = DemoConfig()
    cuda = torch.cuda.is_available() and built_with_cuda()
    p.add_argument("--device", default="cuda" if cuda else "cpu",
                   help="cuda, cuda:N or cpu; on the CPU the ops run the exact C++ reference "
                        "(default: cuda when a GPU and a CUDA build are present, else cpu)")
    p.add_argument("--seqlen", type=int, default=None,
                   help="tokens (keys) per sequence (default: 32768 on CUDA, 4096 on the CPU)")
    p.add_argument("--qlen", type=int, default=None,
                   help="queries per sequence: the last QLEN tokens; fewer than --seqlen is a "
                        "chunked prefill (default: --seqlen, a full prefill)")
    p.add_argument("--batch", type=int, default=d.batch,
                   help="sequences, all of --seqlen tokens (default: %(default)s)")
    p.add_argument("--heads", type=int, default=d.heads,
                   help="query heads (default: %(default)s, MiniMax-M3)")
    p.add_argument("--kv-heads", type=int, default=d.kv_heads,
                   help="KV heads; --heads / --kv-heads query heads share one (default: "
                        "%(default)s)")
    p.add_argument("--index-heads", type=int, default=d.index_heads,
                   help="indexer query heads over one index-K head; equal to --kv-heads selects "
                        "per KV head, otherwise one selection is shared (reduce_heads) "
                        "(default: %(default)s)")
    p.add_argument("--topk", type=int, default=d.topk,
                   help="blocks of 128 tokens each query selects per KV head, 1..64 (default: "
                        "%(default)s)")
    p.add_argument("--local-blocks", type=int, default=d.local_blocks,
                   help="blocks always selected at the end of each query's visible range "
                        "(force_end_blocks: its own block) (default: %(default)s)")
    p.add_argument("--sink-blocks", type=int, default=d.sink_blocks,
                   help="blocks always selected at the start of the sequence "
                        "(force_begin_blocks) (default: %(default)s)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=d.dtype,
                   help="q and compute dtype (default: %(default)s)")
    p.add_argument("--kv-dtype", choices=_KV_DTYPES, default=None,
                   help="KV cache dtype; fp8 also stores the index keys in fp8 (default: --dtype)")
    p.add_argument("--layout", choices=_LAYOUTS, default=d.layout,
                   help="flat varlen K/V, paged cache (pages permuted), or packed K|V pages "
                        "(vLLM's layout) (default: %(default)s)")
    p.add_argument("--needles", type=int, default=d.needles,
                   help="planted needle keys whose blocks the indexer must select; recall is "
                        "reported (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="random seed of the inputs (default: %(default)s)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed repetitions per stage; on CUDA after a warm-up run, L2 flushed "
                        "before each (default: 20 on CUDA, 1 on the CPU)")
    dense = p.add_mutually_exclusive_group()
    dense.add_argument("--dense", dest="dense", action="store_true", default=None,
                       help="also time dense causal attention (torch SDPA) and the speedup "
                            "(default: on CUDA from 32768 tokens)")
    dense.add_argument("--no-dense", dest="dense", action="store_false",
                       help="do not time dense attention (default: see --dense)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the comparison with the fp32 reference (default: compare)")
    p.add_argument("--check-rows", type=int, default=None,
                   help="query rows compared with the reference, spread evenly, plus the needle "
                        "rows (default: all on CUDA, 512 on the CPU)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text; warnings go to stderr "
                        "(default: text)")
    progress = p.add_mutually_exclusive_group()
    progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                          help="draw the progress bar even when stderr is not a terminal "
                               "(default: on a terminal, for runs longer than a second)")
    progress.add_argument("--no-progress", dest="progress", action="store_false",
                          help="never draw the progress bar (default: see --progress)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    seqlen = args.seqlen
    if seqlen is None:
        seqlen = 32768 if args.device.startswith("cuda") else 4096
    return DemoConfig(device=args.device, seqlen=seqlen, qlen=args.qlen, batch=args.batch,
                      heads=args.heads, kv_heads=args.kv_heads, index_heads=args.index_heads,
                      topk=args.topk, local_blocks=args.local_blocks, sink_blocks=args.sink_blocks,
                      dtype=args.dtype, kv_dtype=args.kv_dtype, layout=args.layout,
                      needles=args.needles, seed=args.seed, iters=args.iters, dense=args.dense,
                      check=args.check, check_rows=args.check_rows)


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cfg = config_from_args(args).resolved()
    err = config_error(cfg)
    if err:
        parser.error(err)
    result = run_demo(cfg, progress_enabled=args.progress)
    if args.json:
        for w in result["warnings"]:  # stdout holds the JSON object only
            print(f"flashmsa demo: warning: {w}", file=sys.stderr)
        print(json.dumps(result))
    else:
        print(format_report(result))
    return 0 if result["passed"] else 1

"""SGLang's MiniMax-M3 MSA attention hook, served by flashmsa on any NVIDIA GPU from sm_80.

SGLang runs MiniMax-M3's sparse attention in three steps (``sglang.srt.layers.attention.
minimax_sparse_ops.minimax_sparse``): its Triton indexer scores the KV blocks and picks the top-k
(steps 1-2), then step 3 attends the selected blocks. For step 3 SGLang has a hook, the module
``sglang.srt.layers.attention.minimax_sparse_ops.msa``, whose functions run MiniMax's
``fmha_sm100`` kernels on Blackwell; on every other GPU ``msa_available()`` is False and SGLang's
Triton attention runs instead. This module has the same six functions with SGLang 0.5.23's
signatures and results, computed by flashmsa's kernels (or its CPU reference on CPU tensors), and
:func:`patch` swaps them into that module, so SGLang's ``use_msa`` path runs flashmsa on Hopper
and Ampere too:

* ``msa_available()``: this build has CUDA kernels and the current GPU is sm_80 or newer;
* ``msa_sparse_prefill_main``: :func:`flashmsa.msa_sparse_attention`;
* ``msa_sparse_decode_main``: :func:`flashmsa.msa_sparse_decode_attention`;
* ``build_msa_decode_meta`` / ``build_msa_decode_cg_plan`` / ``update_msa_decode_cg_meta``: the
  decode call's page table and lengths, rebuilt in place each forward outside the CUDA graph
  (device ops only, no host read), read by the captured decode attention.

Layouts, all read in place: SGLang's slot-major caches ``k_cache`` / ``v_cache (max_slots,
num_kv_heads, head_dim)`` with page size 128 are flashmsa's paged NHD views ``(max_slots // 128,
num_kv_heads, 128, head_dim)`` (docs/semantics.md#packed-kv); the top-k
``topk_idx (num_kv_heads, tokens, topk)`` (0-based block ids, ``-1`` padded) is flashmsa's
``q2k_indices``; the page table of request ``b`` is ``req_to_token[slot_ids[b], 128 t] // 128``,
gathered on the device (SGLang allocates whole 128-slot pages, so a block is one page).
Scales follow SGLang's MSA path: attention runs on ``Q * q_scale``, ``K * k_scale``, ``V *
v_scale`` (``None`` = 1), the first two folded into the softmax scale, ``v_scale`` into flashmsa's
``v_global_scale``. fp8 e4m3 ``q`` (SGLang's fp8 attention-GEMM mode) is widened to bf16 exactly;
the output is bf16 then, as SGLang's. Differences from ``fmha_sm100``: flashmsa computes ``P @ V``
with P in bf16 where fmha_sm100's fp8 kernel quantizes P to e4m3 first; selected block ids are
read as a set (duplicates count once).

Turning it on in SGLang: ``FLASHMSA_SGLANG=1`` in the environment of an SGLang with flashmsa
installed (flashmsa registers an ``sglang.srt.plugins`` entry point, which SGLang loads in every
process and which calls :func:`patch` when the variable is set), with ``--page-size 128`` (SGLang's
own condition for its MSA path) and, for decode inside CUDA graphs,
``SGLANG_OPT_USE_MSA_DECODE_UNDER_GRAPH=1``. See docs/sglang.md.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from .. import msa_ops
from ..errors import NotSupportedError
from ._common import PatchHandle, constant, contiguous, decode_cu_seqlens, decode_valid_pages
from ._common import check_int, env_flag, int32, prefill_valid_pages, q2k, select, swap_in, workspace

__all__ = [
    "MSADecodePlan",
    "PatchHandle",
    "build_msa_decode_cg_plan",
    "build_msa_decode_meta",
    "flash_decode_with_topk_idx",
    "flash_prefill_with_topk_index",
    "msa_available",
    "msa_sparse_decode_main",
    "msa_sparse_prefill_main",
    "patch",
    "register",
    "update_msa_decode_cg_meta",
]

PAGE_SIZE = 128  # SGLang's MSA path needs page size == sparse block size == 128, as flashmsa
MSA_MODULE = "sglang.srt.layers.attention.minimax_sparse_ops.msa"
PREFILL_INDEX_MODULE = "sglang.kernels.ops.attention.minimax_sparse.prefill.flash_with_topk_idx"
DECODE_INDEX_MODULE = "sglang.kernels.ops.attention.minimax_sparse.decode.flash_with_topk_idx"
_FP8_Q = (torch.float8_e4m3fn,)


# ---- helpers -------------------------------------------------------------------------------------

def _unit(name: str, scale: Optional[float]) -> float:
    if scale is None:
        return 1.0
    value = float(scale)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def _scales(head_dim: int, sm_scale, q_scale, k_scale, v_scale) -> Tuple[float, Optional[float]]:
    """(softmax scale with q_scale * k_scale folded in, v multiplier or None for 1)."""
    scale = head_dim ** -0.5 if sm_scale is None else _unit("sm_scale", sm_scale)
    scale *= _unit("q_scale", q_scale) * _unit("k_scale", k_scale)
    v = _unit("v_scale", v_scale)
    return scale, (None if v == 1.0 else v)


def _check_block_size(block_size_k: int) -> None:
    if block_size_k != PAGE_SIZE:
        raise NotSupportedError(f"block_size_k: flashmsa's blocks are {PAGE_SIZE} tokens (one "
                                f"page), got {block_size_k}")


def _pages(name: str, cache: torch.Tensor) -> torch.Tensor:
    """SGLang's slot-major ``(max_slots, H, D)`` cache as flashmsa's paged ``(max_slots // 128, H,
    128, D)`` view of its NHD pages (no copy)."""
    if not isinstance(cache, torch.Tensor) or cache.dim() != 3:
        got = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(f"{name} must be a (max_slots, num_heads, head_dim) tensor, got {got}")
    max_slots, heads, d = cache.shape
    if max_slots % PAGE_SIZE:
        raise ValueError(f"{name}: max_slots={max_slots} not divisible by page_size={PAGE_SIZE}")
    if cache.stride() != (heads * d, d, 1):
        raise ValueError(f"{name} must be contiguous (flashmsa reads the cache in place and does "
                         "not copy it)")
    return cache.view(max_slots // PAGE_SIZE, PAGE_SIZE, heads, d).transpose(1, 2)


def _paged(k_cache: torch.Tensor, v_cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    k = _pages("k_cache", k_cache)
    if isinstance(v_cache, torch.Tensor) and v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must be shaped like k_cache {tuple(k_cache.shape)}, got "
                         f"{tuple(v_cache.shape)}")
    return k, _pages("v_cache", v_cache)


def _lengths(name: str, t: torch.Tensor, batch: int) -> int:
    """Checks a per-request int tensor has ``batch`` entries; returns ``batch``."""
    check_int(name, t)
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"{name} must have {batch} entries (one per request), got "
                         f"{tuple(t.shape)}")
    return batch


def _kv_len(req_to_token: torch.Tensor) -> int:
    """req_to_token's width (max_kv_len), after checking it is a 2-D int tensor."""
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2:
        got = tuple(req_to_token.shape) if isinstance(req_to_token, torch.Tensor) else \
            type(req_to_token).__name__
        raise ValueError(f"req_to_token must be 2-D (max_reqs, max_kv_len), got {got}")
    check_int("req_to_token", req_to_token)
    return req_to_token.shape[1]


def _page_table_into(table: torch.Tensor, req_to_token: torch.Tensor, slot_ids: torch.Tensor) -> None:
    """table[b, t] = req_to_token[slot_ids[b], 128 t] // 128 (columns past req_to_token's width
    read its last column; never used, as they lie past the request's length). Device ops only."""
    _kv_len(req_to_token)
    _lengths("slot_ids", slot_ids, table.shape[0])
    width, kv_len, device = table.shape[1], req_to_token.shape[1], req_to_token.device
    cols = constant(("sglang_cols", width, kv_len, device), lambda: (
        torch.arange(width, dtype=torch.int64, device=device) * PAGE_SIZE).clamp_(max=kv_len - 1))
    slots = req_to_token[slot_ids.to(torch.int64).unsqueeze(1), cols.unsqueeze(0)]
    if slots.dtype == table.dtype:
        torch.div(slots, PAGE_SIZE, rounding_mode="floor", out=table)
    else:
        table.copy_(torch.div(slots, PAGE_SIZE, rounding_mode="floor"))


def _page_table(req_to_token: torch.Tensor, slot_ids: torch.Tensor, batch: int,
                max_len: Optional[int] = None) -> torch.Tensor:
    """The (batch, ceil(max_len / 128)) page table of a call (max_len: req_to_token's width by
    default), no host read."""
    kv_len = _kv_len(req_to_token)
    length = kv_len if max_len is None else min(int(max_len), kv_len)
    table = torch.empty((batch, max(-(-length // PAGE_SIZE), 1)), dtype=torch.int32,
                        device=req_to_token.device)
    _page_table_into(table, req_to_token, slot_ids)
    return table


# ---- the hook's functions ------------------------------------------------------------------------

def msa_available() -> bool:
    """Whether flashmsa's kernels serve this process's GPU: a build with CUDA kernels and a current
    GPU of compute capability 8.0 or newer."""
    from .._library import built_with_cuda

    if not built_with_cuda():
        return False
    try:
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
    except (RuntimeError, AssertionError):
        return False


_UNAVAILABLE: Dict[type, type] = {}


def _sglang_falls_back(fn: Callable) -> Callable:
    """fn (an attention function of SGLang's MSA hook) with a call flashmsa refuses
    (NotSupportedError, or ValueError from its checks) raised as an error of SGLang's own
    ``msa.MSAUnavailableError`` class as well: SGLang catches that around these calls, warns and
    runs its Triton attention instead, as when its own MSA kernels cannot run a batch. Outside
    SGLang (its msa module not loaded) the error is flashmsa's as it was."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            base = getattr(sys.modules.get(MSA_MODULE), "MSAUnavailableError", None)
            if not (isinstance(base, type) and issubclass(base, Exception)):
                raise
            cls = _UNAVAILABLE.get(base)
            if cls is None:
                cls = _UNAVAILABLE[base] = type(
                    "MSAUnavailableError", (NotSupportedError, base),
                    {"__module__": __name__, "__doc__": "A call flashmsa refuses, SGLang's "
                     "MSAUnavailableError too (SGLang then runs its Triton kernel)."})
            raise cls(f"flashmsa: {e}") from e
    return call


@_sglang_falls_back
@torch.no_grad()
def msa_sparse_prefill_main(
    q: torch.Tensor,  # [total_q, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim] (slot-major NHD)
    v_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, total_q, topk] (0-based, -1 pad)
    req_to_token: torch.Tensor,  # [max_reqs, max_kv_len]
    slot_ids: torch.Tensor,  # [batch]
    cu_seqlens: torch.Tensor,  # [batch+1] cumulative Q lengths
    seq_lens: torch.Tensor,  # [batch] total K length (prefix + chunk)
    prefix_lens: torch.Tensor,  # [batch]
    block_size_k: int,  # == page_size == 128 for M3
    sm_scale: Optional[float] = None,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> torch.Tensor:
    """Sparse prefill attention (causal; query ``i`` of request ``b`` at position
    ``prefix_lens[b] + i`` sees keys ``j <= position``, ``j < seq_lens[b]``, of the blocks its KV
    head's ``topk_idx`` row names). Returns ``(total_q, num_q_heads, head_dim)`` in q's dtype, bf16
    for fp8 q."""
    _check_block_size(block_size_k)
    k, v = _paged(k_cache, v_cache)
    q_in = q.to(torch.bfloat16) if q.dtype in _FP8_Q else contiguous(q)  # fp8 -> bf16 is exact
    scale, v_mult = _scales(q.shape[-1], sm_scale, q_scale, k_scale, v_scale)
    return msa_ops.msa_sparse_attention(
        q_in, k, v, q2k("topk_idx", topk_idx), int32("cu_seqlens", cu_seqlens),
        None, causal=True, softmax_scale=scale,
        page_table=_page_table(req_to_token, slot_ids, cu_seqlens.shape[0] - 1),
        seqused_k=int32("seq_lens", seq_lens), v_global_scale=v_mult,
        q_offset=int32("prefix_lens", prefix_lens), workspace=workspace(q_in.device))


class MSADecodePlan:
    """One decode batch size's lengths, read by the decode attention and the decode indexer (also
    inside a CUDA graph, by address). ``seq_lens`` and ``valid_pages`` (each request's visible
    block count, the decode top-k's candidate range) are rewritten in place by
    :func:`update_msa_decode_cg_meta`; the page table lives in SGLang's ``kv_indices`` buffer,
    viewed ``(batch_size, -1)``."""

    def __init__(self, batch_size: int, device: torch.device):
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seq_lens = torch.zeros(self.batch_size, dtype=torch.int32, device=device)
        self.valid_pages = torch.zeros(self.batch_size, dtype=torch.int32, device=device)

    def refresh(self, seq_lens: torch.Tensor) -> None:
        """The lengths and visible block counts of this forward, in place (3 small kernels)."""
        self.seq_lens.copy_(seq_lens)
        torch.div(self.seq_lens + (PAGE_SIZE - 1), PAGE_SIZE, rounding_mode="floor",
                  out=self.valid_pages)

    def __repr__(self) -> str:
        return f"MSADecodePlan(batch_size={self.batch_size}, device={self.seq_lens.device})"


def build_msa_decode_meta(
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached KV length per request
    num_q_heads: int,
    block_size_k: int,
    topk: int,
    is_fp8: bool = False,
):
    """One decode call's ``(kv_indices, plan)``: the page table flattened and the lengths."""
    _check_block_size(block_size_k)
    if k_cache.dim() != 3 or k_cache.shape[0] % PAGE_SIZE:
        raise ValueError(f"k_cache must be (max_slots, num_kv_heads, head_dim) with max_slots a "
                         f"multiple of {PAGE_SIZE}, got {tuple(k_cache.shape)}")
    batch = _lengths("seq_lens", seq_lens, seq_lens.shape[0] if seq_lens.dim() == 1 else -1)
    plan = MSADecodePlan(batch, req_to_token.device)
    plan.refresh(seq_lens)
    table = _page_table(req_to_token, slot_ids, batch)
    _remember_forward(req_to_token, slot_ids, seq_lens, table, plan)
    return table.view(-1), plan


def build_msa_decode_cg_plan(
    num_q_heads: int,
    num_kv_heads: int,
    block_size_k: int,
    topk: int,
    batch_size: int,
    device: Optional[torch.device] = None,
    is_fp8: bool = False,
) -> MSADecodePlan:
    """The persistent plan of one decode batch size (CUDA-graph stable): its lengths buffer."""
    _check_block_size(block_size_k)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return MSADecodePlan(batch_size, torch.device(device))


def update_msa_decode_cg_meta(
    plan: MSADecodePlan,
    kv_indices_buf: torch.Tensor,  # persistent page-table buffer [batch * max_pages]
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached KV length per request
    block_size_k: int,
    topk: int,
    num_q_heads: int,
    num_kv_heads: int,
) -> None:
    """Rewrites the plan's lengths and the page table in ``kv_indices_buf`` (viewed ``(batch,
    max_pages)``) in place, by device ops only (no host read): run once per decode forward, outside
    the graph, which then reads both by address."""
    _check_block_size(block_size_k)
    batch = seq_lens.shape[0]
    if batch == 0:
        return
    if not isinstance(plan, MSADecodePlan):
        raise ValueError(f"plan must come from flashmsa's build_msa_decode_cg_plan, got "
                         f"{type(plan).__name__}")
    if batch != plan.batch_size:
        raise ValueError(f"seq_lens has {batch} entries, the plan is for batch size "
                         f"{plan.batch_size}")
    if kv_indices_buf.dtype != torch.int32 or kv_indices_buf.dim() != 1 \
            or kv_indices_buf.numel() % batch or not kv_indices_buf.is_contiguous():
        raise ValueError(f"kv_indices_buf must be a contiguous int32 (batch * max_pages,) buffer, "
                         f"got {kv_indices_buf.dtype} {tuple(kv_indices_buf.shape)}")
    _lengths("seq_lens", seq_lens, batch)
    plan.refresh(seq_lens)
    table = kv_indices_buf.view(batch, -1)
    _page_table_into(table, req_to_token, slot_ids)
    _remember_forward(req_to_token, slot_ids, seq_lens, table, plan)


class _ForwardMeta(NamedTuple):
    """The decode metadata SGLang's backend last built (once per decode forward, before its layers
    run: ``init_forward_metadata_out_graph``), and the tensors it was built from."""
    req_to_token: torch.Tensor
    slot_ids: torch.Tensor
    seq_lens: torch.Tensor
    table: torch.Tensor  # (batch, max_pages) int32
    plan: MSADecodePlan


_FORWARD: List[Optional[_ForwardMeta]] = [None]


def _remember_forward(req_to_token, slot_ids, seq_lens, table, plan) -> None:
    # Strong references: an object of a later forward can never be one of these (``is`` below).
    _FORWARD[0] = _ForwardMeta(req_to_token, slot_ids, seq_lens, table, plan)


def _forward_meta(req_to_token: torch.Tensor, slot_ids: torch.Tensor, seq_lens: torch.Tensor,
                  columns: int) -> Optional[_ForwardMeta]:
    """The decode indexer's page table, lengths and visible block counts from this forward's
    metadata, when the indexer is called with the very tensors it was built from (SGLang's decode
    layers all are: ``minimax_sparse_decode`` passes ``req_to_token``, ``req_pool_indices`` and
    ``seq_lens`` of the forward whose metadata it also hands the attention) and its table holds
    ``columns`` pages a row; else None (the indexer builds its own). Inside a CUDA graph the shared
    buffers are read by address, rewritten before each replay as the attention's are."""
    meta = _FORWARD[0]
    if (meta is None or meta.req_to_token is not req_to_token or meta.slot_ids is not slot_ids
            or meta.seq_lens is not seq_lens or meta.table.shape[1] < columns
            or meta.plan.batch_size != seq_lens.shape[0]):
        return None
    return meta


@_sglang_falls_back
@torch.no_grad()
def msa_sparse_decode_main(
    q: torch.Tensor,  # [batch, num_q_heads, head_dim] (1 query token per request)
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim] (slot-major NHD)
    v_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, batch, topk] (0-based, -1 pad)
    req_to_token: torch.Tensor,  # [max_reqs, max_kv_len]
    slot_ids: torch.Tensor,  # [batch]
    seq_lens: torch.Tensor,  # [batch] cached KV length per request
    block_size_k: int,  # == page_size == 128
    sm_scale: Optional[float] = None,
    kv_indices: Optional[torch.Tensor] = None,  # page table (per-forward cache)
    plan: Optional[MSADecodePlan] = None,  # lengths (per-forward cache)
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
) -> torch.Tensor:
    """Decode attention: request ``b``'s one query, at position ``seq_lens[b] - 1``, attends the
    blocks its KV head's ``topk_idx`` row names. With ``kv_indices`` and ``plan`` (SGLang's
    per-forward cache) the page table and lengths come from them, else they are built here.
    Returns ``(batch, num_q_heads, head_dim)`` in q's dtype, bf16 for fp8 q."""
    _check_block_size(block_size_k)
    k, v = _paged(k_cache, v_cache)
    batch = q.shape[0]
    if batch == 0:
        out_dtype = torch.bfloat16 if q.dtype in _FP8_Q else q.dtype
        return torch.empty(q.shape, dtype=out_dtype, device=q.device)
    _lengths("seq_lens", seq_lens, batch)
    if kv_indices is None or plan is None:
        kv_indices, plan = build_msa_decode_meta(k_cache, req_to_token, slot_ids, seq_lens,
                                                 q.shape[1], block_size_k, topk_idx.shape[-1])
    if not isinstance(plan, MSADecodePlan) or plan.batch_size != batch:
        raise ValueError(f"plan must be flashmsa's decode plan for batch size {batch}, got {plan!r}")
    if kv_indices.numel() % batch:
        raise ValueError(f"kv_indices must hold batch * max_pages entries, got "
                         f"{kv_indices.numel()} for batch {batch}")
    scale, v_mult = _scales(q.shape[-1], sm_scale, q_scale, k_scale, v_scale)
    return msa_ops.msa_sparse_decode_attention(
        contiguous(q), k, v, q2k("topk_idx", topk_idx), page_table=kv_indices.view(batch, -1),
        seqused_k=plan.seq_lens, seqlen_q=1, causal=True, softmax_scale=scale,
        v_global_scale=v_mult, workspace=workspace(q.device))


# ---- the indexer (steps 1-2) ---------------------------------------------------------------------

# SGLang's originals, kept by patch() for the calls flashmsa does not take (index-value layers, sink
# logits, "lse" scores, other block / page sizes): those run SGLang's own kernels as before.
_SGLANG_ORIGINALS: Dict[str, Callable] = {}


def _index_unsupported(q, k_cache, sink, score_type, disable_index_value, block_size_k, page_size,
                       scales) -> Optional[str]:
    """Why flashmsa does not take this indexer call, or None. flashmsa scores blocks by the max of
    the unscaled q . k (a positive scale does not change the selection), selects per token, and
    computes no index-value attention output."""
    if not disable_index_value:
        return "disable_index_value=False: the layer's index-value attention output"
    if sink is not None:
        return "sink: an index sink logit"
    if score_type != "max":
        return f"score_type={score_type!r}: flashmsa scores by the block max"
    if block_size_k != PAGE_SIZE or page_size != PAGE_SIZE:
        return f"block_size_k={block_size_k}, page_size={page_size}: flashmsa needs 128 and 128"
    for name, value in scales:
        if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
            return f"{name}={value}: a non-positive scale changes the selection"
    fp8 = torch.float8_e4m3fn
    if not ((q.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype in (q.dtype, fp8))
            or (q.dtype == fp8 and k_cache.dtype == fp8)):
        return f"q {q.dtype} with an index-K cache of {k_cache.dtype}"
    if q.shape[-1] != 128:
        return f"head_dim {q.shape[-1]}: flashmsa's is 128"
    return None


def _sglang(name: str, why: str) -> Callable:
    """SGLang's own function ``name`` for a call flashmsa does not take."""
    original = _SGLANG_ORIGINALS.get(name)
    if original is None:
        raise NotSupportedError(f"{name}: {why} (flashmsa does not take it, and SGLang's own "
                                "kernel is not at hand: call this through patch())")
    return original


@torch.no_grad()
def flash_prefill_with_topk_index(
    q: torch.Tensor,
    k_cache: torch.Tensor,  # paged
    v_cache: Optional[torch.Tensor],  # paged; ignored when disable_index_value=True
    sink: Optional[torch.Tensor],
    req_to_token: torch.Tensor,
    slot_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seq_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    block_size_q: int,
    block_size_k: int,
    topk: int,
    init_blocks: int = 1,
    local_blocks: int = 2,
    sm_scale: Optional[float] = None,
    use_tma: bool = False,
    score_type: str = "max",
    disable_index_value: bool = False,
    cu_seqblocks_q: Optional[torch.Tensor] = None,
    max_seqblock_q: Optional[int] = None,
    all_seqblock_q: Optional[int] = None,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    page_size: int = 1,
):
    """The prefill indexer: block scores (max over a block's visible keys of q . k) and the top-k
    per (index head, query token), the first ``init_blocks`` and the last ``local_blocks`` visible
    blocks always. Returns ``(None, topk_idx)``, ``topk_idx (num_heads, total_q, topk)`` int32
    (ascending ids, ``-1`` padded). Calls flashmsa does not take (see ``_index_unsupported``;
    also ``block_size_q != 1``, SGLang's query-block selections) run SGLang's kernel."""
    why = _index_unsupported(q, k_cache, sink, score_type, disable_index_value, block_size_k,
                             page_size, (("sm_scale", sm_scale), ("q_scale", q_scale),
                                         ("k_scale", k_scale)))
    if why is None and block_size_q != 1:
        why = f"block_size_q={block_size_q}: flashmsa selects per token"
    if why is not None:
        return _sglang("flash_prefill_with_topk_index", why)(
            q, k_cache, v_cache, sink, req_to_token, slot_ids, cu_seqlens, seq_lens, prefix_lens,
            max_seqlen_q, max_seqlen_k, block_size_q, block_size_k, topk,
            init_blocks=init_blocks, local_blocks=local_blocks, sm_scale=sm_scale,
            use_tma=use_tma, score_type=score_type, disable_index_value=disable_index_value,
            cu_seqblocks_q=cu_seqblocks_q, max_seqblock_q=max_seqblock_q,
            all_seqblock_q=all_seqblock_q, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
            page_size=page_size)
    total_q, heads, _ = q.shape
    cu = int32("cu_seqlens", cu_seqlens)
    batch = cu.shape[0] - 1
    columns = max(-(-int(max_seqlen_k) // PAGE_SIZE), 1)
    score = torch.empty((heads, columns, total_q), dtype=torch.float32, device=q.device)
    prefix = int32("prefix_lens", prefix_lens)
    msa_ops.msa_proxy_score(
        contiguous(q), _pages("k_cache", k_cache), cu,
        page_table=_page_table(req_to_token, slot_ids, batch, int(max_seqlen_k)),
        seqused_k=int32("seq_lens", seq_lens), causal=True, max_seqlen_q=int(max_seqlen_q),
        max_k_tiles=columns, output=score, q_offset=prefix)
    nvp = prefill_valid_pages(cu, prefix, total_q)
    return None, select(score, int(topk), nvp, int(init_blocks), int(local_blocks), None)


@torch.no_grad()
def flash_decode_with_topk_idx(
    q: torch.Tensor,  # [batch_size, num_heads, head_dim]
    sink: Optional[torch.Tensor],
    k_cache: torch.Tensor,  # [max_slots, num_kv_heads, head_dim] (paged)
    v_cache: Optional[torch.Tensor],  # paged; ignored when disable_index_value=True
    req_to_token: torch.Tensor,  # [max_reqs, max_kv_len]
    seq_lens: torch.Tensor,  # [batch_size, ]
    max_seqlen: int,
    slot_ids: torch.Tensor,  # [batch_size, ]
    block_size: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
    sm_scale: Optional[float] = None,
    use_tma: bool = True,
    score_type: str = "max",
    disable_index_value: bool = False,
    use_dense_main_attn: bool = False,
    page_size: int = 1,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
):
    """The decode indexer: request ``b``'s query (position ``seq_lens[b] - 1``) scores the blocks
    of its first ``max_seqlen`` keys and takes the top-k, the first ``init_blocks`` and the last
    ``local_blocks`` blocks always. Returns ``(None, topk_idx, None)``, ``topk_idx (num_heads,
    batch, topk)`` int32 (ascending ids, ``-1`` padded). Device ops only (CUDA-graph safe). Calls
    flashmsa does not take (see ``_index_unsupported``; also ``use_dense_main_attn``, SGLang's
    page-table output) run SGLang's kernel."""
    why = _index_unsupported(q, k_cache, sink, score_type, disable_index_value, block_size,
                             page_size, (("sm_scale", sm_scale), ("q_scale", q_scale),
                                         ("k_scale", k_scale)))
    if why is None and use_dense_main_attn:
        why = "use_dense_main_attn: a page table for a dense attention backend"
    if why is not None:
        return _sglang("flash_decode_with_topk_idx", why)(
            q, sink, k_cache, v_cache, req_to_token, seq_lens, max_seqlen, slot_ids, block_size,
            topk, init_blocks, local_blocks, sm_scale=sm_scale, use_tma=use_tma,
            score_type=score_type, disable_index_value=disable_index_value,
            use_dense_main_attn=use_dense_main_attn, page_size=page_size, q_scale=q_scale,
            k_scale=k_scale, v_scale=v_scale)
    batch, heads, _ = q.shape
    _lengths("seq_lens", seq_lens, batch)
    length = min(int(max_seqlen), _kv_len(req_to_token))
    columns = max(-(-length // PAGE_SIZE), 1)
    if batch == 0:
        return None, torch.empty((heads, 0, int(topk)), dtype=torch.int32, device=q.device), None
    _lengths("slot_ids", slot_ids, batch)
    meta = _forward_meta(req_to_token, slot_ids, seq_lens, columns)
    if meta is not None:  # this forward's metadata: no kernel besides the proxy and the top-k
        table, seq, nvp = meta.table[:, :columns], meta.plan.seq_lens, meta.plan.valid_pages
    else:
        seq = int32("seq_lens", seq_lens)
        table, nvp = _page_table(req_to_token, slot_ids, batch, length), None
    score = torch.empty((heads, columns, batch), dtype=torch.float32, device=q.device)
    msa_ops.msa_proxy_score(
        contiguous(q), _pages("k_cache", k_cache), decode_cu_seqlens(batch, 1, q.device),
        page_table=table, seqused_k=seq, causal=True, max_seqlen_q=1, max_k_tiles=columns,
        output=score)
    if nvp is None:
        nvp = decode_valid_pages(seq, 1)
    return None, select(score, int(topk), nvp, int(init_blocks), int(local_blocks), None), None


# ---- patching SGLang -----------------------------------------------------------------------------

_REPLACEMENTS = {
    MSA_MODULE: ("msa_available", "msa_sparse_prefill_main", "build_msa_decode_meta",
                 "build_msa_decode_cg_plan", "update_msa_decode_cg_meta",
                 "msa_sparse_decode_main"),
}
_INDEXER = {
    PREFILL_INDEX_MODULE: ("flash_prefill_with_topk_index",),
    DECODE_INDEX_MODULE: ("flash_decode_with_topk_idx",),
}


def patch(indexer: bool = True, attention: bool = True) -> PatchHandle:
    """Swap flashmsa's functions into SGLang: with ``attention``, the six of its MSA hook module
    (``sglang.srt.layers.attention.minimax_sparse_ops.msa``: step 3, the attention; its
    ``msa_available()`` then turns SGLang's MSA path on, on any GPU from sm_80) and, with
    ``indexer``, its Triton indexer's prefill and decode entry points (steps 1-2; the calls
    flashmsa does not take still run SGLang's kernels), in their modules and in every already
    imported ``sglang`` module that bound them by name. ``attention=False`` leaves SGLang's MSA
    hook as it is (its Triton attention on Hopper and Ampere), e.g. with speculative decoding under
    CUDA graphs, which SGLang's MSA path refuses at start-up. Raises ImportError when one of those
    modules is not importable and AttributeError when one lacks a function (another SGLang
    version): nothing is replaced then. Returns a :class:`PatchHandle`; calling it twice is
    harmless. Call it before the model's attention backend is built (it asks ``msa_available()``
    then)."""
    if not (indexer or attention):
        raise ValueError("patch: nothing to swap in (indexer=False and attention=False)")
    targets = dict(_REPLACEMENTS if attention else {}, **(_INDEXER if indexer else {}))
    handle = swap_in(sys.modules[__name__], "sglang", targets)
    for module, name, original in handle.swaps:
        if module.__name__ in _INDEXER and name in _INDEXER[module.__name__]:
            _SGLANG_ORIGINALS[name] = original
    return handle


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (SGLang calls it early in every process): patches
    SGLang when ``FLASHMSA_SGLANG`` is ``1`` / ``true`` / ``on`` (the indexer and the attention),
    or ``indexer`` (the indexer only: ``patch(attention=False)``); does nothing otherwise."""
    if os.environ.get("FLASHMSA_SGLANG", "").strip().lower() == "indexer":
        patch(attention=False)
    elif env_flag("FLASHMSA_SGLANG"):
        patch()

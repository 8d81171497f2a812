"""vLLM's MiniMax-M3 sparse-attention ops, computed by flashmsa.

vLLM runs MiniMax-M3's MSA through Triton ops in ``vllm.models.minimax_m3.common.ops``:
``index_topk.minimax_m3_index_score`` / ``minimax_m3_index_topk`` / ``minimax_m3_index_decode`` /
``minimax_m3_index_decode_score`` (the lightning indexer) and ``sparse_attn.minimax_m3_sparse_attn``
/ ``minimax_m3_sparse_attn_decode`` (block-sparse GQA attention; on Hopper, vLLM >= 0.34 binds the
prefill attention from ``vllm.models.minimax_m3.nvidia.ops.sparse_prefill``). The functions below
have their names and vLLM 0.34.0's signatures, tensor layouts and results, and run flashmsa's
kernels (or its CPU reference on CPU tensors):

* one paged K|V cache ``kv_cache (num_blocks, num_kv_heads, 128, 2 * head_dim)``, K in the first
  half of the last dim: read in place as flashmsa's packed K|V views ``kv_cache[..., :128]`` /
  ``kv_cache[..., 128:]`` (docs/semantics.md#packed-kv);
* the index-K cache ``(num_blocks, 128, head_dim)``: read in place as a paged cache with one head;
* scores ``(num_idx_heads, total_q, round_up(max_block, 16))`` float32: flashmsa writes its
  ``(H, P, total_q)`` layout and returns the transposed view, which ``minimax_m3_index_topk`` reads
  back without a copy;
* block tables ``(num_reqs, max_blocks)`` int32 = flashmsa's page tables; ``seq_lens`` = its
  ``seqused_k``; ``prefix_lens`` (tokens before a chunk's first query) = its per-sequence
  ``q_offset``.

What is copied: nothing of the caches or the prefill scores. The top-k is written head-major
``(H, total_q, topk)``, or into ``out[:, :total_q]`` (in place when that is the transpose of a
contiguous token-major block, vLLM's shared top-k buffer); the attention output into the caller's
``output`` (in place where it can); ``topk_idx`` is read in place when it is contiguous or vLLM's
transposed buffer view, other strided ``topk_idx``, ``q`` or ``idx_q`` are made contiguous; decode
scores asked for in ``score_out`` are copied there.

Results are vLLM's with these differences, none of which a MiniMax-M3 forward pass meets:
selected block ids come in ascending order (vLLM's come in score order; its attention reads them
as a set, as flashmsa's does); exact score ties go to the lower block; NaN scores rank first
(vLLM ranks them last); score columns that vLLM leaves unwritten (blocks no query of a 64-token
tile sees) hold ``-inf``; padded query rows give ``-1`` selections and zero outputs.
fp8 K/V: scalar ``k_scale`` / ``v_scale`` are applied, folded exactly into the softmax scale and
``v_global_scale`` (their values read on the host once per scale tensor and version); per-token
scales raise :class:`flashmsa.NotSupportedError`.

Turning it on in vLLM: ``FLASHMSA_VLLM=1`` in the environment of a vLLM with flashmsa installed
(flashmsa registers a ``vllm.general_plugins`` entry point, which vLLM loads in every process and
which calls :func:`patch` when the variable is set), or call :func:`patch` yourself before the
model is built. See docs/vllm.md.
"""

from __future__ import annotations

import math
import sys
import weakref
from typing import Callable, Dict, Optional, Tuple

import torch

from .. import msa_ops
from ._common import SPARSE_BLOCK_SIZE, PatchHandle, env_flag, int32 as _int32, log, swap_in
from ._common import contiguous as _contiguous, q2k as _q2k, workspace as _workspace
from ._common import decode_cu_seqlens as _decode_cu_seqlens, select as _select
from ._common import decode_valid_pages as _decode_valid_pages
from ._common import prefill_valid_pages as _prefill_valid_pages
from ..errors import NotSupportedError

__all__ = [
    "PatchHandle",
    "minimax_m3_index_decode",
    "minimax_m3_index_decode_score",
    "minimax_m3_index_score",
    "minimax_m3_index_topk",
    "minimax_m3_sparse_attn",
    "minimax_m3_sparse_attn_decode",
    "patch",
    "register",
]


INDEX_TOPK_MODULE = "vllm.models.minimax_m3.common.ops.index_topk"
SPARSE_ATTN_MODULE = "vllm.models.minimax_m3.common.ops.sparse_attn"
# vLLM >= 0.34 on Hopper binds the prefill attention from here instead of SPARSE_ATTN_MODULE.
HOPPER_PREFILL_MODULE = "vllm.models.minimax_m3.nvidia.ops.sparse_prefill"
_FP8 = (torch.float8_e4m3fn,)


# ---- calls flashmsa does not take: vLLM's own kernels ------------------------------------------
# vLLM serves configurations flashmsa's ops refuse: an fp8 e5m2 K|V cache (flashmsa reads e4m3),
# and caches with gaps between their pages (vLLM's block-outermost layouts and padded pages,
# e.g. VLLM_KV_CACHE_LAYOUT=BLHNC: one block holds every layer's, so a layer's cache is a view
# with a page stride larger than its page). Such a call runs the vLLM function patch() replaced,
# so turning flashmsa on never stops a configuration vLLM runs; the first call of each kind is
# logged at WARNING.

_VLLM_ORIGINALS: Dict[Tuple[str, str], Callable] = {}  # (defining module, name): kept by patch()
_FALLBACKS_LOGGED: set = set()


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one block of memory in some dim order (no gaps, no overlap)."""
    expected = 1
    for stride, size in sorted((t.stride(d), t.shape[d]) for d in range(t.dim()) if t.shape[d] != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _kv_cache_unsupported(kv_cache: torch.Tensor) -> Optional[str]:
    """Why flashmsa does not read this K|V cache, or None."""
    if kv_cache.dtype not in (torch.bfloat16, torch.float16) + _FP8:
        return f"a {kv_cache.dtype} K|V cache (flashmsa reads bf16, fp16 and fp8 e4m3)"
    if kv_cache.dim() == 4 and not (kv_cache.stride(-1) == 1 and _dense(kv_cache)):
        return ("a K|V cache view with gaps between its pages or a strided content dim (flashmsa "
                "reads a compact cache)")
    return None


def _index_cache_unsupported(cache: torch.Tensor) -> Optional[str]:
    """Why flashmsa does not read this index-K cache, or None (a wrong shape is _index_cache's)."""
    if cache.dim() == 3 and not cache.is_contiguous():
        return "a strided index-K cache view (flashmsa reads a contiguous one in place)"
    return None


def _on_hopper(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] == 9


def _vllm(name: str, why: str, t: torch.Tensor) -> Callable:
    """vLLM's own function ``name`` for a call flashmsa does not take (``t``: a tensor of the
    call, whose GPU picks the prefill attention vLLM binds: Hopper's module on sm_90)."""
    module = SPARSE_ATTN_MODULE if name.startswith("minimax_m3_sparse") else INDEX_TOPK_MODULE
    if (name == "minimax_m3_sparse_attn" and (HOPPER_PREFILL_MODULE, name) in _VLLM_ORIGINALS
            and _on_hopper(t)):
        module = HOPPER_PREFILL_MODULE
    original = _VLLM_ORIGINALS.get((module, name))
    patched = getattr(sys.modules.get(module), name, None) is globals()[name]  # not undone
    if original is None or not patched:
        raise NotSupportedError(f"{name}: {why} (flashmsa does not take it, and vLLM's own kernel "
                                "is not at hand: call this through patch())")
    if (name, why) not in _FALLBACKS_LOGGED:
        _FALLBACKS_LOGGED.add((name, why))
        log.warning("flashmsa: %s: %s; vLLM's own kernel runs such calls", name, why)
    return original


# ---- helpers -------------------------------------------------------------------------------------

def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _index_cache(name: str, cache: torch.Tensor) -> torch.Tensor:
    """vLLM's index-K cache (num_blocks, 128, D) as a one-head paged cache (num_blocks, 1, 128, D),
    a view (a strided one never gets here: _index_cache_unsupported sends it to vLLM's kernel)."""
    if cache.dim() != 3 or cache.shape[1] != SPARSE_BLOCK_SIZE:
        raise ValueError(f"{name} must be (num_blocks, {SPARSE_BLOCK_SIZE}, head_dim), got "
                         f"{tuple(cache.shape)}")
    return cache.unsqueeze(1)


def _kv_halves(kv_cache: torch.Tensor, num_kv_heads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """K and V views of the packed cache (num_blocks, Hkv, 128, 2 * D)."""
    if kv_cache.dim() != 4 or kv_cache.shape[2] != SPARSE_BLOCK_SIZE or kv_cache.shape[3] % 2:
        raise ValueError(f"kv_cache must be (num_blocks, num_kv_heads, {SPARSE_BLOCK_SIZE}, "
                         f"2 * head_dim), got {tuple(kv_cache.shape)}")
    if kv_cache.shape[1] != num_kv_heads:
        raise ValueError(f"kv_cache has {kv_cache.shape[1]} KV heads, num_kv_heads is "
                         f"{num_kv_heads}")
    d = kv_cache.shape[3] // 2
    return kv_cache[..., :d], kv_cache[..., d:]


_SCALES: Dict[int, Tuple[object, int, float]] = {}


def _host_scale(scale: torch.Tensor) -> Optional[float]:
    """A scalar scale tensor's value on the host, read once per tensor and version (a device
    tensor's first read is one synchronisation; vLLM's layer scales are set at loading and kept),
    or None for a device tensor not read yet while a CUDA graph is being captured."""
    if scale.device.type == "cpu":
        return float(scale)
    entry = _SCALES.get(id(scale))
    if entry is not None and entry[0]() is scale and entry[1] == scale._version:
        return entry[2]
    if torch.cuda.is_current_stream_capturing():
        return None
    value = float(scale.item())
    if len(_SCALES) >= 4096:
        _SCALES.clear()
    _SCALES[id(scale)] = (weakref.ref(scale), scale._version, value)
    return value


def _kv_scales(kv_cache, q, sm_scale, k_scale, v_scale):
    """vLLM's fp8 KV scales -> (q to use, softmax scale, host V multiplier, device V multiplier).
    Scales apply to fp8 caches only, as in vLLM. A scale's value is folded exactly into the softmax
    scale (K's) and flashmsa's v_global_scale (V's), read on the host once per scale tensor; only a
    device scale first seen inside a CUDA graph capture multiplies q (K's) and the output (V's)
    instead, reading nothing back to the host."""
    if kv_cache.dtype not in _FP8 or (k_scale is None and v_scale is None):
        return q, sm_scale, None, None
    if k_scale is None or v_scale is None:
        raise ValueError("k_scale and v_scale must be both provided or both None")
    if k_scale.numel() != 1 or v_scale.numel() != 1:
        raise NotSupportedError(
            "k_scale: flashmsa applies scalar fp8 KV scales only, not per-token/head scales "
            f"(got k_scale {tuple(k_scale.shape)}, v_scale {tuple(v_scale.shape)})")
    k_value = _host_scale(k_scale)
    if k_value is not None:
        sm_scale = sm_scale * k_value
    else:
        q = (q.float() * k_scale.float()).to(q.dtype)
    v_host = _host_scale(v_scale)
    return q, sm_scale, v_host, v_scale if v_host is None else None


def _direct_out(output: torch.Tensor, q: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``output`` where the op can write it in place (``out=``: contiguous, q's shape, the op's
    output dtype, apart from q); else None, and the op's result is copied into it."""
    if not (output.is_contiguous() and output.shape == q.shape and output.dtype == dtype
            and output.device == q.device):
        return None
    lo, hi = output.data_ptr(), output.data_ptr() + output.numel() * output.element_size()
    q_lo = q.data_ptr()
    q_hi = q_lo + q.numel() * q.element_size()
    return output if hi <= q_lo or q_hi <= lo else None


def _write_output(output: torch.Tensor, out: torch.Tensor, v_dev: Optional[torch.Tensor]):
    if output.shape != out.shape:
        raise ValueError(f"output must be {tuple(out.shape)}, got {tuple(output.shape)}")
    if v_dev is not None:
        torch.mul(out, v_dev.to(out.dtype), out=out)
    if out is not output:
        output.copy_(out)


# ---- the indexer ---------------------------------------------------------------------------------

@torch.no_grad()
def minimax_m3_index_score(
    idx_q: torch.Tensor,  # [total_q, num_idx_heads, head_dim]
    index_kv_cache: torch.Tensor,  # [num_blocks, 128, head_dim]
    block_table: torch.Tensor,  # [batch, max_blocks]
    cu_seqlens_q: torch.Tensor,  # [batch+1] int32
    seq_lens: torch.Tensor,  # [batch] int32
    prefix_lens: torch.Tensor,  # [batch] int32
    max_query_len: int,
    max_seq_len: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """Per-token block scores: ``score[h, r, t]`` = max over the keys of block ``t`` that query
    ``r`` sees (position ``prefix_len + i``, causal) of the unscaled ``idx_q . index_k``; ``-inf``
    for blocks it does not see. Returns ``(num_idx_heads, total_q, round_up(max_block, 16))``
    float32 (a transposed view of flashmsa's ``(H, P, total_q)`` output)."""
    why = _index_cache_unsupported(index_kv_cache)
    if why is not None:
        return _vllm("minimax_m3_index_score", why, idx_q)(
            idx_q, index_kv_cache, block_table, cu_seqlens_q, seq_lens, prefix_lens,
            max_query_len, max_seq_len, num_kv_heads)
    total_q, num_idx_heads, _ = idx_q.shape
    if num_idx_heads != num_kv_heads:
        raise ValueError(f"idx_q has {num_idx_heads} index heads; MiniMax-M3 expects "
                         f"num_idx_heads == num_kv_heads ({num_kv_heads})")
    max_block = max(math.ceil(max_seq_len / SPARSE_BLOCK_SIZE), 1)
    columns = _round_up(max_block, 16)
    score = torch.empty((num_idx_heads, columns, total_q), dtype=torch.float32,
                        device=idx_q.device)
    msa_ops.msa_proxy_score(
        _contiguous(idx_q), _index_cache("index_kv_cache", index_kv_cache),
        _int32("cu_seqlens_q", cu_seqlens_q), page_table=_int32("block_table", block_table),
        seqused_k=_int32("seq_lens", seq_lens), causal=True,
        max_seqlen_q=int(max_query_len), max_k_tiles=columns, output=score,
        q_offset=_int32("prefix_lens", prefix_lens))
    return score.transpose(1, 2)


@torch.no_grad()
def minimax_m3_index_topk(
    score: torch.Tensor,  # [num_idx_heads, total_q, max_block]
    cu_seqlens_q: torch.Tensor,  # [batch+1] int32
    prefix_lens: torch.Tensor,  # [batch] int32
    max_query_len: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Top-k blocks per (index head, query token) from ``score``: the first ``init_blocks`` and the
    last ``local_blocks`` visible blocks always, then the best scores, ``min(topk, visible)`` ids
    (ascending) and ``-1`` padding. Returns ``(num_idx_heads, total_q, topk)`` int32; with ``out``
    (``(num_idx_heads, >= total_q, topk)`` int32, e.g. the transposed view of vLLM's token-major
    top-k buffer) it writes ``out[:, :total_q]`` and returns that view."""
    if score.dim() != 3:
        raise ValueError(f"score must be (num_idx_heads, total_q, max_block), got "
                         f"{tuple(score.shape)}")
    total_q = score.shape[1]
    # (H, P, total_q) for flashmsa: free when the score came from minimax_m3_index_score above.
    scores_hpt = _contiguous(score.transpose(1, 2))
    cu = _int32("cu_seqlens_q", cu_seqlens_q)
    nvp = _prefill_valid_pages(cu, _int32("prefix_lens", prefix_lens), total_q)
    return _select(scores_hpt, int(topk), nvp, int(init_blocks), int(local_blocks), out)


_FORWARD_NVP: list = [None]  # (vLLM's forward context, seq_lens, decode_query_len, block counts)


def _vllm_forward_context():
    """vLLM's current ForwardContext (a new object per forward: ``set_forward_context``), or None
    outside a forward or without vLLM."""
    module = sys.modules.get("vllm.forward_context")
    if module is None:
        return None
    try:
        return module.get_forward_context()
    except (AssertionError, AttributeError):  # no forward context set
        return None


def _forward_valid_pages(given: torch.Tensor, seq_lens: torch.Tensor,
                         decode_query_len: int) -> torch.Tensor:
    """The rows' visible block counts, made once per vLLM forward: every decode layer's indexer
    gets the same ``seq_lens`` tensor (the forward's indexer metadata), so the layers after the
    first reuse the first one's counts (two small kernels a layer fewer; vLLM runs the indexer
    eagerly, where each costs ~10 us of host time). Keyed on the forward context and ``given``
    by identity, both held, so a later forward (a new context) always recomputes them; inside a
    CUDA graph the first layer's kernels are captured and the others read their output."""
    context = _vllm_forward_context()
    hit = _FORWARD_NVP[0]
    if (context is not None and hit is not None and hit[0] is context and hit[1] is given
            and hit[2] == decode_query_len):
        return hit[3]
    nvp = _decode_valid_pages(seq_lens, decode_query_len)
    _FORWARD_NVP[0] = None if context is None else (context, given, decode_query_len, nvp)
    return nvp


def _decode_scores(idx_q, index_kv_cache, block_table, seq_lens, max_seq_len, num_kv_heads,
                   decode_query_len, max_decode_query_len):
    """flashmsa's decode block scores (H, columns, total_q), -inf where a row sees no key, and the
    rows' visible block counts."""
    total_q, num_idx_heads, _ = idx_q.shape
    if num_idx_heads != num_kv_heads:
        raise ValueError(f"idx_q has {num_idx_heads} index heads; MiniMax-M3 expects "
                         f"num_idx_heads == num_kv_heads ({num_kv_heads})")
    if not 1 <= decode_query_len <= max_decode_query_len:
        raise ValueError(f"decode_query_len must be in [1, max_decode_query_len = "
                         f"{max_decode_query_len}], got {decode_query_len}")
    given, seq_lens = seq_lens, _int32("seq_lens", seq_lens)
    if total_q != seq_lens.shape[0] * decode_query_len:
        raise ValueError(f"idx_q has {total_q} rows; seq_lens ({seq_lens.shape[0]} requests) x "
                         f"decode_query_len ({decode_query_len}) = "
                         f"{seq_lens.shape[0] * decode_query_len}")
    columns = max(math.ceil(max_seq_len / SPARSE_BLOCK_SIZE), 1)
    cu_q = _decode_cu_seqlens(total_q, decode_query_len, idx_q.device)
    score = torch.empty((num_idx_heads, columns, total_q), dtype=torch.float32,
                        device=idx_q.device)
    # Right-aligned causal positions (flashmsa's default q_offset = seq_len - decode_query_len).
    msa_ops.msa_proxy_score(
        _contiguous(idx_q), _index_cache("index_kv_cache", index_kv_cache), cu_q,
        page_table=_int32("block_table", block_table), seqused_k=seq_lens, causal=True,
        max_seqlen_q=int(decode_query_len), max_k_tiles=columns, output=score)
    return score, _forward_valid_pages(given, seq_lens, int(decode_query_len))


def _force_scores(score_hpt: torch.Tensor, nvp: torch.Tensor, init_blocks: int,
                  local_blocks: int) -> torch.Tensor:
    """vLLM's decode score convention, in place on (H, P, total_q): of the blocks a row sees, the
    first ``init_blocks`` score 1e30 and the last ``local_blocks`` 1e29 (local wins)."""
    block = torch.arange(score_hpt.shape[1], device=score_hpt.device, dtype=torch.int32)[:, None]
    visible = block < nvp[None, :]
    score_hpt.masked_fill_(visible & (block < init_blocks), 1e30)
    score_hpt.masked_fill_(visible & (block >= nvp[None, :] - local_blocks), 1e29)
    return score_hpt


def _score_into(score_hpt: torch.Tensor, score_out: Optional[torch.Tensor]) -> torch.Tensor:
    """vLLM's (H, total_q, blocks) scores: the transposed view of ``score_hpt``, or ``score_out``
    (``(H, total_q, >= blocks)`` float32, any strides) with ``score_hpt`` copied into its first
    columns (the ones past them are not written)."""
    view = score_hpt.transpose(1, 2)
    if score_out is None:
        return view
    H, T, P = view.shape
    if (score_out.dim() != 3 or score_out.dtype != torch.float32 or score_out.shape[0] != H
            or score_out.shape[1] != T or score_out.shape[2] < P
            or score_out.device != view.device):
        raise ValueError(f"score_out must be float32 ({H}, {T}, >= {P}) on {view.device}, got "
                         f"{score_out.dtype} {tuple(score_out.shape)} on {score_out.device}")
    score_out[:, :, :P].copy_(view)
    return score_out


@torch.no_grad()
def minimax_m3_index_decode_score(
    idx_q: torch.Tensor,  # [total_q, num_idx_heads, head_dim]
    index_kv_cache: torch.Tensor,  # [num_blocks, 128, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks]
    seq_lens: torch.Tensor,  # [num_reqs] int32
    max_seq_len: int,
    init_blocks: int,
    local_blocks: int,
    num_kv_heads: int,
    decode_query_len: int,
    max_decode_query_len: int,
    score_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Decode block scores without the top-k: request ``b`` owns rows ``[b * decode_query_len,
    (b + 1) * decode_query_len)``, row ``i`` of it sits at ``seq_len - decode_query_len + i``.
    vLLM's convention: of the blocks a row sees, the first ``init_blocks`` score 1e30 and the last
    ``local_blocks`` 1e29; ``-inf`` where it sees no key. Returns ``(num_idx_heads, total_q,
    blocks)`` float32 (a transposed view), or ``score_out`` written (any strides)."""
    why = _index_cache_unsupported(index_kv_cache)
    if why is not None:
        return _vllm("minimax_m3_index_decode_score", why, idx_q)(
            idx_q, index_kv_cache, block_table, seq_lens, max_seq_len, init_blocks, local_blocks,
            num_kv_heads, decode_query_len, max_decode_query_len, score_out=score_out)
    score, nvp = _decode_scores(idx_q, index_kv_cache, block_table, seq_lens, max_seq_len,
                                num_kv_heads, decode_query_len, max_decode_query_len)
    return _score_into(_force_scores(score, nvp, int(init_blocks), int(local_blocks)), score_out)


@torch.no_grad()
def minimax_m3_index_decode(
    idx_q: torch.Tensor,  # [total_q, num_idx_heads, head_dim]
    index_kv_cache: torch.Tensor,  # [num_blocks, 128, head_dim]
    block_table: torch.Tensor,  # [num_reqs, max_blocks]
    seq_lens: torch.Tensor,  # [num_reqs] int32
    max_seq_len: int,
    topk: int,
    init_blocks: int,
    local_blocks: int,
    num_kv_heads: int,
    decode_query_len: int,
    max_decode_query_len: int,
    out: Optional[torch.Tensor] = None,
    score_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Decode block scores + top-k: request ``b`` owns rows ``[b * decode_query_len, (b + 1) *
    decode_query_len)``, row ``i`` of it sits at ``seq_len - decode_query_len + i``. Returns
    ``(num_idx_heads, total_q, topk)`` int32 (ascending ids, ``-1`` padding), or ``out[:, :total_q]``
    written when ``out`` is given; ``score_out`` receives the scores as
    :func:`minimax_m3_index_decode_score` gives them."""
    why = _index_cache_unsupported(index_kv_cache)
    if why is not None:
        return _vllm("minimax_m3_index_decode", why, idx_q)(
            idx_q, index_kv_cache, block_table, seq_lens, max_seq_len, topk, init_blocks,
            local_blocks, num_kv_heads, decode_query_len, max_decode_query_len, out=out,
            score_out=score_out)
    score, nvp = _decode_scores(idx_q, index_kv_cache, block_table, seq_lens, max_seq_len,
                                num_kv_heads, decode_query_len, max_decode_query_len)
    result = _select(score, int(topk), nvp, int(init_blocks), int(local_blocks), out)
    if score_out is not None:
        _score_into(_force_scores(score, nvp, int(init_blocks), int(local_blocks)), score_out)
    return result


# ---- attention -----------------------------------------------------------------------------------

@torch.no_grad()
def minimax_m3_sparse_attn(
    q: torch.Tensor,  # [total_q, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, 128, 2*head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, total_q, topk]
    block_table: torch.Tensor,  # [batch, max_blocks]
    cu_seqlens_q: torch.Tensor,  # [batch+1] int32
    seq_lens: torch.Tensor,  # [batch] int32
    prefix_lens: torch.Tensor,  # [batch] int32
    max_query_len: int,
    num_kv_heads: int,
    sm_scale: float,
    output: torch.Tensor,  # [total_q, num_heads, head_dim]
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """GQA block-sparse prefill attention over the selected blocks, into ``output``: query ``i`` of
    sequence ``b`` (position ``prefix_len + i``) attends the keys ``j <= position``, ``j <
    seq_len`` of the blocks its KV head's ``topk_idx`` row names."""
    why = _kv_cache_unsupported(kv_cache)
    if why is not None:
        return _vllm("minimax_m3_sparse_attn", why, q)(
            q, kv_cache, topk_idx, block_table, cu_seqlens_q, seq_lens, prefix_lens, max_query_len,
            num_kv_heads, sm_scale, output, k_scale=k_scale, v_scale=v_scale)
    k, v = _kv_halves(kv_cache, num_kv_heads)
    q_in, scale, v_host, v_dev = _kv_scales(kv_cache, q, float(sm_scale), k_scale, v_scale)
    q_in = _contiguous(q_in)
    out = msa_ops.msa_sparse_attention(
        q_in, k, v, _q2k("topk_idx", topk_idx),
        _int32("cu_seqlens_q", cu_seqlens_q), None, causal=True, softmax_scale=scale,
        page_table=_int32("block_table", block_table), seqused_k=_int32("seq_lens", seq_lens),
        v_global_scale=v_host, q_offset=_int32("prefix_lens", prefix_lens),
        workspace=_workspace(q_in.device), out=_direct_out(output, q_in, q_in.dtype))
    _write_output(output, out, v_dev)


@torch.no_grad()
def minimax_m3_sparse_attn_decode(
    q: torch.Tensor,  # [total_q, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [num_blocks, num_kv_heads, 128, 2*head_dim]
    topk_idx: torch.Tensor,  # [num_kv_heads, total_q, topk]
    block_table: torch.Tensor,  # [num_reqs, max_blocks]
    seq_lens: torch.Tensor,  # [num_reqs] int32
    num_kv_heads: int,
    sm_scale: float,
    output: torch.Tensor,  # [total_q, num_heads, head_dim]
    decode_query_len: int,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    query_start_loc: Optional[torch.Tensor] = None,
    token_to_req_indices: Optional[torch.Tensor] = None,
) -> None:
    """Decode attention over the selected blocks, into ``output``. Uniform batches:
    ``decode_query_len`` rows per request; ragged ones: ``query_start_loc`` (``num_reqs + 1``
    offsets; ``token_to_req_indices`` is implied by it and not read). Row ``i`` of a request of
    ``n`` rows sits at ``seq_len - n + i``."""
    why = _kv_cache_unsupported(kv_cache)
    if why is not None:
        ragged = {} if query_start_loc is None and token_to_req_indices is None else dict(
            query_start_loc=query_start_loc, token_to_req_indices=token_to_req_indices)
        return _vllm("minimax_m3_sparse_attn_decode", why, q)(  # (0.34's has no ragged arguments)
            q, kv_cache, topk_idx, block_table, seq_lens, num_kv_heads, sm_scale, output,
            decode_query_len, k_scale=k_scale, v_scale=v_scale, **ragged)
    k, v = _kv_halves(kv_cache, num_kv_heads)
    q_in, scale, v_host, v_dev = _kv_scales(kv_cache, q, float(sm_scale), k_scale, v_scale)
    q_in = _contiguous(q_in)
    idx = _q2k("topk_idx", topk_idx)
    page_table, seqused = _int32("block_table", block_table), _int32("seq_lens", seq_lens)
    if query_start_loc is not None:
        if query_start_loc.shape[0] != seqused.shape[0] + 1:
            raise ValueError(f"query_start_loc must have num_reqs + 1 = {seqused.shape[0] + 1} "
                             f"entries, got {query_start_loc.shape[0]}")
        out = msa_ops.msa_sparse_attention(
            q_in, k, v, idx, _int32("query_start_loc", query_start_loc), None, causal=True,
            softmax_scale=scale, page_table=page_table, seqused_k=seqused,
            v_global_scale=v_host, workspace=_workspace(q_in.device),
            out=_direct_out(output, q_in, q_in.dtype))
    else:
        if q.shape[0] != seqused.shape[0] * decode_query_len:
            raise ValueError(f"q has {q.shape[0]} rows; seq_lens ({seqused.shape[0]} requests) x "
                             f"decode_query_len ({decode_query_len}) = "
                             f"{seqused.shape[0] * decode_query_len}")
        out_dtype = torch.bfloat16 if q_in.dtype == torch.float8_e4m3fn else q_in.dtype
        out = msa_ops.msa_sparse_decode_attention(
            q_in, k, v, idx, page_table=page_table, seqused_k=seqused,
            seqlen_q=int(decode_query_len), causal=True, softmax_scale=scale,
            v_global_scale=v_host, workspace=_workspace(q_in.device),
            out=_direct_out(output, q_in, out_dtype))
    _write_output(output, out, v_dev)


# ---- patching vLLM -------------------------------------------------------------------------------

_REPLACEMENTS = {
    INDEX_TOPK_MODULE: ("minimax_m3_index_score", "minimax_m3_index_topk",
                        "minimax_m3_index_decode"),
    SPARSE_ATTN_MODULE: ("minimax_m3_sparse_attn", "minimax_m3_sparse_attn_decode"),
}
# Replaced where this vLLM has them (0.34: the decode scores without top-k, which its Blackwell
# indexer calls, and Hopper's own prefill attention module); absent ones are skipped.
_OPTIONAL = {
    INDEX_TOPK_MODULE: ("minimax_m3_index_decode_score",),
    HOPPER_PREFILL_MODULE: ("minimax_m3_sparse_attn",),
}


def patch() -> PatchHandle:
    """Swap flashmsa's implementations into vLLM's MiniMax-M3 ops modules.

    Imports ``vllm.models.minimax_m3.common.ops.index_topk`` and ``...sparse_attn`` and replaces
    the five ops there, and in every already imported ``vllm`` module that bound them by name
    (``from ... import minimax_m3_sparse_attn``). Raises ImportError when that vLLM module is not
    importable and AttributeError when it lacks one of the ops (another vLLM version): nothing is
    replaced then. Where this vLLM has them, ``minimax_m3_index_decode_score`` and the Hopper
    prefill module's ``minimax_m3_sparse_attn`` are replaced too (with their bindings). vLLM's own
    functions are kept for the calls flashmsa does not take (an fp8 e5m2 K|V cache, a cache view
    with gaps between its pages): those run them. Returns a :class:`PatchHandle`; calling it twice
    is harmless.
    """
    handle = swap_in(sys.modules[__name__], "vllm", _REPLACEMENTS, _OPTIONAL)
    for module, name, original in handle.swaps:  # vLLM's own, for the calls flashmsa does not take
        if module.__name__ in (INDEX_TOPK_MODULE, SPARSE_ATTN_MODULE, HOPPER_PREFILL_MODULE):
            _VLLM_ORIGINALS[(module.__name__, name)] = original
    return handle


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it in every process): patches vLLM
    when ``FLASHMSA_VLLM`` is ``1`` / ``true`` / ``on``, does nothing otherwise."""
    if env_flag("FLASHMSA_VLLM"):
        patch()

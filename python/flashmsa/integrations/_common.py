"""What the engine adapters share: argument coercions, the per-stream attention workspace, cached
constants, and the swap of an engine's functions for flashmsa's (:func:`swap_in`)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .. import msa_ops

log = logging.getLogger("flashmsa")


def check_int(name: str, t: torch.Tensor) -> torch.Tensor:
    """Checks an engine's index tensor is an int32 / int64 tensor; returns it (no conversion, so
    no kernel)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be int32 (or int64), got {t.dtype}")
    return t


def int32(name: str, t: torch.Tensor) -> torch.Tensor:
    """An engine's int32 / int64 index tensor as int32 (int64 is converted, on its device: a
    kernel)."""
    check_int(name, t)
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _unit_rows(t: torch.Tensor) -> bool:
    """Rows of t.shape[-1] consecutive elements: the layouts flashmsa reads q2k_indices in and
    writes top-k's output in (docs/semantics.md#q2k-layout)."""
    return t.dim() == 3 and (t.shape[2] <= 1 or t.stride(2) == 1)


def _disjoint_rows(t: torch.Tensor) -> bool:
    """_unit_rows, and no two rows share an element (by the test the top-k op applies)."""
    if not _unit_rows(t):
        return False
    span = t.shape[2]
    for d in sorted((0, 1), key=lambda d: t.stride(d) if t.shape[d] != 1 else 0):
        if t.shape[d] != 1:
            if t.stride(d) < span:
                return False
            span += (t.shape[d] - 1) * t.stride(d)
    return True


def q2k(name: str, topk_idx: torch.Tensor) -> torch.Tensor:
    """An engine's top-k for the attention ops: as it is when its rows are consecutive (flashmsa
    reads them at any strides, docs/semantics.md#q2k-layout), else a contiguous copy."""
    t = int32(name, topk_idx)
    return t if _unit_rows(t) else t.contiguous()


_WORKSPACES: Dict[Tuple[int, int], "msa_ops.MSASparseAttentionWorkspace"] = {}


def workspace(device: torch.device) -> Optional["msa_ops.MSASparseAttentionWorkspace"]:
    """The attention ops' scratch, one per (GPU, stream), reused by every call there: a call then
    allocates no workspace (an allocation is ~15 us of host time, and engines run these ops eagerly
    at every decode step of every layer). None on the CPU, and while a CUDA graph is being captured
    (the op then takes its scratch from the graph's pool, as without the workspace)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = msa_ops.MSASparseAttentionWorkspace(device)
    return ws


_CONSTANTS: Dict[tuple, torch.Tensor] = {}


def constant(key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A read-only tensor made once per key and kept for good (``make()`` fills it eagerly): a
    CUDA graph captured with it reads it by address, so it is never dropped. One made while a
    graph is being captured is not kept (its values would exist only when that graph replays),
    nor any beyond 4096 keys (then made per call)."""
    value = _CONSTANTS.get(key)
    if value is None:
        value = make()
        if len(_CONSTANTS) < 4096 and not (value.is_cuda and torch.cuda.is_current_stream_capturing()):
            _CONSTANTS[key] = value
    return value


# ---- the indexer's shared pieces ----------------------------------------------------------------

SPARSE_BLOCK_SIZE = 128  # one sparse block == one KV page, in the engines and in flashmsa


def prefill_valid_pages(cu_seqlens_q: torch.Tensor, prefix_lens: torch.Tensor,
                        total_q: int) -> torch.Tensor:
    """Per query row: blocks it may see, position // 128 + 1 with position = prefix_len + local
    index; 0 for rows past cu_seqlens_q[-1]. Computed on the device, no host read."""
    device = cu_seqlens_q.device
    rows = torch.arange(total_q, device=device, dtype=torch.int32)
    batch = cu_seqlens_q.shape[0] - 1
    seq = torch.searchsorted(cu_seqlens_q[1:].contiguous(), rows, right=True)
    valid = seq < batch
    seq = seq.clamp(max=max(batch - 1, 0))
    pos = rows.long() - cu_seqlens_q.long()[seq] + prefix_lens.long()[seq]
    nvp = torch.div(pos, SPARSE_BLOCK_SIZE, rounding_mode="floor") + 1
    return torch.where(valid & (pos >= 0), nvp, torch.zeros_like(nvp)).to(torch.int32)


def decode_valid_pages(seq_lens: torch.Tensor, decode_query_len: int) -> torch.Tensor:
    """Per decode row (request-major, decode_query_len per request): position // 128 + 1 with
    position = seq_len - decode_query_len + offset. Two element-wise kernels (it runs once per
    layer of every decode step): floor((seq_len - n + i + 128) / 128). Never negative for
    lengths >= 0 and n <= 128; msa_topk_select clamps the counts to [0, max_k_tiles] on the
    device anyway (docs/semantics.md#topk-select), so no clamp kernel."""
    batch = seq_lens.shape[0]
    offsets = constant(("decode_offsets", decode_query_len, seq_lens.device), lambda: torch.arange(
        SPARSE_BLOCK_SIZE - decode_query_len, SPARSE_BLOCK_SIZE, dtype=torch.int32,
        device=seq_lens.device))
    shifted = seq_lens.reshape(batch, 1) + offsets  # int32 (batch, decode_query_len)
    return torch.div(shifted, SPARSE_BLOCK_SIZE, rounding_mode="floor").view(-1)


def decode_cu_seqlens(total_q: int, decode_query_len: int, device) -> torch.Tensor:
    return constant(("decode_cu_q", total_q, decode_query_len, device), lambda: torch.arange(
        0, total_q + 1, decode_query_len, dtype=torch.int32, device=device))


def select(scores_hpt: torch.Tensor, topk: int, nvp: torch.Tensor, init_blocks: int,
            local_blocks: int, out: Optional[torch.Tensor]) -> torch.Tensor:
    """msa_topk_select into the engines' head-major (H, total_q, topk): a fresh contiguous tensor, or
    ``out[:, :total_q]`` (``out`` int32 ``(H, >= total_q, topk)``), written in place when its rows
    are consecutive and disjoint (vLLM's shared token-major buffer, a head-major buffer), else
    computed apart and copied in."""
    H, _, total_q = scores_hpt.shape
    if out is None:
        result = torch.empty((H, total_q, topk), dtype=torch.int32, device=scores_hpt.device)
    else:
        if (out.dim() != 3 or out.dtype != torch.int32 or out.shape[0] != H
                or out.shape[1] < total_q or out.shape[2] != topk
                or out.device != scores_hpt.device):
            raise ValueError(f"out must be int32 ({H}, >= {total_q}, {topk}) on "
                             f"{scores_hpt.device}, got {out.dtype} {tuple(out.shape)} on "
                             f"{out.device}")
        result = out[:, :total_q]
    token_major = result.transpose(0, 1)
    direct = _disjoint_rows(token_major)
    target = token_major if direct else torch.empty(
        (total_q, H, topk), dtype=torch.int32, device=scores_hpt.device)
    # Written directly in the layout asked for (no transposed copy) where flashmsa can.
    msa_ops.msa_topk_select(scores_hpt, topk, num_valid_pages=nvp, output=target,
                            force_begin_blocks=init_blocks, force_end_blocks=local_blocks)
    if not direct:
        token_major.copy_(target)
    return result


class PatchHandle:
    """What a ``patch()`` replaced; :meth:`undo` puts the originals back."""

    def __init__(self, swaps: List[Tuple[object, str, object]]):
        self.swaps = swaps

    @property
    def replaced(self) -> Dict[str, List[str]]:
        """module name -> names replaced in it."""
        out: Dict[str, List[str]] = {}
        for module, name, _ in self.swaps:
            out.setdefault(module.__name__, []).append(name)
        return out

    def undo(self) -> None:
        for module, name, original in reversed(self.swaps):
            setattr(module, name, original)
        self.swaps = []


def swap_in(ours: object, engine: str, required: Mapping[str, Sequence[str]],
            optional: Mapping[str, Sequence[str]] = {}) -> PatchHandle:
    """Replaces functions of an engine's modules with the same-named ones of the module ``ours``.

    ``required`` (module name -> function names) must all import and exist, else ImportError /
    AttributeError and nothing is replaced; ``optional`` ones are replaced where present. Every
    already imported module of the engine's package (``engine``, e.g. ``"vllm"``) that bound one of
    the originals by name (``from ... import f``) gets ours too. Idempotent."""
    caller = f"{ours.__name__}.patch"
    targets = []
    for module_name, names in required.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ImportError(f"{caller}: cannot import {module_name} (is a {engine} with "
                              f"MiniMax-M3 support installed?): {e}") from e
        for name in names:
            if not callable(getattr(module, name, None)):
                raise AttributeError(f"{caller}: {module_name} has no function {name}; this "
                                     f"{engine} version is not supported")
            targets.append((module, name, getattr(module, name)))
    for module_name, names in optional.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            log.debug("flashmsa: %s not in this %s; left as is", module_name, engine)
            continue
        targets += [(module, n, getattr(module, n)) for n in names
                    if callable(getattr(module, n, None))]
    swaps: List[Tuple[object, str, object]] = []
    originals = {}
    for module, name, original in targets:
        replacement = getattr(ours, name)
        if original is not replacement:
            originals[id(original)] = replacement
            swaps.append((module, name, original))
            setattr(module, name, replacement)
    # Modules that imported a function by name hold the original: rebind those too.
    names = {n for table in (required, optional) for ns in table.values() for n in ns}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == engine or mod_name.startswith(engine + ".")):
            continue
        for name in names:
            value = getattr(mod, name, None)
            if value is not None and id(value) in originals:
                swaps.append((mod, name, value))
                setattr(mod, name, originals[id(value)])
    handle = PatchHandle(swaps)
    log.info("flashmsa: %s MiniMax-M3 functions replaced: %s", engine, handle.replaced)
    return handle


def env_flag(name: str) -> bool:
    """An on/off environment variable: ``1`` / ``true`` / ``yes`` / ``on`` is on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")

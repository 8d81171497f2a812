"""MiniMax Sparse Attention (MSA) ops: a drop-in for ``flashinfer.msa_ops``.

``import flashmsa.msa_ops as msa_ops`` gives the four functions with FlashInfer's signatures,
defaults, return conventions and errors (docs/semantics.md#d1, #d4, #d9). CPU tensors run the C++
reference, CUDA tensors the kernels (every NVIDIA GPU from SM80 up).

The wrappers only check Python types (``TypeError``) and what the core cannot see (device types,
ints beyond int64), resolve defaults, do the host-side derivations FlashInfer does, allocate
outputs and call ``torch.ops.flashmsa.*``; every check of shapes, dtypes, sizes and devices is the
core's (``make_*_params``), raised as ``ValueError`` naming the argument, or
:class:`~flashmsa.errors.NotSupportedError` (a ``ValueError`` and a ``NotImplementedError``) for
what flashmsa does not support. Outputs are sized from the input tensors only (a derived
``max_k_tiles`` from lengths clamped as the ops clamp them), so no argument can make the wrapper
allocate more than the inputs describe before the core has checked it. Pipeline::

    scores = msa_proxy_score(index_q, index_k, cu_q, cu_k)              # (H, P, total_q) fp32
    sel    = msa_topk_select(scores, 16, nvp, force_end_blocks=1)       # (total_q, H, 16) int32
    q2k    = sel.transpose(0, 1)                                        # (Hkv, total_q, 16), a view
    # (FlashInfer needs the copy .contiguous(); flashmsa reads the view in place)
    out    = msa_sparse_attention(q, k, v, q2k, cu_q, cu_k, causal=True)
"""

import inspect
import numbers
import re
from collections.abc import Mapping
from typing import Optional, Tuple, Union

import torch

from . import _log, _outputs
from ._library import ops as _ops
from .errors import NotSupportedError

__all__ = [
    "MSASparseAttentionWorkspace",
    "NotSupportedError",
    "SUPPORTS_PACKED_KV",
    "msa_proxy_score",
    "msa_proxy_score_fp4",
    "msa_sparse_attention",
    "msa_sparse_decode_attention",
    "msa_topk_select",
    "supports_packed_kv",
]

_BLK_KV = 128  # tokens per KV block == tokens per page
_MAX_TOPK = 64  # docs/semantics.md#d4
_MAX_K_TILES = 1 << 24  # key positions are int32: at most 2^31 / 128 blocks per sequence
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# Capability flag kept for callers written against FlashInfer: both the CPU reference and the CUDA
# kernels read K/V views split from a cache that packs K|V in one 2*head_dim content dim per token.
SUPPORTS_PACKED_KV = True


def supports_packed_kv(device: Union[torch.device, str]) -> bool:
    """Whether the attention ops accept packed paged K|V views on ``device``
    (docs/semantics.md#packed-kv).

    True for CPU (the reference) and CUDA devices (the kernels read the views in place); False for
    other device types, where flashmsa has no ops at all.
    """
    return torch.device(device).type in ("cpu", "cuda")


class MSASparseAttentionWorkspace:
    """Caller-owned device scratch for the sparse attention ops (CUDA graphs,
    docs/semantics.md#d10).

    Pass it as ``workspace=`` to :func:`msa_sparse_attention` /
    :func:`msa_sparse_decode_attention`. A call grows it to the bytes that call needs when it is
    eager; during CUDA-graph capture nothing may be allocated, so a workspace that is too small
    raises ``ValueError`` there. Warm it with one eager call of the exact shapes before capture (or
    construct it with ``nbytes`` large enough); the captured graph then reads and writes only this
    buffer, which must outlive the graph.

    Without a workspace the ops take their scratch from PyTorch's caching allocator (which graph
    capture also handles, from the graph's private pool).
    """

    def __init__(self, device: Union[torch.device, str], nbytes: int = 0):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if not isinstance(nbytes, numbers.Integral) or not 0 <= nbytes <= _INT64_MAX:
            raise ValueError(f"nbytes must be a non-negative int64, got {nbytes!r}")
        self.device = device
        self._buffer = torch.empty(int(nbytes), dtype=torch.uint8, device=device)

    @property
    def nbytes(self) -> int:
        return self._buffer.numel()

    @property
    def buffer(self) -> torch.Tensor:
        """The current ``(nbytes,)`` uint8 scratch tensor (replaced when the workspace grows)."""
        return self._buffer

    def reserve(self, nbytes: int) -> torch.Tensor:
        """Grows the buffer to at least ``nbytes`` (outside CUDA-graph capture) and returns it."""
        if nbytes <= self._buffer.numel():
            return self._buffer
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                f"workspace holds {self.nbytes} bytes but this call needs {nbytes} bytes, and it "
                "cannot grow during CUDA graph capture; warm it with an eager call of the same "
                "shapes before capture, or construct MSASparseAttentionWorkspace(device, "
                f"nbytes={nbytes})")
        # Grow geometrically so that a sequence of slightly larger calls reallocates rarely.
        size = max(int(nbytes), 2 * self._buffer.numel())
        self._buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        return self._buffer

    def __repr__(self) -> str:
        return f"MSASparseAttentionWorkspace(device={self.device}, nbytes={self.nbytes})"


# ---- argument helpers --------------------------------------------------------------------------

def _int64(op: str, name: str, value) -> int:
    """A Python int the schema passes as int64: larger ones are a ValueError naming the argument
    (torch would raise a RuntimeError about the schema instead)."""
    value = int(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{op}: {name} ({value}) does not fit in int64")
    return value


def _int_arg(op: str, name: str, value, *, optional: bool = False) -> Optional[int]:
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:  # the common case, first: the
        return value  # abstract-class test below costs more than the rest of the check
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    return _int64(op, name, value)


def _float_arg(name: str, value, *, optional: bool = True) -> Optional[float]:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        expected = "a float or None" if optional else "a float"
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    return float(value)


def _tensor_or_none(name: str, value) -> Optional[torch.Tensor]:
    if value is not None and not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")
    return value


def _tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _index_tensor(name: str, value) -> Optional[torch.Tensor]:
    """Small index tensors (cu_seqlens, seqused_k, page_table) are read in place when contiguous
    and copied otherwise, as FlashInfer does; their dtype and shape are the core's to check."""
    value = _tensor_or_none(name, value)
    return value.contiguous() if value is not None else None


def _page_table_tensor(value) -> Optional[torch.Tensor]:
    """page_table is read in place when its rows are contiguous (a column range of a wider table,
    e.g. an engine's per-forward table, is taken as it is: the core reads rows by their stride),
    and copied otherwise."""
    value = _tensor_or_none("page_table", value)
    if value is None or value.is_contiguous() or (
            value.dim() == 2 and (value.shape[1] <= 1 or value.stride(1) == 1)):
        return value
    return value.contiguous()


def _int_or_tensor(op: str, name: str, value, tensor: str) -> Tuple[Optional[int], Optional[torch.Tensor]]:
    """An argument that is None, a Python int or an int32 tensor, as the ops' (value, tensor) pair."""
    if value is None or isinstance(value, torch.Tensor):
        return None, value
    if type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
        return _int64(op, name, value), None
    raise TypeError(f"{name} must be None, an int or an int32 tensor{tensor}, got "
                    f"{type(value).__name__}")


def _q_offset_args(op: str, q_offset) -> Tuple[Optional[int], Optional[torch.Tensor]]:
    """q_offset is None, a Python int (one offset for every sequence) or an int32 (B,) tensor."""
    return _int_or_tensor(op, "q_offset", q_offset, " of shape (batch,)")


def _workspace_arg(workspace) -> Optional[MSASparseAttentionWorkspace]:
    if workspace is not None and not isinstance(workspace, MSASparseAttentionWorkspace):
        raise TypeError(
            f"workspace must be an MSASparseAttentionWorkspace or None, got "
            f"{type(workspace).__name__}")
    return workspace


def _check_devices(op: str, **tensors) -> None:
    """Every tensor argument on a CPU or CUDA device. The core checks that they share one device,
    but a tensor on another device type (``meta``) never reaches it: the dispatcher would route the
    whole call to the op's fake implementation, which writes nothing."""
    for name, t in tensors.items():  # is_cuda / is_cpu: no torch.device made per tensor
        if t is not None and not (t.is_cuda or t.is_cpu):
            raise ValueError(f"{op}: {name} must be a CPU or CUDA tensor, got device {t.device}")


def _call(fn, *args):
    """Runs a native op; its "not supported in flashmsa" errors (NotImplementedError from the
    core) become :class:`NotSupportedError`, which is also a ValueError as FlashInfer raises."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        if isinstance(e, NotSupportedError):
            raise
        raise NotSupportedError(str(e)) from None


# The core's error for a caller-owned workspace smaller than the call's plan (bindings/torch/ops.cpp,
# provide_workspace): raised before anything is launched.
_WORKSPACE_SHORT = re.compile(r": workspace holds (\d+) bytes but this call needs (\d+) bytes")


def _run_with_workspace(op, args, workspace, plan) -> Optional[torch.Tensor]:
    """Runs an attention op (args without its trailing workspace and plan) with the caller's
    workspace, grown to what the call needs, and returns the scratch tensor it ran with.

    The op plans once: it runs with the workspace as it is, and only where the core finds it too
    small (it then launches nothing) is the workspace grown to the bytes the error names and the
    op run again. So a warm workspace costs no second planning pass (the op's workspace query),
    and a growth during CUDA-graph capture raises reserve()'s error as before. Under torch.compile
    the workspace is passed as it is (nothing is read back while tracing)."""
    if workspace is None:
        _call(op, *args, None, plan)
        return None
    scratch = workspace.buffer
    if torch.compiler.is_compiling():
        _call(op, *args, scratch, plan)
        return scratch
    try:
        _call(op, *args, scratch, plan)
        return scratch
    except ValueError as e:
        short = _WORKSPACE_SHORT.search(str(e))
        if short is None or int(short.group(1)) != scratch.numel():
            raise
        need = int(short.group(2))
    scratch = workspace.reserve(need)
    _call(op, *args, scratch, plan)
    return scratch


def _host_seqlens(t: Optional[torch.Tensor], name: str, prefix_sums: bool,
                  total: int = -1) -> Optional[torch.Tensor]:
    """The values of cu_seqlens (``prefix_sums``) or seqused_k read on the host as int64 (a
    device->host copy for CUDA tensors), or None when ``t`` cannot hold them (the core then reports
    what is wrong with it). A CUDA tensor's copy goes through the core's content checks, which
    make_* runs itself only on host tensors."""
    if t is None or t.dim() != 1 or t.dtype != torch.int32 or (prefix_sums and t.numel() < 2):
        return None
    host = t.cpu()
    if t.is_cuda:
        if prefix_sums:
            _ops.check_cu_seqlens(host, total, name)
        else:
            _ops.check_seqused_k(host, name)
    return host.long()


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _shape3(t: torch.Tensor) -> Tuple[int, int, int]:
    """(d0, d1, d2) of a 3-D tensor; zeros otherwise (the core rejects the tensor first)."""
    return tuple(t.shape) if t.dim() == 3 else (0, 0, 0)


# ---- stage 1 -----------------------------------------------------------------------------------

def msa_proxy_score(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    *,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    causal: bool = True,
    max_seqlen_q: Optional[int] = None,
    max_k_tiles: Optional[int] = None,
    output: Optional[torch.Tensor] = None,
    reduce_heads: bool = False,
    q_offset=None,
    use_fp32_acc: bool = True,
) -> torch.Tensor:
    """MSA stage 1: per-KV-block maximum of the unscaled, masked ``Q K^T`` logits.

    ``out[h, t, r] = max_{j in block t, visible} dot(q[r, h], k[j, h // G])`` and ``-inf`` where
    block ``t`` holds no visible key (beyond the sequence, above the causal limit, padding columns).

    Parameters
    ----------
    q : torch.Tensor
        ``(total_q, Hq, 128)`` bf16 / fp16, or fp8 e4m3 when ``k`` is fp8 (index queries).
    k : torch.Tensor
        Flat ``(total_k, Hkv, 128)`` with ``cu_seqlens_k``, or paged ``(num_pages, Hkv, 128, 128)``
        with ``page_table`` + ``seqused_k``; q's dtype or fp8 e4m3. ``Hq % Hkv == 0``.
    cu_seqlens_q : torch.Tensor
        ``(B + 1,)`` int32 query prefix sums.
    cu_seqlens_k : torch.Tensor, optional
        ``(B + 1,)`` int32 key prefix sums (flat layout; unused when paged).
    page_table : torch.Tensor, optional
        ``(B, max_pages)`` int32; block ``t`` of sequence ``b`` is page ``page_table[b, t]``.
    seqused_k : torch.Tensor, optional
        ``(B,)`` int32 key counts (paged layout).
    causal : bool
        Right-aligned causal masking, applied per key before the block max.
    max_seqlen_q : int, optional
        Longest query sequence; derived from ``cu_seqlens_q`` on the host when None.
    max_k_tiles : int, optional
        Block columns of the output; ``output.shape[1]`` when ``output`` is given, else
        ``max_b ceil(seqlen_k[b] / 128)`` read on the host. Both must be given (or ``output``)
        during CUDA-graph capture.
    output : torch.Tensor, optional
        Pre-allocated float32 ``(Hq, max_k_tiles, total_q)`` (``(1, ...)`` with ``reduce_heads``).
    reduce_heads : bool
        Max over the head axis: one ``(1, max_k_tiles, total_q)`` score shared by all heads.
    q_offset : int or torch.Tensor, optional
        Position of each sequence's first query (int, or int32 ``(B,)``); default right-aligned
        ``seqlen_k - seqlen_q``.
    use_fp32_acc : bool
        FlashInfer's choice of accumulation precision (``False``: fp16 accumulation of fp8 products
        in its Hopper prefill kernel). flashmsa accumulates in float32 on every path, which
        satisfies either value; the result does not depend on it.

    Returns
    -------
    torch.Tensor
        float32 ``(Hq | 1, max_k_tiles, total_q)``, ready for :func:`msa_topk_select`.
    """
    # Each public wrapper passes its arguments by name, not as **locals(): torch.compile must trace
    # it, and the Dynamo of torch 2.11 cannot trace locals() ("Failed to trace builtin operator";
    # 2.15's can).
    return _proxy_score("", q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        page_table=page_table, seqused_k=seqused_k, causal=causal,
                        max_seqlen_q=max_seqlen_q, max_k_tiles=max_k_tiles, output=output,
                        reduce_heads=reduce_heads, q_offset=q_offset, use_fp32_acc=use_fp32_acc)


def _proxy_score(plan, q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal,
                 max_seqlen_q, max_k_tiles, output, reduce_heads, q_offset, use_fp32_acc=True):
    # use_fp32_acc: every flashmsa path accumulates in float32 (msa_proxy_score's docstring).
    del use_fp32_acc
    op = "msa_proxy_score"
    q = _tensor("q", q)
    k = _tensor("k", k)
    cu_seqlens_q = _index_tensor("cu_seqlens_q", cu_seqlens_q)
    cu_seqlens_k = _index_tensor("cu_seqlens_k", cu_seqlens_k)
    page_table = _page_table_tensor(page_table)
    seqused_k = _index_tensor("seqused_k", seqused_k)
    output = _tensor_or_none("output", output)
    q_offset_value, q_offset_tensor = _q_offset_args(op, q_offset)
    _check_devices(op, q=q, k=k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                   page_table=page_table, seqused_k=seqused_k, output=output,
                   q_offset=q_offset_tensor)
    max_seqlen_q, max_k_tiles, output = _proxy_dims(
        op, q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, max_seqlen_q, max_k_tiles,
        output, reduce_heads)
    args = (q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, bool(causal), max_seqlen_q,
            max_k_tiles, q_offset_value, q_offset_tensor, bool(reduce_heads), output, plan)
    _call(_ops.proxy_score, *args)
    _log.log_plan(op, _ops.proxy_score_describe, args)
    return output


def _proxy_dims(op, q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, max_seqlen_q,
                max_k_tiles, output, reduce_heads):
    """(max_seqlen_q, max_k_tiles, output) of a proxy call: given values, else derived on the host
    from cu_seqlens / seqused_k as FlashInfer does (key lengths clamped as the ops clamp them: to the
    flat rows or to the page table), the output allocated when not given: its size comes from the
    input tensors only (an out-of-range max_k_tiles allocates no column; the core rejects it)."""
    max_seqlen_q = _int_arg(op, "max_seqlen_q", max_seqlen_q, optional=True)
    max_k_tiles = _int_arg(op, "max_k_tiles", max_k_tiles, optional=True)
    if max_k_tiles is None and output is not None and output.dim() >= 2:
        max_k_tiles = int(output.shape[1])
    if max_seqlen_q is None or max_k_tiles is None:
        # Deriving them reads cu_seqlens / seqused_k on the host, which would synchronise (and
        # break) a CUDA-graph capture.
        if _capturing(q):
            raise ValueError(
                f"{op} needs max_seqlen_q and max_k_tiles during CUDA graph capture "
                "(deriving them from cu_seqlens would sync the stream); pass both (computed once "
                "at plan time) or pre-allocate `output`")
        total_q = q.shape[0] if q.dim() == 3 else -1
        if max_seqlen_q is None:
            cu = _host_seqlens(cu_seqlens_q, "cu_seqlens_q", True, total_q)
            if cu is not None:
                max_seqlen_q = max(int((cu[1:] - cu[:-1]).max()), 0)
        if max_k_tiles is None:
            if page_table is not None:
                lengths = _host_seqlens(seqused_k, "seqused_k", False)
                if lengths is not None and page_table.dim() == 2:
                    lengths = lengths.clamp(0, page_table.shape[1] * _BLK_KV)
            else:
                total_k = k.shape[0] if k.dim() == 3 else -1
                cu = _host_seqlens(cu_seqlens_k, "cu_seqlens_k", True, total_k)
                lengths = None
                if cu is not None:
                    lengths = cu[1:] - cu[:-1]
                    if total_k >= 0:
                        lengths = torch.minimum(lengths.clamp(min=0),
                                                total_k - cu[:-1].clamp(0, total_k))
            longest = int(lengths.max()) if lengths is not None and lengths.numel() else 0
            # At least one column: an all-empty batch gives one column of -inf rather than an
            # output with no columns (which the core refuses as max_k_tiles = 0).
            max_k_tiles = max(-(-longest // _BLK_KV), 1)

    if output is None:
        total_q, num_heads, _ = _shape3(q)
        columns = max_k_tiles if 1 <= max_k_tiles <= _MAX_K_TILES else 0
        output = _outputs.empty((1 if reduce_heads else num_heads, columns, total_q),
                                torch.float32, q.device)
    return max_seqlen_q, max_k_tiles, output


def msa_proxy_score_fp4(
    q_fp4: torch.Tensor,
    k_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    q_global_scale: float,
    k_global_scale: float,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    *,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    causal: bool = True,
    max_seqlen_q: Optional[int] = None,
    max_k_tiles: Optional[int] = None,
    output: Optional[torch.Tensor] = None,
    reduce_heads: bool = False,
    q_offset=None,
) -> torch.Tensor:
    """MSA stage 1 on an NVFP4 indexer: :func:`msa_proxy_score` of the dequantized q and k, every
    logit multiplied by ``q_global_scale * k_global_scale`` before the block max.

    ``out[h, t, r] = max_{j in block t, visible} q_gs * k_gs * dot(deq(q[r, h]), deq(k[j, h // G]))``
    with ``deq(x) = e2m1(x) * e4m3(block scale)`` (exact), ``-inf`` where block ``t`` has no visible
    key. CUDA tensors run the proxy kernel with both operands dequantized exactly into bf16 (so the
    result equals :func:`msa_proxy_score` on the dequantized tensors); CPU tensors the reference.

    Parameters
    ----------
    q_fp4 : torch.Tensor
        ``(total_q, Hq, 64)`` uint8, packed e2m1 (low nibble = even element).
    k_fp4 : torch.Tensor
        Flat ``(total_k, Hkv, 64)`` with ``cu_seqlens_k``, or paged ``(num_pages, Hkv, 128, 64)``
        with ``page_table`` + ``seqused_k``; uint8 packed e2m1. ``Hq % Hkv == 0``.
    q_scale, k_scale : torch.Tensor
        Flat uint8 e4m3 block scales (one per 16 values) in the 128x4 swizzled layout, row
        ``token * num_heads + head`` (paged k: ``(page * Hkv + kv_head) * 128 + token_in_page``),
        as ``flashinfer.nvfp4_quantize(..., sf_vec_size=16)`` writes them.
    q_global_scale, k_global_scale : float
        Dequantization multipliers (``1 / global_scale``).
    cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q, max_k_tiles, output, \
reduce_heads, q_offset
        As in :func:`msa_proxy_score`.

    Returns
    -------
    torch.Tensor
        float32 ``(Hq | 1, max_k_tiles, total_q)``, ready for :func:`msa_topk_select`.
    """
    return _proxy_score_fp4("", q_fp4=q_fp4, k_fp4=k_fp4, q_scale=q_scale, k_scale=k_scale,
                            q_global_scale=q_global_scale, k_global_scale=k_global_scale,
                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                            page_table=page_table, seqused_k=seqused_k, causal=causal,
                            max_seqlen_q=max_seqlen_q, max_k_tiles=max_k_tiles, output=output,
                            reduce_heads=reduce_heads, q_offset=q_offset)


def _proxy_score_fp4(plan, q_fp4, k_fp4, q_scale, k_scale, q_global_scale, k_global_scale,
                     cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, causal, max_seqlen_q,
                     max_k_tiles, output, reduce_heads, q_offset):
    op = "msa_proxy_score_fp4"
    q_fp4 = _tensor("q_fp4", q_fp4)
    k_fp4 = _tensor("k_fp4", k_fp4)
    q_scale = _tensor("q_scale", q_scale)
    k_scale = _tensor("k_scale", k_scale)
    q_global_scale = _float_arg("q_global_scale", q_global_scale, optional=False)
    k_global_scale = _float_arg("k_global_scale", k_global_scale, optional=False)
    cu_seqlens_q = _index_tensor("cu_seqlens_q", cu_seqlens_q)
    cu_seqlens_k = _index_tensor("cu_seqlens_k", cu_seqlens_k)
    page_table = _page_table_tensor(page_table)
    seqused_k = _index_tensor("seqused_k", seqused_k)
    output = _tensor_or_none("output", output)
    q_offset_value, q_offset_tensor = _q_offset_args(op, q_offset)
    _check_devices(op, q_fp4=q_fp4, k_fp4=k_fp4, q_scale=q_scale, k_scale=k_scale,
                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, page_table=page_table,
                   seqused_k=seqused_k, output=output, q_offset=q_offset_tensor)
    max_seqlen_q, max_k_tiles, output = _proxy_dims(
        op, q_fp4, k_fp4, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, max_seqlen_q,
        max_k_tiles, output, reduce_heads)
    args = (q_fp4, k_fp4, q_scale.reshape(-1), k_scale.reshape(-1), q_global_scale,
            k_global_scale, cu_seqlens_q, cu_seqlens_k, page_table, seqused_k, bool(causal),
            max_seqlen_q, max_k_tiles, q_offset_value, q_offset_tensor, bool(reduce_heads), output,
            plan)
    _call(_ops.proxy_score_fp4, *args)
    _log.log_plan(op, _ops.proxy_score_fp4_describe, args)
    return output


# ---- stage 2 -----------------------------------------------------------------------------------

def msa_topk_select(
    max_score: torch.Tensor,
    topk: int,
    num_valid_pages: Optional[Union[int, torch.Tensor]] = None,
    output: Optional[torch.Tensor] = None,
    force_begin_blocks: int = 0,
    force_end_blocks: int = 0,
) -> torch.Tensor:
    """MSA stage 2: the ``topk`` best KV blocks of every (query token, head) row.

    Candidates of row ``(s, h)`` are blocks ``[0, nvp)``; the first ``force_begin_blocks`` and last
    ``force_end_blocks`` of them are always selected (inside the ``topk`` slots, whatever their
    score), the rest by score (larger wins, +NaN first, ties to the lower block). A row holds
    ``min(topk, nvp)`` ascending indices followed by ``-1``.

    Parameters
    ----------
    max_score : torch.Tensor
        float32 contiguous ``(H, max_k_tiles, total_q)`` (the layout of :func:`msa_proxy_score`).
    topk : int
        Blocks per row: 1..64 (FlashInfer accepts only 16, flashmsa's tuned path;
        docs/semantics.md#d4).
    num_valid_pages : int or torch.Tensor, optional
        Candidate range ``[0, nvp)``: an int in ``(0, max_k_tiles]``, or an int32 ``(total_q,)``
        tensor of per-token counts (clamped to ``[0, max_k_tiles]`` on the device). Default:
        ``max_k_tiles``.
    output : torch.Tensor, optional
        Pre-allocated int32 ``(total_q, H, topk)`` with unit last stride and rows that do not
        overlap: contiguous, or e.g. ``q2k.transpose(0, 1)`` of a head-major ``(H, total_q,
        topk)`` tensor ``q2k`` (or a row range of a larger one), which the attention ops then take
        as it is (no transposed copy; a flashmsa extension, docs/semantics.md#topk-output).
    force_begin_blocks, force_end_blocks : int
        Sink blocks ``[0, fb)`` and local-window blocks ``[nvp - fe, nvp)`` always selected;
        ``fb + fe <= topk``.

    Returns
    -------
    torch.Tensor
        int32 ``(total_q, H, topk)`` (``output`` when given). Attention takes ``(Hkv, total_q,
        topk)``: ``out.transpose(0, 1)`` as it is (read in place), its contiguous copy, or a
        head-major tensor written directly through ``output=q2k.transpose(0, 1)``.
    """
    return _topk_select("", max_score=max_score, topk=topk, num_valid_pages=num_valid_pages,
                        output=output, force_begin_blocks=force_begin_blocks,
                        force_end_blocks=force_end_blocks)


def _topk_select(plan, max_score, topk, num_valid_pages, output, force_begin_blocks,
                 force_end_blocks):
    op = "msa_topk_select"
    max_score = _tensor("max_score", max_score)
    topk = _int_arg(op, "topk", topk)
    output = _tensor_or_none("output", output)
    force_begin_blocks = _int_arg(op, "force_begin_blocks", force_begin_blocks)
    force_end_blocks = _int_arg(op, "force_end_blocks", force_end_blocks)
    nvp_value, nvp_tensor = _int_or_tensor(op, "num_valid_pages", num_valid_pages, "")
    _check_devices(op, max_score=max_score, num_valid_pages=nvp_tensor, output=output)
    if output is None:
        num_heads, _, total_q = _shape3(max_score)
        # An out-of-range topk allocates no slot (the core rejects it).
        slots = topk if 1 <= topk <= _MAX_TOPK else 0
        output = _outputs.empty((total_q, num_heads, slots), torch.int32, max_score.device)
    args = (max_score, topk, nvp_value, nvp_tensor, force_begin_blocks, force_end_blocks, output,
            plan)
    _call(_ops.topk_select, *args)
    _log.log_plan("msa_topk_select", _ops.topk_select_describe, args)
    return output


# ---- stage 3: prefill / general varlen ---------------------------------------------------------

# The attention ops' q dtypes (the decode op also takes fp8 q with fp8 K, its output then bf16).
_Q_DTYPES = (torch.bfloat16, torch.float16)
_DECODE_Q_DTYPES = (*_Q_DTYPES, torch.float8_e4m3fn)


def _q_shape(q: torch.Tensor, dtypes=_Q_DTYPES) -> Tuple[int, int, int]:
    """q's (total_q, Hq, d) for sizing the attention ops' outputs; zeros for a q the core rejects
    (not 3-D, or a dtype not in `dtypes`), so that no output is sized or typed by a bad q before
    the core names it."""
    return _shape3(q) if q.dtype in dtypes else (0, 0, 0)


def _attention_out(q: torch.Tensor, dtypes=_Q_DTYPES) -> torch.Tensor:
    """The attention ops' output: q's shape, in q's dtype (bf16 for fp8 q); an empty bf16 tensor
    for a q the core rejects."""
    shape = _q_shape(q, dtypes)
    dtype = q.dtype if q.dtype in _Q_DTYPES else torch.bfloat16
    return _outputs.empty(shape, dtype, q.device)


def _lse_outputs(q: torch.Tensor, want_lse: bool, want_lse_t: bool, dtypes=_Q_DTYPES):
    if not (want_lse or want_lse_t):
        return None, None
    total_q, num_heads, _ = _q_shape(q, dtypes)
    lse = _outputs.empty((total_q, num_heads), torch.float32, q.device) if want_lse else None
    lse_t = _outputs.empty((total_q, num_heads), torch.float32, q.device) if want_lse_t else None
    return lse, lse_t


def msa_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_indices: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    return_softmax_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_global_scale: Optional[float] = None,
    v_global_scale: Optional[float] = None,
    q_offset=None,
    return_temperature_lse: bool = False,
    lse_temperature_scale: float = 1.0,
    workspace: Optional[MSASparseAttentionWorkspace] = None,
    out: Optional[torch.Tensor] = None,
):
    """MSA stage 3 (prefill / general varlen): exact attention over the selected KV blocks.

    Query row ``r`` (sequence ``b``), head ``hq`` attends the keys of the blocks listed in
    ``q2k_indices[hq // G, r]`` (a set: entries before the first negative value, ids in
    ``[0, nb_b)``, duplicates once), causally masked if ``causal``. Rows with no visible key give
    output 0 and LSE ``-inf``.

    Parameters
    ----------
    q : torch.Tensor
        ``(total_q, Hq, 128)`` bf16 / fp16, contiguous; also the output dtype.
    k, v : torch.Tensor
        Flat ``(total_k, Hkv, W)`` with ``cu_seqlens_k`` or paged ``(num_pages, Hkv, 128, W)`` with
        ``page_table`` + ``seqused_k``; ``W = 128`` for q's dtype or fp8 e4m3, ``W = 64`` for NVFP4
        (uint8, with ``k_scale`` / ``v_scale``). Paged K/V may be packed K|V views of one cache
        (:func:`supports_packed_kv`).
    q2k_indices : torch.Tensor
        int32 ``(Hkv, total_q, topk)``, ``1 <= topk <= 64``: batch-local block ids, ascending,
        ``-1`` tail padded; rows of ``topk`` consecutive entries at any strides (contiguous,
        ``msa_topk_select(...).transpose(0, 1)``, a row range of a larger buffer, an ``expand``
        of one head), read in place (docs/semantics.md#q2k-layout).
    cu_seqlens_q : torch.Tensor
        ``(B + 1,)`` int32.
    cu_seqlens_k : torch.Tensor, optional
        ``(B + 1,)`` int32; required flat. When paged and given, it (not ``seqused_k``) gives the
        key lengths.
    causal : bool
        Right-aligned causal masking (default False, as FlashInfer).
    softmax_scale : float, optional
        Default ``128 ** -0.5``.
    page_table, seqused_k : torch.Tensor, optional
        ``(B, max_pages)`` / ``(B,)`` int32, paged layout.
    return_softmax_lse : bool
        Also return the natural-log LSE ``(total_q, Hq)`` float32.
    k_scale, v_scale : torch.Tensor, optional
        NVFP4 only: uint8 e4m3 block scales, 128x4 swizzled (see :mod:`flashmsa.testing`).
    k_global_scale : float, optional
        NVFP4 only: multiplies the softmax scale.
    v_global_scale : float, optional
        Multiplies the output, any KV dtype (e.g. an fp8 V descale).
    q_offset : int or torch.Tensor, optional
        Position of each sequence's first query; default right-aligned.
    return_temperature_lse : bool
        Also return ``lse_t = ln sum exp(T * logits)``; the result is then ``(out, lse, lse_t)``
        whatever ``return_softmax_lse`` says.
    lse_temperature_scale : float
        ``T`` of the temperature LSE.
    workspace : MSASparseAttentionWorkspace, optional
        Caller-owned device scratch (CUDA graphs).
    out : torch.Tensor, optional
        Pre-allocated output: contiguous, shaped like ``q``, in q's dtype, on q's device, sharing
        memory with no argument; written in place and returned (no copy). Every device and K/V
        dtype takes it (FlashInfer: its Hopper backend only).

    Returns
    -------
    ``out`` ``(total_q, Hq, 128)`` in q's dtype; ``(out, lse)`` with ``return_softmax_lse``;
    ``(out, lse, lse_t)`` with ``return_temperature_lse``.
    """
    return _sparse_attention("", q=q, k=k, v=v, q2k_indices=q2k_indices, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, causal=causal, softmax_scale=softmax_scale,
                             page_table=page_table, seqused_k=seqused_k,
                             return_softmax_lse=return_softmax_lse, k_scale=k_scale,
                             v_scale=v_scale, k_global_scale=k_global_scale,
                             v_global_scale=v_global_scale, q_offset=q_offset,
                             return_temperature_lse=return_temperature_lse,
                             lse_temperature_scale=lse_temperature_scale, workspace=workspace,
                             out=out)


def _sparse_attention(plan, q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale,
                      page_table, seqused_k, return_softmax_lse, k_scale, v_scale, k_global_scale,
                      v_global_scale, q_offset, return_temperature_lse, lse_temperature_scale,
                      workspace, out=None):
    op = "msa_sparse_attention"
    q = _tensor("q", q)
    k = _tensor("k", k)
    v = _tensor("v", v)
    q2k_indices = _tensor("q2k_indices", q2k_indices)
    cu_seqlens_q = _index_tensor("cu_seqlens_q", cu_seqlens_q)
    cu_seqlens_k = _index_tensor("cu_seqlens_k", cu_seqlens_k)
    page_table = _page_table_tensor(page_table)
    seqused_k = _index_tensor("seqused_k", seqused_k)
    k_scale = _tensor_or_none("k_scale", k_scale)
    v_scale = _tensor_or_none("v_scale", v_scale)
    softmax_scale = _float_arg("softmax_scale", softmax_scale)
    k_global_scale = _float_arg("k_global_scale", k_global_scale)
    v_global_scale = _float_arg("v_global_scale", v_global_scale)
    lse_temperature_scale = _float_arg("lse_temperature_scale", lse_temperature_scale,
                                       optional=False)
    q_offset_value, q_offset_tensor = _q_offset_args(op, q_offset)
    workspace = _workspace_arg(workspace)
    out = _tensor_or_none("out", out)
    _check_devices(op, q=q, k=k, v=v, q2k_indices=q2k_indices, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, page_table=page_table, seqused_k=seqused_k,
                   k_scale=k_scale, v_scale=v_scale, q_offset=q_offset_tensor,
                   workspace=workspace.buffer if workspace is not None else None, out=out)

    want_lse_t = bool(return_temperature_lse)
    want_lse = bool(return_softmax_lse) or want_lse_t
    if out is None:
        out = _attention_out(q)
    lse, lse_t = _lse_outputs(q, want_lse, want_lse_t)
    args = (q, k, v, q2k_indices, cu_seqlens_q, cu_seqlens_k, bool(causal), softmax_scale,
            page_table, seqused_k, k_scale, v_scale, k_global_scale, v_global_scale,
            q_offset_value, q_offset_tensor, lse_temperature_scale, out, lse, lse_t)
    scratch = _run_with_workspace(_ops.sparse_attention, args, workspace, plan)
    _log.log_plan("msa_sparse_attention", _ops.sparse_attention_describe, (*args, scratch, plan))
    if want_lse_t:
        return out, lse, lse_t
    if want_lse:
        return out, lse
    return out


# ---- stage 3: decode / MTP ---------------------------------------------------------------------

def msa_sparse_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_indices: torch.Tensor,
    *,
    page_table: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqlen_q: int = 1,
    causal: bool = True,
    softmax_scale: Optional[float] = None,
    return_softmax_lse: bool = False,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    k_global_scale: Optional[float] = None,
    v_global_scale: Optional[float] = None,
    q_offset=None,
    partial_dtype: Optional[torch.dtype] = None,
    force_fused: Optional[bool] = None,
    workspace: Optional[MSASparseAttentionWorkspace] = None,
    out: Optional[torch.Tensor] = None,
):
    """MSA stage 3 for decode / MTP: ``seqlen_q`` query tokens per request attend their selected
    KV blocks. Token ``i`` of request ``b`` is row ``b * seqlen_q + i`` at position
    ``seqlen_k[b] - seqlen_q + i`` (right-aligned) unless ``q_offset`` says otherwise.

    Parameters
    ----------
    q : torch.Tensor
        ``(B * seqlen_q, Hq, 128)`` bf16 / fp16 / fp8 e4m3 (fp8 q computes in bf16); any GQA
        group ``G = Hq / Hkv`` (FlashInfer: ``G <= 16``).
    k, v : torch.Tensor
        Paged ``(num_pages, Hkv, 128, W)`` with ``page_table`` + ``seqused_k`` (packed K|V views
        allowed), or flat ``(total_k, Hkv, W)`` with ``cu_seqlens_k``; dtypes as in
        :func:`msa_sparse_attention`.
    q2k_indices : torch.Tensor
        int32 ``(Hkv, B * seqlen_q, topk)``, ascending, ``-1`` tail padded; rows of ``topk``
        consecutive entries at any strides, read in place (docs/semantics.md#q2k-layout).
    page_table, seqused_k, cu_seqlens_k : torch.Tensor, optional
        ``(B, max_pages)`` / ``(B,)`` paged, or ``(B + 1,)`` flat; int32.
    seqlen_q : int
        Uniform query tokens per request (1, or more for speculative decoding).
    causal : bool
        Right-aligned causal masking (default True).
    softmax_scale : float, optional
        Default ``128 ** -0.5``.
    return_softmax_lse : bool
        Also return the natural-log LSE ``(B * seqlen_q, Hq)`` float32.
    k_scale, v_scale, k_global_scale, v_global_scale, q_offset
        As in :func:`msa_sparse_attention`.
    partial_dtype : torch.dtype, optional
        Split-K partial outputs: float32, bfloat16, float16 or float8_e4m3fn (default: the
        compute dtype).
    force_fused : bool, optional
        True: one CTA per (token, kv head); False: split-K + combine; None: heuristic.
    workspace : MSASparseAttentionWorkspace, optional
        Caller-owned device scratch (CUDA graphs).
    out : torch.Tensor, optional
        Pre-allocated output: contiguous, shaped like ``q``, in the output dtype (q's; bf16 for
        fp8 q), on q's device, sharing memory with no argument; written in place and returned (no
        copy). Every device and K/V dtype takes it (FlashInfer: its Hopper backend and one
        Blackwell NVFP4 route only).

    Returns
    -------
    ``out`` ``(B * seqlen_q, Hq, 128)`` (q's dtype; bf16 for fp8 q), or ``(out, lse)`` with
    ``return_softmax_lse``.
    """
    return _sparse_decode("", q=q, k=k, v=v, q2k_indices=q2k_indices, page_table=page_table,
                          seqused_k=seqused_k, cu_seqlens_k=cu_seqlens_k, seqlen_q=seqlen_q,
                          causal=causal, softmax_scale=softmax_scale,
                          return_softmax_lse=return_softmax_lse, k_scale=k_scale, v_scale=v_scale,
                          k_global_scale=k_global_scale, v_global_scale=v_global_scale,
                          q_offset=q_offset, partial_dtype=partial_dtype, force_fused=force_fused,
                          workspace=workspace, out=out)


def _sparse_decode(plan, q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q,
                   causal, softmax_scale, return_softmax_lse, k_scale, v_scale, k_global_scale,
                   v_global_scale, q_offset, partial_dtype, force_fused, workspace, out=None):
    op = "msa_sparse_decode_attention"
    q = _tensor("q", q)
    k = _tensor("k", k)
    v = _tensor("v", v)
    q2k_indices = _tensor("q2k_indices", q2k_indices)
    page_table = _page_table_tensor(page_table)
    seqused_k = _index_tensor("seqused_k", seqused_k)
    cu_seqlens_k = _index_tensor("cu_seqlens_k", cu_seqlens_k)
    seqlen_q = _int_arg(op, "seqlen_q", seqlen_q)
    softmax_scale = _float_arg("softmax_scale", softmax_scale)
    k_scale = _tensor_or_none("k_scale", k_scale)
    v_scale = _tensor_or_none("v_scale", v_scale)
    k_global_scale = _float_arg("k_global_scale", k_global_scale)
    v_global_scale = _float_arg("v_global_scale", v_global_scale)
    q_offset_value, q_offset_tensor = _q_offset_args(op, q_offset)
    if partial_dtype is not None and not isinstance(partial_dtype, torch.dtype):
        raise TypeError(
            f"partial_dtype must be a torch.dtype or None, got {type(partial_dtype).__name__}")
    if force_fused is not None and not isinstance(force_fused, bool):
        raise TypeError(f"force_fused must be a bool or None, got {type(force_fused).__name__}")
    workspace = _workspace_arg(workspace)
    out = _tensor_or_none("out", out)
    _check_devices(op, q=q, k=k, v=v, q2k_indices=q2k_indices, page_table=page_table,
                   seqused_k=seqused_k, cu_seqlens_k=cu_seqlens_k, k_scale=k_scale,
                   v_scale=v_scale, q_offset=q_offset_tensor,
                   workspace=workspace.buffer if workspace is not None else None, out=out)

    if out is None:
        out = _attention_out(q, _DECODE_Q_DTYPES)
    lse, _ = _lse_outputs(q, bool(return_softmax_lse), False, _DECODE_Q_DTYPES)
    args = (q, k, v, q2k_indices, page_table, seqused_k, cu_seqlens_k, seqlen_q, bool(causal),
            softmax_scale, k_scale, v_scale, k_global_scale, v_global_scale, q_offset_value,
            q_offset_tensor, partial_dtype, force_fused, out, lse)
    scratch = _run_with_workspace(_ops.sparse_decode, args, workspace, plan)
    _log.log_plan("msa_sparse_decode_attention", _ops.sparse_decode_describe,
                  (*args, scratch, plan))
    if return_softmax_lse:
        return out, lse
    return out


# ---- plan options (private: tests and benchmarks) ----------------------------------------------
# The public functions run the library's own plan (schedule and kernel choices made by the core's
# planner, csrc/sparse_attn/plan.cpp). These private twins take the same arguments plus
# ``options``, the plan options of the call, to force a schedule or a kernel:
#
#   _sparse_attention_planned(q, k, v, q2k, cu_q, cu_k, causal=True,
#                             options=dict(schedule="kv_major", kv_major_kernel="mma_sync"))
#
# msa_sparse_attention: schedule = auto | query_major | kv_major | hybrid, kv_major_kernel = auto |
# mma_sync | wgmma | tma, chunk_rows = <rows per KV-major launch group>, tile_max_waste = <1 to 8>,
# tile_kernel = auto | cp_async | tma (the shared-selection tile kernel; tma falls back to cp_async
# for fp8 K/V, and the plan text says so), lists = per_group | once (the KV-major work lists of all
# launch groups built in one pass; once falls back to per_group beyond its workspace bound),
# tile_bound = auto | fixed | adaptive (adaptive: the tiles' bound and, where the tiles within 3.0
# hold nearly all pairs of the call, 3.0; decided on the device; auto: adaptive with the TMA tiles'
# default bound from 8193 to 40960 query rows, else fixed), kv_major_store = auto | stg | tma (the
# Hopper KV-major kernel's partials by each lane's stores or by TMA stores; tma needs G a multiple
# of 16, else stg, and the plan text says so; auto: tma where it applies), kv_major_math = auto |
# precise | approx (that kernel's row LSEs' log2 and 1 / l correctly rounded, or by the
# special-function unit's approximations, auto's: other last bits, deterministic);
# msa_proxy_score(_fp4): kernel = auto | mma_sync | sm90 | sm90_only | sm90_ss | sm90_ss_only |
# decode | decode_only | decode_f16 | decode_f16_only (the decode kernel with fp16 MMAs for fp8 K) |
# sm90_f16 | sm90_f16_only (the sm_90a kernel with fp16 MMAs for fp8 K with bf16 or fp8 q, and
# for NVFP4 q and K; auto takes each of them there),
# decode_ctas = auto | 2 | 3 | 4, decode_ilp = auto | 1 | 2, nvfp4_cvt = auto | byte | word (the
# decode kernel's NVFP4 conversion; auto: word), decode_fp8 / decode_nvfp4 = auto | cta | tma (fp8 /
# NVFP4 K on the decode kernel's CTA-wide cp.async ring or, sm_90a, its TMA-fed warp-per-block
# kernel; auto: tma where one pass fits, at any batch), decode_tma_issue = auto |
# producer | warps (that kernel's loads by a producer warp or by each consumer warp; auto: warps
# for NVFP4 K, producer for fp8 K);
# msa_topk_select: kernel = auto | warp_per_row | warp_per_row_8 | radix | by_size | radix_1buf |
# warp_split | radix_uniform | warp_digits (warp_split with one-chunk rows' thresholds by
# 8-bit radix digits) | net (sorting networks over words of truncated order key and block offset,
# L lanes a row; auto's kernel where it runs; rows choosing more than 31 blocks or of more than
# 32768 blocks run by_size's kernel), net_lanes = auto | 1 | 2 | 4 | 8 | 16 | 32, net_pivot =
# auto | off | on (net with a pivot before the networks, a warp per row; rows of <= 1024 blocks
# choosing <= 15; auto: on for decode-sized calls, those of >= 16 lanes a row), net_pivot_mode =
# auto | sort | rank_cta (the pivot path's form: a warp a row sorting across it, or a CTA of 4 warps
# a row counting order statistics; the same choice; auto: rank_cta for rows of more than 256
# blocks, sort for shorter ones);
# msa_sparse_decode_attention:
# kernel = auto | smem | regs | wgmma (wgmma: bf16 / fp16 MTP union items on the sm_90a TMA +
# wgmma kernel; other calls planned as auto), mtp = auto | per_token | union,
# split = auto | blocks | cluster (cluster: a row's splits as one thread-block cluster merging in
# shared memory, sm_90; on the 8-warp kernel where it applies, one CTA per SM; auto: blocks),
# split_warps = auto | 4 | 8 (8: decode with 8 warps per CTA
# sharing each 128-key block; 16-bit K/V, or fp8 K/V converted in registers under kernel=auto;
# G <= 16, calls that split by blocks, and where forced fused calls; auto: 8 where it applies to
# split calls, for fp8 where a split holds one block, 4 elsewhere), split_rule = auto | ceil | waves (how split-K decode picks its split count:
# ceil(resident CTAs / items), or the count with the fewest waves x blocks per split; auto: waves),
# nvfp4_cvt = auto | byte | word (the register kernel's NVFP4 conversion; auto: word),
# wgmma_pipe = auto | inline | ahead (the wgmma kernel's items planned by a planner warp ahead of
# its loader warp; bit-identical; auto: ahead), combine_loads = auto | after | with (split-K's
# combine loads the partial values after the LSEs, or the first 16 slots' with them;
# bit-identical; auto: with),
# wgmma_fp8 = auto | off | on (on: fp8 K/V on the wgmma kernel, copied raw and converted in place
# into fp16 by its converter warps, computed in fp16; with the ahead pipe only; auto: on where
# kernel=wgmma is named or auto takes the wgmma kernel for more union items than half the SMs,
# else off),
# regs_feed = auto | cp_async | tma (tma: the 16-row fp8 register kernel's stages filled by TMA,
# sm_90a; bit-identical, measured slower; auto: cp_async)
# (include/flashmsa/plan.h). An
# unknown option or a bad value raises ValueError naming the option; a forced kernel the device
# cannot run raises NotSupportedError (a NotImplementedError).

def _plan_text(options) -> str:
    if options is None:
        return ""
    if isinstance(options, str):
        return options
    if isinstance(options, Mapping):
        return ",".join(f"{name}={value}" for name, value in options.items())
    raise TypeError(f"options must be a mapping, a str or None, got {type(options).__name__}")


def _planned(public, impl):
    signature = inspect.signature(public)

    def planned(*args, options=None, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return impl(_plan_text(options), **bound.arguments)

    planned.__name__ = planned.__qualname__ = f"{impl.__name__}_planned"
    planned.__doc__ = f"{public.__name__}(*args, **kwargs) with plan options (see msa_ops.py)."
    return planned


_proxy_score_planned = _planned(msa_proxy_score, _proxy_score)
_proxy_score_fp4_planned = _planned(msa_proxy_score_fp4, _proxy_score_fp4)
_topk_select_planned = _planned(msa_topk_select, _topk_select)
_sparse_attention_planned = _planned(msa_sparse_attention, _sparse_attention)
_sparse_decode_planned = _planned(msa_sparse_decode_attention, _sparse_decode)

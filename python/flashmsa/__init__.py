"""flashmsa: MiniMax Sparse Attention (MSA) ops for NVIDIA GPUs from SM80 up (fastest on Hopper),
with a multithreaded C++ reference for CPU tensors.

``import flashmsa.msa_ops as msa_ops`` is a drop-in replacement for ``flashinfer.msa_ops``.
``python -m flashmsa demo`` runs the whole pipeline on a synthetic needle-in-a-haystack problem.
"""

from . import errors, msa_ops, testing
from ._library import built_with_cuda
from ._version import __version__
from .errors import NotSupportedError
from .msa_ops import (
    SUPPORTS_PACKED_KV,
    MSASparseAttentionWorkspace,
    msa_proxy_score,
    msa_proxy_score_fp4,
    msa_sparse_attention,
    msa_sparse_decode_attention,
    msa_topk_select,
    supports_packed_kv,
)

__all__ = [
    "MSASparseAttentionWorkspace",
    "NotSupportedError",
    "SUPPORTS_PACKED_KV",
    "built_with_cuda",
    "errors",
    "msa_ops",
    "msa_proxy_score",
    "msa_proxy_score_fp4",
    "msa_sparse_attention",
    "msa_sparse_decode_attention",
    "msa_topk_select",
    "supports_packed_kv",
    "testing",
]

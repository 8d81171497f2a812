"""Loads the native extension ``flashmsa._C`` and registers fake implementations of its ops.

Importing ``_C`` registers ``torch.ops.flashmsa.{proxy_score, proxy_score_fp4, topk_select,
sparse_attention, sparse_decode}`` (and the two workspace-size queries); each takes a trailing
``plan`` string of plan options (empty: the library's own choices; see the private
``*_planned`` functions at the end of :mod:`flashmsa.msa_ops`). Every op writes into caller-allocated
outputs passed as mutable arguments and returns nothing, so its fake (meta) implementation has
nothing to compute: ``torch.compile`` traces the Python wrappers in :mod:`flashmsa.msa_ops`, whose
``torch.empty`` calls give the outputs their shapes.
"""

import torch

try:
    from . import _C
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "flashmsa's native extension flashmsa._C is missing or failed to load; install the package "
        "with `pip install --no-build-isolation .` against the torch you run with"
    ) from e

ops = torch.ops.flashmsa


def built_with_cuda() -> bool:
    """Whether this build has CUDA kernels (a CPU-only build runs the C++ reference only)."""
    return bool(_C.built_with_cuda())


# Every op writes into its caller-allocated outputs (mutable arguments) and returns nothing: one
# fake serves all of them, whatever their arguments (the schemas in bindings/torch/ops.cpp).
def _writes_its_outputs(*args, **kwargs):
    return None


for _op in ("proxy_score", "proxy_score_fp4", "topk_select", "sparse_attention", "sparse_decode"):
    torch.library.register_fake(f"flashmsa::{_op}")(_writes_its_outputs)

"""Output allocation of the ops in :mod:`flashmsa.msa_ops` (private).

The ops allocate their outputs here. Tests can have every such output filled with NaN (float) or
INT32_MIN (int32) before the op runs (:func:`flashmsa.testing.poison_outputs` sets the switch), so
that an element an op forgets to write shows up instead of passing by luck.
"""

from typing import Sequence

import torch

_poison = False


def set_poison(enabled: bool) -> bool:
    """Turns poisoning on or off; returns the previous setting."""
    global _poison
    previous = _poison
    _poison = bool(enabled)
    return previous


def poisoned() -> bool:
    return _poison


def empty(shape: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty``, or a poisoned ``torch.full`` when poisoning is on."""
    if not _poison:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = torch.iinfo(dtype).min if not dtype.is_floating_point else float("nan")
    return torch.full(shape, fill, dtype=dtype, device=device)

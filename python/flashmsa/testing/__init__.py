"""What the tests, the benchmarks and the demo share, in one place:

* :mod:`.inputs`: input builders (seeded Gaussian data, the benchmark selection patterns, decode
  page tables, synthetic indexer data);
* :mod:`.layouts`: flat / paged / packed KV caches and ``cu_seqlens``;
* :mod:`.nvfp4`: NVFP4 quantisation and dequantisation in the layout the ops read;
* :mod:`.cases`: the test cases, one list per op shared by the CPU and the GPU tests;
* :mod:`.reference`: the float64 torch reference of the four ops, written from the semantics
  (docs/semantics.md), not from the C++ reference or the kernels, and its comparison;
* :mod:`.timing`: cold-L2 CUDA-event timing (docs/benchmarks.md, "Timing");
* output poisoning (:func:`poison_outputs`), here.
"""

import math
import os
from typing import Sequence

import torch

from .. import _outputs
from . import cases, inputs, layouts, nvfp4, reference, timing
from .layouts import BLOCK_SIZE, cu_seqlens, pack_kv, paginate
from .nvfp4 import (HEAD_DIM, NVFP4_SF_VEC, dequantize_nvfp4, nvfp4_scale_bytes,
                    nvfp4_scale_offsets, quantize_nvfp4)


class _PoisonScope:
    """Returned by :func:`poison_outputs`; restores the previous setting when used as a context."""

    def __init__(self, previous: bool):
        self.previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _outputs.set_poison(self.previous)
        return False


def poison_outputs(enabled: bool = True) -> _PoisonScope:
    """Fill every output the ops allocate with NaN (float) or INT32_MIN (int32) before the op runs.

    An element the op forgets to write then shows up in comparisons instead of passing by luck
    (``torch.empty`` often hands back zeros). Works as a plain call or as a context manager::

        flashmsa.testing.poison_outputs(True)
        with flashmsa.testing.poison_outputs(): ...
    """
    return _PoisonScope(_outputs.set_poison(enabled))


def outputs_poisoned() -> bool:
    return _outputs.poisoned()


def empty(shape: Sequence[int], dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty``, poisoned when :func:`poison_outputs` is on (as the ops allocate)."""
    return _outputs.empty(shape, dtype, device)


def usable_cpus() -> int:
    """CPU cores this process may use: its affinity mask, bounded by a cgroup v2 CPU quota (a
    container often sees every core of the host). Sizes the fuzzer's pool and the test workers'
    thread shares."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)

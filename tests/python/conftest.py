"""Shared pytest setup for flashmsa's Python tests.

* ``DEVICES`` / ``devices()``: parametrise a test over ``cpu`` and ``cuda``; the CUDA case is
  skipped (not passed) where there is no GPU or the build has no CUDA kernels.
* Every test runs with output poisoning on (``flashmsa.testing.poison_outputs``): an output
  element an op forgets to write reads NaN / INT32_MIN instead of a lucky zero.
* Seeds are fixed per test.
"""

import pytest
import torch

import flashmsa

HAS_CUDA = torch.cuda.is_available() and flashmsa.built_with_cuda()

requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device and a flashmsa build with CUDA kernels")


def devices():
    """``cpu`` always; ``cuda`` marked to skip where it cannot run."""
    return ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.cuda])]


DEVICES = devices()


@pytest.fixture(autouse=True)
def _seed_and_poison():
    torch.manual_seed(0)
    with flashmsa.testing.poison_outputs(True):
        yield

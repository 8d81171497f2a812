"""Shared pytest setup for flashmsa's Python tests.

* ``DEVICES`` (``flashmsa.testing.cases.devices()``): parametrise a test over ``cpu`` and
  ``cuda``; the CUDA case is skipped (not passed) where there is no GPU or the build has no CUDA
  kernels. The cases themselves are in ``flashmsa.testing.cases``.
* Every test runs with output poisoning on (``flashmsa.testing.poison_outputs``): an output
  element an op forgets to write reads NaN / INT32_MIN instead of a lucky zero.
* Seeds are fixed per test.
"""

import pytest
import torch

import flashmsa
from flashmsa.testing import cases

HAS_CUDA = torch.cuda.is_available() and flashmsa.built_with_cuda()

requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device and a flashmsa build with CUDA kernels")

DEVICES = cases.devices()


@pytest.fixture(autouse=True)
def _seed_and_poison():
    torch.manual_seed(0)
    with flashmsa.testing.poison_outputs(True):
        yield

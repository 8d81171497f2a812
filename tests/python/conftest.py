"""Shared pytest setup for flashmsa's Python tests.

* ``DEVICES`` (``flashmsa.testing.cases.devices()``): parametrise a test over ``cpu`` and
  ``cuda``; the CUDA case is skipped (not passed) where there is no GPU or the build has no CUDA
  kernels. The cases themselves are in ``flashmsa.testing.cases``.
* Every test runs with output poisoning on (``flashmsa.testing.poison_outputs``): an output
  element an op forgets to write reads NaN / INT32_MIN instead of a lucky zero.
* Seeds are fixed per test.
* ``FLASHMSA_TEST_REPORT_DIR`` (set by scripts/gpu_check.sh): as each test ends, its outcome and
  duration are appended to ``durations.tsv`` there and a failure's full report to
  ``failures.txt``, so a run cut short (a device call's time limit) still says why a test failed
  and where the time went. Written by the controlling process only (not by xdist workers).
"""

import os

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


_REPORT_DIR = os.environ.get("FLASHMSA_TEST_REPORT_DIR")


def pytest_runtest_logreport(report):
    if not _REPORT_DIR or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.makedirs(_REPORT_DIR, exist_ok=True)
    if report.when == "call" or report.failed:
        with open(os.path.join(_REPORT_DIR, "durations.tsv"), "a") as f:
            f.write(f"{report.duration:.3f}\t{report.outcome}\t{report.when}\t{report.nodeid}\n")
    if report.failed:
        with open(os.path.join(_REPORT_DIR, "failures.txt"), "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
            for name, text in report.sections:
                if "stdout" in name or "stderr" in name:
                    f.write(f"---- {name}\n{text[-4000:]}\n")

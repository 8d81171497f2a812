"""Shared pytest setup for flashmsa's Python tests.

* ``DEVICES`` (``flashmsa.testing.cases.devices()``): parametrise a test over ``cpu`` and
  ``cuda``; the CUDA case is skipped (not passed) where there is no GPU or the build has no CUDA
  kernels. The cases themselves are in ``flashmsa.testing.cases``. The ``cpu`` case is marked
  ``cpu_only`` (below); ``ALL_DEVICES`` is the same pair without that mark, for the hostile and
  bad-input tests, which stay in the GPU run (they exercise the CUDA build's module).
* Marker ``cpu_only`` (pyproject.toml): a test that never touches a CUDA tensor or a kernel of the
  CUDA build: the ``[cpu]`` case of a device-parametrised test, the pure-CPU harness tests (the
  fuzzer's CPU self-tests, the CPU demo, the sanitizer smoke on the CPU reference and gpu_check's
  sanitizer-step harness, the plan-log subprocess). CI's CPU run covers them; scripts/gpu_check.sh deselects them
  (``-m "not cpu_only"``) so that the whole GPU suite fits one device call. Never put it on a test
  that runs a CUDA kernel, nor on an argument-validation test.
* ``Memo``: a per-process memo of a case's read-only inputs and CPU reference results,
  so that the parametrisations of one case over kernels, schedules, fused / split or partial dtypes
  build the inputs and compute the (CPU, often slow) reference once per xdist worker. The tests
  that use it put the kernel-like parameter last (fastest varying) so that those items are adjacent
  and land on one worker (pytest-xdist's worksteal and load schedulers hand out contiguous runs).
  Keys hold the case's repr (every field), the seed and anything else the builder takes; a test
  that changes a memoised object must build its own instead.
* xdist workers share the machine's cores: each one gets ``torch.set_num_threads(cores //
  workers)`` (at least 1; ``OMP_NUM_THREADS`` and ``FLASHMSA_NUM_THREADS`` likewise for its
  subprocesses and the CPU reference) unless ``OMP_NUM_THREADS`` is already set. With every worker
  running a core's worth of OpenMP threads, their spin-waiting made the CPU work of a 16-worker run
  several times slower (on 2 cores with 2 workers: 58 s against 11 s for the CPU reference tests of
  test_sparse_attention.py).
* Every test runs with output poisoning on (``flashmsa.testing.poison_outputs``): an output
  element an op forgets to write reads NaN / INT32_MIN instead of a lucky zero.
* Seeds are fixed per test.
* ``FLASHMSA_TEST_REPORT_DIR`` (set by scripts/gpu_check.sh): as each test ends, its outcome and
  duration are appended to ``durations.tsv`` there and a failure's full report to
  ``failures.txt``, so a run cut short (a device call's time limit) still says why a test failed
  and where the time went. Written by the controlling process only (not by xdist workers).
"""

import collections
import os

import pytest
import torch

import flashmsa
from flashmsa.testing import cases

HAS_CUDA = torch.cuda.is_available() and flashmsa.built_with_cuda()

requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device and a flashmsa build with CUDA kernels")

cpu_only = pytest.mark.cpu_only

ALL_DEVICES = cases.devices()
DEVICES = [pytest.param("cpu", marks=cpu_only), *ALL_DEVICES[1:]]


class Memo:
    """The ``size`` most recently used values of ``make()`` by key, in this process (one xdist
    worker). Values are shared between tests: they must be read only."""

    def __init__(self, size: int = 2):
        self.size = size
        self.entries = collections.OrderedDict()

    def __call__(self, key, make):
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        value = make()
        self.entries[key] = value
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return value




def dispatched_ops(fn):
    """fn()'s result and the names of the ATen / flashmsa ops it dispatched, views and
    allocations left out: each one left is a kernel launch on a GPU (the adapters' per-layer
    costs inside a CUDA graph)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    free = {"view", "reshape", "transpose", "slice", "unsqueeze", "as_strided", "t", "expand",
            "alias", "_unsafe_view", "select", "squeeze", "detach", "empty", "empty_strided"}

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in free:
                self.names.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        result = fn()
    return result, ops.names


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers or "OMP_NUM_THREADS" in os.environ:
        return
    share = max(1, flashmsa.testing.usable_cpus() // max(1, int(workers)))
    torch.set_num_threads(share)
    os.environ["OMP_NUM_THREADS"] = str(share)  # subprocesses (the demo, the plan log)
    os.environ.setdefault("FLASHMSA_NUM_THREADS", str(share))  # the C++ reference's threads


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

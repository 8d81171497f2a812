"""Timing of GPU ops with a cold L2 (docs/benchmarks.md, "Timing"), used by the benchmark and the
demo alike.

On CUDA: one call (L2 flushed) estimates the time and warms up, one more measures the host time of
a call while the GPU is kept busy, then every repetition flushes L2 and queues a GPU-side sleep
ahead of the op (so that host launch time is not timed), and CUDA events bracket the op. The flush
(``flush="read"``, the default) reads a 256 MB buffer, which leaves L2 holding clean lines only;
``flush="write"`` (a 256 MB memset, the method before 2026-12-02) leaves it full of dirty lines, whose
write-back then lands inside the timed op and costs a memory-bound op of ~0.1 ms several µs. The repetition count fits a time budget between ``min_reps`` and ``max_reps``; the median is
the result. On the CPU every repetition is timed with the wall clock (no flush, no sleep).

:func:`capture_graph` captures a function into a CUDA graph (the benchmark's decode step and the
graph tests).
"""

import statistics
import time
from typing import Callable

import torch

FLUSH_BYTES = 256 * 1024 * 1024


class Timer:
    """Times calls of ``fn()`` on ``device``: :meth:`time` returns ``median_us``, ``min_us``,
    ``p10_us``, ``p90_us``, ``reps``, ``host_us`` (host time of one call, CUDA only) and
    ``host_sync`` (the call waited for the GPU)."""

    HOST_PROBE_US = 20_000  # GPU sleep queued while the host time of one call is measured

    def __init__(self, device, budget_s: float, max_reps: int, min_reps: int = 5, flush: str = "read"):
        if flush not in ("read", "write"):
            raise ValueError(f"flush must be 'read' or 'write', got {flush!r}")
        self.flush_mode = flush
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.budget_s = budget_s
        self.max_reps = max_reps
        self.min_reps = min_reps
        self.flush_buf = (torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device=self.device)
                          if self.cuda else None)
        self.cycles_per_us = self._calibrate_sleep() if self.cuda else None

    def _calibrate_sleep(self):
        if not hasattr(torch.cuda, "_sleep"):
            return None
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return cycles / (start.elapsed_time(end) * 1000.0)

    def sleep_us(self, us: float) -> None:
        if self.cycles_per_us and us > 0:
            torch.cuda._sleep(int(us * self.cycles_per_us))

    def flush(self) -> None:
        if self.flush_mode == "write":
            self.flush_buf.zero_()
        else:  # a read of every line: L2 ends up clean (the sum is discarded)
            torch.sum(self.flush_buf.view(torch.int64))

    def host_us(self, fn):
        """Host time of one call while the GPU is busy; a call that synchronizes with the host
        waits for the queued sleep, which shows as a host time near HOST_PROBE_US."""
        if not self.cycles_per_us:
            return None
        self.sleep_us(self.HOST_PROBE_US)
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) * 1e6

    def _reps(self, estimate_us: float) -> int:
        reps = int(self.budget_s * 1e6 / (estimate_us + 100.0))
        return max(self.min_reps, min(self.max_reps, reps))

    def time(self, fn: Callable[[], object], *, return_result: bool = False):
        """The timing dict of ``fn``; with ``return_result`` also the result of the last call,
        as ``(timing, result)``."""
        if not self.cuda:
            return self._time_host(fn, return_result)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush()
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize()
        estimate_us = start.elapsed_time(end) * 1000.0
        if not return_result:
            result = None
        host = self.host_us(fn)
        host_sync = host is not None and host > 0.8 * self.HOST_PROBE_US
        reps = self._reps(estimate_us)
        # The sleep keeps the GPU busy while the host enqueues the op, so the events bracket GPU
        # work only. Useless (and skipped) when the op synchronizes with the host itself.
        lead_us = 0.0 if (host is None or host_sync) else min(1.5 * host + 20.0, 20_000.0)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            self.flush()
            self.sleep_us(lead_us)
            starts[i].record()
            if return_result:
                result = fn()
            else:
                fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
        timing = _summary(times, reps, host, host_sync)
        return (timing, result) if return_result else timing

    def _time_host(self, fn, return_result: bool):
        times = []
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e6)
        reps = self._reps(times[0])
        for _ in range(reps - 1):
            t0 = time.perf_counter()
            result = fn()
            times.append((time.perf_counter() - t0) * 1e6)
        timing = _summary(times, reps, None, False)
        return (timing, result) if return_result else timing


def _summary(times, reps, host, host_sync) -> dict:
    times = sorted(times)
    q = (statistics.quantiles(times, n=10, method="inclusive") if len(times) >= 2
         else [times[0]] * 9)
    return dict(median_us=statistics.median(times), min_us=times[0], p10_us=q[0], p90_us=q[-1],
                reps=reps, host_us=host, host_sync=host_sync)


def capture_graph(fn: Callable):
    """``fn()`` run once on a side stream (warm-up: allocations, plans, shared-memory opt-ins), then
    captured there into a ``torch.cuda.CUDAGraph``. Returns ``(graph, fn's static result)``; a host
    synchronisation inside ``fn`` fails the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        result = fn()
    torch.cuda.synchronize()
    return graph, result

"""benchmarks/sanitize_smoke.py's hostile-input calls, run on the CPU reference: every call is a
valid one (the ops accept it and clamp or ignore the hostile values), so that under
compute-sanitizer on the GPU a failure means a kernel's fault, not a rejected argument."""

import sys
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import sanitize_smoke  # noqa: E402
from flashmsa import msa_ops  # noqa: E402


def test_hostile_calls_run_on_the_cpu_reference(capsys):
    smoke = sanitize_smoke.Smoke(msa_ops, torch.device("cpu"))
    smoke.hostile()
    out = capsys.readouterr().out
    assert smoke.failed == [], out
    assert smoke.skipped == []
    assert len(smoke.passed) >= 60
    names = " ".join(smoke.passed)
    for what in ("invalid page ids", "out-of-range ids", "every selection empty", "nvp all 0",
                 "no query rows", "zero-length sequences", "empty page table",
                 "lengths beyond the table", "every sequence empty", "batch 0"):
        assert what in names, what
    for schedule in ("query_major", "kv_major", "hybrid"):
        assert f"hostile sparse [{schedule}]" in names
    assert smoke.passed == sorted(set(smoke.passed), key=smoke.passed.index)  # names are unique

"""CPU checks of the benchmark tooling: profile_msa's cases build through bench_msa's builders
with the arguments those builders take (a renamed builder or a changed signature fails here, not
on the GPU machine)."""
import os
import sys
from unittest import mock

import pytest

BENCH_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH_DIR))

bm = pytest.importorskip("bench_msa")
profile_msa = pytest.importorskip("profile_msa")


def test_profile_cases_call_existing_builders():
    bench = mock.create_autospec(bm.Bench, instance=True)
    table = profile_msa.cases(bench)
    assert len(table) >= 8
    for name, (build, env) in table.items():
        build()  # autospec: an unknown method or a wrong argument list raises here
        assert all(k in (bm.SCHEDULE_ENV, bm.KERNEL_ENV, bm.TILE_WASTE_ENV, bm.PROXY_KERNEL_ENV)
                   for k in env), name
    called = {c[0] for c in bench.method_calls}
    assert {"build_proxy_prefill", "build_proxy_decode", "build_topk", "build_sparse",
            "build_decode"} <= called


def test_profile_list_needs_no_device(capsys):
    assert profile_msa.main(["--list"]) == 0
    names = capsys.readouterr().out.split()
    assert "proxy_decode_b64" in names and "topk_prefill_32k" in names

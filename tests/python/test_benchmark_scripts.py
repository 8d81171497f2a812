"""CPU checks of the benchmark tooling: profile_msa's cases build through bench_msa's builders
with the arguments those builders take (a renamed builder or a changed signature fails here, not
on the GPU machine)."""
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from flashmsa import msa_ops

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str):
    """benchmarks/<name>.py as module <name> (the scripts import each other by name, as they do
    when run from that directory)."""
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bm = load_script("bench_msa")
profile_msa = load_script("profile_msa")


def test_profile_cases_call_existing_builders():
    bench = mock.create_autospec(bm.Bench, instance=True)
    table = profile_msa.cases(bench)
    assert len(table) >= 8
    for build in table.values():
        build()  # autospec: an unknown method or a wrong argument list raises here
    called = {c[0] for c in bench.method_calls}
    assert {"build_proxy_prefill", "build_proxy_decode", "build_topk", "build_topk_decode",
            "build_sparse", "build_decode"} <= called


def test_profile_list_needs_no_device(capsys):
    assert profile_msa.main(["--list"]) == 0
    names = capsys.readouterr().out.split()
    assert "proxy_decode_b64" in names and "topk_prefill_32k" in names


@pytest.mark.parametrize("label,options", [
    ("auto", None),
    ("query_major", dict(schedule="query_major", kv_major_kernel="auto")),
    ("kv_major", dict(schedule="kv_major", kv_major_kernel="auto")),
    ("kv_major mma_sync", dict(schedule="kv_major", kv_major_kernel="mma_sync")),
    ("hybrid waste=2.5", dict(schedule="hybrid", kv_major_kernel="auto", tile_max_waste="2.5")),
    ("auto combine=overlap", dict(schedule="auto", kv_major_kernel="auto", combine="overlap")),
    ("kv_major wgmma combine=prefetch",
     dict(schedule="kv_major", kv_major_kernel="wgmma", combine="prefetch")),
])
def test_bench_schedule_labels_become_plan_options(label, options):
    assert bm.plan_options(label) == options
    # The core accepts them (a bad name or value raises ValueError): a tiny call on the CPU.
    q = torch.zeros(1, 1, 128, dtype=torch.bfloat16)
    kv = torch.zeros(128, 1, 128, dtype=torch.bfloat16)
    q2k = torch.zeros(1, 1, 1, dtype=torch.int32)
    cu_q, cu_k = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 128], dtype=torch.int32)
    msa_ops._sparse_attention_planned(q, kv, kv, q2k, cu_q, cu_k, options=options)

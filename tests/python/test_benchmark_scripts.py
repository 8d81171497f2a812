"""CPU checks of the benchmark tooling: profile_msa's cases build through bench_msa's builders
with the arguments those builders take (a renamed builder or a changed signature fails here, not
on the GPU machine)."""
import importlib.util
import sys
from pathlib import Path
from unittest import mock

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
    for name, (build, env) in table.items():
        build()  # autospec: an unknown method or a wrong argument list raises here
        assert all(k in (bm.SCHEDULE_ENV, bm.KERNEL_ENV, bm.TILE_WASTE_ENV, bm.PROXY_KERNEL_ENV,
                         bm.TOPK_KERNEL_ENV, bm.DECODE_KERNEL_ENV, bm.DECODE_MTP_ENV)
                   for k in env), name
    called = {c[0] for c in bench.method_calls}
    assert {"build_proxy_prefill", "build_proxy_decode", "build_topk", "build_topk_decode",
            "build_sparse", "build_decode"} <= called


def test_profile_list_needs_no_device(capsys):
    assert profile_msa.main(["--list"]) == 0
    names = capsys.readouterr().out.split()
    assert "proxy_decode_b64" in names and "topk_prefill_32k" in names

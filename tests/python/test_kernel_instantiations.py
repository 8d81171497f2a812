"""The kernel instantiations are generated from one list (csrc/generate_instantiations.py).

These tests need no build: they check that the checked-in files are what the list generates, that
the check catches edits, stale and hand-written files, and that each entry names a template its
header defines and its op's launch.h declares.
"""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
SCRIPT = CSRC / "generate_instantiations.py"


def _load():
    spec = importlib.util.spec_from_file_location("generate_instantiations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load()


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_checked_in_files_are_generated():
    r = _run("--check")
    assert r.returncode == 0, r.stderr


@pytest.fixture
def csrc_copy(tmp_path):
    for op in gen.OPS:
        shutil.copytree(CSRC / op / "instantiations", tmp_path / op / "instantiations")
    return tmp_path


def test_check_catches_edits_and_foreign_files(csrc_copy):
    files = gen.render()
    some_unit = next(p for p in sorted(files) if p.endswith(".cu"))
    edited = csrc_copy / some_unit
    edited.write_text(edited.read_text().replace("template ", "template  ", 1))
    stale = csrc_copy / "sparse_attn" / "instantiations" / "sparse_attn_bf16_int4.cu"
    stale.write_text(gen.GENERATED + "// a unit no entry generates any more\n")
    hand = csrc_copy / "proxy_score" / "instantiations" / "proxy_score_hand.cu"
    hand.write_text("template void f<int>();\n")
    (csrc_copy / "sparse_attn" / "instantiations" / "declarations.h").unlink()

    r = _run("--check", "--csrc", str(csrc_copy))
    assert r.returncode == 1
    assert f"csrc/{some_unit}: differs" in r.stderr
    assert "sparse_attn_bf16_int4.cu: stale" in r.stderr
    assert "proxy_score_hand.cu: not generated" in r.stderr
    assert "sparse_attn/instantiations/declarations.h: missing" in r.stderr

    # Regenerating restores the generated files and removes the stale one; the hand-written file
    # stays (and still fails the run) until its kernels are in the list.
    r = _run("--csrc", str(csrc_copy))
    assert r.returncode == 1 and "proxy_score_hand.cu: not generated" in r.stderr
    assert edited.read_text() == files[some_unit] and not stale.exists()
    hand.unlink()
    assert _run("--check", "--csrc", str(csrc_copy)).returncode == 0


def test_each_unit_instantiates_its_kernels():
    units = gen.units()
    # One file per element type (and KV kind) of each op, as the list says.
    stems = {Path(p).stem for p in units}
    assert {f"proxy_score_{e}" for e in gen.ELEMS} <= stems
    assert {f"sparse_attn_{e}_{kv}" for e in gen.ELEMS for kv in gen.KVS} <= stems
    text = gen.render()
    for path, unit in units.items():
        body = text[path]
        for signature in unit.lines:
            assert f"template {signature};" in body
        decl = text[f"{unit.op}/instantiations/declarations.h"]
        for signature in unit.lines:
            assert f"extern template {signature};" in decl
    # The shared-selection tile kernel has no NVFP4 variant.
    nvfp4 = units["sparse_attn/instantiations/sparse_attn_bf16_nvfp4.cu"].lines
    assert not any("launch_union_sm90" in s for s in nvfp4)


@pytest.mark.parametrize("kernel", gen.KERNELS, ids=lambda k: k.signature.split("(")[0])
def test_entry_names_a_declared_and_defined_template(kernel):
    name = re.match(r"\w+ ([\w:]+)<", kernel.signature).group(1).split("::")[-1]
    op = gen.OPS[kernel.header.split("/")[0]]
    # The header defines the launcher itself or in an op header it includes (proxy_decode.cuh
    # includes proxy_decode_tma.cuh, whose launchers have units of their own).
    header = (CSRC / kernel.header).read_text()
    definition = header + "".join(
        (CSRC / h).read_text() for h in re.findall(r'#include "([^"]+\.cuh)"', header)
        if h.split("/")[0] == kernel.header.split("/")[0])
    launch_h = (CSRC / op.launch_header).read_text()
    # launch.h declares the launchers itself or through the op's headers it includes.
    declaration = launch_h + "".join(
        (CSRC / h).read_text() for h in re.findall(r'#include "([^"]+\.h)"', launch_h)
        if h.split("/")[0] == op.launch_header.split("/")[0] and "instantiations/" not in h)
    assert re.search(rf"\b{name}\s*\(", definition), f"{kernel.header} does not define {name}"
    assert re.search(rf"\b{name}\s*\(", declaration), f"{op.launch_header} does not declare {name}"
    assert '#include "' + op.launch_header.split("/")[0] + '/instantiations/declarations.h"' in launch_h

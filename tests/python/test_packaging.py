"""Packaging: one version everywhere, the command line's --version and build information."""

import importlib.metadata
import re
from pathlib import Path

import pytest

import flashmsa
from flashmsa import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_written_once():
    text = (ROOT / "python" / "flashmsa" / "_version.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', text, re.M)
    assert flashmsa.__version__ == version
    # The installed distribution's metadata comes from the same line (regex metadata provider).
    assert importlib.metadata.version("flashmsa") == version
    # pyproject.toml and CMakeLists.txt state no version of their own.
    assert re.search(r'^version\s*=', (ROOT / "pyproject.toml").read_text(), re.M) is None
    assert "project(flashmsa VERSION ${flashmsa_version}" in (ROOT / "CMakeLists.txt").read_text()


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"flashmsa {flashmsa.__version__}"


def test_cli_info_reports_the_build(capsys):
    import json

    import torch

    assert cli.main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    build = info["build"]
    assert build["version"] == flashmsa.__version__
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?|unknown", build["git_commit"]), build["git_commit"]
    assert build["cuda_kernels"] == flashmsa.built_with_cuda() == info["built_with_cuda"]
    # Architectures and toolkit exactly when the kernels were compiled.
    assert bool(build["cuda_architectures"]) == build["cuda_kernels"]
    assert (build["cuda_toolkit"] is not None) == build["cuda_kernels"]
    for arch in build["cuda_architectures"]:
        assert re.fullmatch(r"[0-9]+[af]?(-real|-virtual)?", arch), arch
    # The extension was compiled against the torch it runs with (scripts/setup.sh builds without
    # isolation); an isolated build against another torch would show here.
    assert build["torch"] == torch.__version__
    assert build["torch_cuda"] == torch.version.cuda

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

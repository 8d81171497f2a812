"""What vllm_ref.py and sglang_ref.py share: an engine's kernel files taken out of its wheel, a
Triton installed beside them, the Triton interpreter's autotuning cut to one configuration, and the
rows a ``check`` compares and prints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterable


def extract_from_wheel(package: str, version: str, site: Path,
                       keep: Callable[[str], bool]) -> list[str]:
    """Downloads ``package==version``'s wheel (``pip download --no-deps``) and copies the files
    ``keep`` accepts (wheel paths) under ``site``, which is emptied first; returns their paths."""
    shutil.rmtree(site, ignore_errors=True)
    kept = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "-d", tmp, f"{package}=={version}"], check=True)
        wheel = next(Path(tmp).glob(f"{package}-{version}-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if keep(name):
                    target = site / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(name))
                    kept.append(name)
    if not kept:
        raise RuntimeError(f"{package} {version}: none of the expected files in its wheel")
    return kept


def add_package_inits(root: Path) -> None:
    """An empty ``__init__.py`` in every directory under ``root`` that has none (the engine's own
    package ``__init__``s import the whole engine, so they are not taken)."""
    for directory, _, files in os.walk(root):
        if "__init__.py" not in files:
            Path(directory, "__init__.py").write_text("")


def load_site(path, package: str, modules: dict[str, str], marker: str, script: str):
    """The engine's modules ``modules`` (key -> module name) from what ``prepare`` put under
    ``path / "site"`` (``marker``: a file there that proves it), and the stand-in package's
    version, as a namespace. The stand-in ``package`` goes first on ``sys.path``: not for a process
    that has imported the real engine."""
    import importlib
    import types

    site = Path(path).resolve() / "site"
    if not (site / marker).exists():
        raise FileNotFoundError(f"{path}: no prepared {package} files (run {script} prepare)")
    real = sys.modules.get(package)
    if real is not None and not str(getattr(real, "__file__", "")).startswith(str(site)):
        raise RuntimeError(f"{script}: a {package} is already imported in this process")
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    version = importlib.import_module(package).__version__
    mods = {key: importlib.import_module(name) for key, name in modules.items()}
    return types.SimpleNamespace(version=version, **mods)


def install_triton(dest: Path, version: str) -> None:
    """``triton==version`` under ``dest / "triton"`` (for the interpreter a kernel needs)."""
    shutil.rmtree(dest / "triton", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(dest / "triton"), f"triton=={version}"], check=True)


def interpreter(dest: Path) -> None:
    """Triton's interpreter for what is imported next (``TRITON_INTERPRET=1``, set before the
    kernels are defined), with the Triton ``prepare`` installed under ``dest`` if there is one."""
    os.environ["TRITON_INTERPRET"] = "1"
    triton_dir = Path(dest).resolve() / "triton"
    if triton_dir.is_dir() and str(triton_dir) not in sys.path:
        sys.path.insert(0, str(triton_dir))


def first_configs(modules: Iterable[object], prefer: Callable[[object], bool] = lambda c: True) -> None:
    """The interpreter has no device to time configurations on: each autotuned kernel of these
    modules runs one configuration (they differ in warps, stages and tile sizes, not in what is
    computed), the first that ``prefer`` accepts (a ``triton.Config``), else its first."""
    from triton.runtime.autotuner import Autotuner

    for module in modules:
        for value in vars(module).values():
            while value is not None:  # under triton.heuristics wrappers too
                if isinstance(value, Autotuner):
                    value.configs = [next((c for c in value.configs if prefer(c)),
                                          value.configs[0])]
                value = getattr(value, "fn", None)


class Rows:
    """A check's comparisons: (case, what was compared, ok)."""

    def __init__(self, engine: str):
        self.engine = engine
        self.rows: list[tuple[str, str, bool]] = []

    def close(self, case, got, want, rtol, atol, mask=None):
        """``got`` (flashmsa's) within ``atol + rtol |want|`` of ``want`` (the engine's)."""
        if mask is not None:
            got, want = got[mask], want[mask]
        err = (got.double() - want.double()).abs()
        ok = bool((err <= atol + rtol * want.double().abs()).all()) and got.numel() > 0
        worst = float(err.max()) if got.numel() else float("nan")
        self.rows.append((case, f"{got.numel()} values, max |difference| {worst:.2e} (allowed "
                                f"{atol:g} + {rtol:g} |{self.engine}'s|)", ok))

    def equal(self, case, got, want):
        import torch

        ok = got.shape == want.shape and bool(torch.equal(got, want))
        self.rows.append((case, f"{got.shape[0] * got.shape[1] if got.dim() > 1 else got.numel()} "
                                f"rows, {'equal' if ok else 'differ'}", ok))

    def report(self, name: str) -> int:
        """Prints the rows; 0 when all agree, else 1."""
        width = max(len(case) for case, _, _ in self.rows)
        for case, what, ok in self.rows:
            print(f"{'ok  ' if ok else 'FAIL'} {case:<{width}}  {what}")
        failed = sum(not ok for _, _, ok in self.rows)
        print(f"{name} check: {len(self.rows) - failed} of {len(self.rows)} agree")
        return 1 if failed else 0


def sorted_sets(sel):
    """Selections as sorted rows (an engine's may come in score order; flashmsa's ascending),
    -1 padding last."""
    import torch

    key = torch.where(sel < 0, torch.iinfo(torch.int32).max, sel)
    return torch.sort(key, dim=-1).values

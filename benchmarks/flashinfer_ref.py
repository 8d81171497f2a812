"""FlashInfer's own MSA ops on Hopper as a measured reference for bench_msa.py (``--flashinfer``).

flashinfer-python 0.7.4 serves ``flashinfer.msa_ops`` on SM90 through two backends: generated CUDA
programs JIT-built with nvcc and loaded through TVM-FFI ("Cake"), and CuTe DSL kernels (which need
``nvidia-cutlass-dsl``, ~160 MB of wheels). Its own dispatch picks between them per shape. This
file prepares the first backend's part of the package for a machine without network access, and
bench_msa.py times FlashInfer's public functions on the same inputs as flashmsa's where they apply
(where FlashInfer's dispatch would take a CuTe DSL kernel that is not installed, the row is a SKIP
naming it).

    # on a machine with network access, from the repository root (~25 MB under .deps/flashinfer):
    python benchmarks/flashinfer_ref.py prepare --dest .deps/flashinfer --prebuild
    # then, where the benchmark runs (python3 of the target version):
    python benchmarks/bench_msa.py --quick --flashinfer .deps/flashinfer --stages decode

``prepare`` downloads the flashinfer-python and apache-tvm-ffi wheels (``pip download``), keeps of
the FlashInfer package the modules that ``flashinfer.msa_ops`` imports (their import closure, with
a package ``__init__`` that imports nothing else) and the Hopper MSA program sources, unpacks the
tvm-ffi wheel beside it, and with ``--prebuild`` compiles every Hopper MSA program for sm_90a with
this machine's nvcc into the package's AOT directory (FlashInfer loads those without building).
Nothing of it is part of flashmsa: it stays under the ignored ``.deps/``.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FLASHINFER_VERSION = "0.7.4"
TVM_FFI_VERSION = "0.1.15.post2"
ROOTS = ("flashinfer.msa_ops", "flashinfer.msa_ops.cake_hopper_sm90", "flashinfer.jit.cake_hopper_msa",
         "flashinfer.fi_trace")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def module_file(root: Path, module: str) -> Path | None:
    path = root.joinpath(*module.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None


def import_closure(root: Path, starts, stub_packages=("flashinfer",)) -> list[str]:
    """The flashinfer modules that ``starts`` import at module level (relative and absolute
    imports; the bodies of functions are not followed: their imports are lazy). The packages in
    ``stub_packages`` are kept without following their ``__init__``."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        path = module_file(root, module)
        if path is None or module in stub_packages:
            continue
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.parse(path.read_text()).body:
            nodes = [node]
            if isinstance(node, ast.Try):
                nodes = node.body + [n for h in node.handlers for n in h.body]
            elif isinstance(node, ast.If):
                nodes = node.body + node.orelse
            for n in nodes:
                if isinstance(n, ast.ImportFrom):
                    if n.level:
                        base = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                        target = ".".join(base + ([n.module] if n.module else []))
                    elif n.module.startswith("flashinfer"):
                        target = n.module
                    else:
                        continue
                    todo.append(target)
                    todo += [f"{target}.{a.name}" for a in n.names]
                elif isinstance(n, ast.Import):
                    todo += [a.name for a in n.names if a.name.startswith("flashinfer")]
    return sorted(m for m in seen if module_file(root, m) is not None)


def download(dest: Path, python_version: str) -> tuple[Path, Path]:
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", python_version, "--implementation", "cp", "-d", str(wheels)]
    for platform in PLATFORMS:
        base += ["--platform", platform]
    subprocess.run(base + [f"flashinfer-python=={FLASHINFER_VERSION}",
                           f"apache-tvm-ffi=={TVM_FFI_VERSION}"], check=True)
    fi = next(wheels.glob(f"flashinfer_python-{FLASHINFER_VERSION}-*.whl"))
    tvm = next(wheels.glob("apache_tvm_ffi-*.whl"))
    return fi, tvm


def extract(fi_wheel: Path, tvm_wheel: Path, dest: Path) -> int:
    """The pruned package and tvm-ffi under dest/site; returns the number of modules kept."""
    site = dest / "site"
    shutil.rmtree(site, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(fi_wheel) as z:
            z.extractall(tmp, [n for n in z.namelist() if n.startswith("flashinfer/")
                               and (n.endswith(".py") or "/data/csrc/cake_hopper_msa/" in n)])
        full = Path(tmp)
        modules = import_closure(full, ROOTS)
        for module in modules:
            src = module_file(full, module)
            dst = site / src.relative_to(full)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        for directory, _, files in os.walk(site / "flashinfer"):
            if "__init__.py" not in files:
                Path(directory, "__init__.py").touch()
        shutil.copytree(full / "flashinfer/data/csrc/cake_hopper_msa",
                        site / "flashinfer/data/csrc/cake_hopper_msa")
    # The package's own __init__ imports every FlashInfer module (and their dependencies): this
    # one makes `import flashinfer.msa_ops` import only what msa_ops needs.
    (site / "flashinfer/__init__.py").write_text(
        "# Pruned by flashmsa's benchmarks/flashinfer_ref.py: only flashinfer.msa_ops.\n"
        "from .version import __version__, __git_version__\n")
    with zipfile.ZipFile(tvm_wheel) as z:
        z.extractall(site)
    return len(modules)


def _build_one(name: str) -> str:
    from flashinfer.jit import cake_hopper_msa as programs
    from flashinfer.jit import env

    spec = programs.gen_hopper_msa_module(name)
    spec.build()
    aot = env.FLASHINFER_AOT_DIR / spec.name
    aot.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, aot / f"{spec.name}.so")
    return spec.name


def prebuild(dest: Path, jobs: int) -> int:
    """Every Hopper MSA program compiled for sm_90a into the package's AOT directory.

    Runs FlashInfer's own JIT build (ninja, nvcc), one process per program, with the pruned
    package and a tvm-ffi this interpreter can import (pip-installed into a scratch directory
    ahead of the unpacked one when that is for another Python version)."""
    site = dest / "site"
    env = dict(os.environ, FLASHINFER_CUDA_ARCH_LIST="9.0a",
               FLASHINFER_WORKSPACE_BASE=str(dest / "workspace"), PYTHONPATH=str(site))
    script = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        if subprocess.run([sys.executable, "-c", "import tvm_ffi"], env=env,
                          capture_output=True).returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", tmp,
                            f"apache-tvm-ffi=={TVM_FFI_VERSION}", "filelock", "nvidia-ml-py"],
                           check=True)
            env["PYTHONPATH"] = os.pathsep.join([tmp, str(site)])
        names = subprocess.run(
            [sys.executable, "-c",
             "from flashinfer.jit import cake_hopper_msa as p; print(' '.join(sorted(p.MODULES)))"],
            env=env, check=True, capture_output=True, text=True).stdout.split()

        def one(name):
            subprocess.run([sys.executable, str(script), "_build", name], env=env, check=True,
                           capture_output=True, text=True)
            return name
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            built = list(pool.map(one, names))
    shutil.rmtree(dest / "workspace", ignore_errors=True)
    return len(built)


def load(path) -> tuple:
    """(flashinfer.msa_ops, version) of the FlashInfer that ``prepare`` put under ``path``."""
    site = Path(path).resolve() / "site"
    if not (site / "flashinfer" / "msa_ops").is_dir():
        raise FileNotFoundError(f"{path}: no prepared FlashInfer (run flashinfer_ref.py prepare)")
    sys.path.insert(0, str(site))
    import flashinfer
    import flashinfer.msa_ops as msa_ops

    if flashinfer.__version__ != FLASHINFER_VERSION:
        raise RuntimeError(f"{path}: FlashInfer {flashinfer.__version__}, not {FLASHINFER_VERSION}")
    return msa_ops, flashinfer.__version__


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="download and prune FlashInfer's msa_ops (see above)")
    prep.add_argument("--dest", type=Path, default=Path(".deps/flashinfer"))
    prep.add_argument("--python-version", default="3.12",
                      help="of the interpreter that will import it (the tvm-ffi wheel's)")
    prep.add_argument("--prebuild", action="store_true",
                      help="compile the Hopper MSA programs here (nvcc), so none builds there")
    prep.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    build = sub.add_parser("_build")  # one program, in a process of its own (prepare --prebuild)
    build.add_argument("name")
    args = ap.parse_args(argv)
    if args.cmd == "_build":
        print(_build_one(args.name))
        return 0
    dest = args.dest.resolve()
    fi, tvm = download(dest, args.python_version)
    kept = extract(fi, tvm, dest)
    print(f"flashinfer_ref: {kept} FlashInfer modules and tvm-ffi under {dest / 'site'}")
    if args.prebuild:
        built = prebuild(dest, args.jobs)
        print(f"flashinfer_ref: {built} Hopper MSA programs built into the package's AOT directory")
    shutil.rmtree(dest / "wheels", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Post-build check of a freshly linked flashmsa._C (run by CMake; not part of the package).

Usage: python check_module.py <path to _C.so>

1. The module loads next to torch (no undefined symbols).
2. A call the binding rejects raises ValueError with the whole message, numbers included. The call
   runs in a child process: a module that carries its own copy of the C++ runtime crashes there (or
   loses the message's tail) instead of raising, and the build should say so rather than die.
"""

import importlib.util
import subprocess
import sys

EXPECTED = "msa_topk_select: max_score must have at most 4 dims, got 5-D"


def load(path):
    import torch  # noqa: F401  (the module links against torch's libraries)

    spec = importlib.util.spec_from_file_location("flashmsa._C", path)
    module = importlib.util.module_from_spec(spec)  # dlopen + PyInit: registers the ops
    return module


def child(path):
    import torch

    load(path)
    try:
        torch.ops.flashmsa.topk_select(torch.zeros(1, 1, 1, 1, 1), 1, None, None, 0, 0,
                                       torch.zeros(1, 1, 1, dtype=torch.int32))
    except ValueError as e:
        message = str(e).splitlines()[0] if str(e) else ""
        if message != EXPECTED:
            sys.exit(f"expected the message {EXPECTED!r}, got {message!r}")
        return
    sys.exit("a 5-D max_score was accepted")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    path = sys.argv[1]
    load(path)
    r = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True)
    if r.returncode != 0:
        how = f"died with signal {-r.returncode}" if r.returncode < 0 else "failed"
        sys.exit(f"check_module: {path}: formatting an error message {how}:\n{r.stderr.strip()}\n"
                 "The module probably carries its own C++ runtime (libstdc++ linked statically): "
                 "see bindings/torch/CMakeLists.txt.")
    print(f"check_module: {path}: imports and raises formatted errors")


if __name__ == "__main__":
    main()

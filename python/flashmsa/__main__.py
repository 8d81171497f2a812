"""Command line: ``python -m flashmsa demo [options]`` (also the ``flashmsa`` console script).

    flashmsa demo                      # the MSA pipeline on the default problem (CUDA if present)
    flashmsa demo --device cpu --seqlen 2048 --layout paged --kv-dtype fp8 --json
    flashmsa info                      # build and device information
    flashmsa --version
"""

import argparse
import json
import sys
from typing import List, Optional

from ._version import __version__


def _info() -> dict:
    import torch

    import flashmsa
    from flashmsa._build_info import BUILD_INFO

    cuda = torch.cuda.is_available()
    return {
        "flashmsa": flashmsa.__version__,
        "torch": torch.__version__,
        "built_with_cuda": flashmsa.built_with_cuda(),
        # Baked in at build time (bindings/torch/build_info.py.in): the commit, the compiled CUDA
        # architectures, the CUDA toolkit and the torch the extension was compiled against.
        "build": BUILD_INFO,
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda else [],
    }


def main(argv: Optional[List[str]] = None) -> int:
    from . import demo

    parser = argparse.ArgumentParser(
        prog="flashmsa", description="flashmsa: MiniMax Sparse Attention ops (drop-in for "
        "flashinfer.msa_ops).")
    parser.add_argument("--version", action="version", version=f"flashmsa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{demo,info}")
    demo_parser = sub.add_parser(
        "demo", help="run proxy score -> top-k -> sparse attention on a synthetic M3 problem",
        description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(demo_parser)
    sub.add_parser("info", help="print build information (commit, CUDA architectures and toolkit, "
                   "build-time torch) and the devices, as JSON")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.main(args, demo_parser)
    if args.command == "info":
        print(json.dumps(_info(), indent=2))
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())

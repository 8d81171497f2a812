#!/usr/bin/env python3
"""The positive control of a compute-sanitizer initcheck run: a flashmsa kernel that reads device
memory nothing wrote must be reported, else the run checked nothing.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool initcheck python3 \
        tests/sanitizer/initcheck_control.py

`msa_topk_select` over a score tensor from `torch.empty` (without the caching allocator, a fresh
cudaMalloc that no kernel or copy has written): initcheck must report "Uninitialized __global__
memory read" in a kernel of namespace flashmsa. scripts/gpu_check.sh runs it with every initcheck
step and fails the step when it is not reported. Exit status 0 when the op ran (its values are
garbage by construction and not looked at).
"""

import torch
from flashmsa import msa_ops


def main() -> int:
    if not torch.cuda.is_available():
        print("initcheck_control: no CUDA device")
        return 2
    scores = torch.empty(4, 512, 64, dtype=torch.float32, device="cuda")  # never written
    out = msa_ops.msa_topk_select(scores, 16, num_valid_pages=512)
    torch.cuda.synchronize()
    print(f"initcheck_control: msa_topk_select ran over uninitialized scores, output {tuple(out.shape)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Random bad input: each op's valid baseline call (test_validation.py's) with one or two random
mutations of its arguments (another dtype, a dimension dropped, added, shortened or doubled, a
strided or empty view, an index value out of range or a cumulative-length tensor out of order,
a Python value of the wrong kind or out of range; on the GPU also a tensor moved to the CPU),
called on the CPU (the reference) and on the GPU (the CUDA build's checks and kernels). The call
either works or raises FlashInfer's classes for bad input (ValueError, NotSupportedError,
TypeError) with a message naming the op or an argument; anything else (an IndexError, a
RuntimeError from torch or the core's internals, a crash, on the GPU a kernel's fault) fails.
Seeded: a failure prints the device, the op, the seed and the mutations, and
`test_mutation[<device>-<op>-<seed>]` reruns it. test_validation.py pins each documented error
exactly; this one searches the space around the baselines for paths those cases do not name.
Not ``cpu_only``: an argument-validation test runs in the GPU suite too (conftest.py)."""

import random
import re

import pytest
import torch

from conftest import ALL_DEVICES
from flashmsa.errors import NotSupportedError
from test_validation import OPS

FP8 = torch.float8_e4m3fn
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
          FP8, torch.bool)
CASES_PER_OP = 250
# Every op's Python name and every argument name any op takes: a message names one of them.
NAMES = ("msa_", "q", "k", "v", "q2k_indices", "cu_seqlens_q", "cu_seqlens_k", "page_table",
         "seqused_k", "max_score", "topk", "num_valid_pages", "output", "out", "k_scale",
         "v_scale", "q_offset", "seqlen_q", "softmax_scale", "workspace")


def _random_index(t: torch.Tensor):
    return tuple(random.randrange(n) for n in t.shape)


def _tensor_mutations(t: torch.Tensor):
    """(description, new value) pairs for a tensor argument."""
    out = [(f"dtype {d}", lambda t=t, d=d: t.to(d)) for d in DTYPES if d != t.dtype]
    out += [("None", lambda: None), ("int 3", lambda: 3),
            ("list", lambda t=t: t.tolist() if t.numel() < 64 else [1, 2, 3])]
    if t.dim() >= 1 and t.shape[-1] > 0:
        out.append(("drop last dim", lambda t=t: t[..., 0]))
    if t.dim() >= 1:
        out += [("empty", lambda t=t: t[:0]), ("add leading dim", lambda t=t: t.unsqueeze(0)),
                ("double dim 0", lambda t=t: torch.cat([t, t])),
                ("step-2 view of dim 0", lambda t=t: t[::2])]
        if t.shape[-1] > 1:
            out.append(("last dim one shorter", lambda t=t: t[..., :-1]))
    if t.dim() >= 2:
        out.append(("transpose last two dims", lambda t=t: t.transpose(-1, -2)))
    if t.is_cuda:
        out.append(("on the CPU", lambda t=t: t.cpu()))
    if t.dtype in (torch.int32, torch.int64) and t.numel() > 0:
        for v in (-7, 2**31 - 1, -(2**31), 10**6):
            def poke(t=t, v=v):
                u = t.clone()  # the same strides
                u[_random_index(u)] = v
                return u
            out.append((f"an element set to {v}", poke))
        out.append(("flipped", lambda t=t: t.flip(-1)))
    if t.is_floating_point() and t.numel() > 0:
        def nan(t=t):
            u = t.clone()
            u[_random_index(u)] = float("nan")
            return u
        out.append(("a NaN element", nan))
    return out


def _scalar_mutations(x):
    return [(f"value {v!r}", lambda v=v: v)
            for v in (-1, 0, 10**6, -(10**9), 2**40, 1.5, float("nan"), float("inf"), "x", None,
                      True, [1])
            if v is not x]


def _mutate(args: dict, rng: random.Random):
    """Applies one random mutation to one random argument; returns its description."""
    name = rng.choice(sorted(args))
    value = args[name]
    options = (_tensor_mutations(value) if isinstance(value, torch.Tensor)
               else _scalar_mutations(value))
    what, make = rng.choice(options)
    args[name] = make()
    return f"{name}: {what}"


def _cases():
    for op in sorted(OPS):
        for i in range(CASES_PER_OP):
            yield op, 1000 * (1 + sorted(OPS).index(op)) + i


@pytest.mark.parametrize("op,seed", list(_cases()), ids=lambda x: str(x))
@pytest.mark.parametrize("device", ALL_DEVICES)
def test_mutation(device, op, seed):
    fn, baseline = OPS[op]
    rng = random.Random(seed)
    random.seed(seed)  # the element pokes
    torch.manual_seed(seed)
    args = {name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in baseline().items()}
    done = [_mutate(args, rng) for _ in range(1 + (rng.random() < 0.3))]
    try:
        fn(**args)
    except (ValueError, TypeError) as err:  # NotSupportedError is a ValueError
        if isinstance(err, NotImplementedError):
            assert isinstance(err, NotSupportedError), (done, repr(err))
        message = str(err)
        assert any(re.search(rf"\b{n}", message) for n in NAMES), (done, message)
    except Exception as err:  # noqa: BLE001: any other class is the finding
        pytest.fail(f"{device} {op} seed {seed} with {done}: {type(err).__name__}: {err}")
    if device == "cuda":
        torch.cuda.synchronize()  # a kernel's fault surfaces here, naming this case

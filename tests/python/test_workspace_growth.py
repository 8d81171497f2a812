"""How the attention ops grow a caller's workspace (msa_ops._run_with_workspace), without a GPU: the
native op is replaced by a fake that reports a short workspace the way the core does, so that the
grow-and-retry path, what it leaves alone and its contract with the binding's message are tested
on any machine. The GPU side (the real core, CUDA-graph capture) is test_gpu_graphs.py's
test_workspace_grows_once_and_capture_refuses_growth. ``cpu_only`` (conftest.py)."""

import pathlib

import pytest
import torch

from conftest import cpu_only
from flashmsa import msa_ops

pytestmark = cpu_only

ROOT = pathlib.Path(__file__).resolve().parents[2]


class FakeOp:
    """Plays a native attention op that needs `need` bytes: a shorter workspace gets the core's
    error (bindings/torch/ops.cpp, provide_workspace) and runs nothing."""

    def __init__(self, need: int, message: str = None):
        self.need, self.message, self.calls = need, message, []

    def __call__(self, *args):
        scratch = args[-2]
        self.calls.append(None if scratch is None else scratch.numel())
        have = 0 if scratch is None else scratch.numel()
        if scratch is not None and have < self.need:
            raise ValueError(self.message or (
                f"msa_sparse_decode_attention: workspace holds {have} bytes but this call needs "
                f"{self.need} bytes; grow it (MSASparseAttentionWorkspace.reserve) before CUDA-graph capture"))


def test_a_short_workspace_grows_once_and_the_call_runs_again():
    ws = msa_ops.MSASparseAttentionWorkspace("cpu")
    op = FakeOp(4096)
    scratch = msa_ops._run_with_workspace(op, ("args",), ws, "")
    assert op.calls == [0, ws.nbytes] and ws.nbytes >= 4096 and scratch is ws.buffer
    grown = ws.buffer
    assert msa_ops._run_with_workspace(op, ("args",), ws, "") is grown
    assert op.calls[2:] == [grown.numel()]  # a warm workspace: one call, no second planning pass


def test_no_workspace_runs_once_without_scratch():
    op = FakeOp(4096)
    assert msa_ops._run_with_workspace(op, ("args",), None, "") is None
    assert op.calls == [None]


@pytest.mark.parametrize("message", [
    "msa_sparse_decode_attention: q2k_indices must be int32",  # any other ValueError
    "msa_sparse_decode_attention: workspace holds 7 bytes but this call needs 4096 bytes",  # not this buffer
])
def test_other_errors_pass_through(message):
    ws = msa_ops.MSASparseAttentionWorkspace("cpu")
    op = FakeOp(4096, message)
    with pytest.raises(ValueError, match="msa_sparse_decode_attention") as e:
        msa_ops._run_with_workspace(op, ("args",), ws, "")
    assert str(e.value) == message and op.calls == [0] and ws.nbytes == 0


def test_the_binding_writes_the_message_the_wrapper_reads():
    """The wrapper recognizes the core's short-workspace error by its text: the binding's message
    must keep the pieces msa_ops._WORKSPACE_SHORT matches."""
    src = (ROOT / "bindings" / "torch" / "ops.cpp").read_text()
    assert '": workspace holds "' in src and '" bytes but this call needs "' in src, \
        "provide_workspace's message changed: update msa_ops._WORKSPACE_SHORT"
    text = ("msa_sparse_attention: workspace holds 0 bytes but this call needs 123 bytes; grow it "
            "(MSASparseAttentionWorkspace.reserve) before CUDA-graph capture")
    m = msa_ops._WORKSPACE_SHORT.search(text)
    assert m is not None and (m.group(1), m.group(2)) == ("0", "123")

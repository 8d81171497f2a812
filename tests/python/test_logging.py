"""FLASHMSA_LOG and the plan log (flashmsa._log): levels from the environment, one record per
distinct call shape; end to end (a subprocess), the plan line of each op. The end-to-end test runs
CPU tensors only: ``cpu_only`` (conftest.py), left to CI by the GPU check.""" 
import logging
import os
import subprocess
import sys

import pytest
import torch

from conftest import cpu_only
from flashmsa import _log


@pytest.fixture
def fresh_logger():
    saved = (_log.logger.level, _log.logger.propagate, list(_log.logger.handlers), _log._handler)
    _log.reset_seen()
    yield _log.logger
    _log.logger.setLevel(saved[0])
    _log.logger.propagate = saved[1]
    _log.logger.handlers[:] = saved[2]
    _log._handler = saved[3]
    _log.reset_seen()


@pytest.mark.parametrize("value,level", [("info", logging.INFO), ("DEBUG", logging.DEBUG),
                                         (" warning ", logging.WARNING), ("off", _log._OFF)])
def test_configure_levels(fresh_logger, value, level):
    assert _log.configure(value) == level
    assert fresh_logger.level == level
    assert _log._handler in fresh_logger.handlers and fresh_logger.propagate is False


def test_configure_unset_or_unknown_leaves_logger_alone(fresh_logger, capsys):
    level = fresh_logger.level
    assert _log.configure("") is None
    assert _log.configure("loud") is None
    assert "FLASHMSA_LOG='loud' ignored" in capsys.readouterr().err
    assert fresh_logger.level == level


def test_plan_logs_once_per_key(fresh_logger, caplog):
    fresh_logger.propagate = True  # let caplog see the records
    fresh_logger.setLevel(logging.INFO)
    calls = []

    def describe():
        calls.append(1)
        return "kernel=x (why)"
    key = (("q", _log.tensor_key(torch.zeros(2, 3))), ("causal", True))
    with caplog.at_level(logging.INFO, logger="flashmsa"):
        for _ in range(3):
            _log.plan("msa_op", key, describe)
        _log.plan("msa_op", (("q", _log.tensor_key(torch.zeros(4, 3))),), describe)
        _log.plan("msa_op", key, lambda: 1 / 0)  # already seen: not even described
    records = [r.getMessage() for r in caplog.records if r.name == "flashmsa"]
    assert records == ["msa_op(q=[2, 3] float32 cpu, causal=True): kernel=x (why)",
                       "msa_op(q=[4, 3] float32 cpu): kernel=x (why)"]
    assert len(calls) == 2


def test_plan_silent_below_info_and_survives_a_failing_description(fresh_logger, caplog):
    fresh_logger.propagate = True
    fresh_logger.setLevel(logging.WARNING)
    _log.plan("msa_op", (("n", 1),), lambda: pytest.fail("described while not logging"))
    fresh_logger.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger="flashmsa"):
        _log.plan("msa_op", (("n", 2),), lambda: 1 / 0)
    assert "no plan description: ZeroDivisionError" in caplog.records[-1].getMessage()


def test_tensor_key_names_strided_layouts():
    t = torch.zeros(4, 6)[:, ::2]
    assert _log.tensor_key(t) == ((4, 3), "float32", "cpu", "strides (6, 2)")
    assert "(strides (6, 2))" in _log.format_key((("k", _log.tensor_key(t)),))


E2E = r"""
import torch
from flashmsa import msa_ops
from flashmsa.testing import cu_seqlens
q, k = torch.randn(300, 2, 128).bfloat16(), torch.randn(300, 1, 128).bfloat16()
cu = cu_seqlens([300], "cpu")
for _ in range(2):
    s = msa_ops.msa_proxy_score(q, k, cu, cu, causal=True)
    sel = msa_ops.msa_topk_select(s, 2)
    q2k = sel.transpose(0, 1)[:1].contiguous()
    kv = torch.randn(300, 1, 128).bfloat16()
    msa_ops.msa_sparse_attention(q, kv, kv, q2k, cu, cu, causal=True)
msa_ops.msa_topk_select(s[:, :, :100].contiguous(), 2)
"""


@cpu_only
def test_each_op_logs_its_plan_once_per_shape():
    env = dict(os.environ, FLASHMSA_LOG="info", FLASHMSA_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", E2E], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("flashmsa INFO: ")]
    ops = [line.split(": ", 1)[1].split("(", 1)[0] for line in lines]
    assert ops == ["msa_proxy_score", "msa_topk_select", "msa_sparse_attention",
                   "msa_topk_select"], r.stderr
    assert "max_score=[2, 3, 300] float32 cpu" in lines[1]
    assert "max_score=[2, 3, 100] float32 cpu" in lines[3]
    assert all("the exact C++ reference runs" in line for line in lines)
    quiet = subprocess.run([sys.executable, "-c", E2E], capture_output=True, text=True,
                           env=dict(env, FLASHMSA_LOG=""), timeout=300)
    assert quiet.returncode == 0 and "flashmsa INFO" not in quiet.stderr

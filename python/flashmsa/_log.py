"""flashmsa's logger (``logging.getLogger("flashmsa")``) and the plan log.

``FLASHMSA_LOG`` (read once, at import) sets its level: ``debug``, ``info``, ``warning``, ``error``
or ``off``; flashmsa then writes its records to stderr itself (``flashmsa INFO: ...``). Unset, the
logger is left to the application's ``logging`` configuration (nothing is printed by default).

At ``info``, each op logs, once per distinct call shape (tensor shapes, dtypes, devices and layout,
and the arguments that change the plan), the plan the core made: which kernel and schedule run
and why (``describe(plan)`` in include/flashmsa/plan_describe.h).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Callable, Hashable, Optional

logger = logging.getLogger("flashmsa")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR}
_OFF = logging.CRITICAL + 10
_handler: Optional[logging.Handler] = None
_seen: set = set()
_lock = threading.Lock()


def configure(value: Optional[str] = None) -> Optional[int]:
    """Apply a FLASHMSA_LOG value (default: the environment's). Returns the level set, or None when
    the value is empty (logger left alone) or unknown (a warning on stderr, logger left alone)."""
    global _handler
    if value is None:
        value = os.environ.get("FLASHMSA_LOG", "")
    text = value.strip().lower()
    if not text:
        return None
    if text in ("off", "none", "0"):
        level = _OFF
    elif text in _LEVELS:
        level = _LEVELS[text]
    else:
        print(f"flashmsa: FLASHMSA_LOG={value!r} ignored: use debug, info, warning, error or off",
              file=sys.stderr)
        return None
    logger.setLevel(level)
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("flashmsa %(levelname)s: %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False  # the application's handlers would print it a second time
    return level


def reset_seen() -> None:
    """Forget which call shapes were logged (tests)."""
    with _lock:
        _seen.clear()


def _first_time(key: Hashable) -> bool:
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def tensor_key(t) -> tuple:
    """What of a tensor argument can change a plan: shape, dtype, device, layout."""
    if t is None:
        return ()
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type,
            "contiguous" if t.is_contiguous() else f"strides {tuple(t.stride())}")


def format_key(key: tuple) -> str:
    parts = []
    for name, value in key:
        if isinstance(value, tuple) and len(value) == 4 and isinstance(value[0], tuple):
            shape, dtype, device, layout = value
            text = f"{name}={list(shape)} {dtype} {device}"
            if layout != "contiguous":
                text += f" ({layout})"
        else:
            text = f"{name}={value}"
        parts.append(text)
    return ", ".join(parts)


def plan(op: str, key: tuple, describe: Callable[[], str]) -> None:
    """Log ``describe()`` at INFO the first time ``op`` runs with ``key`` ((name, value) pairs)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    import torch
    if torch.compiler.is_compiling():  # traced calls run with fake tensors: nothing to plan
        return
    if not _first_time((op, key)):
        return
    try:
        text = describe()
    except Exception as e:  # the op itself succeeded; a description must never fail it
        text = f"(no plan description: {type(e).__name__}: {e})"
    logger.info("%s(%s): %s", op, format_key(key), text)


_NOT_KEYS = {"output", "out", "lse", "lse_t", "workspace"}  # outputs and scratch: no plan input
_arg_names: dict = {}


def log_plan(op: str, describe_op, args: tuple) -> None:
    """Log, at INFO, the plan of an op call that just ran, once per distinct call shape: the key is
    the call's arguments (tensors by shape, dtype, device and layout; outputs left out), the text
    the core's ``<op>_describe`` (``describe_op``, the same arguments) returns."""
    import torch
    if torch.compiler.is_compiling():  # first: a traced call must not reach the logger at all
        return
    if not logger.isEnabledFor(logging.INFO):
        return
    names = _arg_names.get(describe_op)
    if names is None:
        names = _arg_names[describe_op] = [a.name for a in describe_op.default._schema.arguments]
    key = []
    for name, value in zip(names, args):
        if name in _NOT_KEYS or value is None:
            continue
        if isinstance(value, torch.Tensor):
            key.append((name, tensor_key(value)))
        elif not (isinstance(value, str) and not value):
            key.append((name, value))
    plan(op, tuple(key), lambda: describe_op(*args))


configure()

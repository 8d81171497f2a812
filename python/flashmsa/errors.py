"""Exceptions of flashmsa beyond Python's own.

Bad arguments raise ``ValueError`` naming the argument (``TypeError`` for a wrong Python type), as
FlashInfer's ops do. Input that FlashInfer would accept but flashmsa does not support (``topk > 64``,
``lse_temperature_scale <= 0`` with a temperature LSE, CUDA tensors in a build without kernels)
raises :class:`NotSupportedError`, which is both: code written for FlashInfer that catches
``ValueError`` catches it, and so does code that catches ``NotImplementedError``.
"""

__all__ = ["NotSupportedError"]


class NotSupportedError(ValueError, NotImplementedError):
    """An input flashmsa does not support (a declared limit, not a malformed argument)."""

"""Adapters that put flashmsa behind other projects' MSA entry points.

* :mod:`flashmsa.integrations.vllm`: vLLM's MiniMax-M3 sparse-attention ops (same signatures, layouts
  and results), and :func:`flashmsa.integrations.vllm.patch` to swap them into vLLM.
"""

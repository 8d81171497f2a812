"""Adapters that put flashmsa behind other projects' MSA entry points.

* :mod:`flashmsa.integrations.vllm`: vLLM's MiniMax-M3 sparse-attention ops (same signatures, layouts
  and results), and :func:`flashmsa.integrations.vllm.patch` to swap them into vLLM.
* :mod:`flashmsa.integrations.sglang`: SGLang's MiniMax-M3 MSA hook (step 3, the attention) and its
  indexer's entry points (same signatures, layouts and results), and
  :func:`flashmsa.integrations.sglang.patch` to swap them into SGLang.
"""

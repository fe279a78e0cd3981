"""Evaluation. ``grpolab.eval.metrics`` is pure Python; keep this package import-light (no torch models,
transformers or matplotlib here)."""

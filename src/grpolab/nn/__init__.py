"""Low-level torch modules installed into a loaded model (``grpolab.models``); they import only torch.

``chunked_head``: the LM head that computes per-token log-probs and entropies chunk by chunk, without
the full ``[n, T, V]`` logits. It sits here, below ``models.py`` and the trainer, so that loading a model
imports nothing of ``grpolab.training``.
"""

"""Rollout: samplers that turn prompt token ids into groups of completions, and the engines that build them.

The contract is ``rollout.base.Sampler``; ``rollout.engines`` chooses the engine (``rollout.engine``,
``rollout.mode``) from one dict. Nothing is imported here, so that ``import grpolab.rollout.hf`` loads the
hf engine alone, not vLLM's client and the rewards it bounds its calls with.
"""

"""Rollout: samplers that turn prompt token ids into groups of completions."""

from grpolab.rollout.base import Sampler
from grpolab.rollout.hf import HFSampler

__all__ = ["HFSampler", "Sampler"]

"""Rollout: samplers that turn prompt token ids into groups of completions, and the engines that build them."""

from grpolab.rollout.base import Sampler
from grpolab.rollout.engines import ENGINES, build_sampler
from grpolab.rollout.hf import HFSampler

__all__ = ["ENGINES", "HFSampler", "Sampler", "build_sampler"]

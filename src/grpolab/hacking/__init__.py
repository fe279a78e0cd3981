"""``grpolab hacking``: does optimising a proxy reward raise a gold reward, or hack the proxy? (arXiv 2210.10760)."""

from grpolab.hacking.run import HackingResult, grid_configs, hacking

__all__ = ["HackingResult", "grid_configs", "hacking"]

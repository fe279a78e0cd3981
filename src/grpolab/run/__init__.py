"""The run around the algorithm: its assembly, run directory checks, checkpoints, logging, progress, signals.

``assemble.py`` reads a config into a working run (models, reference, rewards, data, sampler, optimizer,
resume point) in one step, for ``train``, ``sft`` and ``eval`` alike. ``grpolab.training`` holds the
algorithm (batches, log-probs, the policy and value updates, the loop that drives them); this package
holds the plumbing a run needs whatever the algorithm, and decides for itself what only one process of a
distributed job should write.
"""

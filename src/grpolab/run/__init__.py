"""The run around the algorithm: run directory checks, checkpoints, logging, progress, signals, run info.

``grpolab.train`` holds the algorithm (batches, log-probs, the policy and value updates, the loop that
drives them); this package holds the plumbing a run needs whatever the algorithm, and decides for
itself what only one process of a distributed job should write.
"""

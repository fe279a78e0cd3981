"""The run around the algorithm: assembly, preflight checks, checkpoints, resume, the run-dir lock, guards, logging, trackers, progress."""

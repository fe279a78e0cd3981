"""Cost of running a reward in its worker process (rewards.worker) against calling it in the trainer.

``python benchmarks/reward_worker_overhead.py [calls]``: microseconds per ``score_batch`` call of a
trivial per-sample reward, called directly (no timeout), in a thread (``in_process = True``, the
path before workers) and in its worker, for one short row and for 64 rows of 2000 characters with
500 token ids each; then the first call of a new reward (the fork).
"""

from __future__ import annotations

import sys
import time

from grpolab.rewards import WeightedReward, per_sample, score_batch
from grpolab.types import Completion, Example

MODES = {"direct (no timeout)": None, "thread (in_process)": 5.0, "worker process": 5.0}


def per_call_us(rows: int, chars: int, mode: str, calls: int) -> float:
    reward = per_sample(lambda completion, example: 1.0, name="trivial")
    reward.in_process = mode.startswith("thread")
    weighted = WeightedReward(reward)
    completions = [Completion("x" * chars, chars, "stop", tuple(range(chars // 4))) for _ in range(rows)]
    examples = [Example("What is " + "q" * 200, "42", meta={"row": {"prompt": "p" * 200}}) for _ in range(rows)]
    score_batch([weighted], completions, examples, timeout_s=MODES[mode])  # the worker starts here
    start = time.perf_counter()
    for _ in range(calls):
        score_batch([weighted], completions, examples, timeout_s=MODES[mode])
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    for rows, chars in ((1, 100), (64, 2000)):
        for mode in MODES:
            print(f"rows={rows:3d} chars={chars:5d} {mode:22s} {per_call_us(rows, chars, mode, calls):9.1f} us/call")
    start = time.perf_counter()
    for _ in range(20):
        weighted = WeightedReward(per_sample(lambda completion, example: 1.0, name="fresh"))
        score_batch([weighted], [Completion("x", 1)], [Example("q")], timeout_s=5.0)
        del weighted
    print(f"first call of a new reward (fork, call, then kill and reap): {(time.perf_counter() - start) / 20 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()

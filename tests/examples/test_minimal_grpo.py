"""examples/minimal_grpo.py runs as a script, takes its arguments, prints a finite reward per step, and
needs nothing of grpolab above the rollout layer (no runtime, commands, training or rewards)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"
# Run the script as __main__, then report which grpolab packages it loaded (on stderr, after its output).
DRIVER = """import runpy, sys
script, *args = sys.argv[1:]
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
print("LOADED", *sorted({".".join(m.split(".")[:2]) for m in sys.modules if m.startswith("grpolab.")}), file=sys.stderr)
"""
ABOVE_THE_MATH = {f"grpolab.{p}" for p in ("data", "rewards", "training", "eval", "runtime", "commands", "trl")}


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_a_few_steps_print_a_finite_reward_each():
    done = run("--steps", "3", "--prompts", "2", "--group", "4", "--mu", "2")
    assert done.returncode == 0, done.stderr
    header, *rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert header == ["iter", "step", "reward", "kl", "loss", "clip", "zero_std"]
    assert [row[:2] for row in rows] == [["1", "1"], ["1", "2"], ["1", "3"]]  # --steps 3: three rows
    numbers = [[float(x) for x in row[2:]] for row in rows]
    assert all(math.isfinite(x) for row in numbers for x in row)
    rewards = [row[header.index("reward") - 2] for row in numbers]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    kls = [row[header.index("kl") - 2] for row in numbers]
    assert kls[-1] > 0.0  # the reference is the initial policy, and the policy has moved away from it

    loaded = next(line.split()[1:] for line in done.stderr.splitlines() if line.startswith("LOADED"))
    assert "grpolab.algo" in loaded and "grpolab.rollout" in loaded
    assert ABOVE_THE_MATH.isdisjoint(loaded)

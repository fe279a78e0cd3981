"""The optimizer's lr schedule rebuilt after a state load (training/optim.py)."""

from __future__ import annotations

import pytest
import torch

from grpolab.config import OptimConfig
from grpolab.training.optim import apply_optim_config, build_optimizer


def test_apply_optim_config_rebases_the_schedule_on_the_new_lr():
    model = torch.nn.Linear(2, 1)
    old = OptimConfig(lr=1e-3, schedule="linear")
    opt, sched = build_optimizer(model, old, total_steps=10)
    for _ in range(4):
        opt.step()
        sched.step()
    state = (opt.state_dict(), sched.state_dict())
    new = OptimConfig(lr=1e-5, schedule="linear", weight_decay=0.1)
    opt2, sched2 = build_optimizer(model, new, total_steps=10)
    opt2.load_state_dict(state[0])
    sched2.load_state_dict(state[1])
    assert sched2.get_last_lr()[0] == pytest.approx(6e-4)  # the saved state wins without the rebuild
    apply_optim_config(opt2, sched2, new)
    assert sched2.get_last_lr()[0] == pytest.approx(6e-6) and opt2.param_groups[0]["lr"] == pytest.approx(6e-6)
    assert opt2.param_groups[0]["weight_decay"] == 0.1
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(5e-6)  # 1e-5 * (1 - 5/10)

"""transformers ``TrainerCallback``s given to GRPOTrainer (``callbacks=[...]``), called as transformers calls them.

Each event is ``callback.on_<event>(args, state, control, **kwargs)`` with transformers' own ``TrainerState``
and ``TrainerControl``; a callback that returns a ``TrainerControl`` replaces it, as transformers'
CallbackHandler does. The events grpolab has:

* ``on_train_begin`` / ``on_train_end``: when ``train()`` starts and ends;
* ``on_step_end``: after each step's update and log (a grpolab step: one generation batch and its updates);
* ``on_log``: with that step's metrics (``logs=``), then with the end-of-training row;
* ``on_evaluate``: with the metrics of each evaluation (``metrics=``), periodic or ``evaluate()``.

``control.should_training_stop`` set by any of them ends training after that step, with a checkpoint, as
transformers does. ``args`` is what GRPOTrainer was given as ``args`` (TRL's ``GRPOConfig`` where one was
given). The keyword arguments are transformers' ``model`` and ``processing_class``; its optimizer,
scheduler and dataloaders are grpolab's own and not passed. transformers' other events (on_step_begin,
on_substep_end, on_save, on_prediction_step, ...) are not called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState

from grpolab.errors import ConfigError


class Callbacks:
    """The callbacks of one trainer, with the ``TrainerState`` and ``TrainerControl`` they share."""

    def __init__(self, callbacks: Sequence[Any] | None, args: Any) -> None:
        self.callbacks = []
        for i, cb in enumerate(callbacks or ()):
            cb = cb() if isinstance(cb, type) else cb  # transformers takes a class too
            if not isinstance(cb, TrainerCallback):
                raise ConfigError(
                    f"callbacks[{i}] is a {type(cb).__name__}: give a transformers.TrainerCallback (or its class)"
                )
            self.callbacks.append(cb)
        self.args = args
        self.state = TrainerState()
        self.control = TrainerControl()
        self.kwargs: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def call(self, event: str, **extra: Any) -> TrainerControl:
        for cb in self.callbacks:
            result = getattr(cb, event)(self.args, self.state, self.control, **self.kwargs, **extra)
            if result is not None:
                self.control = result
        return self.control

    def train_begin(self, max_steps: int, global_step: int, model: Any, processing_class: Any) -> None:
        self.state.max_steps, self.state.global_step = max_steps, global_step
        self.kwargs = {"model": model, "processing_class": processing_class}
        self.control = TrainerControl()
        self.call("on_train_begin")

    def step_end(self, step: int, logs: dict[str, float]) -> bool:
        """on_step_end then on_log for ``step``; True when a callback asked training to stop."""
        self.state.global_step = step
        self.state.epoch = None
        self.call("on_step_end")
        self.log(logs)
        return bool(self.control.should_training_stop)

    def log(self, logs: dict[str, float]) -> None:
        row = {**logs, "step": self.state.global_step}
        self.state.log_history.append(row)
        self.call("on_log", logs=logs)

    def evaluated(self, metrics: dict[str, float]) -> None:
        self.log(metrics)
        self.call("on_evaluate", metrics=metrics)

    def train_end(self) -> None:
        self.call("on_train_end")

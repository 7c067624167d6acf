"""Model selection: the best epoch by a validation metric, with early stopping after ``patience`` epochs.

One rule for every job: after each epoch's validation, :meth:`BestEpoch.update` compares the metric with the
best so far (higher or lower is better, as the metric is); on a strict improvement it keeps a copy of what the
job hands it (weights, and for a temporal model its node memory as the epoch's training left it), so the job
can report, and go on from, the model of the best epoch rather than the last one. With ``patience`` N the job
stops once N epochs in a row have not improved on the best (TGN's rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

from distgnn.errors import ConfigError

State = TypeVar("State")


class BestEpoch(Generic[State]):
    """The best epoch so far by a validation metric, and a copy of its state.

    Args:
        higher_is_better: True for accuracy or AP, False for a loss or MSE.
        patience: stop after this many epochs in a row without improvement (None: never stop early).

    Attributes:
        best_epoch: the epoch of the best value (None before any finite value).
        best_value: that value.
        state: what ``capture`` returned at that epoch.
    """

    def __init__(self, higher_is_better: bool = True, patience: int | None = None):
        if patience is not None and patience < 1:
            raise ConfigError(f"patience must be >= 1 epoch (or None: no early stopping), got {patience}")
        self.higher_is_better, self.patience = higher_is_better, patience
        self.best_epoch: int | None = None
        self.best_value: float | None = None
        self.state: State | None = None
        self.last_epoch: int | None = None

    def update(self, epoch: int, value: float, capture: Callable[[], State]) -> bool:
        """Records epoch ``epoch``'s validation ``value``; on an improvement (strictly better; a NaN never is)
        keeps ``capture()`` and returns True."""
        self.last_epoch = epoch
        if math.isnan(value):
            return False
        if self.best_value is not None:
            better = value > self.best_value if self.higher_is_better else value < self.best_value
            if not better:
                return False
        self.best_epoch, self.best_value, self.state = epoch, value, capture()
        return True

    @property
    def epochs_without_improvement(self) -> int:
        """Epochs validated since the best one (all of them before a finite value)."""
        if self.last_epoch is None:
            return 0
        if self.best_epoch is None:
            return self.last_epoch + 1
        return self.last_epoch - self.best_epoch

    @property
    def should_stop(self) -> bool:
        """Whether ``patience`` epochs in a row have not improved."""
        return self.patience is not None and self.epochs_without_improvement >= self.patience


def copy_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state dict (detached clones, on the model's devices)."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}

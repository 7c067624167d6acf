"""Model selection: the best epoch by a validation metric, with early stopping after ``patience`` epochs.

One rule for every job: after each epoch's validation, :meth:`BestEpoch.update` compares the metric with the
best so far (higher or lower is better, as the metric is); on a strict improvement it keeps a copy of what the
job hands it (weights, and for a temporal model its node memory as the epoch's training left it), so the job
can report, and go on from, the model of the best epoch rather than the last one. With ``patience`` N the job
stops once N epochs in a row have not improved on the best (TGN's rule).

:class:`Selection` is that rule in a training loop with the flags of :func:`add_selection_args` (``--select``,
``--patience``): it validates after every epoch, keeps the best epoch's weights and figures (rank 0's figures
are the job's: every trainer takes the same decision), loads the best weights back at the end and gives the
RESULT keys :data:`~distgnn.train.result.SELECTION_KEYS` (``best_epoch``, ``epochs_trained``), the selected
model's ``val_*`` / ``test_*`` figures and the last epoch's as ``last_val_<metric>``, ``last_test_<metric>``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from distgnn.errors import ConfigError
from distgnn.train.collective import broadcast_object, world

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


def add_selection_args(parser: argparse.ArgumentParser, metric: str) -> None:
    """``--select`` and ``--patience`` of a job that selects on validation ``metric`` (named in the help)."""
    group = parser.add_argument_group("model selection")
    group.add_argument(
        "--select",
        choices=("last", "best"),
        default="last",
        help=f"best: validate after every epoch and report (and keep) the model of the epoch with the best\n"
        f"validation {metric}, with the last epoch's figures as last_*; last: the last epoch's model, evaluated\n"
        "once at the end",
    )
    group.add_argument(
        "--patience",
        type=int,
        metavar="N",
        help=f"stop after N epochs in a row without a better validation {metric} (implies --select best)",
    )


def check_selection_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--patience`` implies ``--select best``; selection needs the evaluation."""
    if args.patience is not None:
        if args.patience < 1:
            parser.error(f"--patience must be >= 1 epoch, got {args.patience}")
        args.select = "best"
    if args.select == "best" and args.no_eval:
        parser.error("--select best (or --patience) validates every epoch: it cannot go with --no-eval")


class Selection:
    """Model selection in a training loop, as ``--select`` and ``--patience`` ask.

    After each epoch the loop calls :meth:`epoch_done` with the job's evaluation (a collective where the job's
    is); at the end :meth:`result` gives the RESULT figures: with ``--select best`` those of the best epoch's
    model (whose weights it loads back into ``model``) and the last epoch's as ``last_*``; with ``--select
    last``, one evaluation of the model as training left it.

    Args:
        args: parsed flags of :func:`add_selection_args` (after :func:`check_selection_args`).
        metric: the figure selected on: ``val_<metric>`` of the evaluation's result.
        higher_is_better: True for accuracy, MRR; False for MSE.
        model: whose weights are kept (the unwrapped module).
        evaluate: returns ``{"val_<m>": ..., "test_<m>": ...}`` (on rank 0 at least; the others may return
            anything, e.g. None: rank 0's figures are the job's).
    """

    def __init__(
        self,
        args: argparse.Namespace,
        metric: str,
        higher_is_better: bool,
        model: torch.nn.Module,
        evaluate: Callable[[], dict[str, float] | None],
    ) -> None:
        self.enabled = args.select == "best"
        self.metric, self.model, self._evaluate = metric, model, evaluate
        self.best: BestEpoch[tuple[dict[str, torch.Tensor], dict[str, float]]] = BestEpoch(
            higher_is_better, args.patience
        )
        self.last: dict[str, float] = {}
        self.eval_time_s = 0.0

    def _figures(self) -> dict[str, float]:
        start = time.perf_counter()
        figures = broadcast_object(self._evaluate())
        self.eval_time_s = time.perf_counter() - start
        return figures

    def epoch_done(self, epoch: int) -> bool:
        """With ``--select best``: validates after ``epoch``, keeps its weights and figures if it is the best so
        far; returns whether ``--patience`` says stop (the same on every trainer). Without: does nothing."""
        if not self.enabled:
            return False
        self.last = self._figures()
        if f"val_{self.metric}" not in self.last:
            raise ConfigError(f"--select best chooses by validation {self.metric}, and this job has no validation set")
        value = float(self.last[f"val_{self.metric}"])
        self.best.update(epoch, value, lambda: (copy_weights(self.model), self.last))
        if self.best.should_stop and world()[0] == 0:
            print(f"no better validation {self.metric} in {self.best.patience} epochs: stopping after epoch {epoch}")
        return self.best.should_stop

    def result(self) -> dict[str, Any]:
        """The RESULT figures (see the class), with ``eval_time_s`` (the last evaluation's seconds)."""
        if not self.enabled or not self.last:  # --select last, or no epoch left to train after a resume
            return {**self._figures(), "eval_time_s": self.eval_time_s}
        figures = self.last
        if self.best.state is not None:
            weights, figures = self.best.state
            self.model.load_state_dict(weights)
        return {
            "best_epoch": self.best.best_epoch,
            "epochs_trained": (self.best.last_epoch or 0) + 1,
            **figures,
            **{f"last_{split}_{self.metric}": self.last[f"{split}_{self.metric}"] for split in ("val", "test")},
            "eval_time_s": self.eval_time_s,
        }

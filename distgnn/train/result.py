"""What an example prints when it ends: one ``RESULT {json}`` line of a schema defined here, and its exit code.

Every job kind prints :data:`SHARED_KEYS` first (what ran, where, and how long an epoch took), then its own
keys (:data:`SCHEMAS`), then, unless ``--no-eval``, one of its sets of evaluation keys; a job that selected its
model by a validation figure (:mod:`distgnn.train.selection`) adds :data:`SELECTION_KEYS` and the last epoch's
``last_val_<metric>`` and ``last_test_<metric>`` (its kind's ``metric``). ``epoch_time_s`` is
:func:`epoch_time_s` everywhere: the median of the epochs after the first (the first also pays for warm-up:
allocations, caches, a CUDA graph's capture). :func:`print_result` checks a result against its kind's schema
before printing it, and :func:`read_result` reads it back from a run's output; :func:`exit_code` runs an
example's body and turns a :class:`~distgnn.errors.DistGNNError` into one ``error: ...`` line on stderr and exit
code 2.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distgnn.errors import DistGNNError

# Exit code of an example stopped by bad input or a failed job (argparse's, for a bad flag, is also 2).
ERROR_EXIT_CODE = 2

SHARED_KEYS = (
    "dataset",
    "device",
    "backend",  # torch.distributed's backend; None in a single process
    "num_trainers",
    "num_parts",  # machines (= partitions); 1 in a single process
    "epochs",
    "epoch_time_s",  # epoch_time_s(epoch_times_s)
    "epoch_times_s",  # every epoch this run trained, in order, seconds
)

# The epoch whose model the figures are of, and how many epochs ran (fewer than ``epochs`` after early stopping).
SELECTION_KEYS = ("best_epoch", "epochs_trained")


@dataclass(frozen=True)
class ResultSchema:
    """The RESULT keys of one job kind: ``keys`` in every run after :data:`SHARED_KEYS`, and after an
    evaluation every key of one set of ``evaluation`` (a kind whose task varies has one set per task); with model
    selection also :data:`SELECTION_KEYS` and ``val_<m>``, ``test_<m>``, ``last_val_<m>``, ``last_test_<m>`` for
    one ``m`` of ``metrics`` (what the kind selects on)."""

    kind: str
    keys: tuple[str, ...]
    evaluation: tuple[frozenset[str], ...]
    metrics: tuple[str, ...] = ()

    def selection_keys(self, metric: str) -> tuple[str, ...]:
        """The keys a result selected on ``metric`` carries."""
        return (*SELECTION_KEYS, f"val_{metric}", f"test_{metric}", f"last_val_{metric}", f"last_test_{metric}")

    def check(self, result: dict[str, Any]) -> None:
        """Raises ValueError naming the keys ``result`` lacks, or its evaluation keys when they complete no set."""
        missing = [k for k in (*SHARED_KEYS, *self.keys) if k not in result]
        if missing:
            raise ValueError(f"{self.kind} RESULT lacks {missing}")
        named = frozenset().union(*self.evaluation) & result.keys()
        if named and not any(s <= result.keys() for s in self.evaluation):
            raise ValueError(
                f"{self.kind} RESULT has evaluation keys {sorted(named)}; expected one of "
                f"{[sorted(s) for s in self.evaluation]}"
            )
        if "best_epoch" in result and not any(set(self.selection_keys(m)) <= result.keys() for m in self.metrics):
            raise ValueError(
                f"{self.kind} RESULT has best_epoch; expected one of {[self.selection_keys(m) for m in self.metrics]}"
            )


_STATIC = ("batches_per_epoch", "train_loss", "seps", "stage_times_s", "stage_split_s")

SCHEMAS = {
    # graphsage, rgcn
    "node": ResultSchema("node", (*_STATIC, "model"), (frozenset({"val_acc", "test_acc", "eval_time_s"}),), ("acc",)),
    # link_prediction: after an evaluation, mrr, hits@k, auc and num_pairs of each split that holds pairs
    # (val_*, test_*), as --val-fraction and --test-fraction leave them
    "link": ResultSchema("link", (*_STATIC, "neg_sampler", "num_negs"), (frozenset({"eval_time_s"}),), ("mrr",)),
    # tgn: after an evaluation, the model of the best validation epoch's figures and the last epoch's
    "temporal": ResultSchema(
        "temporal",
        ("num_events", "events_per_s", "minibatch_parallelism", "epoch_parallelism", "memory_parallelism"),
        (
            frozenset(
                {"best_epoch", "epochs_trained", "val_ap", "val_auc", "test_ap", "test_auc", "test_mrr"}
                | {"last_val_ap", "last_test_ap"}
            ),
        ),
        ("ap",),
    ),
    # snapshot: node regression, or next-snapshot links
    "snapshot": ResultSchema(
        "snapshot",
        ("train_loss", "model", "sequence", "schedule", "window", "load_imbalance", "planned_imbalance"),
        (frozenset({"test_mse"}), frozenset({"test_mrr", "test_auc"})),
        ("mse", "mrr"),
    ),
}


def epoch_time_s(epoch_times: Sequence[float]) -> float | None:
    """The median of ``epoch_times`` after the first (the first alone when it is the only one; None for none)."""
    steady = list(epoch_times[1:]) or list(epoch_times)
    return statistics.median(steady) if steady else None


def print_result(result: dict[str, Any], kind: str) -> None:
    """Print ``RESULT {json}`` with :data:`SHARED_KEYS` first, after checking ``result`` against ``kind``'s schema."""
    schema = SCHEMAS[kind]
    schema.check(result)
    ordered = {k: result[k] for k in SHARED_KEYS} | result
    print("RESULT " + json.dumps(ordered), flush=True)


def read_result(output: str) -> dict[str, Any]:
    """The result of the one ``RESULT {json}`` line in a run's ``output`` (what :func:`print_result` printed).

    Raises:
        ValueError: ``output`` holds no RESULT line, or more than one.
    """
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if len(lines) != 1:
        raise ValueError(f"expected one RESULT line in the run's output, found {len(lines)}")
    return json.loads(lines[0][len("RESULT ") :])


def exit_code(body: Callable[[], int]) -> int:
    """``body()``'s exit code, or :data:`ERROR_EXIT_CODE` after one ``error: ...`` line on stderr when it raises
    a :class:`~distgnn.errors.DistGNNError` (bad input, a failed job)."""
    try:
        return body()
    except DistGNNError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return ERROR_EXIT_CODE

"""Model selection in a training loop (train.selection.Selection): the best epoch's weights and figures, the last
epoch's as ``last_*``, early stopping, and the examples reporting it. One decision on every trainer: in
tests/train/test_collective.py's two-rank run."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from distgnn.errors import ConfigError
from distgnn.train.result import SCHEMAS, SHARED_KEYS
from distgnn.train.selection import Selection, add_selection_args, check_selection_args
from tests.examples.test_result_schema import SMALL, load, printed_result


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-eval", action="store_true")
    add_selection_args(parser, "accuracy")
    args = parser.parse_args(argv)
    check_selection_args(parser, args)
    return args


def run_epochs(args: argparse.Namespace, val: list[float], higher_is_better: bool = True):
    """A loop over ``val`` (one validation figure per epoch) whose model's weight is the epoch number."""
    model = torch.nn.Linear(1, 1, bias=False)
    epoch_of = {"now": -1}

    def evaluate() -> dict[str, float]:
        e = epoch_of["now"]
        return {"val_acc": val[e], "test_acc": 10.0 + e}

    selection = Selection(args, "acc", higher_is_better, model, evaluate)
    for epoch in range(len(val)):
        epoch_of["now"] = epoch
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        if selection.epoch_done(epoch):
            break
    return selection.result(), float(model.weight.detach())


def test_best_keeps_the_best_epochs_weights_and_figures_and_the_last_ones():
    result, weight = run_epochs(parse("--select", "best"), [0.5, 0.8, 0.7, 0.6])
    assert (result["best_epoch"], result["epochs_trained"]) == (1, 4)
    assert (result["val_acc"], result["test_acc"]) == (0.8, 11.0)
    assert (result["last_val_acc"], result["last_test_acc"]) == (0.6, 13.0)
    assert weight == 1.0  # the best epoch's weights are back in the model
    SCHEMAS["node"].check({**dict.fromkeys((*SHARED_KEYS, *SCHEMAS["node"].keys)), **result})


def test_patience_stops_and_lower_is_better():
    result, weight = run_epochs(parse("--patience", "2"), [3.0, 2.0, 2.5, 2.0, 1.0], higher_is_better=False)
    assert (result["best_epoch"], result["epochs_trained"], weight) == (1, 4, 1.0)  # a tie is no improvement


def test_last_evaluates_once_at_the_end_and_adds_no_selection_keys():
    result, weight = run_epochs(parse(), [0.5, 0.8, 0.7])
    assert set(result) == {"val_acc", "test_acc", "eval_time_s"} and result["val_acc"] == 0.7 and weight == 2.0


def test_bad_selection_flags_are_refused(capsys):
    for argv in (["--patience", "0"], ["--select", "best", "--no-eval"], ["--patience", "2", "--no-eval"]):
        with pytest.raises(SystemExit):
            parse(*argv)
    assert "--no-eval" in capsys.readouterr().err
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ConfigError, match="no validation set"):
        Selection(parse("--select", "best"), "acc", True, model, lambda: {"test_acc": 1.0}).epoch_done(0)


def test_a_selected_result_must_carry_the_selection_keys():
    shared = dict.fromkeys((*SHARED_KEYS, *SCHEMAS["snapshot"].keys))
    with pytest.raises(ValueError, match="has best_epoch"):
        SCHEMAS["snapshot"].check({**shared, "test_mse": 1.0, "best_epoch": 0})


def two_ranks_select(rank: int) -> tuple[dict, float]:
    """Run on each of two gloo ranks (tests/train/test_collective.py): rank 1 sees other figures than rank 0,
    and rank 0's decide for both."""
    val = [0.5, 0.8, 0.7, 0.6, 0.9] if rank == 0 else [0.9, 0.1, 0.1, 0.1, 0.1]
    result, weight = run_epochs(parse("--patience", "2"), val)
    result.pop("eval_time_s")
    return result, weight


def check_two_ranks_selected_alike(results: dict[int, tuple[dict, float]]) -> None:
    assert results[0] == results[1]
    result, weight = results[0]
    assert (result["best_epoch"], result["epochs_trained"], result["val_acc"], weight) == (1, 4, 0.8, 1.0)


# graphsage's loop selects as rgcn's does (the same three lines); one example per metric.
@pytest.mark.parametrize("name", ["rgcn", "link_prediction", "snapshot"])
def test_the_examples_report_their_selected_model(name, capsys, tmp_path):
    flags = ["--synthetic-snapshots=20"] if name == "snapshot" else []
    argv = [*SMALL[name], *flags, "--single", "--epochs=3", "--patience=1", f"--run-dir={tmp_path}"]
    assert load(name).main(argv) == 0
    result = printed_result(capsys.readouterr().out)
    metric = {"graphsage": "acc", "rgcn": "acc", "link_prediction": "mrr", "snapshot": "mse"}[name]
    assert 0 <= result["best_epoch"] < result["epochs_trained"] <= 3
    # Patience 1: every epoch before the last one trained improved, and an early stop follows one that did not.
    assert result["best_epoch"] >= result["epochs_trained"] - 2
    if result["epochs_trained"] < 3:
        assert result["best_epoch"] == result["epochs_trained"] - 2
    better = min if metric == "mse" else max
    assert better(result[f"val_{metric}"], result[f"last_val_{metric}"]) == result[f"val_{metric}"]
    epochs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in epochs if r.get("kind") == "epoch"]) == result["epochs_trained"]

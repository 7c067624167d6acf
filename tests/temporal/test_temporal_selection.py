"""Model selection: the best-epoch tracker, and the temporal job reporting its best epoch's model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from distgnn.errors import ConfigError
from distgnn.train.selection import BestEpoch, copy_weights
from tests.temporal.test_temporal_parallel import SMALL, example_main


def test_best_epoch_keeps_the_best_state_and_counts_patience():
    higher = BestEpoch(higher_is_better=True, patience=2)
    captured = []

    def capture(epoch):
        captured.append(epoch)
        return {"epoch": epoch}

    for epoch, value in enumerate([0.5, 0.7, 0.7, 0.6]):
        higher.update(epoch, value, lambda e=epoch: capture(e))
    assert higher.best_epoch == 1 and higher.best_value == 0.7 and higher.state == {"epoch": 1}
    assert captured == [0, 1]  # a tie is no improvement: nothing copied
    assert higher.epochs_without_improvement == 2 and higher.should_stop
    lower = BestEpoch(higher_is_better=False)
    for epoch, value in enumerate([3.0, math.nan, 2.0, 2.5]):
        lower.update(epoch, value, lambda e=epoch: e)
    assert lower.best_epoch == 2 and lower.state == 2 and not lower.should_stop  # no patience: never stops
    nan_only = BestEpoch(patience=1)
    nan_only.update(0, math.nan, lambda: 0)
    assert nan_only.best_epoch is None and nan_only.should_stop
    with pytest.raises(ConfigError, match="patience"):
        BestEpoch(patience=0)


def test_copy_weights_is_a_copy():
    layer = torch.nn.Linear(2, 2)
    kept = copy_weights(layer)
    with torch.no_grad():
        layer.weight.add_(1.0)
    assert not torch.equal(kept["weight"], layer.weight)
    layer.load_state_dict(kept)
    assert torch.equal(kept["weight"], layer.weight)


def test_job_reports_the_best_epochs_model_and_stops_on_patience(tmp_path, capsys):
    main = example_main()
    small = [a for a in SMALL if a not in ("--no-eval", "--quiet")]
    # A large learning rate makes validation AP go up and down within a few epochs.
    args = ["--single", *small, "--epochs", "6", "--lr", "0.03", "--num-threads", "1", "--patience", "2"]
    assert main([*args, "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    val_aps = [r["val_ap"] for r in epochs]
    best = val_aps.index(max(val_aps))
    assert result["best_epoch"] == best and result["epochs_trained"] == len(epochs)
    # The best epoch's weights and memory, restored, score what they scored at that epoch (same negatives).
    assert result["val_ap"] == pytest.approx(epochs[best]["val_ap"], abs=1e-6)
    assert result["test_ap"] == pytest.approx(epochs[best]["test_ap"], abs=1e-6)
    assert result["test_auc"] == pytest.approx(epochs[best]["test_auc"], abs=1e-6)
    assert 0 < result["test_mrr"] <= 1
    assert result["last_val_ap"] == epochs[-1]["val_ap"] and result["last_test_ap"] == epochs[-1]["test_ap"]
    if len(epochs) < 6:  # stopped early: exactly `patience` epochs after the best
        assert len(epochs) - 1 - best == 2 and "stopping after epoch" in out
    else:
        assert len(epochs) - 1 - best < 2

"""distgnn.train.bookkeeping in one process: a loop stopped after a checkpoint and run again with ``--resume auto``
ends bit-identical to an uninterrupted one, with its metrics continuing at the checkpoint's step."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from distgnn.data.datasets import DatasetSpec, load_dataset
from distgnn.loader.node import DistNodeDataLoader
from distgnn.nn import GraphSAGE
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler
from distgnn.train.bookkeeping import Bookkeeper, add_bookkeeping_args, check_bookkeeping_args
from distgnn.train.epoch import EpochMeter

EPOCHS = 3
BATCH = 16  # 60 seeds: 4 batches per epoch


@pytest.fixture(scope="module")
def graph() -> InProcessGraph:
    spec = DatasetSpec("synthetic", num_nodes=200, avg_degree=5.0, feat_dim=8, num_classes=3, seed=1)
    return InProcessGraph(load_dataset(spec))


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--single", action="store_true")
    add_bookkeeping_args(p)
    args = p.parse_args(argv)
    check_bookkeeping_args(p, args)
    return args


def train(g: InProcessGraph, args: argparse.Namespace, stop_after: int | None = None) -> dict[str, torch.Tensor]:
    """The examples' loop; ``stop_after`` steps it stops as a killed process would (nothing saved at the end)."""
    torch.manual_seed(0)
    model = GraphSAGE(8, 16, 3, num_layers=2, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    seeds = torch.arange(60)
    loader = DistNodeDataLoader(g, seeds, NeighborSampler([4, 3]), BATCH, shuffle=True, seed=5)
    with Bookkeeper(args, g, model=model, optimizer=optimizer, loader=loader, batches_per_epoch=len(loader)) as books:
        for epoch in books.epochs(EPOCHS):
            meter = EpochMeter(epoch, books.batches_in(epoch), torch.device("cpu"), show_progress=False)
            inputs = lambda b: (b, g.ndata["feat"][b[0]], g.ndata["label"][b[1]])  # noqa: E731
            for (_, out, blocks), x, y in meter.steps(loader, inputs):
                loss = F.cross_entropy(model(blocks, x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                meter.step_done(loss, len(out), 0)
                books.step_done(epoch, loss)
                if books.step == stop_after:
                    loader.close()
                    return {}
            books.epoch_done(meter.finish())
    loader.close()
    return {k: v.clone() for k, v in model.state_dict().items()}


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_loop_resumed_mid_epoch_ends_bit_identical_and_its_metrics_continue(graph, tmp_path):
    plain = train(graph, parse())
    flags = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "3", "--resume", "auto"]
    flags += ["--run-dir", str(tmp_path / "run"), "--metrics-every", "1"]
    assert train(graph, parse(*flags), stop_after=8) == {}  # checkpoints at steps 3 and 6 (epoch 1, batch 2)
    resumed = train(graph, parse(*flags))
    assert resumed.keys() == plain.keys()
    for name in plain:
        assert torch.equal(resumed[name], plain[name]), name
    steps = [r["step"] for r in records(tmp_path / "run", "step")]
    assert steps == [*range(1, 9), *range(7, EPOCHS * 4 + 1)]
    epochs = [(r["epoch"], r["step"]) for r in records(tmp_path / "run", "epoch")]
    assert epochs == [(0, 4), (1, 8), (2, 12)]  # epoch 1 is recorded by the resumed run only, at its end
    assert sorted(p.name for p in (tmp_path / "ck").glob("step-*")) == ["step-00000009", "step-00000012"]


def test_without_flags_it_only_counts_steps(graph, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(graph, parse(), stop_after=5)
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_of_a_single_process_run_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse("--single", "--checkpoint-dir", "ck")
    assert "--checkpoint-dir needs a distributed job" in capsys.readouterr().err

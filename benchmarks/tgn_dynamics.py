"""What a TGN's training does epoch by epoch: loss, gradient norm, memory and message scale, time-encoding inputs.

distgnn's TGN as benchmarks/train_tgn.py trains it (PyG's example's configuration) and PyG's TGN beside it, on
the same stream, one epoch of each in turn. Per epoch, for distgnn: the mean training loss, the median and
largest gradient norm of the steps, the mean row norm of the node memory and of the stored messages at the
epoch's end, the time-encoding inputs of the GRU (the time since a node's last update for the mail a step
applies: the share that is a node's first mail, timed from 0, and the median of the others, in seconds) and
the validation AP, then its loss by tenth of each epoch; for PyG: the mean training loss and the validation
AP. Two probes: ``--shift-times`` (the stream's times start at 0) and ``--no-reset`` (distgnn's epochs go on
from the memory the last one ended with).

    python benchmarks/tgn_dynamics.py --epochs 6
    python benchmarks/tgn_dynamics.py --dataset events:../shared/data/snap/soc-sign-bitcoinotc.csv \\
        --columns src,dst,rating,time
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tgn import COLLEGE_MSG, Ours, Pyg  # noqa: E402

from distgnn.data.events import parse_columns  # noqa: E402
from distgnn.temporal.job import load_stream  # noqa: E402
from distgnn.temporal.train import batch_ranges, train_epoch  # noqa: E402


def ours_epoch(ours: Ours, reset: bool = True) -> dict[str, float]:
    """One training epoch of distgnn's TGN with its figures (``reset``: from a zeroed memory, as the example)."""
    grads, deltas, first = [], [], 0

    def on_step(step: int, loss: float) -> None:
        grads.append(
            float(torch.norm(torch.stack([p.grad.norm() for p in ours.model.parameters() if p.grad is not None])))
        )

    losses = []
    memory = ours.runner.memory
    original = ours.runner.train_batch

    def train_batch(begin, end, optimizer, net=None, share=(0, 1)):
        nonlocal first
        nodes = torch.unique(torch.cat([ours.runner.src[begin:end], ours.runner.dst[begin:end]]))
        pending = nodes[memory.has_mail[nodes]]
        never = memory.last_update[pending] == 0
        first += int(never.sum())
        deltas.extend((memory.mail_time[pending] - memory.last_update[pending])[~never].tolist())
        losses.append(original(begin, end, optimizer, net, share))
        return losses[-1]

    ours.runner.train_batch = train_batch
    try:
        train_epoch(ours.runner, batch_ranges(0, ours.train_end, 200), ours.optimizer, on_step=on_step, reset=reset)
    finally:
        del ours.runner.train_batch
    applied = first + len(deltas)
    return {
        "loss": float(np.mean(losses)),
        "loss_tenths": [float(part.mean()) for part in np.array_split(np.array(losses), 10)],
        "grad_median": float(np.median(grads)),
        "grad_first_tenth": float(np.median(grads[: max(len(grads) // 10, 1)])),
        "grad_max": float(np.max(grads)),
        "memory_norm": float(memory.memory.norm(dim=1).mean()),
        "message_norm": float(memory.mail[memory.has_mail].norm(dim=1).mean()),
        "first_mail": first / max(applied, 1),
        "delta_median_s": float(np.median(deltas)) if deltas else 0.0,
    }


def pyg_epoch(pyg: Pyg) -> float:
    """One training epoch of PyG's TGN (as Pyg.epoch), returning its mean loss."""
    pyg.memory.train(), pyg.gnn.train(), pyg.predictor.train()
    pyg.memory.reset_state()
    pyg.neighbors.reset_state()
    losses = []
    for batch in pyg.loaders[0]:
        batch = batch.to(pyg.device)
        pyg.optimizer.zero_grad()
        pos, neg = pyg._batch(batch)
        loss = F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
        loss = loss + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg))
        pyg._apply(batch)
        loss.backward()
        pyg.optimizer.step()
        pyg.memory.detach()
        losses.append(float(loss.detach()))
    return float(np.mean(losses))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    p.add_argument("--columns", type=parse_columns, help="the stream's columns (the example's flag)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--systems", default="distgnn,pyg")
    p.add_argument("--shift-times", action="store_true", help="times minus the first event's (the stream starts at 0)")
    p.add_argument(
        "--no-reset",
        action="store_true",
        help="distgnn: each epoch starts from the memory the last one's training ended with, not a zeroed one",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    events = load_stream(args.dataset, seed=args.seed, columns=args.columns)
    if args.shift_times:
        events = dataclasses.replace(events, time=events.time - events.time[0])
    device = torch.device("cpu")
    ours = Ours(events, device, args.seed) if "distgnn" in args.systems else None
    pyg = Pyg(events, device, args.seed) if "pyg" in args.systems else None
    print(f"{args.dataset}: {len(events)} events, seed {args.seed}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(
        f"{'epoch':>5} {'loss':>7} {'grad med':>9} {'grad 1st 10%':>12} {'grad max':>9} {'|memory|':>9} {'|message|':>10} "
        f"{'first mail':>10} {'delta med s':>12} {'val AP':>7} | {'PyG loss':>8} {'PyG val AP':>10}",
        flush=True,
    )
    tenths = []
    for epoch in range(args.epochs):
        row = {}
        val = float("nan")
        if ours:
            row = ours_epoch(ours, reset=not args.no_reset or epoch == 0)
            trained = ours.runner.memory.state()
            val = ours.runner.evaluate(batch_ranges(ours.train_end, ours.val_end, 200))["ap"]
            if args.no_reset:
                ours.runner.memory.load_state(trained)  # the next epoch goes on from the training's end
            tenths.append(row["loss_tenths"])
        pyg_loss = pyg_epoch(pyg) if pyg else float("nan")
        pyg_val = pyg._score(pyg.loaders[1]) if pyg else float("nan")
        if ours:
            print(
                f"{epoch:>5} {row['loss']:>7.4f} {row['grad_median']:>9.4f} {row['grad_first_tenth']:>12.4f} "
                f"{row['grad_max']:>9.4f} {row['memory_norm']:>9.3f} {row['message_norm']:>10.3f} "
                f"{row['first_mail']:>10.3f} {row['delta_median_s']:>12,.0f} {val:>7.4f} | {pyg_loss:>8.4f} "
                f"{pyg_val:>10.4f}",
                flush=True,
            )
        else:
            print(f"{epoch:>5} | {pyg_loss:>8.4f} {pyg_val:>10.4f}", flush=True)
    if tenths:
        print("\ndistgnn's training loss by tenth of the epoch")
        for epoch, parts in enumerate(tenths):
            print(f"{epoch:>5} " + " ".join(f"{part:.3f}" for part in parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

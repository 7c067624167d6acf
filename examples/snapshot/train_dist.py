"""Discrete-time dynamic GNN training on snapshot sequences, scheduled BLAD's way (or the two usual ways).

Three ways to run it:

* ``--local``: the whole job on this host: ``--num-parts`` x ``--trainers-per-machine`` trainers (this script
  again, with torchrun's environment), no graph servers (every trainer reads the sequence itself).
* no flag: one trainer of a job started by ``distgnn-launch`` (or by ``--local``).
* ``--single``: one process, the reference.

Training samples are windows of ``--window`` consecutive snapshots (0: the whole training span as one
sequence); the recurrent state starts from zero at each window. An epoch is one optimizer step on the mean
loss over the training snapshots (as PyTorch Geometric Temporal's examples). ``--schedule`` says who computes
what: ``blad`` balances windows over trainers by cost (vertices + edges; ``--cost measured``: the first epoch's
times), ``contiguous`` gives each trainer a contiguous range of snapshots and hands the state on, ``vertex``
gives each trainer a share of every snapshot's vertices and exchanges rows through torch.distributed. All
three train the same model to the same loss.

Rank 0 prints one line per epoch and finally ``RESULT {json}`` (the ``snapshot`` keys of
:mod:`distgnn.train.result`) with ``test_mse`` (node regression) or ``test_mrr``/``test_auc`` (links) and
``load_imbalance`` (max over mean of the trainers' busy time); ``--select best`` (or ``--patience N``) validates
on ``--val-ratio`` of the samples after every epoch and reports the model of the best validation MSE (links: MRR); bad input ends in one ``error:`` line and exit
code 2.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import ConfigError
from distgnn.nn.recurrent import CELLS, SnapshotModel
from distgnn.snapshot import job as snapshot_job
from distgnn.snapshot.schedule import SCHEDULES, idle_trainers_warning, make_plan, make_windows
from distgnn.snapshot.train import EpochPosition, SnapshotRunner, all_reduce_gradients, held_out_figures, train_epoch
from distgnn.train import job
from distgnn.train.bookkeeping import Bookkeeper, add_bookkeeping_args, check_bookkeeping_args
from distgnn.train.collective import all_gather_arrays
from distgnn.train.epoch import EpochSummary
from distgnn.train.result import epoch_time_s
from distgnn.train.selection import Selection, add_selection_args, check_selection_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    snapshot_job.add_snapshot_dataset_args(p)
    job.add_job_args(p, epochs=200)
    model = p.add_argument_group("model, schedule and optimiser")
    model.add_argument("--model", default="gconvgru", choices=sorted(CELLS))
    model.add_argument("--schedule", default="blad", choices=SCHEDULES)
    model.add_argument("--cost", default="size", choices=("size", "measured"), help="blad: what a window costs")
    model.add_argument("--hidden", type=int, default=32)
    model.add_argument("--cheb-k", type=int, default=1, help="Chebyshev order (1: no neighbours)")
    model.add_argument("--lr", type=float, default=0.01)
    model.add_argument("--window", type=int, default=0, help="snapshots per training sample (0: the whole span)")
    model.add_argument("--train-ratio", type=float, default=0.8)
    model.add_argument(
        "--val-ratio",
        type=float,
        default=None,
        help="share of the samples after the training span that validates (default 0; 0.1 with --select best);\n"
        "the test span is the rest",
    )
    model.add_argument("--procs-per-gpu", type=int, default=1, choices=(1, 2))
    add_bookkeeping_args(p)
    add_selection_args(p, "MSE (links: MRR)")
    args = p.parse_args(argv)
    check_bookkeeping_args(p, args)
    check_selection_args(p, args)
    if args.val_ratio is None:
        args.val_ratio = 0.1 if args.select == "best" else 0.0
    if args.select == "best" and args.val_ratio <= 0:
        p.error("--select best (or --patience) chooses by validation: give --val-ratio > 0")
    if args.procs_per_gpu > 1 and args.device != "cuda":
        p.error("--procs-per-gpu 2 shares a GPU between two trainers; it needs --device cuda")
    if args.single and args.procs_per_gpu > 1:
        p.error("--procs-per-gpu 2 needs two trainers (--local or distgnn-launch), not --single")
    if args.schedule == "vertex" and args.dataset.startswith("events:"):
        p.error("--schedule vertex trains node regression; events:PATH trains links: use blad or contiguous")
    return args


def run(trainer: snapshot_job.SnapshotTrainer, args: argparse.Namespace) -> dict:
    device, rank, world = trainer.device, trainer.rank, trainer.world_size
    sequence, task = snapshot_job.load_sequence(args)
    # Links: sample t predicts snapshot t + 1's edges, so there is one sample fewer than snapshots.
    samples = len(sequence) - (task == "link")
    num_train = int(args.train_ratio * samples)
    num_val = int(args.val_ratio * samples)
    if not 0 < num_train <= num_train + num_val < samples or (args.val_ratio > 0 and num_val == 0):
        raise ConfigError(
            f"{sequence.name}: {samples} samples split {args.train_ratio:g} / {args.val_ratio:g} leave an empty side; "
            "give more snapshots"
        )
    windows = make_windows(num_train, args.window)
    costs = sequence.costs()[:num_train]
    plan = make_plan(args.schedule, costs, windows, world, args.procs_per_gpu)

    torch.manual_seed(args.seed)  # the same initial weights on every trainer
    model = SnapshotModel(args.model, sequence.num_features, args.hidden, args.cheb_k, task).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    comm = device if device.type == "cpu" or args.procs_per_gpu == 1 else torch.device("cpu")
    runner = SnapshotRunner(model, sequence, num_train, device, rank, world, args.seed, comm)
    if rank == 0:
        print(
            f"{sequence!r}, task {task}: {num_train} training samples in {len(windows)} windows; {args.schedule} on "
            f"{world} trainers, planned imbalance {plan.imbalance():.3f}",
            flush=True,
        )
        if warning := idle_trainers_warning(plan, len(windows), num_train, args.window):
            print(f"warning: {warning}", file=sys.stderr, flush=True)

    def evaluate() -> dict[str, float] | None:
        """Rank 0's validation and test figures (the others': None)."""
        return held_out_figures(runner, args.window, num_train, num_val, samples) if rank == 0 else None

    selection = Selection(args, "mse" if task == "node" else "mrr", task != "node", model, evaluate)
    epoch_times, imbalances, loss = [], [], float("nan")
    position = EpochPosition()
    with Bookkeeper(args, None, model=model, optimizer=optimizer, loader=position, batches_per_epoch=1) as books:
        for epoch in books.epochs(args.epochs):
            position.epoch = epoch
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            result = train_epoch(runner, plan, epoch)
            all_reduce_gradients(model, comm)
            optimizer.step()
            busy = _gather([result.busy_s, result.wait_s, result.loss])
            elapsed = max(_gather([time.perf_counter() - start])[:, 0])
            loss = float(busy[:, 2].sum())
            imbalance = float(busy[:, 0].max() / busy[:, 0].mean())
            epoch_times.append(elapsed)
            imbalances.append(imbalance)
            books.step_done(epoch, torch.tensor(loss))
            books.epoch_done(
                EpochSummary(
                    epoch, loss, None, elapsed, 0.0, 0.0, float(busy[:, 0].max()), float(busy[:, 1].max()), 0.0
                )
            )
            if rank == 0 and (epoch % max(1, args.epochs // 10) == 0 or epoch == args.epochs - 1):
                print(f"epoch {epoch:4d} loss {loss:.4f} time {elapsed:.3f}s imbalance {imbalance:.3f}", flush=True)
            if epoch == 0 and args.cost == "measured" and args.schedule == "blad" and world > 1:
                plan = _replan_on_measured(plan, result.segment_s, costs, windows, world, args.procs_per_gpu)
            if selection.epoch_done(epoch):
                break
    out = {
        **trainer.result_fields(args),
        "epoch_time_s": epoch_time_s(epoch_times),
        "epoch_times_s": [round(t, 4) for t in epoch_times],
        "sequence": sequence.name,
        "model": args.model,
        "schedule": args.schedule,
        "window": args.window,
        "train_loss": loss,
        "load_imbalance": float(np.mean(imbalances[1:] or imbalances)),
        "planned_imbalance": plan.imbalance(),
    }
    if not args.no_eval:
        out.update(selection.result())
    return out


def _gather(values: list[float]) -> np.ndarray:
    """``(world, len(values))``: every trainer's ``values``."""
    return np.stack(all_gather_arrays(np.asarray(values, dtype=np.float64)))


def _replan_on_measured(plan, segment_s, costs, windows, world, procs_per_gpu):
    measured = torch.zeros(len(windows), dtype=torch.float64)
    for w, seconds in segment_s.items():
        measured[w] = seconds
    dist.all_reduce(measured)
    return make_plan("blad", costs, windows, world, procs_per_gpu, measured=measured.numpy())


def main(argv: list[str] | None = None) -> int:
    # No graph servers: every trainer reads the sequence itself.
    return job.main(
        __file__, argv, parse_args, lambda args: None, run, kind="snapshot", start=snapshot_job.start_trainer
    )


if __name__ == "__main__":
    sys.exit(main())

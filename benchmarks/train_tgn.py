"""TGN training: distgnn.temporal against PyG's TGN on the same stream, same machine, same run.

Both sides get the configuration of PyG's examples/tgn.py: memory, time and embedding dims 100, the 10 most
recent neighbours, one attention layer with 2 heads, a 2-layer MLP link predictor, batches of 200 events
against one uniform random destination each, Adam with lr 1e-4, a chronological 70/15/15 split. The PyG side
is built from ``TGNMemory`` (identity message, last aggregator), ``LastNeighborLoader`` and
``TransformerConv``. Epochs of the two alternate (distgnn's epoch e, then PyG's epoch e), so load from other
work on a shared machine falls on both. Both are scored by the same code: AP and AUC per held-out batch
against one random destination per event, averaged, after every epoch. The table gives, per seed, seconds per
training epoch (median), training events per second, the epoch of the best validation AP and that model's
validation and test AP (the example's model selection), the last epoch's, and the speed ratio; then test AP
median and range over the seeds.

``--scaling 1,2,4`` also runs examples/tgn/train_dist.py with memory parallelism on 1, 2 and 4 simulated
machines (one torch thread each) and reports the time each takes to reach the single trainer's best
validation AP, and what the copies' warm-up costs (``--systems ''``: the scaling part alone). Time to
accuracy: training seconds (evaluations left out), summed over the run, until a validation first scores the
single trainer's best validation AP. Every run validates by the same rule (``--evals-per-epoch`` times an
epoch, the example's flag, 4 here: a validation inside an epoch scores a memory caught up by replay, which
scores lower than the memory an epoch ends with, so a run reaching the target there has reached it) and
uses the same ``--lr-scaling`` (the example's flag: linear, the default, multiplies the learning rate by the
j*k batches a step averages, sqrt by its square root; the single trainer's is 1).

    python benchmarks/train_tgn.py --epochs 3                          # CollegeMsg, CPU, one thread each
    python benchmarks/train_tgn.py --epochs 10 --seeds 0,1,2 --columns src,dst,rating,time \
        --dataset events:../shared/data/snap/soc-sign-bitcoinotc.csv
    python benchmarks/train_tgn.py --dataset synthetic-events:10000:200000
    python benchmarks/train_tgn.py --device cuda                       # on a GPU (--step eager: no CUDA graph)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distgnn.data.events import EventStream, parse_columns
from distgnn.nn.temporal import TGN
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.job import load_stream
from distgnn.temporal.loop import adam
from distgnn.temporal.train import TGNRunner, average_precision, batch_ranges, chronological_split, train_epoch
from distgnn.temporal.warm import StreamReplay
from distgnn.train.selection import BestEpoch

ROOT = Path(__file__).resolve().parents[1]
COLLEGE_MSG = ROOT / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"
DIM, NEIGHBORS, BATCH, LR = 100, 10, 200, 1e-4


class Ours:
    name = "distgnn"

    def __init__(
        self, events: EventStream, device: torch.device, seed: int, step: str = "auto", learn_time: bool = False
    ):
        torch.manual_seed(seed)
        self.model = TGN(events.num_nodes, events.feat_dim, DIM, DIM, DIM, heads=2, learn_time=learn_time)
        self.model.to(device)
        csr = build_temporal_csr(events)
        self.runner = TGNRunner(self.model, events, csr, device, NEIGHBORS, seed=seed, step=step)
        self.optimizer = adam(self.model.parameters(), LR, device, step)  # as the example
        self.train_end, self.val_end = chronological_split(len(events))
        self.num_events = len(events)

    def epoch(self) -> float:
        # On a GPU the losses stay on the device until the epoch ends, as in the job (no wait for every step).
        lazy = self.runner.device.type == "cuda"
        _, timing = train_epoch(self.runner, batch_ranges(0, self.train_end, BATCH), self.optimizer, lazy_loss=lazy)
        return timing.seconds

    def evaluate(self) -> tuple[float, float]:
        val = self.runner.evaluate(batch_ranges(self.train_end, self.val_end, BATCH))
        test = self.runner.evaluate(batch_ranges(self.val_end, self.num_events, BATCH))
        return val["ap"], test["ap"]


class PygAttention(nn.Module):
    """PyG example's embedding: TransformerConv (2 heads, dropout 0.1) over edges carrying time encoding and
    message."""

    def __init__(self, in_dim: int, out_dim: int, msg_dim: int, time_enc: nn.Module):
        from torch_geometric.nn import TransformerConv

        super().__init__()
        self.time_enc = time_enc
        self.conv = TransformerConv(
            in_dim, out_dim // 2, heads=2, dropout=0.1, edge_dim=msg_dim + time_enc.out_channels
        )

    def forward(self, x, last_update, edge_index, t, msg):
        rel_t = last_update[edge_index[0]] - t
        edge_attr = torch.cat([self.time_enc(rel_t.to(x.dtype)), msg], dim=-1)
        return self.conv(x, edge_index, edge_attr)


class PygPredictor(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.src, self.dst, self.final = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)

    def forward(self, z_src, z_dst):
        return self.final((self.src(z_src) + self.dst(z_dst)).relu())


class Pyg:
    name = "PyG TGN"

    def __init__(self, events: EventStream, device: torch.device, seed: int):
        from torch_geometric.data import TemporalData
        from torch_geometric.loader import TemporalDataLoader
        from torch_geometric.nn import TGNMemory
        from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, LastNeighborLoader

        torch.manual_seed(seed)
        # PyG's message store cannot hold 0-wide messages: a stream without features gets one zero column.
        msg = torch.from_numpy(events.feat) if events.feat is not None else torch.zeros(len(events), 1)
        # PyG keeps times as integers; the streams here have integral times (CollegeMsg: UNIX seconds).
        data = TemporalData(
            src=torch.from_numpy(events.src),
            dst=torch.from_numpy(events.dst),
            t=torch.from_numpy(events.time).long(),
            msg=msg,
        ).to(device)
        self.data, self.device = data, device
        train_end, val_end = chronological_split(len(events))
        self.loaders = [
            TemporalDataLoader(part, batch_size=BATCH, neg_sampling_ratio=1.0)
            for part in (data[:train_end], data[train_end:val_end], data[val_end:])
        ]
        self.memory = TGNMemory(
            events.num_nodes, msg.shape[1], DIM, DIM, IdentityMessage(msg.shape[1], DIM, DIM), LastAggregator()
        ).to(device)
        self.gnn = PygAttention(DIM, DIM, msg.shape[1], self.memory.time_enc).to(device)
        self.predictor = PygPredictor(DIM).to(device)
        params = set(self.memory.parameters()) | set(self.gnn.parameters()) | set(self.predictor.parameters())
        self.optimizer = torch.optim.Adam(params, lr=LR)
        self.neighbors = LastNeighborLoader(events.num_nodes, size=NEIGHBORS, device=device)
        self.assoc = torch.empty(events.num_nodes, dtype=torch.long, device=device)

    def _batch(self, batch):
        n_id, edge_index, e_id = self.neighbors(batch.n_id)
        self.assoc[n_id] = torch.arange(n_id.size(0), device=self.device)
        z, last_update = self.memory(n_id)
        z = self.gnn(z, last_update, edge_index, self.data.t[e_id].to(self.device), self.data.msg[e_id])
        pos = self.predictor(z[self.assoc[batch.src]], z[self.assoc[batch.dst]])
        neg = self.predictor(z[self.assoc[batch.src]], z[self.assoc[batch.neg_dst]])
        return pos, neg

    def _apply(self, batch):
        self.memory.update_state(batch.src, batch.dst, batch.t, batch.msg)
        self.neighbors.insert(batch.src, batch.dst)

    def epoch(self) -> float:
        start = time.perf_counter()
        self.memory.train(), self.gnn.train(), self.predictor.train()
        self.memory.reset_state()
        self.neighbors.reset_state()
        for batch in self.loaders[0]:
            batch = batch.to(self.device)
            self.optimizer.zero_grad()
            pos, neg = self._batch(batch)
            loss = F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
            loss = loss + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg))
            self._apply(batch)
            loss.backward()
            self.optimizer.step()
            self.memory.detach()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    @torch.no_grad()
    def _score(self, loader) -> float:
        self.memory.eval(), self.gnn.eval(), self.predictor.eval()
        aps = []
        for batch in loader:
            batch = batch.to(self.device)
            pos, neg = self._batch(batch)
            aps.append(average_precision(pos.squeeze(-1).cpu().numpy(), neg.squeeze(-1).cpu().numpy()))
            self._apply(batch)
        return float(np.mean(aps))

    def evaluate(self) -> tuple[float, float]:
        return self._score(self.loaders[1]), self._score(self.loaders[2])


def compare(events: EventStream, args: argparse.Namespace, seed: int) -> list[dict]:
    """One seed: both systems trained epoch by epoch (alternating), each validated and tested after every epoch;
    each reports the model of its best validation epoch (distgnn.train.selection, as the example selects)
    and its last epoch's."""
    device = torch.device(args.device)
    systems = [Ours(events, device, seed, args.step)]
    if "pyg" in args.systems:
        systems.append(Pyg(events, device, seed))
    times: dict[str, list[float]] = {s.name: [] for s in systems}
    selections = {s.name: BestEpoch(higher_is_better=True) for s in systems}
    last: dict[str, tuple[float, float]] = {}
    for epoch in range(args.epochs):
        for system in systems:
            seconds = system.epoch()
            times[system.name].append(seconds)
            val, test = system.evaluate()
            last[system.name] = (val, test)
            selections[system.name].update(epoch, val, lambda test=test: test)
            print(
                f"  seed {seed} {system.name} epoch {epoch}: {seconds:.2f} s, val AP {val:.4f}, test AP {test:.4f}",
                file=sys.stderr,
                flush=True,
            )
    train_events = chronological_split(len(events))[0]
    rows = []
    for system in systems:
        seconds = statistics.median(times[system.name])
        best = selections[system.name]
        rows.append(
            {
                "system": system.name,
                "seed": seed,
                "s_per_epoch": seconds,
                "events_per_s": train_events / seconds,
                "best_epoch": best.best_epoch,
                "val_ap": best.best_value,
                "test_ap": best.state,
                "last_val_ap": last[system.name][0],
                "last_test_ap": last[system.name][1],
            }
        )
    return rows


def scaling(args: argparse.Namespace) -> list[dict]:
    """Memory parallelism on 1, 2, 4 simulated machines: time to the first run's best val AP. Each run is
    ``N`` (N trainers, memory parallelism, one simulated machine each), ``jN`` (N trainers of one machine, epoch
    parallelism over one memory copy), either with ``@LR`` (learning rate LR; default PyG's 1e-4)."""
    rows = []
    for run in args.scaling.split(","):
        trainers, _, lr = run.partition("@")
        epoch_parallel = trainers.startswith("j")
        trainers, lr = int(trainers.removeprefix("j")), float(lr or LR)
        run_dir = Path(args.workdir) / f"scaling-{run.replace('@', '-')}-{time.strftime('%H%M%S')}"
        if trainers == 1:
            mode = ["--single"]
        elif epoch_parallel:
            mode = ["--local", "--trainers-per-machine", str(trainers), "--epoch-parallelism", str(trainers)]
        else:
            mode = ["--local", "--num-parts", str(trainers), "--memory-parallelism", str(trainers)]
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "tgn" / "train_dist.py"),
            *mode,
            "--dataset",
            args.dataset,
            *(["--columns", ",".join(args.columns)] if args.columns else []),
            "--epochs",
            str(args.epochs),
            "--num-threads",
            "1",
            "--seed",
            str(args.seed),
            "--lr",
            str(lr),
            "--lr-scaling",
            args.lr_scaling,
            "--evals-per-epoch",
            str(args.evals_per_epoch),
            "--run-dir",
            str(run_dir),
            "--quiet",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        epochs = [e for e in records if e["kind"] == "epoch"]
        evals = [e for e in records if e["kind"] == "eval"]
        # j * k = trainers in both kinds of run (the example's lr_multiplier)
        multiplier = {"linear": trainers, "sqrt": math.sqrt(trainers), "none": 1}[args.lr_scaling]
        rows.append(
            {
                "trainers": f"j{trainers}" if epoch_parallel else trainers,
                "lr": lr * multiplier,
                "epochs": epochs,
                "evals": evals,
            }
        )
    best = max(e["val_ap"] for e in rows[0]["evals"])
    table = []
    for row in rows:
        reached = next((e["train_s"] for e in row["evals"] if e["val_ap"] >= best - 1e-9), None)
        table.append(
            {
                "trainers": row["trainers"],
                "lr": row["lr"],
                "best_val_ap": max(e["val_ap"] for e in row["evals"]),
                "evals_to_target": next(
                    (n + 1 for n, e in enumerate(row["evals"]) if e["val_ap"] >= best - 1e-9), None
                ),
                "val_aps": [e["val_ap"] for e in row["epochs"]],
                "test_ap": row["epochs"][-1]["test_ap"],
                "s_per_epoch": statistics.median(e["epoch_time_s"] for e in row["epochs"]),
                "train_s_to_target": reached,
            }
        )
    base = table[0]["train_s_to_target"]
    for row in table:
        row["ratio"] = row["train_s_to_target"] / base if row["train_s_to_target"] and base else None
    return table


def warm_up_seconds(events: EventStream, copies: int, seed: int) -> float:
    """Seconds the last of ``copies`` memory copies spends warming its memory each epoch: the events
    before its segment replayed through the memory only (as examples/tgn/train_dist.py does), one thread."""
    torch.manual_seed(seed)
    model = TGN(events.num_nodes, events.feat_dim, DIM, DIM, DIM, heads=2)
    batches = batch_ranges(0, chronological_split(len(events))[0], BATCH)
    per_copy = len(batches) // copies
    stop = batches[len(batches) - per_copy][0]
    tensors = [torch.from_numpy(a) for a in (events.src, events.dst, events.time)]
    feat = None if events.feat is None else torch.from_numpy(events.feat)
    replay = StreamReplay(*tensors, feat, stop, BATCH, torch.device("cpu"))  # planned once per job
    start = time.perf_counter()
    replay.replay(model, model.new_memory())
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (both systems)")
    p.add_argument("--systems", default="distgnn,pyg", help="'' skips the comparison (with --scaling)")
    p.add_argument("--seed", type=int, default=0, help="the --scaling runs' seed")
    p.add_argument(
        "--seeds", type=lambda text: [int(v) for v in text.split(",")], default=[0], help="comparison seeds, e.g. 0,1,2"
    )
    p.add_argument("--columns", type=parse_columns, help="the stream's columns (the example's flag)")
    p.add_argument(
        "--step",
        default="auto",
        choices=("auto", "eager", "graph"),
        help="distgnn's training step: graph (replayed from a CUDA graph), eager, auto (graph on a GPU)",
    )
    p.add_argument(
        "--scaling",
        default="",
        help="e.g. 1,2,4 or 1,2@2e-4,j2: trainers, memory-parallel (simulated machines) or jN epoch-parallel[@lr]",
    )
    p.add_argument(
        "--lr-scaling",
        default="linear",
        choices=("linear", "sqrt", "none"),
        help="the example's flag, for every --scaling run",
    )
    p.add_argument(
        "--evals-per-epoch", type=int, default=4, help="the example's flag: validations an epoch in --scaling runs"
    )
    p.add_argument("--workdir", default=".work/bench-tgn")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    events = load_stream(args.dataset, seed=args.seed, columns=args.columns)
    print(
        f"stream {args.dataset}: {len(events)} events, {events.num_nodes} nodes; device {args.device}, step {args.step}, "
        f"{args.threads} thread(s); {args.epochs} epochs; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    if args.systems:
        rows = [row for seed in args.seeds for row in compare(events, args, seed)]
        print(
            f"{'system':<10} {'seed':>4} {'s/epoch':>9} {'events/s':>10} {'best ep':>7} {'val AP':>8} {'test AP':>8} "
            f"{'last val':>8} {'last test':>9} {'speed vs PyG':>13}"
        )
        peers = {row["seed"]: row["s_per_epoch"] for row in rows if row["system"] == Pyg.name}
        for row in rows:
            ratio = peers.get(row["seed"], row["s_per_epoch"]) / row["s_per_epoch"]
            print(
                f"{row['system']:<10} {row['seed']:>4} {row['s_per_epoch']:>9.2f} {row['events_per_s']:>10,.0f} "
                f"{row['best_epoch']:>7} {row['val_ap']:>8.4f} {row['test_ap']:>8.4f} {row['last_val_ap']:>8.4f} "
                f"{row['last_test_ap']:>9.4f} {ratio:>12.2f}x"
            )
        print(f"\ntest AP over seeds {','.join(map(str, args.seeds))}: median [min, max]")
        for name in dict.fromkeys(row["system"] for row in rows):
            best = [row["test_ap"] for row in rows if row["system"] == name]
            final = [row["last_test_ap"] for row in rows if row["system"] == name]
            print(
                f"{name:<10} best-val epoch {statistics.median(best):.4f} [{min(best):.4f}, {max(best):.4f}]; "
                f"last epoch {statistics.median(final):.4f} [{min(final):.4f}, {max(final):.4f}]"
            )
    if args.scaling:
        print(
            f"\nscaling (memory parallelism, one thread per trainer, {args.epochs} epochs; --lr-scaling "
            f"{args.lr_scaling}, --evals-per-epoch {args.evals_per_epoch})"
        )
        print(
            f"{'trainers':>8} {'lr':>8} {'best val AP':>12} {'val AP by epoch':>24} {'s/epoch':>8} {'last test AP':>12} "
            f"{'train s to 1-trainer best':>26} {'at eval':>7} {'ratio':>7}"
        )
        table = scaling(args)
        for row in table:
            reached = "not reached" if row["train_s_to_target"] is None else f"{row['train_s_to_target']:.1f}"
            at_eval = "-" if row["evals_to_target"] is None else str(row["evals_to_target"])
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
            by_epoch = " ".join(f"{ap:.4f}" for ap in row["val_aps"])
            print(
                f"{row['trainers']:>8} {row['lr']:>8.2e} {row['best_val_ap']:>12.4f} {by_epoch:>24} {row['s_per_epoch']:>8.2f} {row['test_ap']:>12.4f} "
                f"{reached:>26} {at_eval:>7} {ratio:>7}"
            )
        largest = max(row["trainers"] for row in table if isinstance(row["trainers"], int))
        if largest > 1:
            warm_s = warm_up_seconds(events, largest, args.seed)
            print(
                f"warm-up of the last of {largest} copies (each epoch): {warm_s:.2f} s, one thread, "
                f"{warm_s / table[0]['s_per_epoch']:.1%} of one trainer's epoch"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Snapshot training: distgnn vs PyTorch Geometric Temporal, and the three schedules on a skewed sequence.

Part 1 (``--part peer``): chickenpox and england_covid (PyTorch Geometric Temporal's JSON files in
``../shared/data/pyg_temporal``), both sides on the same snapshots (distgnn's reader, framed as PyTorch
Geometric Temporal's loaders: lags 4 and 8, chronological 80/20 split), the same model (GConvGRU with
``--cheb-k``, 32 hidden, ReLU, a linear head), Adam at lr 0.01, ``--epochs`` epochs of one step on the mean
snapshot MSE, a zero state at every snapshot (``--window 1``: what PyTorch Geometric Temporal's examples do by
calling the cell without a state), for each of ``--seeds``. Seconds per epoch (the mean after the first) and
test MSE. Both sides compute the MSE of ``(N,)`` predictions against ``(N,)`` targets (the examples broadcast
an ``(N, 1)`` prediction against ``(N,)`` targets; that is not copied). One thread.

PyTorch Geometric Temporal imports ``torch_sparse`` when its package is imported, and there is no wheel of it
for this torch: where it does not import, this script puts a stub ``torch_sparse`` module (an empty
``SparseTensor`` class) on ``sys.path`` before importing the peer; the cells benchmarked here (ChebConv inside
GConvGRU) never call it. Without the peer installed, part 1 runs distgnn's side only.

Part 1b (``--part breakdown``): where an epoch goes on each ``--datasets`` entry, both sides in one process,
the same model and framing as part 1, ``--breakdown-epochs`` epochs after one warm-up: the forward, the backward
and the optimizer step (medians over epochs), aten ops an epoch and a snapshot (torch.profiler, nested ops
counted once each), and the adjacency's construction and normalisation per snapshot (PyTorch Geometric
Temporal's ``ChebConv.__norm__``, called inside every convolution of every epoch; distgnn's ``to_device``, once
per snapshot and then kept). What the ops' own time leaves of the profiled epoch is Python and dispatch.

Part 2 (``--part schedules``): ``examples/snapshot/train_dist.py --local`` with each schedule at 1, 2 and 4
trainers of one thread each on a skewed synthetic sequence (growing node set, log-normal bursts): epoch time,
load imbalance (max over mean of the trainers' busy time), speed-up over one trainer.

    flock /tmp/distgnn-heavy.lock python benchmarks/train_snapshot.py --seeds 0,1,2
    python benchmarks/train_snapshot.py --part breakdown --datasets twitter_tennis_rg17
    python benchmarks/train_snapshot.py --device cuda          # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from distgnn.train.result import read_result

ROOT = Path(__file__).resolve().parents[1]
PGT_DATA = ROOT / ".." / "shared" / "data" / "pyg_temporal"
TRAIN = ROOT / "examples" / "snapshot" / "train_dist.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="all", choices=("all", "peer", "breakdown", "schedules"))
    p.add_argument("--breakdown-epochs", type=int, default=5)
    p.add_argument("--datasets", default="chickenpox,england_covid")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--cheb-k", type=int, default=1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--synthetic-nodes", type=int, default=100_000)
    p.add_argument("--synthetic-snapshots", type=int, default=100)
    p.add_argument("--schedule-epochs", type=int, default=4)
    p.add_argument("--schedule-window", type=int, default=4)
    p.add_argument("--schedule-model", default="gconvgru")
    p.add_argument("--schedule-cheb-k", type=int, default=2, help="2: the convolutions read neighbours")
    p.add_argument("--procs-per-gpu", type=int, default=1, choices=(1, 2), help="with --device cuda")
    p.add_argument("--trainers", default="1,2,4")
    p.add_argument("--skip-pgt", action="store_true")
    return p.parse_args(argv)


# -- part 1 ------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_distgnn(name: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    from distgnn.nn.recurrent import SnapshotModel
    from distgnn.snapshot import read_pgt_json
    from distgnn.snapshot.schedule import make_plan, make_windows
    from distgnn.snapshot.train import SnapshotRunner, evaluate, train_epoch

    device = torch.device(args.device)
    seq = read_pgt_json(PGT_DATA / f"{name}.json")
    num_train = int(0.8 * len(seq))
    torch.manual_seed(seed)
    model = SnapshotModel("gconvgru", seq.num_features, args.hidden, args.cheb_k).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SnapshotRunner(model, seq, num_train, device, seed=seed)
    plan = make_plan("blad", seq.costs()[:num_train], make_windows(num_train, 1), 1)
    times = []
    for epoch in range(args.epochs):
        _sync(device)
        start = time.perf_counter()
        optimizer.zero_grad()
        train_epoch(runner, plan, epoch)
        optimizer.step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.mean(times[1:] or times), evaluate(runner, 1, num_train, len(seq))["mse"]


def pgt_available() -> bool:
    """Whether PyTorch Geometric Temporal imports (with a stub ``torch_sparse`` on ``sys.path`` when the real
    one is missing)."""
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        stub = Path(tempfile.mkdtemp(prefix="torch_sparse_stub-"))
        (stub / "torch_sparse").mkdir()
        (stub / "torch_sparse" / "__init__.py").write_text("class SparseTensor:\n    pass\n")
        sys.path.insert(0, str(stub))
    try:
        import torch_geometric_temporal  # noqa: F401
    except ImportError as e:
        print(f"PyTorch Geometric Temporal does not import ({e}): distgnn's side only", flush=True)
        return False
    return True


def run_pgt(name: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    from torch_geometric_temporal.nn.recurrent import GConvGRU

    from distgnn.snapshot import read_pgt_json

    device = torch.device(args.device)
    seq = read_pgt_json(PGT_DATA / f"{name}.json")
    num_train = int(0.8 * len(seq))
    data = []
    for s in seq:
        weight = s.edge_weight if s.edge_weight is not None else torch.ones(s.num_edges).numpy()
        data.append(
            tuple(
                torch.as_tensor(a).to(device)
                for a in (s.x, s.edge_index, torch.as_tensor(weight, dtype=torch.float32), s.y)
            )
        )

    class RecurrentGCN(torch.nn.Module):
        def __init__(self, features: int) -> None:
            super().__init__()
            self.recurrent = GConvGRU(features, args.hidden, args.cheb_k)
            self.linear = torch.nn.Linear(args.hidden, 1)

        def forward(self, x, edge_index, edge_weight):
            return self.linear(F.relu(self.recurrent(x, edge_index, edge_weight))).squeeze(-1)

    torch.manual_seed(seed)
    model = RecurrentGCN(seq.num_features).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    times = []
    for _ in range(args.epochs):
        _sync(device)
        start = time.perf_counter()
        cost = 0
        for x, ei, ew, y in data[:num_train]:
            cost = cost + torch.mean((model(x, ei, ew) - y) ** 2)
        (cost / num_train).backward()
        optimizer.step()
        optimizer.zero_grad()
        _sync(device)
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        test = [float(torch.mean((model(x, ei, ew) - y) ** 2)) for x, ei, ew, y in data[num_train:]]
    return statistics.mean(times[1:] or times), statistics.mean(test)


def part_peer(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    with_peer = not args.skip_pgt and pgt_available()
    rows = []
    for name in args.datasets.split(","):
        ours = [run_distgnn(name, seed, args) for seed in seeds]
        peer = [run_pgt(name, seed, args) for seed in seeds] if with_peer else []
        row = {"dataset": name, "seeds": seeds, "distgnn": ours, "pgt": peer}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"{'dataset':<15}{'side':<10}{'s/epoch':>10}{'test MSE mean':>15}{'min':>9}{'max':>9}{'speed-up':>10}")
    for row in rows:
        base = statistics.mean(t for t, _ in row["pgt"]) if row["pgt"] else None
        for side in ("pgt", "distgnn"):
            if not row[side]:
                continue
            t = statistics.mean(t for t, _ in row[side])
            mse = [m for _, m in row[side]]
            ratio = f"{base / t:.1f}x" if base else "-"
            print(
                f"{row['dataset']:<15}{side:<10}{t:>10.4f}{statistics.mean(mse):>15.4f}{min(mse):>9.4f}"
                f"{max(mse):>9.4f}{ratio:>10}"
            )
    return rows


# -- part 1b -----------------------------------------------------------------------------------------


def _epoch_parts(forward, step) -> tuple[float, float, float]:
    """Seconds of ``forward()`` (returns the loss), its backward, and ``step()``."""
    t0 = time.perf_counter()
    loss = forward()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    step()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def _profiled(forward, step) -> tuple[int, float, float]:
    """(aten ops, their own CPU seconds, the profiled epoch's seconds) of one epoch."""
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        forward().backward()
        step()
    wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    return sum(e.count for e in events), sum(e.self_cpu_time_total for e in events) / 1e6, wall


def breakdown_distgnn(name: str, args: argparse.Namespace) -> dict:
    from distgnn.nn.recurrent import SnapshotModel
    from distgnn.snapshot import read_pgt_json
    from distgnn.snapshot.schedule import make_plan, make_windows
    from distgnn.snapshot.sequence import to_device
    from distgnn.snapshot.train import SnapshotRunner, _lockstep_batch

    seq = read_pgt_json(PGT_DATA / f"{name}.json")
    num_train = int(0.8 * len(seq))
    t0 = time.perf_counter()
    for s in seq[:num_train]:
        to_device(s, torch.device("cpu"))
    adjacency = (time.perf_counter() - t0) / num_train
    torch.manual_seed(0)
    model = SnapshotModel("gconvgru", seq.num_features, args.hidden, args.cheb_k)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SnapshotRunner(model, seq, num_train, torch.device("cpu"))
    plan = make_plan("blad", seq.costs()[:num_train], make_windows(num_train, 1), 1)
    segments = plan.segments[0]
    batches = []
    while sum(len(b) for b in batches) < len(segments):
        batches.append(_lockstep_batch(runner, plan, segments, sum(len(b) for b in batches)))

    def forward():
        # train_epoch's lockstep batches, their losses summed before one backward (the same gradient).
        return sum(runner.lockstep_loss([s.start for s in b], 1, 0) for b in batches)

    def step():
        optimizer.step()
        optimizer.zero_grad()

    return _breakdown(forward, step, adjacency, num_train, args)


def breakdown_pgt(name: str, args: argparse.Namespace) -> dict:
    from torch_geometric.nn import ChebConv
    from torch_geometric_temporal.nn.recurrent import GConvGRU

    from distgnn.snapshot import read_pgt_json

    seq = read_pgt_json(PGT_DATA / f"{name}.json")
    num_train = int(0.8 * len(seq))
    data = [
        (torch.as_tensor(s.x), torch.as_tensor(s.edge_index), torch.as_tensor(s.edge_weight), torch.as_tensor(s.y))
        for s in seq[:num_train]
    ]
    torch.manual_seed(0)
    recurrent = GConvGRU(seq.num_features, args.hidden, args.cheb_k)
    linear = torch.nn.Linear(args.hidden, 1)
    optimizer = torch.optim.Adam([*recurrent.parameters(), *linear.parameters()], lr=0.01)
    norm = ChebConv.__norm__
    calls = [0, 0.0]  # __norm__ calls, their seconds

    def timed_norm(*a, **k):
        t0 = time.perf_counter()
        out = norm(*a, **k)
        calls[0] += 1
        calls[1] += time.perf_counter() - t0
        return out

    def forward():
        cost = 0
        for x, ei, ew, y in data:
            cost = cost + torch.mean((linear(F.relu(recurrent(x, ei, ew))).squeeze(-1) - y) ** 2)
        return cost / num_train

    def step():
        optimizer.step()
        optimizer.zero_grad()

    row = _breakdown(forward, step, 0.0, num_train, args)
    ChebConv.__norm__ = timed_norm
    try:
        with torch.no_grad():
            forward()
    finally:
        ChebConv.__norm__ = norm
    # Every convolution of every epoch normalises its snapshot's adjacency again.
    row["adjacency_s_per_snapshot"] = calls[1] / num_train
    row["adjacency_calls_per_snapshot"] = calls[0] / num_train
    return row


def _breakdown(forward, step, adjacency: float, snapshots: int, args: argparse.Namespace) -> dict:
    _epoch_parts(forward, step)
    parts = [_epoch_parts(forward, step) for _ in range(args.breakdown_epochs)]
    ops, op_s, profiled = _profiled(forward, step)
    f, b, o = (statistics.median(p[i] for p in parts) for i in range(3))
    return {
        "epoch_s": f + b + o,
        "forward_s": f,
        "backward_s": b,
        "step_s": o,
        "ops_per_epoch": ops,
        "ops_per_snapshot": ops / snapshots,
        "not_in_ops_share": max(0.0, 1 - op_s / profiled),
        "adjacency_s_per_snapshot": adjacency,
    }


def part_breakdown(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(1)
    with_peer = not args.skip_pgt and pgt_available()
    rows = []
    for name in args.datasets.split(","):
        for side, run in (("pgt", breakdown_pgt), ("distgnn", breakdown_distgnn)):
            if side == "pgt" and not with_peer:
                continue
            row = {"dataset": name, "side": side, **run(name, args)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    head = f"{'dataset':<22}{'side':<9}{'epoch s':>9}{'fwd s':>8}{'bwd s':>8}{'step s':>8}"
    print(head + f"{'ops/epoch':>10}{'ops/snap':>9}{'not in ops':>11}{'adj ms/snap':>12}")
    for r in rows:
        print(
            f"{r['dataset']:<22}{r['side']:<9}{r['epoch_s']:>9.4f}{r['forward_s']:>8.4f}{r['backward_s']:>8.4f}"
            f"{r['step_s']:>8.4f}{r['ops_per_epoch']:>10}{r['ops_per_snapshot']:>9.1f}"
            f"{r['not_in_ops_share']:>10.0%}{1e3 * r['adjacency_s_per_snapshot']:>12.3f}"
        )
    return rows


# -- part 2 ------------------------------------------------------------------------------------------


def run_example(schedule: str, trainers: int, args: argparse.Namespace, workdir: Path) -> dict:
    cmd = [
        sys.executable,
        str(TRAIN),
        "--dataset=synthetic",
        f"--synthetic-nodes={args.synthetic_nodes}",
        f"--synthetic-snapshots={args.synthetic_snapshots}",
        f"--model={args.schedule_model}",
        f"--window={args.schedule_window}",
        f"--epochs={args.schedule_epochs}",
        f"--schedule={schedule}",
        f"--cheb-k={args.schedule_cheb_k}",
        f"--device={args.device}",
        "--num-threads=1",
        "--no-eval",
        "--quiet",
        f"--workdir={workdir}",
    ]
    cmd += ["--single"] if trainers == 1 else ["--local", f"--num-parts={trainers}"]
    if trainers > 1 and args.procs_per_gpu > 1:
        cmd.append(f"--procs-per-gpu={args.procs_per_gpu}")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return read_result(proc.stdout)


def part_schedules(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trainers in [int(t) for t in args.trainers.split(",")]:
            for schedule in ("blad", "contiguous", "vertex"):
                if trainers == 1 and schedule != "blad":
                    continue  # one trainer: the three schedules are the same single process
                result = run_example(schedule, trainers, args, Path(tmp))
                rows.append(result)
                print(json.dumps(result), flush=True)
    one = next(r["epoch_time_s"] for r in rows if r["num_trainers"] == 1)
    print()
    print(f"{'schedule':<12}{'trainers':>9}{'epoch s':>10}{'speed-up':>10}{'imbalance':>11}{'planned':>9}")
    for r in rows:
        name = r["schedule"] if r["num_trainers"] > 1 else "(single)"
        print(
            f"{name:<12}{r['num_trainers']:>9}{r['epoch_time_s']:>10.3f}{one / r['epoch_time_s']:>9.2f}x"
            f"{r['load_imbalance']:>11.3f}{r['planned_imbalance']:>9.3f}"
        )
    return rows


def main() -> None:
    args = parse_args()
    if args.part in ("all", "peer"):
        part_peer(args)
    if args.part == "breakdown":
        part_breakdown(args)
    if args.part in ("all", "schedules"):
        part_schedules(args)


if __name__ == "__main__":
    main()

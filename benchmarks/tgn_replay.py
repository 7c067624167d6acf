"""The per-epoch memory replay of a memory copy: the chunk-by-chunk replay against the planned one, same stream.

    python benchmarks/tgn_replay.py [--dataset events:PATH] [--columns ...] [--copies 2] [--device cpu|cuda]

Under memory parallelism k, the copy that trains the last segment empties its memory every epoch and replays the
training events before its segment (batches of 200) with the current weights. ``chunked`` is
:func:`~distgnn.temporal.warm.replay_memory` (each chunk's distinct endpoints and mail found on the device: a
host sync per chunk on a GPU); ``planned`` is :class:`~distgnn.temporal.warm.StreamReplay` (indices found once
on the host, then per call only the GRU and the writes; on a GPU from a CUDA graph after its first call;
``planned eager`` is that replay without the graph). Each is timed ``--repeats`` times, interleaved, after a
warm-up call (on a GPU the planned replay's first call, eager and then captured), on a GPU synchronised around
each call; the weights move a little between calls, as an epoch moves them.
The table gives the median, fastest and slowest call, the ratio of medians against ``chunked``, and the
largest difference of the replayed memory from ``chunked``'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from distgnn.data.events import parse_columns
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal.job import load_stream
from distgnn.temporal.train import batch_ranges, chronological_split
from distgnn.temporal.warm import StreamReplay, replay_memory

ROOT = Path(__file__).resolve().parents[1]
COLLEGE_MSG = ROOT / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"
DIM, BATCH = 100, 200


def timed(call, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def largest_difference(a: NodeMemory, b: NodeMemory) -> float:
    return max(float((getattr(a, f).double() - getattr(b, f).double()).abs().max()) for f in NodeMemory.FIELDS)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    p.add_argument("--columns", type=parse_columns, help="the stream's columns (the example's flag)")
    p.add_argument("--copies", type=int, default=2, help="memory copies: the last one's segment start is replayed")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    events = load_stream(args.dataset, seed=0, columns=args.columns)
    batches = batch_ranges(0, chronological_split(len(events))[0], BATCH)
    stop = batches[len(batches) - len(batches) // args.copies][0]
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim, DIM, DIM, DIM, heads=2).to(device)
    src, dst, times = (torch.from_numpy(a).to(device) for a in (events.src, events.dst, events.time))
    feat = None if events.feat is None else torch.from_numpy(events.feat).to(device)
    planned_at = time.perf_counter()
    replay = StreamReplay(src, dst, times, feat, stop, BATCH, device)
    plan_s = time.perf_counter() - planned_at
    reference = model.new_memory(device)

    def chunked() -> None:
        reference.reset()
        replay_memory(model, reference, src, dst, times, feat, batch_ranges(0, stop, BATCH))

    memory = model.new_memory(device)
    variants = {"chunked": chunked, "planned": lambda: replay.replay(model, memory)}
    if device.type == "cuda":
        variants["planned eager"] = lambda: replay.replay(model, memory, graph=False)
    print(
        f"stream {args.dataset}: {len(events)} events; replay of events [0, {stop}) ({len(batches[: stop // BATCH])} "
        f"chunks, {replay.num_reads} memory reads) for copy {args.copies - 1} of {args.copies}; device {device}, "
        f"{args.threads} thread(s); plan {plan_s:.3f} s (once); {time.strftime('%Y-%m-%d %H:%M')}"
    )
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    differences: dict[str, float] = {name: 0.0 for name in variants}
    for call in variants.values():
        call()  # warm-up: on a GPU the planned replay's first call runs eagerly and is captured
    for _ in range(args.repeats):
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1.001)
        for name, call in variants.items():  # interleaved: load on the machine falls on each alike
            seconds[name].append(timed(call, device))
            if name != "chunked":
                differences[name] = max(differences[name], largest_difference(memory, reference))
    base = statistics.median(seconds["chunked"])
    print(f"{'replay':<14} {'median s':>9} {'fastest':>9} {'slowest':>9} {'vs chunked':>11} {'max |diff|':>11}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(
            f"{name:<14} {median:>9.4f} {min(values):>9.4f} {max(values):>9.4f} {base / median:>10.2f}x "
            f"{differences[name]:>11.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

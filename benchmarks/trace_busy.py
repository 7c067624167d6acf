"""How busy the GPU was in a torch.profiler trace of a training run: kernel time over wall time, per epoch.

Reads the Chrome trace that ``benchmarks/scaling.py --timeline T --trace PATH`` (``train_dist.py --trace``) writes
and, for each epoch's span of batches (from the ``distgnn.wait`` ranges to the last ``distgnn.compute`` range), prints
the union of GPU kernel, copy and fill intervals over the wall time: the fraction of the epoch in which the GPU
was running something. Unlike the timeline's "GPU busy" (the union of each stage's CUDA-event interval, which
counts a stage's gaps between kernels as busy), this counts only device activity.

    python3 benchmarks/trace_busy.py trace-1gpu.json [--batches-per-epoch 30]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def union(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to [lo, hi]."""
    busy, reach = 0.0, lo
    for begin, end in sorted(intervals):
        begin, end = max(begin, reach), min(end, hi)
        if end > begin:
            busy += end - begin
            reach = end
    return busy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--batches-per-epoch", type=int, required=True, help="the run's --max-batches")
    args = p.parse_args()
    events = load(args.trace)
    device = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATEGORIES]
    waits = sorted(e["ts"] for e in events if e["name"] == "distgnn.wait" and e.get("cat") == "user_annotation")
    computes = sorted(
        e["ts"] + e["dur"] for e in events if e["name"] == "distgnn.compute" and e.get("cat") == "user_annotation"
    )
    n = args.batches_per_epoch
    for epoch in range(len(waits) // n):
        lo, hi = waits[epoch * n], computes[(epoch + 1) * n - 1]
        # The last compute range ends on the host; let the GPU finish the work it queued (up to the next batch).
        cap = waits[(epoch + 1) * n] if (epoch + 1) * n < len(waits) else float("inf")
        tail = max((end for begin, end in device if lo <= begin < cap), default=hi)
        hi = max(hi, min(tail, cap))
        busy = union(device, lo, hi)
        print(
            f"epoch {epoch}: {n} batches, wall {(hi - lo) / 1e3:.1f} ms, GPU active {busy / 1e3:.1f} ms "
            f"({busy / (hi - lo):.0%}), {sum(1 for b, _ in device if lo <= b < hi) / n:.0f} device ops per batch"
        )


if __name__ == "__main__":
    main()

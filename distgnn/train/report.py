"""``distgnn-report RUN_DIR``: plots of a run's ``metrics.jsonl`` (see :mod:`distgnn.train.metrics`) as PNG.

Draws ``loss.png`` (loss and accuracy over steps: per-step records as a line, per-epoch records as
points) and ``stages.png`` (per epoch, the slowest trainer's sample / fetch / compute / wait seconds as
stacked bars, with the epoch's wall time). A run resumed from a checkpoint appends to the same file and
repeats some steps: the last record of each step wins. Needs matplotlib (``pip install 'distgnn[report]'``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from distgnn.errors import InputError
from distgnn.train.metrics import METRICS_FILE, STAGES

log = logging.getLogger(__name__)

_STAGE_COLOURS = {"sample_s": "#4C72B0", "fetch_s": "#55A868", "compute_s": "#C44E52", "wait_s": "#8172B2"}


def read_records(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Records by kind (``"epoch"``, ``"step"``), sorted by step, the last one of each step (or epoch) kept.

    ``path``: a run directory or its ``metrics.jsonl``. A line cut short by a crash is skipped with a warning.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise InputError(f"no metrics file {path}: run training with --run-dir to write one")
    latest: dict[str, dict[Any, dict]] = {}
    bad = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record["kind"]
            key = record["epoch"] if kind == "epoch" else record["step"]
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        latest.setdefault(kind, {})[key] = record
    if bad:
        log.warning("skipped %d malformed lines in %s", bad, path)
    return {
        kind: sorted(by_key.values(), key=lambda r: (r["step"], r.get("epoch", 0))) for kind, by_key in latest.items()
    }


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "distgnn-report needs matplotlib: pip install 'distgnn[report]' (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _series(records: list[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def loss_series(records: dict[str, list[dict]]) -> dict[str, dict[str, tuple[list, list]]]:
    """What ``loss.png`` draws: for ``"loss"`` and ``"acc"``, the ``"step"`` and ``"epoch"`` lines as
    ``(optimizer steps, values)``, records without the value left out."""
    return {key: {kind: _series(records.get(kind, []), key) for kind in ("step", "epoch")} for key in ("loss", "acc")}


def stage_bars(epochs: list[dict]) -> tuple[list, dict[str, tuple[list, list]], list]:
    """What ``stages.png`` draws: the epochs, each stage's ``(heights, bottoms)`` stacked in ``STAGES`` order (a
    missing stage counts 0), and each epoch's wall time."""
    xs = [r["epoch"] for r in epochs]
    bottom = [0.0] * len(epochs)
    bars = {}
    for stage in STAGES:
        heights = [r.get(stage) or 0.0 for r in epochs]
        bars[stage] = (heights, bottom)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    return xs, bars, [r.get("epoch_s") or 0.0 for r in epochs]


def plot_loss(records: dict[str, list[dict]], out: Path, title: str) -> Path:
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    series = loss_series(records)
    for key, ax, label in (("loss", ax_loss, "training loss"), ("acc", ax_acc, "training accuracy")):
        steps, values = series[key]["step"]
        if steps:
            ax.plot(steps, values, color="#999999", linewidth=1, label="per step")
        steps, values = series[key]["epoch"]
        if steps:
            ax.plot(steps, values, "o-", color="#C44E52", label="epoch (all trainers)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_stages(epochs: list[dict], out: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(8.5, 0.6 * len(epochs) + 4), 4.8))
    xs, bars, epoch_s = stage_bars(epochs)
    for stage, (heights, bottom) in bars.items():
        ax.bar(xs, heights, bottom=bottom, color=_STAGE_COLOURS[stage], label=stage.removesuffix("_s"), width=0.7)
    ax.plot(xs, epoch_s, "k_", markersize=28, markeredgewidth=2, label="epoch time")
    ax.set_xlabel("epoch")
    ax.set_ylabel("seconds (slowest trainer)")
    ax.set_xticks(xs)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    # Top of the stack first, as the bars read.
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    fig.text(
        0.01,
        0.01,
        "With prefetching, sampling and fetching run ahead of compute; 'wait' is what they cost the trainer.",
        fontsize=8,
        color="#555555",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def report(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw the run's plots into ``out_dir`` (default: the run directory); returns the files written."""
    run_dir = Path(run_dir)
    records = read_records(run_dir)
    if not records.get("epoch") and not records.get("step"):
        raise InputError(f"{run_dir} has no epoch or step records to plot")
    out = Path(out_dir) if out_dir is not None else (run_dir if run_dir.is_dir() else run_dir.parent)
    out.mkdir(parents=True, exist_ok=True)
    title = run_dir.resolve().name if run_dir.is_dir() else run_dir.resolve().parent.name
    written = [plot_loss(records, out / "loss.png", title)]
    if records.get("epoch"):
        written.append(plot_stages(records["epoch"], out / "stages.png", title))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distgnn-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl (or the file itself)")
    parser.add_argument("--out", default=None, help="where the PNGs go (default: the run directory)")
    args = parser.parse_args(argv)
    try:
        written = report(args.run_dir, args.out)
    except InputError as exc:
        print(f"distgnn-report: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

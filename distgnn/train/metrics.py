"""Training metrics: per-epoch and per-N-step records as JSON lines in the run directory, and TensorBoard.

An epoch's :class:`distgnn.train.epoch.EpochSummary` (already reduced over the trainers by
``EpochMeter.finish``: loss, accuracy, the slowest trainer's sample / fetch / compute / wait seconds,
throughput, cache hits) plus the RPC bytes of all trainers (:class:`RpcTraffic`) becomes one record;
:class:`MetricsLogger` appends records on rank 0 to ``<run dir>/metrics.jsonl`` (one JSON object a line,
``"kind": "epoch"`` or ``"step"``) and, when asked for and installed, to TensorBoard.
``distgnn-report RUN_DIR`` (:mod:`distgnn.train.report`) draws them.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from distgnn.errors import ConfigError
from distgnn.train.epoch import EpochSummary, all_reduce

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# Stage times a record may carry, in seconds (the slowest trainer's), in the order the report stacks them.
STAGES = ("sample_s", "fetch_s", "compute_s", "wait_s")


def epoch_record(summary: EpochSummary, step: int, rpc_bytes: tuple[int, int] | None = None) -> dict[str, Any]:
    """The JSON record of an epoch (:class:`distgnn.train.epoch.EpochSummary`, already reduced over trainers)
    after ``step`` optimizer steps; ``rpc_bytes`` from :meth:`RpcTraffic.take`."""
    lookups = summary.cache_lookups
    record = {
        "epoch": summary.epoch,
        "step": step,
        "loss": summary.loss,
        "acc": summary.accuracy,
        "epoch_s": summary.time_s,
        **dict(zip(STAGES, summary.stage_times, strict=True)),
        "edges_per_s": summary.edges_per_s,
        "cache_hit_rate": summary.cache_hits / lookups if lookups else None,
    }
    if rpc_bytes is not None:
        record["rpc_sent_bytes"], record["rpc_received_bytes"] = rpc_bytes
    return record


class RpcTraffic:
    """RPC bytes sent and received by all trainers (their main processes) between calls of :meth:`take`.

    Args:
        client: this trainer's :class:`distgnn.rpc.RpcClient` (``DistContext.client``).
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._last = client.traffic()

    def take(self) -> tuple[int, int]:
        """``(sent, received)`` bytes since the last call, summed over trainers (a collective)."""
        now = self._client.traffic()
        delta = [float(now[0] - self._last[0]), float(now[1] - self._last[1])]
        self._last = now
        sent, received = all_reduce(delta)
        return int(sent), int(received)


class MetricsLogger:
    """Writes records on rank 0 (other ranks' calls do nothing): JSON lines, and TensorBoard if asked for.

    Args:
        run_dir: ``metrics.jsonl`` is appended to here (a resumed run adds to its file; the report keeps
            the last record of each step).
        rank: this trainer's rank (torch.distributed's if None).
        tensorboard_dir: also write TensorBoard scalars here; if ``tensorboard`` is not installed, one warning.
        every_n_steps: :meth:`should_log_step` is true every N steps (0: never).
    """

    def __init__(
        self,
        run_dir: str | Path,
        rank: int | None = None,
        tensorboard_dir: str | Path | None = None,
        every_n_steps: int = 0,
    ) -> None:
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.enabled = rank == 0
        self.every_n_steps = every_n_steps
        self.path = Path(run_dir) / METRICS_FILE
        self._file = None
        self._tb = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.warning(
                    "--tensorboard %s: the tensorboard package is not installed (pip install tensorboard); "
                    "metrics go to %s only",
                    tensorboard_dir,
                    self.path,
                )
            else:
                self._tb = SummaryWriter(str(tensorboard_dir))

    def should_log_step(self, step: int) -> bool:
        return self.every_n_steps > 0 and step % self.every_n_steps == 0

    def log(self, kind: str, record: dict[str, Any]) -> None:
        """Append ``{"kind": kind, "time": unix seconds, **record}``; ``record`` needs ``step``."""
        if not self.enabled:
            return
        if "step" not in record:
            raise ValueError(f"a metrics record needs a 'step', got keys {sorted(record)}")
        line = {"kind": kind, "time": time.time(), **record}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self._tb.add_scalar(f"{kind}/{key}", value, record["step"])
            self._tb.flush()

    def log_epoch(self, summary: EpochSummary, step: int, rpc_bytes: tuple[int, int] | None = None) -> None:
        """Record an epoch (see :func:`epoch_record`)."""
        self.log("epoch", epoch_record(summary, step, rpc_bytes))

    def log_step(self, step: int, epoch: int, **values: float) -> None:
        self.log("step", {"step": step, "epoch": epoch, **values})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def add_metrics_args(parser: argparse.ArgumentParser) -> None:
    """``--run-dir D --metrics-every N --tensorboard DIR``."""
    group = parser.add_argument_group("metrics")
    group.add_argument("--run-dir", default=None, help="rank 0 appends metrics.jsonl here (see distgnn-report)")
    group.add_argument("--metrics-every", type=int, default=0, help="also a record every N steps (0: per epoch)")
    group.add_argument("--tensorboard", default=None, metavar="DIR", help="also write TensorBoard scalars here")


def metrics_from_args(args: argparse.Namespace, rank: int | None = None) -> MetricsLogger | None:
    """The MetricsLogger the flags of :func:`add_metrics_args` ask for (None without ``--run-dir``)."""
    if args.run_dir is None:
        if args.tensorboard is not None or args.metrics_every:
            raise ConfigError("--tensorboard and --metrics-every need --run-dir")
        return None
    return MetricsLogger(args.run_dir, rank, args.tensorboard, args.metrics_every)

"""Training metrics: per-epoch and per-N-step records as JSON lines in the run directory, and TensorBoard.

A training loop keeps an :class:`EpochMeter` per epoch (loss, accuracy, seeds, sampled edges, the
sample / fetch / compute / wait seconds, cache counters, RPC bytes), reduces it over the trainers with the
all_reduce it already does (:meth:`EpochMeter.reduce`: sums, and the slowest trainer's times), and hands the
record to :class:`MetricsLogger`, which on rank 0 appends it to ``<run dir>/metrics.jsonl``
(one JSON object a line, ``"kind": "epoch"`` or ``"step"``) and, when asked for and installed, to
TensorBoard. ``distgnn-report RUN_DIR`` (:mod:`distgnn.report`) draws them.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distgnn.errors import ConfigError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# Stage times a record may carry, in seconds (the slowest trainer's), in the order the report stacks them.
STAGES = ("sample_s", "fetch_s", "compute_s", "wait_s")


class EpochMeter:
    """What one trainer did in one epoch, reduced over all trainers at its end.

    Call :meth:`add_batch` per step with plain numbers (convert device tensors once per epoch where a
    host sync per batch would cost: pass them as 0-d tensors, they are summed as tensors).
    """

    def __init__(self, rpc_client: Any = None) -> None:
        self.start = time.perf_counter()
        self.totals: dict[str, Any] = {"loss_sum": 0.0, "correct": 0.0, "seen": 0.0, "edges": 0.0, "batches": 0.0}
        self.stages = dict.fromkeys(STAGES, 0.0)
        self.cache = [0.0, 0.0]  # hits, lookups
        self._client = rpc_client
        self._traffic0 = rpc_client.traffic() if rpc_client is not None else (0, 0)

    def add_batch(
        self,
        loss_sum: float | torch.Tensor,
        correct: float | torch.Tensor,
        seen: int,
        edges: int = 0,
        **stage_seconds: float,
    ) -> None:
        """One batch: summed loss over its seeds, correct predictions, seed count, sampled edges, and stage
        seconds by name (``sample_s``, ``fetch_s``, ``compute_s``, ``wait_s``)."""
        unknown = stage_seconds.keys() - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; known: {STAGES}")
        self.totals["loss_sum"] = self.totals["loss_sum"] + loss_sum
        self.totals["correct"] = self.totals["correct"] + correct
        self.totals["seen"] += seen
        self.totals["edges"] += edges
        self.totals["batches"] += 1
        for name, seconds in stage_seconds.items():
            self.stages[name] += seconds

    def add_cache(self, hits: float, lookups: float) -> None:
        self.cache[0] += hits
        self.cache[1] += lookups

    def reduce(self, epoch: int, step: int) -> dict[str, Any]:
        """The epoch's record, the same on every trainer (collective under torch.distributed): loss and
        accuracy over all trainers' seeds, throughput over the slowest trainer's time, stage seconds of the
        slowest trainer, cache hit rate and RPC bytes summed over trainers."""
        elapsed = time.perf_counter() - self.start
        sent, received = self._client.traffic() if self._client is not None else (0, 0)
        sums = [
            float(self.totals["loss_sum"]),
            float(self.totals["correct"]),
            self.totals["seen"],
            self.totals["edges"],
            self.totals["batches"],
            *self.cache,
            float(sent - self._traffic0[0]),
            float(received - self._traffic0[1]),
        ]
        slowest = [elapsed, *self.stages.values()]
        sums, slowest = _all_reduce(sums, "sum"), _all_reduce(slowest, "max")
        loss_sum, correct, seen, edges, batches, hits, lookups, sent, received = sums
        epoch_s = slowest[0]
        record = {
            "epoch": epoch,
            "step": step,
            "loss": loss_sum / seen if seen else None,
            "acc": correct / seen if seen else None,
            "batches": int(batches),
            "epoch_s": epoch_s,
            "seeds_per_s": seen / epoch_s if epoch_s > 0 else None,
            "edges_per_s": edges / epoch_s if epoch_s > 0 else None,
            **dict(zip(STAGES, slowest[1:], strict=True)),
            "cache_hit_rate": hits / lookups if lookups else None,
            "rpc_sent_bytes": int(sent),
            "rpc_received_bytes": int(received),
        }
        return record


def _all_reduce(values: list[float], op: str) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()):
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


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

    def log_epoch(self, record: dict[str, Any]) -> None:
        self.log("epoch", record)

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

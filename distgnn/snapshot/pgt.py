"""Reader for the JSON layouts of PyTorch Geometric Temporal's datasets, recognised by their keys.

Four layouts, framed as PyTorch Geometric Temporal's own loaders frame them (any file in one of these layouts
reads without change):

* ``edges``, ``FX`` (chickenpox): a static graph with weight 1; features the previous ``lags`` weeks, target
  the week after (lags 4).
* ``edges``, ``weights``, ``X`` (pedalme): a static weighted graph, the same lag framing (lags 4).
* ``time_periods``, ``edge_mapping`` (``edge_index``/``edge_weight`` by time), ``y`` (england_covid): a graph per
  day; the signal standardised per node; the previous ``lags`` days predict the next (lags 8); snapshot ``t``
  takes day ``t``'s edges.
* ``time_periods`` and one object per time ``"0"``, ``"1"``... with ``edges``, ``weights``, ``X`` ([degree,
  transitivity] per node), ``y`` (twitter_tennis): features one-hot encoded (ceil(log(degree + 1)) capped at 4:
  5 columns; floor(10 x transitivity): 11 columns), target log(1 + y) of the next time (the last one repeats).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from distgnn.errors import InputError
from distgnn.snapshot.sequence import Snapshot, SnapshotSequence

# The lags PyTorch Geometric Temporal's loaders use by default, by layout.
DEFAULT_LAGS = {"static": 4, "static_weighted": 4, "mobility": 8, "per_time": 0}


def layout_of(data: dict[str, Any], path: str) -> str:
    """Which of the four layouts ``data`` is in, from its keys.

    Raises:
        InputError: the keys match none of them (the message lists what each needs).
    """
    keys = set(data)
    if {"time_periods", "edge_mapping", "y"} <= keys:
        return "mobility"
    if "time_periods" in keys and "0" in keys:
        return "per_time"
    if {"edges", "weights", "X"} <= keys:
        return "static_weighted"
    if {"edges", "FX"} <= keys:
        return "static"
    raise InputError(
        f"{path}: keys {sorted(keys)[:8]} match no PyTorch Geometric Temporal layout; expected one of "
        "{edges, FX} (chickenpox), {edges, weights, X} (pedalme), {time_periods, edge_mapping, y} "
        '(england_covid), {time_periods, "0", "1", ...} (twitter_tennis)'
    )


def read_pgt_json(path: str | os.PathLike, lags: int | None = None) -> SnapshotSequence:
    """Read a PyTorch Geometric Temporal JSON file into a :class:`SnapshotSequence` of node regression.

    Args:
        path: the JSON file.
        lags: past steps as features for the lag layouts (default: the layout's, 4 or 8); ignored by the
            per-time layout (its features are its own).

    Raises:
        InputError: unreadable JSON (the message gives the line and column), a missing key, a value that is
            not a finite number (the message names its key and index), inconsistent shapes, or ``lags`` that
            leave no snapshot.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read it as JSON ({e})") from e
    if not isinstance(data, dict):
        raise InputError(f"{path}: the top level is a {type(data).__name__}, expected an object of keys")
    layout = layout_of(data, str(path))
    lags = DEFAULT_LAGS[layout] if lags is None else lags
    if layout != "per_time" and lags < 1:
        raise InputError(f"{path}: lags {lags}; give at least 1")
    name = path.stem
    if layout == "static":
        edges = _edges(data["edges"], path, "edges")
        return _lagged(name, _matrix(data["FX"], path, "FX"), lambda t: (edges, None), lags, path)
    if layout == "static_weighted":
        edges = _edges(data["edges"], path, "edges")
        weights = _vector(data["weights"], path, "weights", edges.shape[1])
        return _lagged(name, _matrix(data["X"], path, "X"), lambda t: (edges, weights), lags, path)
    if layout == "mobility":
        return _mobility(name, data, lags, path)
    return _per_time(name, data, path)


def _require(data: dict[str, Any], key: str, path: Path, where: str = "") -> Any:
    if key not in data:
        raise InputError(f"{path}: {where}no key {key!r}; the layout needs it")
    return data[key]


def _numbers(raw: Any, path: Path, key: str) -> np.ndarray:
    """``raw`` as a float64 array of finite numbers (nested lists of one shape), or an InputError naming ``key``
    and the first bad entry."""
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise InputError(
            f"{path}: {key} is not an array of numbers (rows differ in length, or a value is not a number: {e})"
        ) from e
    bad = ~np.isfinite(arr)
    if bad.any():
        where = "".join(f"[{i}]" for i in np.argwhere(bad)[0])
        raise InputError(f"{path}: {key}{where} is {arr[bad].flat[0]}, expected a finite number")
    return arr


def _edges(raw: Any, path: Path, key: str) -> np.ndarray:
    arr = _numbers(raw, path, key)
    if arr.size == 0:
        return np.zeros((2, 0), np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InputError(f"{path}: {key} has shape {arr.shape}, expected a list of [u, v] pairs")
    fractional = arr != np.floor(arr)
    if fractional.any():
        row, column = np.argwhere(fractional)[0]
        raise InputError(f"{path}: {key}[{row}][{column}] is {arr[row, column]}, expected an integer node id")
    return np.ascontiguousarray(arr.T.astype(np.int64))


def _matrix(raw: Any, path: Path, key: str) -> np.ndarray:
    arr = _numbers(raw, path, key)
    if arr.ndim != 2:
        raise InputError(f"{path}: {key} has shape {arr.shape}, expected [time][node]")
    return arr


def _vector(raw: Any, path: Path, key: str, length: int) -> np.ndarray:
    arr = _numbers(raw, path, key).astype(np.float32).reshape(-1)
    if arr.shape[0] != length:
        raise InputError(f"{path}: {key} has {arr.shape[0]} values for {length} edges; give one per edge")
    return arr


def _count(raw: Any, path: Path, key: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise InputError(f"{path}: {key} is {raw!r}, expected a positive integer")
    return raw


def _lagged(name: str, signal: np.ndarray, graph_at, lags: int, path: Path) -> SnapshotSequence:
    """Snapshot ``t``: features ``signal[t : t + lags].T``, target ``signal[t + lags]``, graph ``graph_at(t)``."""
    steps, n = signal.shape
    if steps <= lags:
        raise InputError(f"{path}: {steps} time steps with {lags} lags leave no snapshot; give fewer lags")
    snapshots = []
    for t in range(steps - lags):
        edges, weights = graph_at(t)
        snapshots.append(
            Snapshot(
                edges,
                weights,
                np.ascontiguousarray(signal[t : t + lags].T, np.float32),
                signal[t + lags].astype(np.float32),
                n,
            )
        )
    return _sequence(snapshots, name, path)


def _mobility(name: str, data: dict[str, Any], lags: int, path: Path) -> SnapshotSequence:
    periods = _count(data["time_periods"], path, "time_periods")
    mapping = data["edge_mapping"]
    if not isinstance(mapping, dict):
        raise InputError(f"{path}: edge_mapping is a {type(mapping).__name__}, expected an object of keys")
    index = _require(mapping, "edge_index", path, "edge_mapping: ")
    weight = _require(mapping, "edge_weight", path, "edge_mapping: ")
    signal = _matrix(data["y"], path, "y")
    if signal.shape[0] != periods:
        raise InputError(f"{path}: y has {signal.shape[0]} time steps, time_periods says {periods}")
    # Standardised per node, as the reference loader does.
    signal = (signal - signal.mean(axis=0)) / (signal.std(axis=0) + 1e-10)

    def graph_at(t: int) -> tuple[np.ndarray, np.ndarray]:
        edges = _edges(_require(index, str(t), path, "edge_mapping.edge_index: "), path, f"edge_index[{t}]")
        raw = _require(weight, str(t), path, "edge_mapping.edge_weight: ")
        return edges, _vector(raw, path, f"edge_weight[{t}]", edges.shape[1])

    graphs = [graph_at(t) for t in range(periods)]  # every day checked, also those past the last snapshot
    return _lagged(name, signal, graphs.__getitem__, lags, path)


def _sequence(snapshots: list[Snapshot], name: str, path: Path) -> SnapshotSequence:
    """The sequence, its consistency errors (an edge id past the node count, ...) naming the file."""
    try:
        return SnapshotSequence(snapshots, name)
    except InputError as e:
        raise InputError(f"{path}: {e}") from e


def _one_hot(values: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((len(values), width), np.float32)
    out[np.arange(len(values)), values.astype(np.int64)] = 1.0
    return out


def encode_degree_transitivity(raw: np.ndarray) -> np.ndarray:
    """``(N, 2)`` [degree, transitivity] -> ``(N, 16)`` float32 one-hot: ceil(log(degree + 1)) capped at 4,
    then floor(10 x transitivity) in 0..10."""
    degree = np.minimum(np.ceil(np.log(raw[:, 0] + 1.0)), 4)
    transitivity = np.clip(np.floor(raw[:, 1] * 10), 0, 10)
    return np.concatenate([_one_hot(degree, 5), _one_hot(transitivity, 11)], axis=1)


def _per_time(name: str, data: dict[str, Any], path: Path) -> SnapshotSequence:
    periods = _count(data["time_periods"], path, "time_periods")
    steps = [_time_step(data, t, path) for t in range(periods)]
    snapshots = []
    for t, (edges, weights, raw, _) in enumerate(steps):
        y = np.log1p(steps[min(t + 1, periods - 1)][3]).astype(np.float32)  # the last time repeats its target
        snapshots.append(Snapshot(edges, weights, encode_degree_transitivity(raw), y, raw.shape[0]))
    return _sequence(snapshots, name, path)


def _time_step(data: dict[str, Any], t: int, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Time ``t`` of the per-time layout: its edges, weights, raw [degree, transitivity] rows and ``y``."""
    step = _require(data, str(t), path)
    if not isinstance(step, dict):
        raise InputError(f"{path}: {t} is a {type(step).__name__}, expected an object of keys")
    edges = _edges(_require(step, "edges", path, f"time {t}: "), path, f"{t}.edges")
    weights = _vector(_require(step, "weights", path, f"time {t}: "), path, f"{t}.weights", edges.shape[1])
    raw = _matrix(_require(step, "X", path, f"time {t}: "), path, f"{t}.X")
    if raw.shape[1] != 2:
        raise InputError(f"{path}: {t}.X has {raw.shape[1]} columns, expected [degree, transitivity]")
    y = _numbers(_require(step, "y", path, f"time {t}: "), path, f"{t}.y")
    if (y < 0).any():
        raise InputError(f"{path}: {t}.y holds {y.min()}, expected counts >= 0")
    return edges, weights, raw, y

"""Event streams: timestamped edges read from CSV / SNAP files or generated synthetically.

An :class:`EventStream` holds its events sorted by time (stable, so events of equal time keep their file
order). :func:`read_events` reads the CSV header forms ``src,dst,time``, ``u,i,ts`` and JODIE's
``user_id,item_id,timestamp`` (then an optional ``label``/``state_label`` column and numeric feature
columns) and SNAP's whitespace format (``src dst time`` a line, optional ``#`` comments and header line).
:func:`synthetic_events` generates streams with a temporal signal a memory-based model can learn.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distgnn.errors import InputError

# Accepted names of the first three columns (source, destination, time).
HEADER_FORMS: tuple[tuple[str, str, str], ...] = (
    ("src", "dst", "time"),
    ("u", "i", "ts"),
    ("user_id", "item_id", "timestamp"),
)
LABEL_NAMES = ("label", "state_label")


@dataclass(frozen=True)
class EventStream:
    """Timestamped edges, sorted by time.

    Attributes:
        src: int64 [E], source node of each event.
        dst: int64 [E], destination node of each event.
        time: float64 [E], ascending.
        num_nodes: number of nodes, ``max id + 1`` (ids are used as given).
        label: float32 [E] per-event label, or None.
        feat: float32 [E, d] per-event features, or None.
    """

    src: np.ndarray
    dst: np.ndarray
    time: np.ndarray
    num_nodes: int
    label: np.ndarray | None = None
    feat: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.src.shape[0]
        if self.src.dtype != np.int64 or self.dst.dtype != np.int64 or self.time.dtype != np.float64:
            raise InputError(
                f"EventStream wants src/dst int64 and time float64, got {self.src.dtype}/{self.dst.dtype}/"
                f"{self.time.dtype}"
            )
        if self.dst.shape != (n,) or self.time.shape != (n,):
            raise InputError(
                f"EventStream arrays differ in length: src {n}, dst {self.dst.shape}, time {self.time.shape}"
            )
        if self.label is not None and self.label.shape != (n,):
            raise InputError(f"EventStream label has shape {self.label.shape}, expected ({n},)")
        if self.feat is not None and (self.feat.ndim != 2 or self.feat.shape[0] != n):
            raise InputError(f"EventStream feat has shape {self.feat.shape}, expected ({n}, d)")

    def __len__(self) -> int:
        return int(self.src.shape[0])

    @property
    def feat_dim(self) -> int:
        """Width d of the event features (0 without features)."""
        return 0 if self.feat is None else int(self.feat.shape[1])

    def slice(self, start: int, stop: int) -> EventStream:
        """Events ``start:stop`` (a time segment), with the same ``num_nodes``."""
        return EventStream(
            self.src[start:stop],
            self.dst[start:stop],
            self.time[start:stop],
            self.num_nodes,
            None if self.label is None else self.label[start:stop],
            None if self.feat is None else self.feat[start:stop],
        )


def _from_columns(
    src: np.ndarray,
    dst: np.ndarray,
    time: np.ndarray,
    label: np.ndarray | None,
    feat: np.ndarray | None,
    bipartite: bool,
) -> EventStream:
    order = np.argsort(time, kind="stable")
    src, dst, time = src[order], dst[order], time[order]
    label = None if label is None else np.ascontiguousarray(label[order], dtype=np.float32)
    feat = None if feat is None else np.ascontiguousarray(feat[order], dtype=np.float32)
    if bipartite and len(src):
        dst = dst + (int(src.max()) + 1)
    num_nodes = int(max(src.max(), dst.max())) + 1 if len(src) else 0
    return EventStream(src, dst, time, num_nodes, label, feat)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split(line: str, delimiter: str | None) -> list[str]:
    return [t.strip() for t in line.split(delimiter)] if delimiter else line.split()


def _first_line(path: Path) -> tuple[int, str]:
    """(1-based number, text) of the first line that is neither blank nor a ``#`` comment."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                return number, stripped
    raise InputError(f"{path}: no events (the file is empty or only comments); expected lines `src dst time`")


def _header(path: Path, number: int, names: list[str]) -> bool:
    """Validates a header line; returns whether column 4 is a label."""
    if len(names) < 3:
        raise InputError(
            f"{path}:{number}: an event stream needs at least 3 columns (source, destination, time), "
            f"got {len(names)}: {names}"
        )
    lowered = tuple(n.lower() for n in names[:3])
    if lowered not in HEADER_FORMS:
        forms = " / ".join(",".join(form) for form in HEADER_FORMS)
        raise InputError(f"{path}:{number}: header starts with {','.join(names[:3])}; expected one of {forms}")
    return len(names) > 3 and names[3].lower() in LABEL_NAMES


def _scan_for_error(path: Path, delimiter: str | None, start_line: int) -> None:
    """Walks the data lines and raises InputError naming the first bad one (the slow path after a failure)."""
    width = None
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            stripped = line.strip()
            if number < start_line or not stripped or stripped.startswith("#"):
                continue
            tokens = _split(stripped, delimiter)
            if len(tokens) < 3:
                raise InputError(
                    f"{path}:{number}: an event needs at least 3 columns (source, destination, time), "
                    f"got {len(tokens)}: {stripped!r}"
                )
            if width is None:
                width = len(tokens)
            elif len(tokens) != width:
                raise InputError(
                    f"{path}:{number}: {len(tokens)} columns where the first event line has {width}; "
                    "every event must carry the same label and feature columns"
                )
            for column, role in ((0, "source"), (1, "destination")):
                try:
                    value = int(tokens[column])
                except ValueError:
                    raise InputError(
                        f"{path}:{number}: {role} id {tokens[column]!r} is not an integer; node ids must be "
                        "non-negative integers"
                    ) from None
                if value < 0:
                    raise InputError(f"{path}:{number}: {role} id {value} is negative; node ids must be >= 0")
            if not _is_number(tokens[2]) or not math.isfinite(float(tokens[2])):
                raise InputError(f"{path}:{number}: time {tokens[2]!r} is not a finite number")
            for column in range(3, len(tokens)):
                if not _is_number(tokens[column]):
                    raise InputError(
                        f"{path}:{number}: column {column + 1} ({tokens[column]!r}) is not a number; labels "
                        "and features must be numeric"
                    )


def read_events(path: str | os.PathLike, bipartite: bool = False) -> EventStream:
    """Read an event stream from a CSV or SNAP whitespace file, sorted by time (stable).

    CSV (a comma in the first line): a header whose first three names are one of :data:`HEADER_FORMS`,
    then optionally ``label`` (or JODIE's ``state_label``) and numeric feature columns (JODIE files list
    one header name for all of them; rows may be wider than the header). Whitespace: ``src dst time``
    lines with an optional header line of the same forms, extra columns as features. Lines starting
    with ``#`` are comments.

    Args:
        path: the file.
        bipartite: renumber destinations after sources (``dst + max(src) + 1``), JODIE's user/item
            convention, so users and items never share an id.

    Raises:
        InputError: not an event stream (fewer than 3 columns, non-integer or negative ids, non-numeric
            times or features, rows of different widths), naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"event file {path} does not exist; pass a CSV (src,dst,time,...) or a SNAP .txt")
    number, first = _first_line(path)
    delimiter = "," if "," in first else None
    tokens = _split(first, delimiter)
    has_header = not all(_is_number(t) for t in tokens[:3]) if len(tokens) >= 3 else True
    has_label = _header(path, number, tokens) if has_header else False
    data_start = number + 1 if has_header else number
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data")
            table = np.loadtxt(
                path, delimiter=delimiter, comments="#", skiprows=data_start - 1, dtype=np.float64, ndmin=2
            )
            ids = np.loadtxt(
                path,
                delimiter=delimiter,
                comments="#",
                skiprows=data_start - 1,
                usecols=(0, 1),
                dtype=np.int64,
                ndmin=2,
            )
    except ValueError as err:
        _scan_for_error(path, delimiter, data_start)
        raise InputError(
            f"{path}: not an event stream ({err}); expected lines `src dst time [label] [features]`"
        ) from err
    if table.shape[0] == 0:
        raise InputError(f"{path}: no events after the header; expected lines `src dst time`")
    if table.shape[1] < 3 or (ids < 0).any() or not np.isfinite(table[:, 2]).all():
        _scan_for_error(path, delimiter, data_start)
    label = table[:, 3] if has_label else None
    first_feature = 4 if has_label else 3
    feat = table[:, first_feature:] if table.shape[1] > first_feature else None
    return _from_columns(
        np.ascontiguousarray(ids[:, 0]),
        np.ascontiguousarray(ids[:, 1]),
        np.ascontiguousarray(table[:, 2]),
        label,
        feat,
        bipartite,
    )


def synthetic_events(
    num_nodes: int,
    num_events: int,
    seed: int = 0,
    *,
    num_communities: int = 16,
    num_phases: int = 8,
    repeat_prob: float = 0.6,
    noise: float = 0.05,
    favourites: int = 4,
    popularity_exponent: float = 2.0,
    feat_dim: int = 0,
) -> EventStream:
    """A synthetic event stream whose next destinations are predictable from the recent past.

    Nodes are split into ``num_communities`` blocks. The stream is cut into ``num_phases`` equal time
    phases; in each phase a source is interested in one community, which drifts from phase to phase
    (half of the sources move to another community each phase). A source's event goes, with probability
    ``repeat_prob``, to one of its ``favourites`` partners of this phase (repeated interactions), else
    to a uniform member of its current community; a fraction ``noise`` goes anywhere. Sources are drawn
    with a power-law popularity. A model that remembers who a node met recently predicts its next
    partners; a static model sees only the averaged-out communities. Vectorised: 10M events take a few
    seconds.

    Args:
        num_nodes: N >= num_communities.
        num_events: E >= 1.
        seed: the stream is a deterministic function of the arguments.
        feat_dim: width of per-event float32 features (0: none): the destination's community as a
            noisy one-hot, repeated to fill ``feat_dim``.

    Returns:
        EventStream with times ``cumsum`` of unit exponential gaps (float64, strictly increasing).
    """
    if num_events < 1 or num_nodes < max(2, num_communities):
        raise InputError(
            f"synthetic_events needs num_events >= 1 and num_nodes >= max(2, num_communities={num_communities}), "
            f"got num_nodes={num_nodes}, num_events={num_events}"
        )
    rng = np.random.default_rng(seed)
    time = np.cumsum(rng.exponential(1.0, num_events))
    phase = np.minimum((np.arange(num_events, dtype=np.int64) * num_phases) // num_events, num_phases - 1)
    block = num_nodes // num_communities
    node_ids = rng.permutation(num_nodes).astype(np.int64)  # community c holds node_ids[c*block:(c+1)*block]

    # Power-law source popularity over a random order of the nodes.
    src = node_ids[
        np.minimum((rng.random(num_events) ** popularity_exponent * num_nodes).astype(np.int64), num_nodes - 1)
    ]
    home = rng.integers(0, num_communities, num_nodes)
    step = (
        rng.integers(0, 2, (num_nodes, num_phases)).cumsum(axis=1)
        * rng.integers(1, num_communities, num_nodes)[:, None]
    )
    interest = (home[src] + step[src, phase]) % num_communities

    # Favourite partners of (source, phase): fixed slots of the interest community, from a hash.
    slot = rng.integers(0, favourites, num_events).astype(np.uint64)
    key = (src.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        phase.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    )
    key ^= slot * np.uint64(0x94D049BB133111EB)
    key ^= key >> np.uint64(31)
    key *= np.uint64(0xD6E8FEB86659FD93)
    key ^= key >> np.uint64(32)
    favourite = (key % np.uint64(block)).astype(np.int64)
    member = np.where(rng.random(num_events) < repeat_prob, favourite, rng.integers(0, block, num_events))
    dst = node_ids[interest * block + member]
    anywhere = rng.random(num_events) < noise
    dst[anywhere] = rng.integers(0, num_nodes, int(anywhere.sum()))
    feat = None
    if feat_dim > 0:
        community = np.full(num_nodes, num_communities, dtype=np.int64)
        community[node_ids[: block * num_communities]] = np.arange(block * num_communities) // block
        columns = np.arange(feat_dim) % (num_communities + 1)
        feat = (community[dst][:, None] == columns[None, :]).astype(np.float32)
        feat += rng.normal(0.0, 0.5, feat.shape).astype(np.float32)
    return EventStream(src, dst, time, num_nodes, None, feat)

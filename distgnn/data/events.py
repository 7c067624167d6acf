"""Event streams: timestamped edges read from CSV / SNAP files or generated synthetically.

An :class:`EventStream` holds its events in time order. :func:`read_events` reads CSV and SNAP's
whitespace files whose columns a header line or ``--columns`` names (a headerless file of three columns is
``src dst time``), keeps the attribute columns as standardised event features, and refuses, naming the file
and line, what it cannot read unambiguously.
:func:`synthetic_events` generates streams with a temporal signal a memory-based model can learn.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distgnn.errors import ConfigError, InputError


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
        name: what the stream is called (the dataset name it was loaded by; empty if none).
    """

    src: np.ndarray
    dst: np.ndarray
    time: np.ndarray
    num_nodes: int
    label: np.ndarray | None = None
    feat: np.ndarray | None = None
    name: str = ""

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
            self.name,
        )


# Names a header or --columns may give each role; any other name is an attribute column (an event feature).
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "src": ("src", "u", "user_id", "source"),
    "dst": ("dst", "i", "item_id", "target"),
    "time": ("time", "ts", "timestamp"),
    "label": ("label", "state_label"),
}
REQUIRED_ROLES = ("src", "dst", "time")
MAX_ID = 2**53  # ids are parsed as float64, exact up to here


@dataclass(frozen=True)
class ColumnLayout:
    """Which column holds what: ``src``, ``dst``, ``time`` (and ``label``) are 0-based column indices,
    ``features`` the attribute columns; with ``wider`` (a JODIE header, which names one column for all its
    features) the columns past ``width`` are attributes too, else a row has exactly ``width`` columns."""

    src: int
    dst: int
    time: int
    label: int | None
    features: tuple[int, ...]
    width: int
    wider: bool = False

    @classmethod
    def from_names(cls, names: Sequence[str], wider: bool = False) -> ColumnLayout | None:
        """The layout ``names`` describe, or None when they name a role twice or miss src, dst or time."""
        roles: dict[str, int] = {}
        features = []
        for index, name in enumerate(names):
            role = next((r for r, aliases in ROLE_NAMES.items() if name.strip().lower() in aliases), None)
            if role is None:
                features.append(index)
            elif role in roles:
                return None
            else:
                roles[role] = index
        if any(role not in roles for role in REQUIRED_ROLES):
            return None
        return cls(roles["src"], roles["dst"], roles["time"], roles.get("label"), tuple(features), len(names), wider)


def parse_columns(spec: str) -> tuple[str, ...]:
    """``--columns``' names (``src,dst,weight,time``): src, dst and time once each (or their aliases of
    :data:`ROLE_NAMES`), at most one label; every other name is an attribute column."""
    names = tuple(name.strip() for name in spec.split(","))
    if any(not name for name in names) or ColumnLayout.from_names(names) is None:
        raise ConfigError(
            f"--columns {spec!r}: name every column, comma-separated, with src, dst and time once each and at most "
            "one label; other names are attribute columns (e.g. --columns src,dst,weight,time)"
        )
    return names


def _data_lines(path: Path, start_line: int) -> Iterator[tuple[int, str]]:
    """(1-based number, text without a ``#`` comment) of the data lines from ``start_line`` on."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            text = line.split("#", 1)[0].strip()
            if number >= start_line and text:
                yield number, text


def _first_line(path: Path) -> tuple[int, str]:
    """(1-based number, text) of the first line that is neither blank nor a ``#`` comment."""
    for number, text in _data_lines(path, 1):
        return number, text
    raise InputError(f"{path}: no events (the file is empty or only comments); expected lines `src dst time`")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split(line: str, delimiter: str | None) -> list[str]:
    return [t.strip() for t in line.split(delimiter)] if delimiter else line.split()


def _layout(path: Path, number: int, tokens: list[str], header: bool, columns: Sequence[str] | None) -> ColumnLayout:
    """The columns' roles: from ``--columns``, else from the header line, else ``src dst time`` for a file of
    three columns; anything else is refused (which column is the time cannot be told)."""
    say = "name them with --columns (e.g. --columns src,dst,weight,time)"
    if columns is not None:
        return ColumnLayout.from_names(parse_columns(",".join(columns)))
    if header:
        layout = ColumnLayout.from_names(tokens, wider=True)
        if layout is None:
            forms = ", ".join("/".join(aliases) for aliases in ROLE_NAMES.values())
            raise InputError(
                f"{path}:{number}: header {','.join(tokens)!r} does not name the source, destination and time "
                f"columns once each (names: {forms}); {say}"
            )
        return layout
    if len(tokens) == 3:
        return ColumnLayout(0, 1, 2, None, (), 3)
    raise InputError(
        f"{path}: {len(tokens)} columns and no header line: which is the time and which are attributes cannot be "
        f"told apart; {say}"
    )


def _line_error(path: Path, start_line: int, row: int, what: str) -> InputError:
    """An InputError naming the file line of data row ``row`` (0-based, counted from ``start_line``)."""
    for index, (number, text) in enumerate(_data_lines(path, start_line)):
        if index == row:
            return InputError(f"{path}:{number}: {what} in {text!r}")
    return InputError(f"{path}: {what} (event {row + 1})")


def _scan_for_error(path: Path, delimiter: str | None, start_line: int, layout: ColumnLayout) -> None:
    """Walks the data lines and raises InputError naming the first one that is not numbers of the layout's width
    (the slow path after the fast read failed)."""
    width = None
    for number, text in _data_lines(path, start_line):
        tokens = _split(text, delimiter)
        if len(tokens) < 3:
            raise InputError(
                f"{path}:{number}: an event needs at least 3 columns (source, destination, time), got "
                f"{len(tokens)}: {text!r}"
            )
        if width is None:
            width = len(tokens)
        elif len(tokens) != width:
            raise InputError(
                f"{path}:{number}: {len(tokens)} columns where the first event line has {width}; every event must "
                "carry the same label and attribute columns"
            )
        for column, token in enumerate(tokens):
            if not _is_number(token):
                raise InputError(f"{path}:{number}: column {column + 1} ({token!r}) is not a number")


def _check_table(path: Path, start_line: int, table: np.ndarray, layout: ColumnLayout) -> None:
    """Refuses (naming the file line) a width the layout does not give, a value that is not finite, a node id
    that is negative or not an integer, a time before the previous event's, and ids that look like no ids."""
    width = table.shape[1]
    if width < layout.width or (width > layout.width and not layout.wider):
        raise _line_error(path, start_line, 0, f"{width} columns where the column names give {layout.width}")
    finite = np.isfinite(table)
    if not finite.all():
        row, column = np.argwhere(~finite)[0]
        raise _line_error(path, start_line, row, f"column {column + 1} is {table[row, column]}, not a finite number")
    for column, role in ((layout.src, "source"), (layout.dst, "destination")):
        ids = table[:, column]
        bad = (ids < 0) | (ids != np.floor(ids)) | (ids >= MAX_ID)
        if bad.any():
            row = int(np.argmax(bad))
            raise _line_error(
                path, start_line, row, f"{role} id {ids[row]:g} is not a node id (an integer from 0 to 2^53)"
            )
    times = table[:, layout.time]
    back = np.flatnonzero(times[1:] < times[:-1])
    if len(back):
        row = int(back[0]) + 1
        raise _line_error(
            path,
            start_line,
            row,
            f"time {times[row]:g} is before the previous event's {times[row - 1]:g}: events must be listed in time "
            "order (sort the file by its time column), or this column is not the time (name the columns with "
            "--columns)",
        )
    ids = np.concatenate([table[:, layout.src], table[:, layout.dst]]).astype(np.int64)
    distinct = len(np.unique(ids))
    largest = int(ids.max())
    if largest + 1 > 4 * distinct + 1000:
        row = int(np.argmax((table[:, layout.src] == largest) | (table[:, layout.dst] == largest)))
        raise _line_error(
            path,
            start_line,
            row,
            f"node id {largest}, where {distinct} distinct ids appear: a node memory would hold {largest + 1} rows; "
            "renumber the ids 0..n-1, or this column is not an id (name the columns with --columns)",
        )


def standardise(feat: np.ndarray) -> np.ndarray:
    """float32 columns of mean 0 and standard deviation 1 (a constant column becomes 0)."""
    mean = feat.mean(axis=0, keepdims=True)
    std = feat.std(axis=0, keepdims=True)
    return ((feat - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)


def read_events(
    path: str | os.PathLike,
    bipartite: bool = False,
    columns: Sequence[str] | None = None,
) -> EventStream:
    """Read an event stream from a CSV or whitespace-separated (SNAP) file.

    Which column is what: ``columns`` (``--columns src,dst,weight,time``) names every column; else a header
    line names them (src/u/user_id/source, dst/i/item_id/target, time/ts/timestamp, label/state_label; rows
    may be wider than a header, JODIE's, the extra columns attributes); else a file of three columns is
    ``src dst time``. A headerless file of more columns is refused: which one is the time cannot be told.
    Columns other than source, destination, time and label are attributes (SNAP's rating, JODIE's features):
    kept as float32 event features, standardised per column to mean 0 and standard deviation 1 over the
    file's events (a constant column becomes 0), which the TGN's messages carry. Lines starting with ``#`` are
    comments. Events must be listed in time order (the SNAP and JODIE files are): a time before the previous
    event's is refused, as it is what a wrongly named column gives.

    Args:
        path: the file.
        bipartite: renumber destinations after sources (``dst + max(src) + 1``), JODIE's user/item
            convention, so users and items never share an id.
        columns: the columns' names, in file order (a header line, if any, is then skipped).

    Raises:
        InputError: not an event stream (columns that cannot be told apart, ids that are negative, not
            integers or far sparser than the events, values that are not finite numbers, rows of different
            widths, times out of order, no events), naming the file and, for a bad line, its number.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"event file {path} does not exist; pass a CSV (src,dst,time,...) or a SNAP .txt")
    number, first = _first_line(path)
    delimiter = "," if "," in first else None
    tokens = _split(first, delimiter)
    header = not all(_is_number(t) for t in tokens)
    layout = _layout(path, number, tokens, header, columns)
    data_start = number + 1 if header else number
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data")
            table = np.loadtxt(
                path, delimiter=delimiter, comments="#", skiprows=data_start - 1, dtype=np.float64, ndmin=2
            )
    except ValueError as err:
        _scan_for_error(path, delimiter, data_start, layout)
        raise InputError(f"{path}: not an event stream ({err}); expected lines `src dst time [attributes]`") from err
    if table.shape[0] == 0:
        raise InputError(f"{path}: no events after the header; expected lines `src dst time`")
    _check_table(path, data_start, table, layout)
    attributes = list(layout.features) + list(range(layout.width, table.shape[1]))
    src = table[:, layout.src].astype(np.int64)
    dst = table[:, layout.dst].astype(np.int64)
    if bipartite:
        dst = dst + (int(src.max()) + 1)
    label = None if layout.label is None else np.ascontiguousarray(table[:, layout.label], dtype=np.float32)
    feat = standardise(table[:, attributes]) if attributes else None
    num_nodes = int(max(src.max(), dst.max())) + 1
    return EventStream(src, dst, np.ascontiguousarray(table[:, layout.time]), num_nodes, label, feat)


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

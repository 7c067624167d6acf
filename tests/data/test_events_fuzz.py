"""Fuzzing the two stream readers: the event reader (CSV / SNAP) and PyTorch Geometric Temporal's JSON.

Every damaged file either reads as what it says (checked against a plain reference parser) or is refused
with an InputError naming the file (and, for the event reader, the damaged line); never another exception,
never a silent wrong read.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from distgnn.data.events import read_events
from distgnn.errors import InputError
from distgnn.snapshot.pgt import read_pgt_json

COLUMNS = ("src", "dst", "rating", "weight", "time")
NUM_EVENTS = 40


def make_table(rng: np.random.Generator) -> list[list[str]]:
    """Rows of tokens in COLUMNS order: small dense ids, UNIX-like ordered times, an integer and a float
    attribute."""
    times = 1_300_000_000 + np.cumsum(rng.integers(0, 1000, NUM_EVENTS))
    return [
        [
            str(rng.integers(0, 30)),
            str(rng.integers(0, 30)),
            str(rng.integers(-10, 11)),
            f"{rng.random():.4f}",
            str(t),
        ]
        for t in times
    ]


def render(rows: list[list[str]], order: list[int], delimiter: str, header: bool) -> tuple[str, list[int]]:
    """The file text with columns in ``order``, and the 1-based line number of each row."""
    lines = [delimiter.join(COLUMNS[c] for c in order)] if header else []
    numbers = []
    for row in rows:
        lines.append(delimiter.join(row[c] for c in order))
        numbers.append(len(lines))
    return "\n".join(lines) + "\n", numbers


def reference(text: str, order: list[int], delimiter: str, header: bool) -> dict | None:
    """What the file says, parsed line by line (None: it is not a valid stream)."""
    lines = [line for line in text.splitlines() if line.strip()][1 if header else 0 :]
    width = len(order)
    rows = []
    for line in lines:
        tokens = [t.strip() for t in line.split(delimiter)] if delimiter == "," else line.split()
        if len(tokens) != width:
            return None
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            return None
        if not all(np.isfinite(values)):
            return None
        rows.append(dict(zip((COLUMNS[c] for c in order), values, strict=True)))
    if not rows:
        return None
    for row in rows:
        for role in ("src", "dst"):
            if row[role] < 0 or row[role] != int(row[role]):
                return None
    times = [row["time"] for row in rows]
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        return None
    attributes = np.array([[row[c] for c in COLUMNS if c in ("rating", "weight")] for row in rows])
    std = attributes.std(0)
    return {
        "src": [row["src"] for row in rows],
        "dst": [row["dst"] for row in rows],
        "time": times,
        "feat": (attributes - attributes.mean(0)) / np.where(std > 0, std, 1),
    }


def read_or_error(path: Path, order: list[int], header: bool):
    columns = None if header else tuple(COLUMNS[c] for c in order)
    try:
        return read_events(path, columns=columns), None
    except InputError as err:
        return None, str(err)


def assert_matches(events, expected: dict, order: list[int]) -> None:
    np.testing.assert_array_equal(events.src, expected["src"])
    np.testing.assert_array_equal(events.dst, expected["dst"])
    np.testing.assert_array_equal(events.time, expected["time"])
    # The reader keeps the attributes in file order; the reference in COLUMNS order.
    file_order = [c for c in order if COLUMNS[c] in ("rating", "weight")]
    permutation = np.argsort(np.argsort(file_order))
    np.testing.assert_allclose(events.feat, expected["feat"][:, np.argsort(permutation)], atol=1e-4)


def layout(seed: int) -> tuple[list[int], str, bool]:
    rng = np.random.default_rng(seed)
    return [int(c) for c in rng.permutation(len(COLUMNS))], [",", " "][seed % 2], bool(seed % 3)


@pytest.mark.parametrize("seed", range(40))
def test_truncated_event_file_reads_its_lines_or_names_the_cut_line(tmp_path, seed):
    rng = np.random.default_rng(seed)
    order, delimiter, header = layout(seed)
    text, _ = render(make_table(rng), order, delimiter, header)
    cut = text[: int(rng.integers(0, len(text)))]
    path = tmp_path / "cut.csv"
    path.write_text(cut)
    events, error = read_or_error(path, order, header)
    expected = reference(cut, order, delimiter, header)
    if expected is None:
        assert error is not None and error.startswith(str(path))
        last = len(cut.splitlines())
        if last > (1 if header else 0) and cut.splitlines()[-1].strip():
            assert f"{path}:{last}:" in error  # only the last line is damaged
    else:
        assert error is None, error
        assert_matches(events, expected, order)


# src with dst and one attribute with another give another valid stream: every other swap must be refused.
PAIRS = [(a, b) for a in range(len(COLUMNS)) for b in range(a + 1, len(COLUMNS)) if {a, b} not in ({0, 1}, {2, 3})]


@pytest.mark.parametrize(("first", "second"), PAIRS)
@pytest.mark.parametrize("header", [True, False])
def test_swapped_columns_are_refused(tmp_path, first, second, header):
    """Two columns' values swapped under their names."""
    rng = np.random.default_rng(first * 10 + second)
    rows = make_table(rng)
    for row in rows:
        row[first], row[second] = row[second], row[first]
    order = list(range(len(COLUMNS)))
    text, _ = render(rows, order, ",", header)
    path = tmp_path / "swapped.csv"
    path.write_text(text)
    _, error = read_or_error(path, order, header)
    assert error is not None and error.startswith(f"{path}:")


BAD_TOKENS = ["nan", "inf", "-inf", "x", "", "-3", "2.5", "1e999", "0x10", "--1"]


@pytest.mark.parametrize("seed", range(60))
def test_bad_value_names_its_line_or_reads_correctly(tmp_path, seed):
    rng = np.random.default_rng(1000 + seed)
    order, delimiter, header = layout(seed)
    rows = make_table(rng)
    row, column = int(rng.integers(0, NUM_EVENTS)), int(rng.integers(0, len(COLUMNS)))
    rows[row][column] = BAD_TOKENS[seed % len(BAD_TOKENS)]
    text, numbers = render(rows, order, delimiter, header)
    path = tmp_path / "bad.csv"
    path.write_text(text)
    events, error = read_or_error(path, order, header)
    expected = reference(text, order, delimiter, header)
    if expected is None:
        assert error is not None and f"{path}:{numbers[row]}:" in error, error
    else:
        assert error is None, error
        assert_matches(events, expected, order)


# -- PyTorch Geometric Temporal's JSON --------------------------------------------------------------------


def pgt_files(rng: np.random.Generator) -> dict[str, dict]:
    """One small valid file of each layout the reader knows."""
    nodes, steps = 5, 10  # the mobility layout's 8 lags leave 2 snapshots
    edges = [[int(u), int(v)] for u, v in rng.integers(0, nodes, (8, 2))]
    signal = np.round(rng.random((steps, nodes)), 3).tolist()
    per_time = {"time_periods": 3}
    for t in range(3):
        per_time[str(t)] = {
            "edges": edges,
            "weights": [1.0] * len(edges),
            "X": [[int(rng.integers(0, 6)), round(float(rng.random()), 2)] for _ in range(nodes)],
            "y": [int(rng.integers(0, 9)) for _ in range(nodes)],
        }
    return {
        "static": {"edges": edges, "FX": signal},
        "static_weighted": {"edges": edges, "weights": [0.5] * len(edges), "X": signal},
        "mobility": {
            "time_periods": steps,
            "edge_mapping": {
                "edge_index": {str(t): edges for t in range(steps)},
                "edge_weight": {str(t): [1.0] * len(edges) for t in range(steps)},
            },
            "y": signal,
        },
        "per_time": per_time,
    }


def leaves(data, where=()):
    """Paths to every number in ``data``."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*where, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, (*where, index))
    else:
        yield where


def put(data, where, value):
    for key in where[:-1]:
        data = data[key]
    data[where[-1]] = value


def is_edge_id(where) -> bool:
    return any(key in ("edges", "edge_index") for key in where)


def write_json(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sequence.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("seed", range(24))
def test_truncated_pgt_json_is_refused_with_its_line(tmp_path, seed):
    rng = np.random.default_rng(seed)
    name = list(pgt_files(rng))[seed % 4]
    text = json.dumps(pgt_files(rng)[name], indent=1)
    path = write_json(tmp_path, text[: int(rng.integers(0, len(text) - 1))])
    with pytest.raises(InputError) as info:
        read_pgt_json(path)
    assert str(info.value).startswith(f"{path}: cannot read it as JSON") and "line" in str(info.value)


ALWAYS_BAD = [float("nan"), "x", None, [], [1, 2], {"a": 1}]
BAD_EDGE_IDS = [1.5, -1, 10**6]


@pytest.mark.parametrize("seed", range(60))
def test_bad_pgt_value_is_refused_naming_the_file(tmp_path, seed):
    rng = np.random.default_rng(seed)
    files = pgt_files(rng)
    name = list(files)[seed % 4]
    data = copy.deepcopy(files[name])
    spots = list(leaves(data))
    where = spots[int(rng.integers(0, len(spots)))]
    candidates = ALWAYS_BAD + (BAD_EDGE_IDS if is_edge_id(where) else [])
    if where == ("time_periods",):
        candidates = ["x", None, 0, -2, 2.5]
    put(data, where, candidates[int(rng.integers(0, len(candidates)))])
    path = write_json(tmp_path, json.dumps(data))
    with pytest.raises(InputError) as info:
        read_pgt_json(path)
    assert str(info.value).startswith(f"{path}: ")


@pytest.mark.parametrize("name", ["static", "static_weighted", "mobility", "per_time"])
def test_clean_pgt_files_read(tmp_path, name):
    data = pgt_files(np.random.default_rng(0))[name]
    sequence = read_pgt_json(write_json(tmp_path, json.dumps(data)))
    assert len(sequence) >= 1 and sequence[0].num_nodes == 5 and sequence[0].num_edges == 8


def test_swapped_pgt_keys_are_refused(tmp_path):
    data = pgt_files(np.random.default_rng(0))["static_weighted"]
    for first, second in (("edges", "X"), ("edges", "weights"), ("weights", "X")):
        swapped = dict(data, **{first: data[second], second: data[first]})
        path = write_json(tmp_path, json.dumps(swapped))
        with pytest.raises(InputError) as info:
            read_pgt_json(path)
        assert str(info.value).startswith(f"{path}: ")

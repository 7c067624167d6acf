"""Event streams: every accepted file form, the bad-input messages, CollegeMsg, and the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distgnn.data.events import EventStream, read_events, synthetic_events
from distgnn.errors import InputError

COLLEGE_MSG = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"


def write(tmp_path: Path, text: str, name: str = "events.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("header", ["src,dst,time", "u,i,ts", "user_id,item_id,timestamp"])
def test_csv_header_forms_sorted_stably(tmp_path, header):
    path = write(tmp_path, f"{header}\n3,1,5.0\n0,2,1.5\n4,0,1.5\n1,1,0\n")
    events = read_events(path)
    np.testing.assert_array_equal(events.time, [0.0, 1.5, 1.5, 5.0])
    np.testing.assert_array_equal(events.src, [1, 0, 4, 3])  # equal times keep file order
    np.testing.assert_array_equal(events.dst, [1, 2, 0, 1])
    assert events.src.dtype == np.int64 and events.time.dtype == np.float64
    assert events.num_nodes == 5 and len(events) == 4
    assert events.label is None and events.feat is None


def test_label_and_feature_columns(tmp_path):
    path = write(tmp_path, "user_id,item_id,timestamp,state_label,features\n0,1,2,1,0.5,0.25\n1,0,1,0,-1,3\n")
    events = read_events(path)
    np.testing.assert_array_equal(events.label, np.array([0, 1], dtype=np.float32))
    np.testing.assert_array_equal(events.feat, np.array([[-1, 3], [0.5, 0.25]], dtype=np.float32))
    assert events.feat.dtype == np.float32 and events.feat_dim == 2


def test_features_without_label(tmp_path):
    events = read_events(write(tmp_path, "src,dst,time,f0,f1,f2\n0,1,0,1,2,3\n"))
    assert events.label is None
    np.testing.assert_array_equal(events.feat, [[1, 2, 3]])


def test_snap_whitespace_with_comments_and_header(tmp_path):
    path = write(tmp_path, "# a comment\nsrc dst time\n1 2 10\n\n2\t3   5\n# trailing\n", "graph.txt")
    events = read_events(path)
    np.testing.assert_array_equal(events.src, [2, 1])
    np.testing.assert_array_equal(events.dst, [3, 2])
    assert events.num_nodes == 4


def test_snap_without_header(tmp_path):
    events = read_events(write(tmp_path, "0 1 3\n1 0 2\n", "graph.txt"))
    np.testing.assert_array_equal(events.time, [2.0, 3.0])


def test_bipartite_renumbers_destinations_after_sources(tmp_path):
    events = read_events(write(tmp_path, "u,i,ts\n0,0,1\n2,1,2\n"), bipartite=True)
    np.testing.assert_array_equal(events.dst, [3, 4])
    assert events.num_nodes == 5


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("src,dst,time\n0,1,2\n0,1\n", 3, "at least 3 columns"),
        ("src,dst\n0,1\n", 1, "at least 3 columns"),
        ("src dst time\n0 1 2\nx 1 2\n", 3, "source id 'x' is not an integer"),
        ("src,dst,time\n0,-4,2\n", 2, "destination id -4 is negative"),
        ("src,dst,time\n0,1,2\n0,1,noon\n", 3, "time 'noon' is not a finite number"),
        ("src,dst,time,f\n0,1,2,0.5\n0,1,2,0.5,0.7\n", 3, "5 columns where the first event line has 4"),
        ("a,b,c\n0,1,2\n", 1, "expected one of"),
        ("src,dst,time,f\n0,1,2,abc\n", 2, "is not a number"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        read_events(path)
    message = str(info.value)
    assert f"{path}:{line}:" in message
    assert words in message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_events(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="no events"):
        read_events(write(tmp_path, "# nothing\n"))
    with pytest.raises(InputError, match="no events after the header"):
        read_events(write(tmp_path, "src,dst,time\n"))


def test_stream_checks_and_slices():
    events = EventStream(np.array([0, 1]), np.array([1, 2]), np.array([0.0, 1.0]), 3)
    tail = events.slice(1, 2)
    assert len(tail) == 1 and tail.src[0] == 1 and tail.num_nodes == 3
    with pytest.raises(InputError, match="int64"):
        EventStream(np.array([0], dtype=np.int32), np.array([1]), np.array([0.0]), 2)


def test_college_msg():
    if not COLLEGE_MSG.is_file():
        pytest.skip(f"CollegeMsg not found at {COLLEGE_MSG} (shared data absent)")
    events = read_events(COLLEGE_MSG)
    assert len(events) == 59835
    assert events.num_nodes == 1900  # ids 1..1899
    assert events.src.min() >= 1 and (np.diff(events.time) >= 0).all()


def test_synthetic_events_signal_and_determinism():
    a = synthetic_events(2000, 50_000, seed=3, feat_dim=4)
    b = synthetic_events(2000, 50_000, seed=3, feat_dim=4)
    np.testing.assert_array_equal(a.dst, b.dst)
    assert len(a) == 50_000 and a.num_nodes == 2000 and a.feat.shape == (50_000, 4)
    assert (np.diff(a.time) > 0).all() and a.src.max() < 2000 and a.dst.max() < 2000
    # Repeated interactions: a pair recurs far more often than uniform destinations would make it.
    pairs = a.src * a.num_nodes + a.dst
    repeat = 1 - np.unique(pairs).size / pairs.size
    uniform = np.random.default_rng(0).integers(0, 2000, 50_000)
    baseline = 1 - np.unique(a.src * a.num_nodes + uniform).size / pairs.size
    assert repeat > 5 * baseline + 0.05
    with pytest.raises(InputError, match="num_nodes"):
        synthetic_events(4, 10, num_communities=16)

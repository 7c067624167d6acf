"""Event streams: every accepted file form, the bad-input messages, CollegeMsg, and the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distgnn.data.events import EventStream, parse_columns, read_events, synthetic_events
from distgnn.errors import ConfigError, InputError

COLLEGE_MSG = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"


def write(tmp_path: Path, text: str, name: str = "events.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("header", ["src,dst,time", "u,i,ts", "user_id,item_id,timestamp", "time,source,target"])
def test_csv_header_forms(tmp_path, header):
    order = {"src": 0, "u": 0, "user_id": 0, "source": 0, "dst": 1, "i": 1, "item_id": 1, "target": 1}
    names = header.split(",")
    rows = [(1, 1, 0.0), (0, 2, 1.5), (4, 0, 1.5), (3, 1, 5.0)]
    lines = []
    for src, dst, t in rows:
        values = {0: src, 1: dst}
        lines.append(",".join(str(values[order[n]]) if n in order else str(t) for n in names))
    events = read_events(write(tmp_path, header + "\n" + "\n".join(lines) + "\n"))
    np.testing.assert_array_equal(events.time, [0.0, 1.5, 1.5, 5.0])
    np.testing.assert_array_equal(events.src, [1, 0, 4, 3])
    np.testing.assert_array_equal(events.dst, [1, 2, 0, 1])
    assert events.src.dtype == np.int64 and events.time.dtype == np.float64
    assert events.num_nodes == 5 and len(events) == 4
    assert events.label is None and events.feat is None


def test_label_and_feature_columns_standardised(tmp_path):
    path = write(tmp_path, "user_id,item_id,timestamp,state_label,features\n1,0,1,0,-1,3\n0,1,2,1,0.5,3\n")
    events = read_events(path)
    np.testing.assert_array_equal(events.label, np.array([0, 1], dtype=np.float32))
    # Per column mean 0 and standard deviation 1; the constant column becomes 0.
    np.testing.assert_allclose(events.feat, [[-1, 0], [1, 0]])
    assert events.feat.dtype == np.float32 and events.feat_dim == 2


def test_features_without_label(tmp_path):
    events = read_events(write(tmp_path, "src,dst,time,f0,f1,f2\n0,1,0,1,2,3\n1,0,1,3,2,1\n"))
    assert events.label is None
    np.testing.assert_allclose(events.feat, [[-1, 0, 1], [1, 0, -1]])


def test_snap_whitespace_with_comments_and_header(tmp_path):
    path = write(tmp_path, "# a comment\nsrc dst time\n2\t3   5\n\n1 2 10\n# trailing\n", "graph.txt")
    events = read_events(path)
    np.testing.assert_array_equal(events.src, [2, 1])
    np.testing.assert_array_equal(events.dst, [3, 2])
    assert events.num_nodes == 4


def test_snap_without_header(tmp_path):
    events = read_events(write(tmp_path, "0 1 2\r\n1 0 3\r\n", "graph.txt"))
    np.testing.assert_array_equal(events.time, [2.0, 3.0])
    np.testing.assert_array_equal(events.src, [0, 1])


def test_columns_name_a_headerless_file(tmp_path):
    path = write(tmp_path, "6,2,4,100\n6,5,-2,130\n1,15,1,130\n")
    with pytest.raises(InputError) as info:
        read_events(path)
    assert str(info.value).startswith(f"{path}: 4 columns and no header line") and "--columns src,dst" in str(
        info.value
    )
    events = read_events(path, columns=("src", "dst", "rating", "time"))
    np.testing.assert_array_equal(events.time, [100, 130, 130])
    np.testing.assert_array_equal(events.dst, [2, 5, 15])
    np.testing.assert_allclose(events.feat[:, 0], (np.array([4, -2, 1]) - 1) / np.std([4, -2, 1]), rtol=1e-6)
    with pytest.raises(InputError, match=f"{path}:2: time -2 is before the previous event's 4"):
        read_events(path, columns=("src", "dst", "time", "rating"))


def test_columns_replace_a_header_and_are_checked(tmp_path):
    path = write(tmp_path, "a,b,c,d\n0,1,5,10\n1,0,7,20\n")
    with pytest.raises(InputError, match="does not name the source, destination and time"):
        read_events(path)
    events = read_events(path, columns=("src", "dst", "weight", "time"))
    np.testing.assert_array_equal(events.time, [10, 20])
    with pytest.raises(InputError, match=f"{path}:2: 4 columns where the column names give 3"):
        read_events(path, columns=("src", "dst", "time"))
    for bad in ("src,dst,weight", "src,src,dst,time", "src,,dst,time"):
        with pytest.raises(ConfigError, match="--columns"):
            parse_columns(bad)
    assert parse_columns(" src, dst ,rating,time") == ("src", "dst", "rating", "time")


def test_bipartite_renumbers_destinations_after_sources(tmp_path):
    events = read_events(write(tmp_path, "u,i,ts\n0,0,1\n2,1,2\n"), bipartite=True)
    np.testing.assert_array_equal(events.dst, [3, 4])
    assert events.num_nodes == 5


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("src,dst,time\n0,1,2\n0,1\n", 3, "at least 3 columns"),
        ("src,dst\n0,1\n", 1, "does not name the source, destination and time"),
        ("src dst time\n0 1 2\nx 1 2\n", 3, "column 1 ('x') is not a number"),
        ("src,dst,time\n0,-4,2\n", 2, "destination id -4 is not a node id"),
        ("src,dst,time\n0,1.5,2\n", 2, "destination id 1.5 is not a node id"),
        ("src,dst,time\n0,1,2\n0,1,noon\n", 3, "column 3 ('noon') is not a number"),
        ("src,dst,time\n0,1,2\n0,1,nan\n", 3, "column 3 is nan, not a finite number"),
        ("src,dst,time,f\n0,1,2,0.5\n0,1,2,0.5,0.7\n", 3, "5 columns where the first event line has 4"),
        ("a,b,c\n0,1,2\n", 1, "does not name the source, destination and time columns"),
        ("src,dst,time,f\n0,1,2,abc\n", 2, "is not a number"),
        ("src,dst,time,f\n0,1,2,1\n0,1,3,inf\n", 3, "column 4 is inf"),
        ("# c\nsrc,dst,time\n0,1,5\n\n0,1,3\n", 5, "time 3 is before the previous event's 5"),
        ("src,dst,time\n0,1,5\n1289241912,1,6\n", 3, "node id 1289241912, where 3 distinct ids appear"),
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


BITCOIN_OTC = COLLEGE_MSG.parent / "soc-sign-bitcoinotc.csv"


def test_bitcoin_otc_needs_its_columns_and_keeps_the_rating():
    if not BITCOIN_OTC.is_file():
        pytest.skip(f"Bitcoin OTC not found at {BITCOIN_OTC} (shared data absent)")
    with pytest.raises(InputError, match="4 columns and no header line"):
        read_events(BITCOIN_OTC)
    events = read_events(BITCOIN_OTC, columns=("src", "dst", "rating", "time"))
    assert len(events) == 35592 and events.num_nodes == 6006 and events.feat_dim == 1
    assert events.time.min() > 1.2e9 and (np.diff(events.time) >= 0).all()  # UNIX seconds, in order
    raw = np.loadtxt(BITCOIN_OTC, delimiter=",")
    np.testing.assert_array_equal(events.src, raw[:, 0])
    np.testing.assert_allclose(events.feat[:, 0], (raw[:, 2] - raw[:, 2].mean()) / raw[:, 2].std(), atol=1e-5)


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


def test_dataset_kinds_name_event_streams(tmp_path):
    from distgnn.data.datasets import DatasetSpec, graph_name, load_dataset

    path = write(tmp_path, "u,i,ts\n0,0,1\n2,1,2\n", "clicks.csv")
    events = load_dataset(DatasetSpec(f"events:{path}", bipartite=True))
    assert isinstance(events, EventStream) and events.num_nodes == 5 and events.name == "clicks"
    assert graph_name(DatasetSpec(f"events:{path}")) == "clicks"
    spec = DatasetSpec("synthetic-events:100:500", seed=2)
    np.testing.assert_array_equal(load_dataset(spec).dst, synthetic_events(100, 500, seed=2).dst)
    assert graph_name(spec) == "synthetic-events-n100-e500-s2"
    with pytest.raises(ConfigError, match="NODES:EVENTS"):
        load_dataset(DatasetSpec("synthetic-events:100"))

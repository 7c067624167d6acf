"""An event stream cut into snapshots: CollegeMsg by span and by count; bad cuts named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distgnn.data.events import EventStream, read_events
from distgnn.errors import InputError
from distgnn.snapshot.events import snapshots_from_events

COLLEGE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"


@pytest.mark.skipif(not COLLEGE.exists(), reason=f"CollegeMsg not found at {COLLEGE}")
def test_college_msg_by_count_and_by_span():
    stream = read_events(COLLEGE)
    seq = snapshots_from_events(stream, num_snapshots=30, name="CollegeMsg")
    assert len(seq) == 30 and seq.growing
    assert sum(s.num_edges for s in seq) == len(stream)
    assert seq.num_nodes == len(np.unique(np.concatenate([stream.src, stream.dst])))
    assert seq.num_features == 2
    weekly = snapshots_from_events(stream, span=7 * 86400.0)
    days = (stream.time[-1] - stream.time[0]) / 86400
    assert len(weekly) == int(days // 7) + 1


def test_bad_cuts_say_what_is_wrong():
    one = EventStream(np.array([0]), np.array([1]), np.array([0.0]), 2)
    with pytest.raises(InputError, match="--snapshot-span -1"):
        snapshots_from_events(one, span=-1)
    with pytest.raises(InputError, match="--num-snapshots 0"):
        snapshots_from_events(one, num_snapshots=0)
    empty = EventStream(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), 0)
    with pytest.raises(InputError, match="no events, so no snapshots after cutting"):
        snapshots_from_events(empty, num_snapshots=3)

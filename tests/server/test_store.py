"""distgnn.server.store.load_partition: the partition in shared memory and the time its log line reports."""

from __future__ import annotations

import logging
import re
import time
import uuid

import numpy as np
from serving_graphs import job_files, small_graph

from distgnn.partition.format import read_meta
from distgnn.server.store import load_partition
from distgnn.store import shm


def test_load_logs_the_time_the_load_took(tmp_path, caplog) -> None:
    graph = small_graph(tmp_path, num_parts=2)
    meta = read_meta(graph.json_path)
    job_id = f"t{uuid.uuid4().hex[:8]}"
    try:
        with caplog.at_level(logging.INFO, logger="distgnn.server.store"):
            began = time.monotonic()
            part = load_partition(job_id, 1, meta)  # partition 1: its feature ranges do not start at 0
            took = time.monotonic() - began
        first, end = graph.node_map[1]
        np.testing.assert_array_equal(part.tensor("node", "feat"), graph.ndata["feat"][first:end])
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded partition 1 ")]
        logged = float(re.search(r" in ([0-9.]+)s$", line).group(1))
        assert logged <= took + 0.01, (line, took)
    finally:
        shm.remove_segments(job_id)
    assert job_files(job_id) == []

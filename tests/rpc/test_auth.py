"""Only peers that know the job token get answers, with PLAIN (default) and CURVE."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from serving_graphs import child_processes, job_files, small_graph

from distgnn.errors import RpcTimeoutError
from distgnn.rpc import RpcClient, wire
from distgnn.train.cluster import LocalCluster


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "curve"])
def served(request, tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("auth") / "out", num_parts=1, num_nodes=50, num_edges=200)
    with LocalCluster(graph.json_path, curve=request.param, rpc_timeout_s=10) as cluster:
        yield graph, cluster
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def test_a_client_with_the_token_is_served(served):
    graph, cluster = served
    with RpcClient(cluster.config(0)) as client:
        ids = np.arange(10, dtype=np.int64)
        got = client.call(0, "pull", {"policy": "node", "name": "feat"}, [ids]).arrays[0]
        np.testing.assert_array_equal(got, graph.ndata["feat"][ids])


@pytest.mark.parametrize("wrong", ["token", "mechanism"])
def test_a_client_with_wrong_credentials_gets_nothing(served, wrong):
    _, cluster = served
    cfg = cluster.config(0)
    cfg = cfg.with_(token="not-the-token") if wrong == "token" else cfg.with_(curve=not cfg.curve)
    with RpcClient(cfg, timeout_s=0.6) as client, pytest.raises(RpcTimeoutError, match="no reply to 'meta'"):
        client.call(0, "meta")
    with RpcClient(cluster.config(0)) as client:
        assert client.call(0, "meta").header["ok"]


def test_a_peer_without_any_security_gets_nothing(served):
    _, cluster = served
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        host, port = cluster.config(0).server_address(0, 0)
        sock.connect(f"tcp://{host}:{port}")
        sock.send_multipart(wire.encode({"op": "meta", "rid": 1}))
        assert sock.poll(600) == 0
    finally:
        sock.close(0)
        ctx.term()
    assert cluster.process(0).poll() is None

"""A pending request to a server that dies (or freezes) fails within seconds, naming that server."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from serving_graphs import small_graph

from distgnn.errors import ServerLostError
from distgnn.rpc import RpcClient
from distgnn.rpc.client import HEARTBEAT_TIMEOUT_MS
from distgnn.train.cluster import LocalCluster

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job-control signals")


@pytest.fixture
def cluster(tmp_path):
    graph = small_graph(tmp_path / "g", num_parts=2, num_nodes=60, num_edges=200)
    with LocalCluster(graph.json_path, rpc_timeout_s=60) as cluster:
        yield cluster
        for machine_id in (0, 1):
            # A frozen server must run again to be stopped by SIGTERM.
            os.kill(cluster.process(machine_id).pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_pending_request_fails_soon_and_names_the_server(cluster, how):
    with RpcClient(cluster.config(0)) as client:
        assert client.call(1, "meta").header["ok"]  # the connection to server 0 of machine 1 is established
        server = cluster.process(1)
        os.kill(server.pid, signal.SIGSTOP)  # it cannot answer what comes next
        ids = np.arange(35, 40, dtype=np.int64)
        other = client.send(0, "pull", {"policy": "node", "name": "feat"}, [ids - 30])
        rid = client.send(1, "pull", {"policy": "node", "name": "feat"}, [ids])
        started = time.monotonic()
        if how == "killed":
            os.kill(server.pid, signal.SIGKILL)
        with pytest.raises(ServerLostError) as caught:
            client.wait([other, rid])
        took = time.monotonic() - started
    host, port = cluster.config(0).server_address(1, 0)
    message = str(caught.value)
    assert f"'pull' on server 0 of machine 1 (partition 1) at {host}:{port} failed" in message, message
    limit = 2.0 if how == "killed" else HEARTBEAT_TIMEOUT_MS / 1000 + 2.0
    assert took < limit, f"{took:.2f} s to notice a {how} server"


def test_a_server_that_answers_slowly_is_not_lost(cluster):
    with RpcClient(cluster.config(0)) as client:
        assert client.call(1, "meta").header["ok"]
        server = cluster.process(1)
        os.kill(server.pid, signal.SIGSTOP)
        rid = client.send(1, "meta")
        time.sleep(1.0)  # shorter than the heartbeat timeout: the connection stays up
        os.kill(server.pid, signal.SIGCONT)
        assert client.wait([rid])[0].header["ok"]

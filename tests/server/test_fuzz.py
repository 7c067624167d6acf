"""Fuzzing a live server: random, truncated and malicious requests never crash it or break later answers."""

from __future__ import annotations

import socket

import msgpack
import numpy as np
import pytest
import zmq
from serving_graphs import child_processes, job_files, small_graph

from distgnn.rpc import RpcClient, wire
from distgnn.rpc.auth import secure_client
from distgnn.train.cluster import LocalCluster

# No "shutdown" (a token holder may stop the server) and no "barrier" (its reply waits for other parties).
OPS = ["meta", "pull", "push", "init_data", "sample", "degrees", "find_edges", "nope", ""]
FIELD_VALUES = [
    None,
    True,
    -1,
    0,
    1,
    2**63 - 1,
    2**64 - 1,
    -(2**63),
    1.5,
    float("nan"),
    "",
    "feat",
    "node",
    "edge",
    "w",
    "../../etc/passwd",
    "x" * 300,
    [],
    [1, 2],
    [2**40, 2**40],
    {"a": 1},
    b"\x00\xff",
]
FIELDS = [
    "policy",
    "name",
    "mode",
    "dtype",
    "shape",
    "init",
    "low",
    "high",
    "seed",
    "fanout",
    "replace",
    "prob",
    "edge_dir",
    "parties",
    "arrays",
]
DTYPES = sorted(wire.DTYPES)


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def _random_array(rng):
    dtype = DTYPES[rng.integers(len(DTYPES))]
    shape = tuple(int(d) for d in rng.integers(0, 6, rng.integers(0, 3)))
    values = rng.integers(-(2**40), 2**40, shape) if rng.random() < 0.5 else rng.integers(-5, 400, shape)
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing casts are part of the fuzz
        return values.astype(dtype)


def _random_message(rng) -> list[bytes]:
    kind = rng.integers(7)
    if kind == 0:  # random bytes
        return [rng.bytes(int(rng.integers(0, 80))) for _ in range(int(rng.integers(1, 4)))]
    header = {"op": OPS[rng.integers(len(OPS))], "rid": int(rng.integers(1, 1000))}
    for key in rng.choice(FIELDS, int(rng.integers(0, 6)), replace=False):
        header[str(key)] = FIELD_VALUES[rng.integers(len(FIELD_VALUES))]
    if kind == 1:  # a well-formed message with random fields and arrays
        header.pop("arrays", None)
        return [bytes(f) for f in wire.encode(header, [_random_array(rng) for _ in range(int(rng.integers(0, 3)))])]
    if kind == 2:  # truncated frames
        frames = [
            bytes(f)
            for f in wire.encode(
                {"op": "pull", "rid": 3, "policy": "node", "name": "feat"}, [np.arange(8, dtype=np.int64)]
            )
        ]
        i = int(rng.integers(len(frames)))
        frames[i] = frames[i][: int(rng.integers(0, len(frames[i]) + 1))]
        return frames[: int(rng.integers(1, len(frames) + 1))]
    if kind == 3:  # a header that lies about its arrays (huge shapes, wrong dtypes)
        specs = [
            {
                "dtype": _pick(rng, ["float32", "int64", "object", "<U4", 7]),
                "shape": _pick(rng, [[2**62], [-3], [3, 2**31, 2**31], [2], "x"]),
            }
        ]
        return [msgpack.packb({**header, "arrays": specs}), rng.bytes(16)]
    if kind == 4:  # valid ops with ids far out of range or wrong dtype
        ids = rng.integers(-(2**62), 2**62, 5).astype(_pick(rng, ["int64", "int32", "float64", "uint64"]))
        op = _pick(rng, ["pull", "degrees", "sample", "push", "find_edges"])
        fields = {"op": op, "rid": 5, "policy": "node", "name": "feat", "fanout": 3, "mode": "add"}
        arrays = [ids] if op != "push" else [ids, np.zeros((5, 8), np.float32)]
        return [bytes(f) for f in wire.encode(fields, arrays)]
    if kind == 5:  # init_data asking for absurd memory
        fields = {
            "op": "init_data",
            "rid": 6,
            "policy": "node",
            "name": "big",
            "dtype": "float64",
            "shape": [300, int(rng.integers(2**20, 2**40))],
        }
        return [bytes(f) for f in wire.encode(fields)]
    return [msgpack.packb(header)]  # a header only


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("fuzz") / "out", num_parts=2)
    with LocalCluster(graph.json_path, servers_per_machine=1, rpc_timeout_s=20) as cluster:
        yield graph, cluster
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def test_random_requests_get_error_replies_and_the_server_keeps_serving(served):
    graph, cluster = served
    cfg = cluster.config(0)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    secure_client(sock, cfg.token, cfg.curve)
    host, port = cfg.server_address(0, 0)
    sock.connect(f"tcp://{host}:{port}")
    rng = np.random.default_rng(1234)
    sent = replies = 0
    try:
        for _ in range(600):
            frames = _random_message(rng)
            sock.send_multipart(frames)
            sent += 1
            while sock.poll(0):
                sock.recv_multipart()
                replies += 1
        while replies < sent and sock.poll(5000):
            sock.recv_multipart()
            replies += 1
    finally:
        sock.close(0)
        ctx.term()
    assert replies == sent  # every request, however malformed, got a reply
    assert cluster.process(0).poll() is None
    with RpcClient(cfg) as client:
        ids = np.random.default_rng(0).integers(0, graph.num_nodes, 200).astype(np.int64)
        for m in range(2):
            own = ids[(ids >= graph.node_map[m][0]) & (ids < graph.node_map[m][1])]
            got = client.call(m, "pull", {"policy": "node", "name": "feat"}, [own]).arrays[0]
            np.testing.assert_array_equal(got, graph.ndata["feat"][own])
        counts = client.call(0, "degrees", arrays=[np.arange(10, dtype=np.int64)]).arrays[0]
        np.testing.assert_array_equal(counts, np.bincount(graph.dst, minlength=graph.num_nodes)[:10])


def test_garbage_on_the_tcp_port_does_not_hurt_the_server(served):
    graph, cluster = served
    host, port = cluster.config(0).server_address(1, 0)
    rng = np.random.default_rng(7)
    for size in (0, 1, 10, 64, 5000):
        with socket.create_connection((host, port), timeout=2) as s:
            s.sendall(rng.bytes(size))
    with socket.create_connection((host, port), timeout=2) as s:
        s.sendall(b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL" + b"\x00" * 60)
    assert cluster.process(1).poll() is None
    with RpcClient(cluster.config(0)) as client:
        assert client.call(1, "meta").header["node_range"] == graph.node_map[1].tolist()

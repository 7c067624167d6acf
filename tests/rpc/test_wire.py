"""The wire format: round trips, zero-copy decoding, and rejection of malformed messages."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from distgnn.errors import ProtocolError
from distgnn.rpc import wire


def _as_bytes(frames: list) -> list[bytes]:
    return [bytes(f) for f in frames]


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_round_trip_every_allowed_dtype(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.random((7, 3)) * 100).astype(dtype)
    header, arrays = wire.decode(_as_bytes(wire.encode({"op": "pull", "rid": 5, "name": "x"}, [arr])))
    assert header["op"] == "pull" and header["rid"] == 5 and header["name"] == "x"
    assert arrays[0].dtype == arr.dtype and np.array_equal(arrays[0], arr)


def test_round_trip_empty_scalar_and_non_contiguous_arrays():
    big = np.arange(200_000, dtype=np.int64).reshape(1000, 200)
    inputs = [np.zeros((0, 4), np.float32), np.array(3.5), big[:, ::2], big]
    _, arrays = wire.decode(_as_bytes(wire.encode({"rid": 1}, inputs)))
    for got, want in zip(arrays, inputs, strict=True):
        assert got.shape == want.shape and np.array_equal(got, want)


def test_decoded_arrays_view_the_received_frames_without_copying():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://wire")
        b.connect("inproc://wire")
        rows = np.random.default_rng(1).random((5000, 32)).astype(np.float32)
        a.send_multipart(wire.encode({"rid": 9}, [rows]), copy=False)
        frames = b.recv_multipart(copy=False)
        _, (got,) = wire.decode(frames)
        assert np.array_equal(got, rows)
        assert np.shares_memory(got, np.frombuffer(frames[1].buffer, np.uint8))
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_encode_refuses_object_arrays():
    with pytest.raises(ProtocolError, match="dtype"):
        wire.encode({"rid": 1}, [np.array(["a"], dtype=object)])


def _header(**fields) -> bytes:
    return msgpack.packb({"rid": 1, **fields})


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "empty"),
        ([b"\xc1\xc1"], "msgpack"),
        ([msgpack.packb([1, 2])], "map"),
        ([msgpack.packb({"op": "x"})], "rid"),
        ([msgpack.packb({"rid": -1})], "rid"),
        ([msgpack.packb({"rid": "1"})], "rid"),
        ([_header(arrays=[{"dtype": "float32", "shape": [2]}])], "describes 1 arrays"),
        ([_header(arrays=[{"dtype": "object", "shape": [1]}]), b"x" * 8], "dtype"),
        ([_header(arrays=[{"dtype": "float32", "shape": [3]}]), b"x" * 8], "needs 12 bytes"),
        ([_header(arrays=[{"dtype": "float32", "shape": [2**30, 2**30]}]), b"x" * 8], "needs"),
        ([_header(arrays=[{"dtype": "float32", "shape": [-1]}]), b""], "shape"),
        ([_header(arrays=[{"dtype": "float32", "shape": [1, 1, 1, 1, 1]}]), b"x" * 4], "shape"),
        ([_header(arrays=[{"dtype": "float32", "shape": [1.5]}]), b"x" * 4], "shape"),
        ([_header(arrays=["float32"]), b"x" * 4], "spec"),
        ([_header(arrays={"dtype": "float32"})], "list"),
        ([b"\x81\xa3rid" + b"\x01" + b"\x00" * (wire.MAX_HEADER_BYTES + 1)], "limit"),
    ],
)
def test_decode_rejects_malformed_messages(frames, message):
    with pytest.raises(ProtocolError, match=message):
        wire.decode(frames)

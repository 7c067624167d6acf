"""The wire format under random input: random valid messages come back exactly; every mutation of a valid
message is either rejected with ProtocolError or decodes to exactly what its (mutated) header describes."""

from __future__ import annotations

import math

import msgpack
import numpy as np

from distgnn.errors import ProtocolError
from distgnn.rpc import wire

DTYPES = sorted(wire.DTYPES)


def random_message(rng: np.random.Generator) -> tuple[dict, list[np.ndarray]]:
    header = {"op": "pull", "rid": int(rng.integers(0, 2**62)), "name": "feat", "count": int(rng.integers(-5, 5))}
    arrays = []
    for _ in range(int(rng.integers(0, 5))):
        shape = tuple(int(d) for d in rng.integers(0, 5, size=int(rng.integers(0, wire.MAX_NDIM + 1))))
        dtype = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
        raw = rng.bytes(math.prod(shape) * dtype.itemsize)
        arrays.append(np.frombuffer(raw, dtype=dtype).reshape(shape))
    return header, arrays


def test_random_valid_messages_round_trip_exactly():
    rng = np.random.default_rng(0)
    for _ in range(300):
        header, arrays = random_message(rng)
        got_header, got = wire.decode([bytes(f) for f in wire.encode(header, arrays)])
        assert {k: got_header[k] for k in header} == header
        assert len(got) == len(arrays)
        for a, b in zip(got, arrays, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def mutate(frames: list[bytes], rng: np.random.Generator) -> list[bytes]:
    """One random change: a header byte, a spec's dtype or shape, an array frame's length or bytes, a frame
    dropped or added."""
    frames = list(frames)
    kind = int(rng.integers(6))
    if kind == 0:
        header = bytearray(frames[0])
        header[int(rng.integers(len(header)))] = int(rng.integers(256))
        frames[0] = bytes(header)
    elif kind in (1, 2) and len(frames) > 1:
        header = msgpack.unpackb(frames[0])
        spec = header["arrays"][int(rng.integers(len(header["arrays"])))]
        if kind == 1:
            spec["dtype"] = DTYPES[int(rng.integers(len(DTYPES)))] if rng.random() < 0.8 else "object"
        else:
            spec["shape"] = [int(d) for d in rng.integers(-1, 6, size=int(rng.integers(0, wire.MAX_NDIM + 2)))]
        frames[0] = msgpack.packb(header)
    elif kind == 3 and len(frames) > 1:
        i = int(rng.integers(1, len(frames)))
        frames[i] = frames[i][: int(rng.integers(len(frames[i]) + 1))] + rng.bytes(int(rng.integers(0, 3)))
    elif kind == 4 and len(frames) > 1:
        i = int(rng.integers(1, len(frames)))
        frames[i] = rng.bytes(len(frames[i]))  # same length, other contents: a valid message still
    else:
        frames = frames[:-1] if rng.random() < 0.5 else [*frames, rng.bytes(int(rng.integers(0, 16)))]
    return frames


def test_mutated_messages_are_rejected_or_decode_to_what_their_header_says():
    rng = np.random.default_rng(1)
    accepted = rejected = 0
    for _ in range(2000):
        frames = mutate([bytes(f) for f in wire.encode(*random_message(rng))], rng)
        try:
            header, arrays = wire.decode(frames)
        except ProtocolError as err:
            assert str(err)  # a message saying what was wrong
            rejected += 1
            continue
        accepted += 1
        specs = header.get("arrays", [])
        assert len(specs) == len(arrays) == len(frames) - 1
        for spec, array, frame in zip(specs, arrays, frames[1:], strict=True):
            assert spec["dtype"] in wire.DTYPES and array.dtype == np.dtype(spec["dtype"])
            assert array.shape == tuple(spec["shape"]) and all(d >= 0 for d in array.shape)
            assert array.tobytes() == frame  # the frame's bytes, all of them, nothing else
    # Both outcomes happen: the mutations reach past the first checks, and consistent ones are accepted.
    assert accepted > 200 and rejected > 200, (accepted, rejected)

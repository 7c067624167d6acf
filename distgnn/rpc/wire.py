"""The RPC wire format: one msgpack header frame, then one raw frame per array.

A message is ``[header, array_0, array_1, ...]``. The header is a msgpack map
``{"op" | "ok": ..., "rid": int, "arrays": [{"dtype": str, "shape": [int]}], ...}``
describing every following frame. Arrays travel as their raw contiguous bytes:
sent without copies (pyzmq references the numpy buffer) and received without
copies (``np.frombuffer`` over the zmq frame). Nothing is pickled.

``decode`` validates everything a peer controls (header type and size, field
types, dtype whitelist, shape, byte counts) and raises ``ProtocolError``; the
caller turns that into an error reply, so no message can crash a server.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from distgnn.errors import ProtocolError

MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAYS = 16
MAX_NDIM = 4
# One message may carry at most this many array bytes (a 100k x 1000 float32 pull is 400 MB).
MAX_MESSAGE_BYTES = 2 * 1024**3

DTYPES = frozenset(
    ("bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32", "float64", "uint16", "uint32")
)

# Frames shorter than this are copied by pyzmq anyway; zero-copy pays off only for big ones.
_ZERO_COPY_BYTES = 64 * 1024


def encode(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> list:
    """Frames for ``header`` plus ``arrays`` (made contiguous; dtype and shape go into the header)."""
    if len(arrays) > MAX_ARRAYS:
        raise ProtocolError(f"at most {MAX_ARRAYS} arrays per message, got {len(arrays)}")
    frames: list = [None]
    specs = []
    for arr in arrays:
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        if arr.dtype.name not in DTYPES:
            raise ProtocolError(f"dtype {arr.dtype} cannot go on the wire (allowed: {sorted(DTYPES)})")
        specs.append({"dtype": arr.dtype.name, "shape": list(arr.shape)})
        frames.append(arr.data if arr.nbytes >= _ZERO_COPY_BYTES else arr.tobytes())
    frames[0] = msgpack.packb({**header, "arrays": specs}, use_bin_type=True)
    return frames


def _frame_bytes(frame: Any) -> memoryview:
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    return memoryview(buf).cast("B")


def decode_header(frame: Any) -> dict[str, Any]:
    """Unpack and type-check the header frame (a dict with str keys, an int ``rid``)."""
    raw = _frame_bytes(frame)
    if raw.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {raw.nbytes} bytes, limit is {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_array_len=1024,
            max_map_len=64,
            max_str_len=4096,
            max_bin_len=4096,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, FormatError, ...)
        raise ProtocolError(f"header is not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a msgpack map, got {type(header).__name__}")
    rid = header.get("rid")
    if type(rid) is not int or not 0 <= rid < 2**63:
        raise ProtocolError(f"header field 'rid' must be a non-negative integer, got {rid!r}")
    return header


def decode(frames: Sequence[Any]) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``(header, arrays)`` from received frames; arrays are views of the frames (no copy)."""
    if not frames:
        raise ProtocolError("empty message")
    header = decode_header(frames[0])
    specs = header.get("arrays", [])
    if not isinstance(specs, list) or len(specs) > MAX_ARRAYS:
        raise ProtocolError(f"header field 'arrays' must be a list of at most {MAX_ARRAYS} specs")
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"header describes {len(specs)} arrays but {len(frames) - 1} array frames came")
    arrays = []
    total = 0
    for i, (spec, frame) in enumerate(zip(specs, frames[1:], strict=True)):
        dtype, shape = _check_spec(spec, i)
        data = _frame_bytes(frame)
        expected = math.prod(shape) * dtype.itemsize
        if data.nbytes != expected:
            raise ProtocolError(f"array {i}: {dtype.name}{list(shape)} needs {expected} bytes, frame has {data.nbytes}")
        total += expected
        if total > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message carries more than {MAX_MESSAGE_BYTES} array bytes")
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
        if not arr.flags.aligned:
            arr = arr.copy()
        arrays.append(arr)
    return header, arrays


def _check_spec(spec: Any, i: int) -> tuple[np.dtype, tuple[int, ...]]:
    if not isinstance(spec, dict):
        raise ProtocolError(f"array {i}: spec must be a map {{dtype, shape}}, got {type(spec).__name__}")
    dtype, shape = spec.get("dtype"), spec.get("shape")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ProtocolError(f"array {i}: dtype {dtype!r} not allowed (allowed: {sorted(DTYPES)})")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(type(d) is int and 0 <= d <= MAX_MESSAGE_BYTES for d in shape)
    ):
        raise ProtocolError(f"array {i}: shape must be a list of at most {MAX_NDIM} non-negative ints, got {shape!r}")
    return np.dtype(dtype), tuple(shape)

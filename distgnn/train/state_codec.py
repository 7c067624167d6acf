"""A checkpoint piece's state dict as JSON plus named arrays, and this process's RNG states as JSON.

:func:`encode` turns a nested state (dicts, lists, tuples, numbers, strings, tensors, numpy arrays) into a JSON
tree in which every tensor or array is replaced by a reference naming the ``.npy`` file it goes to (its path in
the state where that makes a valid file name, ``model.layers.0.weight``); :func:`decode` puts arrays back in.
Tensors keep their dtype (bfloat16 as its bits), shape and device; nothing is pickled.
"""

from __future__ import annotations

import base64
import random
import re
from typing import Any

import numpy as np
import torch

from distgnn.errors import CheckpointError

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,200}$")


def encode(state: Any, prefix: str) -> tuple[Any, dict[str, np.ndarray]]:
    """``(tree, arrays)``: ``state`` as JSON with its tensors and arrays by file stem (each starts with
    ``prefix``). Raises CheckpointError for a value of any other type."""
    arrays: dict[str, np.ndarray] = {}

    def stem(path: str) -> str:
        name = f"{prefix}.{path}" if path else prefix
        return name if _NAME.match(name) and name not in arrays else f"{prefix}._{len(arrays)}"

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            name = stem(path)
            arrays[name] = to_numpy(obj)
            return {"__tensor__": name, "dtype": str(obj.dtype), "shape": list(obj.shape), "device": str(obj.device)}
        if isinstance(obj, np.ndarray):
            name = stem(path)
            arrays[name] = obj
            return {"__array__": name, "dtype": str(obj.dtype), "shape": list(obj.shape)}
        inner = f"{path}." if path else ""
        if isinstance(obj, dict):
            return {"__dict__": [[walk(k, ""), walk(v, f"{inner}{k}")] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {"__tuple__": [walk(v, f"{inner}{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [walk(v, f"{inner}{i}") for i, v in enumerate(obj)]
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise CheckpointError(
            f"cannot store a {type(obj).__name__} in a checkpoint (tensors, arrays, numbers, str, containers)"
        )

    return walk(state, ""), arrays


def decode(tree: Any, arrays: dict[str, np.ndarray | torch.Tensor]) -> Any:
    """The state :func:`encode` gave ``tree`` for, its tensors (on their saved device) and arrays from ``arrays``."""
    if isinstance(tree, list):
        return [decode(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        value = arrays[tree["__tensor__"]]
        t = value if isinstance(value, torch.Tensor) else from_numpy(value, tree["dtype"])
        return t.to(tree["device"])
    if "__array__" in tree:
        return np.array(arrays[tree["__array__"]])  # a copy: checkpoint files are mapped read-only
    if "__tuple__" in tree:
        return tuple(decode(v, arrays) for v in tree["__tuple__"])
    return {decode(k, arrays): decode(v, arrays) for k, v in tree["__dict__"]}


def references(tree: Any) -> list[dict]:
    """Every tensor and array reference in ``tree`` (dicts with ``__tensor__`` or ``__array__``, in order)."""
    if isinstance(tree, list):
        return [r for v in tree for r in references(v)]
    if not isinstance(tree, dict):
        return []
    if "__tensor__" in tree or "__array__" in tree:
        return [tree]
    values = tree.get("__tuple__") or [v for pair in tree.get("__dict__", []) for v in pair]
    return [r for v in values for r in references(v)]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bits
        t = t.view(torch.int16)
    return t.numpy()


def from_numpy(arr: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.array(arr))
    return t.view(torch.bfloat16) if dtype == "torch.bfloat16" else t


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown tensor dtype {name!r} in the checkpoint")
    return dtype


# -- RNG states ------------------------------------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's torch, CUDA, numpy and python RNG states as JSON-able values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else None
    return {
        "torch": _b64(torch.get_rng_state()),
        "cuda": cuda,
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))

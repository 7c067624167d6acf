"""The ``adam_step`` op's update: Adam on the touched rows of an embedding table held by this server.

:func:`adam_rows` is the one switch point: the C++ kernel (``csrc/cpu/optim.cpp``, one pass per row, in
place) or, where the extension cannot be built, :func:`adam_rows_reference`, the plain numpy version the
kernel is tested against (gathers the rows, updates them in temporaries, scatters them back).
"""

from __future__ import annotations

import numpy as np

from distgnn.errors import InputError
from distgnn.native.cpu import extension
from distgnn.native.optional import OptionalExtension

_kernels = OptionalExtension("adam_step's compiled kernel", extension, "the numpy reference")


def adam_rows_reference(
    weight: np.ndarray,
    state: np.ndarray,
    ids: np.ndarray,
    grad: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """Adam on ``weight[ids]`` in place (numpy).

    Args:
        weight: float32 ``(N, D)``; state: float32 ``(N, 2D + 1)``, per row ``[m | v | t]`` (updated too).
        ids: int64 ``(n,)`` unique rows in ``[0, N)``; grad: float32 ``(n, D)``, each row's summed gradient.
        lr, beta1, beta2, eps: Adam's; the bias corrections use each row's own step count ``t``.
    """
    dim = weight.shape[1]
    rows = state[ids]
    m, v, t = rows[:, :dim], rows[:, dim : 2 * dim], rows[:, 2 * dim :]
    # 1 - beta and the bias corrections in float64, rounded to float32 once (as the kernel does)
    keep1, keep2 = np.float32(1 - beta1), np.float32(1 - beta2)
    t += 1
    m += keep1 * (grad - m)
    v += keep2 * (grad * grad - v)
    state[ids] = rows
    correct1 = (1 - beta1 ** t.astype(np.float64)).astype(np.float32)
    correct2 = (1 - beta2 ** t.astype(np.float64)).astype(np.float32)
    weight[ids] -= lr * (m / correct1) / (np.sqrt(v / correct2) + eps)


def adam_rows(
    weight: np.ndarray,
    state: np.ndarray,
    ids: np.ndarray,
    grad: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """As :func:`adam_rows_reference`, in one pass per row where the C++ kernels load (same results to float32
    rounding; ids in any order). Raises InputError when ``ids`` repeat a row or leave ``[0, N)``."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    kernels = _kernels()
    if kernels is None:
        if len(np.unique(ids)) != len(ids):
            raise InputError("adam_step ids must be unique (sum the gradients of repeated ids first)")
        if len(ids) and (ids.min() < 0 or ids.max() >= len(weight)):
            raise InputError(f"adam_step ids must be rows in [0, {len(weight)})")
        adam_rows_reference(weight, state, ids, grad, lr, beta1, beta2, eps)
        return
    try:
        kernels.sparse_adam(weight, state, ids, np.ascontiguousarray(grad, np.float32), lr, beta1, beta2, eps, 1)
    except (ValueError, IndexError) as exc:
        raise InputError(f"adam_step failed: {exc}") from None

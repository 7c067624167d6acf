"""A direct ``METIS_PartGraphKway`` call into the METIS library that pymetis bundles.

pymetis 2025.2 passes ``ncon = 1`` to METIS whatever the length of
``vweights``, so several balance constraints (and edge weights) go straight to
the library through ctypes, with the same int64 arrays pymetis would use.
"""

from __future__ import annotations

import ctypes

import numpy as np

from distgnn.errors import InputError

_METIS_OK = 1
_METIS_STATUS = {-2: "input error", -3: "out of memory", -4: "error"}


def metis_kway(
    xadj: np.ndarray,
    adjncy: np.ndarray,
    vweights: np.ndarray | None,
    adjwgt: np.ndarray | None,
    num_parts: int,
    seed: int,
    ncuts: int = 1,
) -> tuple[np.ndarray, int]:
    """``METIS_PartGraphKway`` on int64 CSR with ``ncon = vweights.shape[1]`` constraints and optional edge weights.

    ``ncuts``: METIS computes that many partitions and keeps the best. Returns ``(part, edge_cut)``.
    """
    import pymetis
    from pymetis import _internal

    if _internal._idx_type_width() != 64:
        raise InputError("this METIS call needs pymetis built with 64-bit METIS indices")
    lib = ctypes.CDLL(_internal.__file__)
    idx = ctypes.c_int64

    def ptr(arr: np.ndarray | None):
        if arr is None:
            return None
        if arr.dtype != np.int64 or not arr.flags.c_contiguous:
            raise InputError(f"METIS arrays must be contiguous int64, got {arr.dtype}")
        return arr.ctypes.data_as(ctypes.POINTER(idx))

    options = np.zeros(64, dtype=np.int64)  # METIS_NOPTIONS is 40; room to spare
    lib.METIS_SetDefaultOptions(ptr(options))
    options[int(pymetis.OptionKey.SEED)] = seed
    options[int(pymetis.OptionKey.NUMBERING)] = 0
    options[int(pymetis.OptionKey.NCUTS)] = ncuts
    part = np.empty(xadj.shape[0] - 1, dtype=np.int64)
    ncon = 1 if vweights is None else vweights.shape[1]
    nvtxs, ncon_c, nparts, edge_cut = idx(part.shape[0]), idx(ncon), idx(num_parts), idx(0)
    status = lib.METIS_PartGraphKway(
        ctypes.byref(nvtxs),
        ctypes.byref(ncon_c),
        ptr(xadj),
        ptr(adjncy),
        ptr(vweights),
        None,
        ptr(adjwgt),
        ctypes.byref(nparts),
        None,
        None,
        ptr(options),
        ctypes.byref(edge_cut),
        ptr(part),
    )
    if status != _METIS_OK:
        raise InputError(f"METIS failed ({_METIS_STATUS.get(status, status)}) with {ncon} balance constraints")
    return part, int(edge_cut.value)

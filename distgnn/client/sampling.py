"""A DistGraph as the sampler reads it (:class:`distgnn.sampling.source.GraphSource`): this machine's partition
straight from shared memory, and ``sample`` / ``find_edges`` requests to the other machines' servers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distgnn.sampling.source import LocalCSC, SampleRequest


class RpcSampling:
    """``sample`` requests to other machines' servers through a DistGraph's RPC client."""

    def __init__(self, g):
        self.client = g.rpc
        self.context = g.context

    def send_sample(self, machine_id: int, request: SampleRequest) -> int:
        fields = {"replace": bool(request.replace), "seed": int(request.rng_seed), "prob": request.prob}
        arrays = [request.seeds]
        if request.etypes is None:
            fields["fanout"] = int(request.fanout)
        else:
            fields["fanouts"] = [int(f) for f in request.fanout]
            arrays.append(np.ascontiguousarray(request.etypes, dtype=np.int64))
        server = self.context.read_server(machine_id)
        return self.client.send(machine_id, "sample", fields, arrays, server_id=server)

    def wait_sample(self, handles: Sequence[object]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [tuple(reply.arrays) for reply in self.client.wait(list(handles))]

    def find_edges(self, eids_by_machine: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        rids = {
            m: self.client.send(m, "find_edges", arrays=[eids], server_id=self.context.read_server(m))
            for m, eids in eids_by_machine.items()
        }
        replies = self.client.wait(list(rids.values()))
        return {m: (reply.arrays[0], reply.arrays[1]) for m, reply in zip(rids, replies, strict=True)}


def sampling_view(g: Any) -> tuple[LocalCSC, RpcSampling]:
    """A DistGraph's sampling view: this machine's shared-memory partition, and the RPC client for the others."""
    part = g.local_partition
    shared = g.context.local_partition()
    weights = {}
    for name in g.edata:
        arr = shared.tensor("edge", name)
        if arr is not None and arr.ndim == 1 and arr.dtype == np.float32:
            weights[name] = arr
    local = LocalCSC(
        part_id=part.part_id,
        node_start=part.node_range[0],
        indptr=part.indptr,
        indices=part.indices,
        eids=part.eids,
        local2global=part.local2global,
        edge_weights=weights,
        num_etypes=part.num_etypes,
        eid_offset=part.eid_offset,
    )
    return local, RpcSampling(g)

"""Clique cache over processes: shards shared by CUDA IPC, read by the gather kernel (skips without a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distgnn.cache import HostTier, clique_over_processes, gather

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NUM_NODES, WIDTH, NUM_HOT = 3000, 24, 1001


def shared_inputs():
    gen = torch.Generator().manual_seed(11)
    table = torch.randn(NUM_NODES, WIDTH, generator=gen).to(torch.bfloat16)
    hot = torch.randperm(NUM_NODES, generator=gen)[:NUM_HOT]
    ids = torch.randint(0, NUM_NODES, (5000,), generator=gen)
    return table, hot, ids


def clique_worker(rank: int, world_size: int, init_file: str, rows_by_function: bool) -> None:
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        table, hot, ids = shared_inputs()
        fetched = []

        def fetch(ids):
            fetched.append(ids)
            return table[ids]

        rows = fetch if rows_by_function else table[hot]
        cache = clique_over_processes(hot, rows, NUM_NODES, rank, world_size, device)
        if rows_by_function:  # each process fetched exactly its own shard's rows
            assert len(fetched) == 1 and torch.equal(fetched[0], hot[rank::world_size])
        assert cache.num_shards == world_size and cache.local_rank == rank
        assert cache.shards[rank].shape[0] == len(range(rank, NUM_HOT, world_size))
        host = HostTier(table.pin_memory(), 0)
        out = torch.full((len(ids), WIDTH), float("nan"), dtype=torch.bfloat16, device=device)
        gather(out, ids.to(device), cache=cache, host=host, impl="cuda")
        assert torch.equal(out.cpu(), table[ids])
        slots = cache.slot_table.cpu()[ids]
        assert cache.stats.peer_hits == int(((slots >= 0) & (slots % world_size != rank)).sum()) > 0
        dist.barrier()  # peers read this shard until here
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("rows_by_function", [False, True])
def test_clique_over_processes_reads_peer_shards(tmp_path, world_size, rows_by_function):
    init_file = tmp_path / "init"
    mp.spawn(clique_worker, args=(world_size, str(init_file), rows_by_function), nprocs=world_size, join=True)

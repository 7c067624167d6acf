"""Checkpoint and resume on a live 2-machine cluster: a run stopped after a checkpoint and resumed with fresh
objects ends bit-identical to an uninterrupted one; bad checkpoints are refused and change nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from netns_cluster import free_port
from serving_graphs import child_processes, job_files, small_graph

from distgnn.client.context import connect
from distgnn.client.embedding import DistEmbedding, SparseAdagrad, SparseAdam
from distgnn.client.graph import DistGraph
from distgnn.errors import CheckpointError, ConfigError
from distgnn.loader.node import DistNodeDataLoader
from distgnn.nn import GraphSAGE
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.train.bookkeeping import add_checkpoint_args, checkpointer_from_args
from distgnn.train.checkpoint import Checkpointer, Position
from distgnn.train.checkpoint_pieces import training_pieces
from distgnn.train.cluster import LocalCluster

EMB_DIM = 4
BATCH = 25  # about 90 training seeds: 4 batches per epoch
TOTAL_STEPS = 10


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("ckpt") / "g", num_parts=2, num_nodes=300, num_edges=2000)
    with LocalCluster(graph.json_path, rpc_timeout_s=30) as cluster, connect(cluster.config(0)) as ctx:
        yield graph, ctx
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


@dataclass
class Trainer:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    emb: DistEmbedding
    sparse: SparseAdagrad | SparseAdam
    loader: DistNodeDataLoader
    g: DistGraph

    def state(self) -> dict:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "loader": self.loader,
            "sparse_optimizers": [self.sparse],
        }


def build(job, emb_name: str, hidden: int = 16, prefetch: int = 0, sparse: type = SparseAdagrad) -> Trainer:
    graph, ctx = job
    g = DistGraph("g", graph.json_path, context=ctx)
    torch.manual_seed(0)
    model = GraphSAGE(8 + EMB_DIM, hidden, 5, num_layers=2, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    emb = DistEmbedding(graph.num_nodes, EMB_DIM, emb_name, context=ctx)
    seeds = torch.from_numpy(np.flatnonzero(graph.ndata["train_mask"]))
    loader = DistNodeDataLoader(g, seeds, NeighborSampler([4, 3]), BATCH, shuffle=True, seed=3, prefetch=prefetch)
    return Trainer(model, optimizer, emb, sparse([emb], lr=0.05), loader, g)


def train_step(t: Trainer, batch) -> None:
    input_nodes, seeds, blocks = batch
    x = torch.cat([t.g.ndata["feat"][input_nodes], t.emb(input_nodes)], 1)
    loss = F.cross_entropy(t.model(blocks, x), t.g.ndata["label"][seeds])
    t.optimizer.zero_grad()
    loss.backward()
    t.optimizer.step()
    t.sparse.step()


def train(t: Trainer, until: int, checkpointer: Checkpointer | None = None, position: Position | None = None) -> None:
    step = position.step if position is not None else 0
    while step < until:
        for batch in t.loader:
            train_step(t, batch)
            step += 1
            if checkpointer is not None:
                checkpointer.maybe_save(step, t.loader.epoch - 1, training_pieces(**t.state()))
            if step == until:
                return


def everything(t: Trainer, num_nodes: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(num_nodes)
    out = {f"model.{k}": v.clone() for k, v in t.model.state_dict().items()}
    for i, s in t.optimizer.state_dict()["state"].items():
        out.update({f"adam.{i}.{k}": v.clone() for k, v in s.items()})
    out["emb"] = t.emb.weight[ids]
    state = t.sparse.state[t.emb.name]
    for name, tensor in state.items() if isinstance(state, dict) else [("adagrad", state)]:
        out[f"sparse.{name}"] = tensor[ids]
    return out


@pytest.mark.parametrize(
    ("every", "crash_at", "sparse"),
    [(3, 7, SparseAdagrad), (4, 5, SparseAdagrad), (3, 5, SparseAdam)],  # resume mid-epoch, and at an epoch's end
)
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(job, tmp_path, every, crash_at, sparse):
    graph, _ = job
    straight = build(job, f"emb_straight_{every}_{sparse.__name__}", sparse=sparse)
    train(straight, TOTAL_STEPS)
    expected = everything(straight, graph.num_nodes)

    ckpt_dir = tmp_path / "ckpt"
    first = build(job, f"emb_resumed_{every}_{sparse.__name__}", sparse=sparse)
    train(first, crash_at, Checkpointer(ckpt_dir, every, keep=2))  # "crashes" after crash_at steps
    saved = [p.name for p in Checkpointer(ckpt_dir, every).checkpoints()]
    assert saved == [f"step-{s:08d}" for s in range(every, crash_at + 1, every)][-2:]
    at_crash = everything(first, graph.num_nodes)["emb"]

    # Fresh objects; the servers still hold the first run's later updates, and the RNGs were used since.
    torch.manual_seed(1234)
    np.random.seed(1234)
    second = build(
        job, f"emb_resumed_{every}_{sparse.__name__}", prefetch=1, sparse=sparse
    )  # a prefetch thread: the workers' start position too
    checkpointer = Checkpointer(ckpt_dir, every, keep=2)
    position = checkpointer.resume("auto", training_pieces(**second.state()))
    last = every * (crash_at // every)
    assert (position.step, position.path.name) == (last, f"step-{last:08d}")
    assert (position.epoch, position.batch) == divmod(last, len(second.loader))
    # The servers' rows are the checkpoint's again, not the first run's later ones.
    files = [position.path / f"dist.node.emb_resumed_{every}_{sparse.__name__}.p{m}.npy" for m in (0, 1)]
    at_checkpoint = torch.from_numpy(np.concatenate([np.load(f) for f in files]))
    assert torch.equal(second.emb.weight[torch.arange(graph.num_nodes)], at_checkpoint)
    assert not torch.equal(at_checkpoint, at_crash)
    train(second, TOTAL_STEPS, checkpointer, position)
    got = everything(second, graph.num_nodes)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


@pytest.fixture(scope="module")
def saved(job, tmp_path_factory):
    """A trainer after 4 steps and the checkpoint it wrote at step 4."""
    root = tmp_path_factory.mktemp("saved")
    (root / ".staging-step-00000002").mkdir()  # what a save that crashed leaves
    (root / ".staging-step-00000002" / "model.x.npy").write_bytes(b"partial")
    t = build(job, "emb_saved")
    train(t, 4, Checkpointer(root, 4))
    return t, root / "step-00000004"


def test_the_manifest_lists_every_file_with_size_and_checksum(saved):
    _, path = saved
    manifest = json.loads((path / "manifest.json").read_text())
    on_disk = {p.name for p in path.iterdir()} - {"manifest.json"}
    assert on_disk == set(manifest["files"]) | set(manifest["dist_files"])
    assert {f for f in manifest["dist_files"]} == {
        f"dist.node.{name}.p{m}.npy" for name in ("emb_saved", "emb_saved.adagrad") for m in (0, 1)
    }
    for name, entry in {**manifest["files"], **manifest["dist_files"]}.items():
        assert (path / name).stat().st_size == entry["bytes"]
    assert not list(path.parent.glob(".staging-*"))  # the crashed save's leftovers too


def _unchanged_after_refusal(job, t: Trainer, resume) -> None:
    graph, _ = job
    before = everything(t, graph.num_nodes)
    with pytest.raises(CheckpointError) as info:
        resume()
    after = everything(t, graph.num_nodes)
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    return str(info.value)


@pytest.mark.parametrize(
    ("victim", "damage", "message"),
    [
        ("dist.node.emb_saved.p1.npy", "flip", "sha256"),
        ("model.layers.0.fc_self.weight.npy", "truncate", "truncated"),
        ("state.json", "flip", "sha256"),
    ],
)
def test_a_tampered_or_truncated_checkpoint_is_refused_and_changes_nothing(
    job, saved, tmp_path, victim, damage, message
):
    import shutil

    t, original = saved
    path = tmp_path / original.name
    shutil.copytree(original, path)
    target = path / victim
    if not target.exists():  # parameter names come from the model: pick the first one
        target = sorted(path.glob("model.*.npy"))[0]
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[-1] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    target.write_bytes(bytes(data))
    error = _unchanged_after_refusal(
        job, t, lambda: Checkpointer(tmp_path, 4).resume(str(path), training_pieces(**t.state()))
    )
    assert message in error and target.name in error


def test_another_model_is_refused_in_one_line(job, saved):
    _, path = saved
    other = build(job, "emb_saved", hidden=32)
    error = _unchanged_after_refusal(
        job, other, lambda: Checkpointer(path.parent, 4).resume(str(path), training_pieces(**other.state()))
    )
    assert "another model" in error and "\n" not in error


def test_resume_auto_without_checkpoints_starts_fresh_and_a_missing_path_is_an_error(job, tmp_path):
    t = build(job, "emb_fresh")
    assert Checkpointer(tmp_path, 4).resume("auto", training_pieces(**t.state())) == Position()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        Checkpointer(tmp_path, 4).resume(str(tmp_path / "step-00000004"), training_pieces(**t.state()))


def test_the_command_line_flags_make_a_checkpointer(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_checkpoint_args(parser)
    args = parser.parse_args(["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "5", "--resume", "auto"])
    checkpointer = checkpointer_from_args(args)
    assert (checkpointer.root, checkpointer.every_n_steps, checkpointer.keep) == (tmp_path, 5, 2)
    assert checkpointer_from_args(parser.parse_args([])) is None
    with pytest.raises(ConfigError, match="need --checkpoint-dir"):
        checkpointer_from_args(parser.parse_args(["--resume", "auto"]))


def test_a_checkpoint_of_another_partitioning_is_refused(saved, tmp_path):
    _, path = saved
    graph = small_graph(tmp_path / "g3", num_parts=3, num_nodes=300, num_edges=2000)
    with LocalCluster(graph.json_path, rpc_timeout_s=30) as cluster, connect(cluster.config(0)) as ctx:
        other = build((graph, ctx), "emb_saved")
        with pytest.raises(CheckpointError, match="made with 2 partitions, this job has 3"):
            Checkpointer(path.parent, 4).resume(str(path), training_pieces(**other.state()))


@pytest.mark.parametrize(
    ("op", "fields", "message"),
    [
        ("save_tensor", {"root": "relative/dir", "dir": ".staging-step-1", "file": "a.npy"}, "absolute"),
        ("save_tensor", {"dir": ".staging-../../etc", "file": "a.npy"}, "step-<n>"),
        ("save_tensor", {"dir": ".staging-step-1", "file": "../a.npy"}, "no directories"),
        ("save_tensor", {"dir": "step-1", "file": "a.npy"}, "staging directory"),
        ("save_tensor", {"dir": ".staging-step-9", "file": "a.npy"}, "prepare"),
        ("load_tensor", {"dir": "step-00000004", "file": "dist.node.emb_saved.p0.npy", "sha256": "0" * 64}, "sha256"),
        ("load_tensor", {"dir": "step-00000004", "file": "dist.node.emb_saved.p1.npy"}, "another partition"),
        ("checkpoint_dir", {"dir": "step-00000004", "action": "explode"}, "prepare, commit or remove"),
    ],
)
def test_server_checkpoint_ops_refuse_bad_requests(job, saved, op, fields, message):
    from distgnn.errors import RpcError

    _, ctx = job
    _, path = saved
    manifest = json.loads((path / "manifest.json").read_text())
    request = {"policy": "node", "name": "emb_saved", "root": str(path.parent), "bytes": 0, "sha256": ""}
    entry = manifest["dist_files"].get(fields.get("file", ""))
    if entry is not None:
        request.update(bytes=entry["bytes"], sha256=entry["sha256"], rows=entry["rows"])
    request.update(fields)
    with pytest.raises(RpcError, match=message):
        ctx.client.call(0, op, request)


def test_a_symlink_out_of_the_root_is_refused(job, tmp_path):
    from distgnn.errors import RpcError

    _, ctx = job
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / ".staging-step-1").symlink_to(tmp_path / "elsewhere")
    fields = {"policy": "node", "name": "feat", "root": str(tmp_path / "root"), "dir": ".staging-step-1"}
    with pytest.raises(RpcError, match="outside the checkpoint root"):
        ctx.client.call(0, "save_tensor", {**fields, "file": "x.npy"})
    assert list((tmp_path / "elsewhere").iterdir()) == []


def _rank_main(rank: int, graph, config, port: int, root: str, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ctx = connect(config, rank=rank, world_size=2)
    try:
        t = build((graph, ctx), "emb_two_ranks")
        t.model = torch.nn.parallel.DistributedDataParallel(t.model)
        torch.manual_seed(rank)  # dropout differs per rank, as in the examples
        checkpointer = Checkpointer(root, 3)
        train(t, 3, checkpointer)
        saved = {
            "model": {k: v.clone() for k, v in t.model.module.state_dict().items()},
            "loader": t.loader.state_dict(),
            "draw": torch.rand(4),
        }
        train(t, 5, position=Position(step=3))  # on past the checkpoint, then "crash"
        position = checkpointer.resume("auto", training_pieces(**t.state()))
        same_model = all(torch.equal(v, saved["model"][k]) for k, v in t.model.module.state_dict().items())
        out.put(
            (
                rank,
                position.step,
                same_model,
                t.loader.state_dict() == saved["loader"],
                torch.equal(torch.rand(4), saved["draw"]),
            )
        )
    finally:
        ctx.close()
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_save_and_resume_through_torch_distributed(job, tmp_path):
    import torch.multiprocessing as mp

    graph, ctx = job
    port = free_port()
    spawn = mp.get_context("spawn")
    out = spawn.Queue()
    configs = [ctx.config.with_(machine_id=r) for r in range(2)]
    procs = [spawn.Process(target=_rank_main, args=(r, graph, configs[r], port, str(tmp_path), out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    # Each rank gets back the model, its own loader position and its own RNG stream.
    assert results == [(0, 3, True, True, True), (1, 3, True, True, True)]


def test_a_checkpoint_at_a_capped_epoch_end_continues_with_the_next_epoch(job, tmp_path):
    t = build(job, "emb_cap")
    checkpointer = Checkpointer(tmp_path, 2)
    for step, batch in zip((1, 2), t.loader, strict=False):  # the loop takes 2 of the loader's 4 batches
        train_step(t, batch)
        checkpointer.maybe_save(step, 0, training_pieces(**t.state()))
    resumed = build(job, "emb_cap")
    position = checkpointer.resume("auto", training_pieces(**resumed.state()), batches_per_epoch=2)
    assert (position.step, position.epoch, position.batch) == (2, 1, 0)
    reference = build(job, "emb_cap")
    list(reference.loader)  # epoch 0
    _, expected, _ = next(iter(reference.loader))
    _, got, _ = next(iter(resumed.loader))
    assert torch.equal(got, expected)

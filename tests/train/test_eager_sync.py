"""EagerSync (distgnn/train/grad_sync.py): the eager step of jobs that are not captured, in one process.

A gloo group of one: with a GradSync (``ddp=False``) a step leaves every dense ``.grad`` a view of the flat buffer
even though the optimiser's ``zero_grad`` sets them to None, the weights follow the plain eager step, and the
parameters outside ``dense`` (a sparse embedding with its own optimiser) are stepped but not in the buffer;
``pad`` steps the dense optimiser on a zero gradient, and ``epoch`` pads the steps an epoch did not take; ``ddp=None``
on a CPU wraps the model in DDP; one trainer takes the plain step. Two GPUs against DDP: tests/train/test_eager_sync_gpus.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distgnn.errors import ConfigError, InputError
from distgnn.train.grad_sync import EagerSync, padded_epoch


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 4, sparse=True)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, ids):
        return self.lin(self.emb(ids))


def _optimizers(net: _Net) -> list:
    return [torch.optim.Adam(net.lin.parameters(), lr=0.1), torch.optim.SparseAdam(net.emb.parameters(), lr=0.1)]


def test_one_trainer_and_no_dense_parameter():
    net = _Net()
    sync = EagerSync(net, net.lin.parameters(), distributed=False)  # no group needed
    assert sync.model is net and sync.grad_sync is None and sync.agree_steps(3) == 3
    sync.pad(2, torch.optim.SGD(net.lin.parameters()))  # nothing to pair up
    with pytest.raises(ConfigError, match="no dense parameter"):
        EagerSync(net, [torch.nn.Parameter(torch.ones(2), requires_grad=False)], distributed=False)


def test_grad_sync_step_matches_the_plain_step_and_pads(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        assert isinstance(EagerSync(_Net(), _Net().lin.parameters(), True).model, DistributedDataParallel)  # CPU
        net, plain = _Net(), _Net()
        sync = EagerSync(net, net.lin.parameters(), distributed=True, ddp=False)
        assert sync.model is net and sync.grad_sync.params == list(net.lin.parameters())
        opts, plain_opts = _optimizers(net), _optimizers(plain)
        marks = []
        for step in range(3):
            ids = torch.tensor([step, step + 1, 7])
            sync.step(net(ids).square().mean(), opts, marks.append)
            loss = plain(ids).square().mean()
            for opt in plain_opts:
                opt.zero_grad()
            loss.backward()
            for opt in plain_opts:
                opt.step()
            assert sync.grad_sync.attached()  # zero_grad(set_to_none=True) dropped them; step put them back
        assert marks == ["backward"] * 3
        for a, b in zip(net.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(a, b)  # the sparse rows too: stepped by their own optimiser
        before = copy.deepcopy(net.lin.state_dict())
        emb_before = net.emb.weight.detach().clone()
        sync.pad(2, opts[0])
        assert not sync.grad_sync.buffers[torch.float32].any()
        assert opts[0].state[net.lin.weight]["step"] == 5  # two more Adam steps on a zero gradient
        assert not torch.equal(net.lin.weight, before["weight"])  # Adam's momentum still moves the weights
        assert torch.equal(net.emb.weight, emb_before)  # the sparse optimiser took no step
    finally:
        dist.destroy_process_group()


def test_an_epoch_pads_the_steps_it_did_not_take(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        net = _Net()
        sync = EagerSync(net, net.lin.parameters(), distributed=True, ddp=False)
        opts = _optimizers(net)
        with sync.epoch(4, opts[0]) as agreed:
            assert agreed == 4
            sync.step(net(torch.tensor([1, 2])).square().mean(), opts)
        assert opts[0].state[net.lin.weight]["step"] == 4  # one real step, three on a zero gradient
        with pytest.raises(RuntimeError, match="left"), sync.epoch(3, opts[0]):
            raise RuntimeError("left mid-epoch")
        assert opts[0].state[net.lin.weight]["step"] == 4  # an exception leaves without padding
        with pytest.raises(InputError, match="took 2 steps, more than the 1 agreed"), sync.epoch(1, opts[0]):
            for _ in range(2):
                sync.step(net(torch.tensor([3])).square().mean(), opts)
    finally:
        dist.destroy_process_group()


def test_padded_epoch_agrees_counts_and_pads_through_the_sync():
    class Sync:
        steps_taken = 7  # counted before the epoch: only the epoch's own steps count

        def __init__(self):
            self.calls = []

        def agree_steps(self, planned):
            self.calls.append(("agree", planned))
            return planned + 2  # another trainer plans two more

        def pad(self, steps, *args):
            self.calls.append(("pad", steps, *args))

    sync = Sync()
    with padded_epoch(sync, 3, "opt") as agreed:
        assert agreed == 5
        sync.steps_taken += 3
    assert sync.calls == [("agree", 3), ("pad", 2, "opt")]

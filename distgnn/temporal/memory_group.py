"""One memory copy shared by the i trainers of a mini-batch-parallel group, its reads and writes serialised by
one owner.

The group's first trainer owns the :class:`~distgnn.nn.temporal.NodeMemory`; every trainer (the owner too)
reads the rows its share of a batch needs and, after the step, hands back its writes, with gloo collectives
of the group (gather to the owner, scatter back). The owner applies the writes share by share in batch order,
so the copy ends exactly as one trainer running the whole batch would leave it: a node read by two shares
reads the same stored rows and the same weights, so both write the same value, and mail is stored in event
order. Rows travel as one float64 matrix per message (int64 ids and float32 values are exact in it), on the
host (gloo), whatever device the trainers compute on.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distgnn.nn.temporal import NodeMemory
from distgnn.train.collective import gather_arrays, scatter_arrays


class MemoryGroup:
    """The memory copy of a group of trainers (``ranks``, the first the owner), reached through collectives.

    Args:
        ranks: the group's global ranks, owner first.
        group: the torch.distributed (gloo) process group of exactly those ranks.
        memory: the copy itself on the owner; None elsewhere.
        memory_dim, edge_dim: widths, to size the views.
    """

    def __init__(self, ranks: list[int], group, memory: NodeMemory | None, memory_dim: int, edge_dim: int):
        self.ranks, self.group, self.memory = ranks, group, memory
        self.owner = ranks[0]
        self.memory_dim, self.edge_dim = memory_dim, edge_dim
        self.is_owner = dist.get_rank() == self.owner

    def _gather(self, rows: torch.Tensor) -> list[torch.Tensor] | None:
        """Every member's ``rows`` (float64 [n_r, w]) on the owner, in group order; None elsewhere."""
        return gather_arrays(rows, self.owner, self.group)

    def _scatter(self, replies: list[torch.Tensor] | None, count: int, width: int) -> torch.Tensor:
        """The owner's ``replies[r]`` to member r; this member gets ``count`` rows of ``width``."""
        return scatter_arrays(replies, torch.empty(count, width, dtype=torch.float64), self.owner, self.group)

    def read(self, nodes: torch.Tensor) -> NodeMemory:
        """A :class:`NodeMemory` of ``len(nodes)`` rows: row u holds node ``nodes[u]``'s state in the copy
        (collective over the group)."""
        m, mail_width = self.memory_dim, 2 * self.memory_dim + self.edge_dim
        width = m + mail_width + 3
        asked = self._gather(nodes.cpu().to(torch.float64).unsqueeze(1))
        replies = None
        if self.is_owner:
            replies = []
            for ids in asked:
                mem = self.memory
                ids = ids[:, 0].long().to(mem.memory.device)
                replies.append(
                    torch.cat(
                        [
                            mem.memory[ids].double(),
                            mem.mail[ids].double(),
                            mem.last_update[ids].unsqueeze(1),
                            mem.mail_time[ids].unsqueeze(1),
                            mem.has_mail[ids].double().unsqueeze(1),
                        ],
                        1,
                    ).cpu()
                )
        rows = self._scatter(replies, len(nodes), width).to(nodes.device)
        view = NodeMemory(len(nodes), m, self.edge_dim, nodes.device)
        view.memory.copy_(rows[:, :m])
        view.mail.copy_(rows[:, m : m + mail_width])
        view.last_update.copy_(rows[:, -3])
        view.mail_time.copy_(rows[:, -2])
        view.has_mail.copy_(rows[:, -1] > 0.5)
        return view

    def commit(
        self,
        nodes: torch.Tensor,
        memory_rows: torch.Tensor,
        src: torch.Tensor,
        dst: torch.Tensor,
        time: torch.Tensor,
        src_rows: torch.Tensor,
        dst_rows: torch.Tensor,
        feat: torch.Tensor | None,
    ) -> None:
        """Hands this share's writes to the owner, which applies every share's in group order (collective)."""
        writes = self._gather(torch.cat([nodes.double().unsqueeze(1), memory_rows.detach().double()], 1).cpu())
        feat = feat if feat is not None else src_rows.new_zeros(len(src), 0)
        mail = torch.cat(
            [
                src.double()[:, None],
                dst.double()[:, None],
                time[:, None],
                src_rows.double(),
                dst_rows.double(),
                feat.double(),
            ],
            1,
        ).cpu()
        mails = self._gather(mail)
        if not self.is_owner:
            return
        m, device = self.memory_dim, self.memory.memory.device
        for write in writes:
            write = write.to(device)
            self.memory.write_memory(write[:, 0].long(), write[:, 1:].float())
        events = torch.cat(mails).to(device)
        self.memory.store_mail(
            events[:, 0].long(),
            events[:, 1].long(),
            events[:, 2],
            events[:, 3 : 3 + m].float(),
            events[:, 3 + m : 3 + 2 * m].float(),
            events[:, 3 + 2 * m :].float() if self.edge_dim else None,
        )

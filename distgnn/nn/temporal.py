"""Memory-based temporal GNN pieces (TGN, with DistTGL's static node memory).

* :class:`NodeMemory`: per-node state (not parameters): the memory vector, its last update time, and a
  mailbox holding each node's last message (identity message: own memory, the other endpoint's memory,
  the event's features) with the message's time.
* :class:`TimeEncoder`: ``cos(w t + b)``.
* :class:`MemoryUpdater`: a GRU cell applied to a node's pending mail (message plus the encoded time since
  the node's last update); the result is the memory a batch reads.
* :class:`TemporalAttention`: one graph-attention layer over a node's sampled temporal neighbours.
* :class:`LinkPredictor`: an MLP scoring (source, destination) embedding pairs.
* :class:`TGN`: the model, holding the above and (DistTGL) a learnable static memory per node.

The order inside a batch is what keeps it honest: :meth:`TGN.read_memory` applies only mail of earlier
batches; the batch's own events become mail through :meth:`NodeMemory.store_mail` after its step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distgnn.native.cpu import extension


class NodeMemory:
    """Memory and mailbox of ``num_nodes`` nodes, on one device.

    Attributes:
        memory: float32 [N, m], detached state.
        last_update: float64 [N], time of the last event applied to each memory (0 initially).
        mail: float32 [N, 2m + d_e], each node's last message (own memory, other memory, event features).
        mail_time: float64 [N], the time of that message.
        has_mail: bool [N], whether a message waits to be applied.
    """

    FIELDS = ("memory", "last_update", "mail", "mail_time", "has_mail")

    def __init__(self, num_nodes: int, memory_dim: int, edge_dim: int = 0, device: torch.device | str = "cpu"):
        self.num_nodes, self.memory_dim, self.edge_dim = num_nodes, memory_dim, edge_dim
        self.memory = torch.zeros(num_nodes, memory_dim, device=device)
        self.last_update = torch.zeros(num_nodes, dtype=torch.float64, device=device)
        self.mail = torch.zeros(num_nodes, 2 * memory_dim + edge_dim, device=device)
        self.mail_time = torch.zeros(num_nodes, dtype=torch.float64, device=device)
        self.has_mail = torch.zeros(num_nodes, dtype=torch.bool, device=device)

    @staticmethod
    def nbytes(num_nodes: int, memory_dim: int, edge_dim: int = 0) -> int:
        """Bytes of the five arrays for ``num_nodes`` nodes (what one memory copy holds)."""
        return num_nodes * (4 * memory_dim + 8 + 4 * (2 * memory_dim + edge_dim) + 8 + 1)

    def reset(self) -> None:
        """Back to the start of the stream: zero memory, empty mailbox."""
        for name in self.FIELDS:
            getattr(self, name).zero_()

    def updated_at(self, nodes: torch.Tensor) -> torch.Tensor:
        """float64 [U]: when the memory of ``nodes`` was last updated as a batch reads it (pending mail applied)."""
        return torch.where(self.has_mail[nodes], self.mail_time[nodes], self.last_update[nodes])

    def write_memory(self, nodes: torch.Tensor, memory: torch.Tensor) -> None:
        """Apply the mail of ``nodes`` (int64 [U], distinct): their memory becomes ``memory`` ([U, m], from
        :meth:`TGN.read_memory`), their last update the mail's time, their mailbox empty."""
        pending = self.has_mail[nodes]
        self.memory[nodes] = memory.detach()
        self.last_update[nodes] = torch.where(pending, self.mail_time[nodes], self.last_update[nodes])
        self.has_mail[nodes] = False

    def store_mail(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        time: torch.Tensor,
        src_memory: torch.Tensor,
        dst_memory: torch.Tensor,
        edge_feat: torch.Tensor | None,
    ) -> None:
        """Mail of a batch's events (int64 [B] endpoints, float64 [B] ascending times, their memories [B, m]
        as the batch read them, features [B, d_e] or None): each endpoint keeps its last event's message."""
        feat = edge_feat if edge_feat is not None else src_memory.new_zeros(len(src), 0)
        nodes = torch.cat([src, dst])
        messages = torch.cat(
            [torch.cat([src_memory, dst_memory, feat], 1), torch.cat([dst_memory, src_memory, feat], 1)]
        ).detach()
        times = torch.cat([time, time])
        # The last occurrence of each node wins: positions ordered by (event index), src before dst per event.
        order = torch.cat([torch.arange(len(src)) * 2, torch.arange(len(dst)) * 2 + 1]).to(nodes.device)
        last = _last_occurrence(nodes, order)
        self.mail[nodes[last]] = messages[last]
        self.mail_time[nodes[last]] = times[last]
        self.has_mail[nodes[last]] = True

    def state(self) -> dict[str, np.ndarray]:
        """The five arrays by name (CPU numpy copies), for a checkpoint."""
        return {name: getattr(self, name).cpu().numpy().copy() for name in self.FIELDS}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restores :meth:`state`'s arrays (same shapes)."""
        for name in self.FIELDS:
            getattr(self, name).copy_(torch.from_numpy(np.array(arrays[name])))  # a copy: checkpoints map read-only


def _last_occurrence(keys: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Indices into ``keys`` of each distinct key's entry with the largest ``order``."""
    sort = torch.argsort(order)
    keys_sorted = keys[sort]
    # Stable sort by key keeps order ascending within a key; the last of each run wins.
    by_key = torch.argsort(keys_sorted, stable=True)
    runs = keys_sorted[by_key]
    is_last = torch.ones_like(runs, dtype=torch.bool)
    is_last[:-1] = runs[1:] != runs[:-1]
    return sort[by_key[is_last]]


class TimeEncoder(nn.Module):
    """``cos(w t + b)`` of time deltas: float [...] -> float32 [..., dim].

    ``w`` is ``10^-linspace(0, 9, dim)`` (TGN's choice), so deltas of seconds to years all resolve, and ``b`` 0.
    Fixed by default (GraphMixer's encoding): trained with Adam (``learnable=True``, TGN's and PyG's choice),
    every step moves each frequency by about the learning rate, which is ~1e-4 radians a second, so within the
    first steps the slow frequencies turn deltas of days into noise; on CollegeMsg some runs (seeds x
    rounding-level weight perturbations) then collapsed in their third epoch, none with the fixed encoding,
    whose runs also scored higher (docs/benchmarks-history.md).
    """

    def __init__(self, dim: int, learnable: bool = False):
        super().__init__()
        self.dim, self.learnable = dim, learnable
        frequency = torch.from_numpy(1 / 10 ** np.linspace(0, 9, dim)).float()
        if learnable:
            self.linear = nn.Linear(1, dim)
            with torch.no_grad():
                self.linear.weight.copy_(frequency.view(dim, 1))
                self.linear.bias.zero_()
        else:
            self.register_buffer("frequency", frequency)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        if self.learnable:
            return torch.cos(self.linear(t.float().unsqueeze(-1)))
        return torch.cos(t.float().unsqueeze(-1) * self.frequency)


class MemoryUpdater(nn.Module):
    """GRU memory update: ``GRUCell([mail, time_enc(mail_time - last_update)], memory)``.

    ``forward(mail [U, 2m + d_e], delta [U] float, memory [U, m]) -> [U, m]``.
    """

    def __init__(self, memory_dim: int, edge_dim: int, time_dim: int, learn_time: bool = False):
        super().__init__()
        self.time = TimeEncoder(time_dim, learn_time)
        self.gru = nn.GRUCell(2 * memory_dim + edge_dim + time_dim, memory_dim)

    def forward(self, mail: torch.Tensor, delta: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.gru(torch.cat([mail, self.time(delta)], 1), memory)


class TemporalAttention(nn.Module):
    """One temporal graph-attention layer (multi-head, TGN's embedding module).

    A root attends over its k sampled neighbours: query from the root's features and ``time_enc(0)``, keys and
    values from each neighbour's features plus one shared projection of the event's features and
    ``time_enc(delta)`` (:meth:`TGN.embed` says which time difference);
    the heads' output plus a projection of the root's features is the embedding. A root without neighbours
    gets the projection alone. Node features are projected once per distinct node, then gathered.

    ``forward(features [U, f], root_index [R], nbr_index [R, k], edge_feat [R, k, d_e], delta [R, k],
    mask [R, k] bool)`` -> ``[R, out_dim]``; rows of ``features`` are the batch's distinct nodes. With both
    indices None, ``features`` is [R + R * k, f] in the dense layout: the roots' rows, then each root's k
    neighbour rows (no gather, so no data-dependent work in backward either).
    """

    def __init__(
        self, in_dim: int, edge_dim: int, time_dim: int, out_dim: int, heads: int = 2, learn_time: bool = False
    ):
        super().__init__()
        self.heads, self.head_dim, self.out_dim = heads, out_dim // heads, out_dim
        if self.head_dim * heads != out_dim:
            raise ValueError(f"out_dim {out_dim} must be a multiple of heads {heads}")
        self.time = TimeEncoder(time_dim, learn_time)
        self.query_time = nn.Linear(time_dim, out_dim, bias=False)
        self.root = nn.Linear(in_dim, 2 * out_dim)  # the query's node part and the root's own projection
        self.key_value_node = nn.Linear(in_dim, 2 * out_dim)
        # One projection of the event (features, encoded time) joins both key and value (as TransformerConv's
        # edge term), which halves the layer's largest product: one row per sampled neighbour.
        self.event = nn.Linear(edge_dim + time_dim, out_dim, bias=False)
        self.out = nn.Linear(out_dim, out_dim)
        self.pack_events = True  # on the CPU, project the filled neighbour slots only (False: every slot)

    def forward(
        self,
        features: torch.Tensor,
        root_index: torch.Tensor | None,
        nbr_index: torch.Tensor | None,
        edge_feat: torch.Tensor,
        delta: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        num_roots = len(mask)
        if root_index is None:  # the dense layout (TGN.forward_dense): R root rows, then R * k neighbour rows
            root_features, kv_rows, slots = features[:num_roots], self.key_value_node(features[num_roots:]), None
        else:
            root_features, kv_rows, slots = features[root_index], self.key_value_node(features), nbr_index
        query_node, own = self.root(root_features).split(self.out_dim, 1)
        query = query_node + self.query_time(self.time(features.new_zeros(1)))
        event_rows, event_slots = self._event_term(edge_feat, delta, mask)
        return self.out(attend(query, kv_rows, slots, event_rows, event_slots, mask, self.heads)) + own

    def _event_term(
        self, edge_feat: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The event projection of the neighbour slots: ``(rows [F, out_dim], slot_rows)``, where
        ``slot_rows`` int64 [R, k] gives each filled slot's row (None: one row per slot, in slot order). On the
        CPU only the filled slots are projected (a fraction of them where nodes have few past events): an empty
        slot's score is masked and its value weighted 0, so nothing downstream, gradients included, reads its
        row. On a GPU every slot is projected (packing would sync with the host)."""
        if mask.is_cuda or not self.pack_events:
            inputs = self.time(delta) if edge_feat.shape[-1] == 0 else torch.cat([edge_feat, self.time(delta)], 2)
            return self.event(inputs).flatten(0, 1), None
        flat = mask.flatten()
        filled = flat.nonzero().squeeze(1)
        encoded = self.time(delta.flatten()[filled])
        if edge_feat.shape[-1]:
            encoded = torch.cat([edge_feat.flatten(0, 1)[filled], encoded], 1)
        return self.event(encoded), (torch.cumsum(flat, 0) - 1).view(mask.shape)


def attend(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    slots: torch.Tensor | None,
    event_rows: torch.Tensor,
    event_slots: torch.Tensor | None,
    mask: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """Each root's attention over its k neighbour slots (the one dispatch point of the op).

    ``query`` [R, W]; ``kv_rows`` [U, 2W] (a row: W key, then W value) with ``slots`` int64 [R, k] the row of
    each slot, or None when ``kv_rows`` holds the R * k slots in order; ``event_rows`` [F, W], added to both
    key and value, with ``event_slots`` int64 [R, k] (each filled slot its own row) or None (one row per slot,
    in order); ``mask`` bool [R, k] (False: an empty slot, whose rows are not read). Per head (W = heads * D):
    softmax over the filled slots of ``<query, key> / sqrt(D)``, then the weighted sum of the values; a root
    without a filled slot gets 0. -> [R, W]. On the CPU the C++ kernel (gathers, scores, softmax and sum in one
    pass, and its backward), elsewhere :func:`attend_reference`'s torch ops.
    """
    if query.device.type == "cpu" and slots is not None and query.dtype == torch.float32:
        if event_slots is None:
            event_slots = torch.arange(mask.numel()).view(mask.shape)
        return _FusedAttention.apply(query, kv_rows, slots, event_rows, event_slots, mask, heads)
    return attend_reference(query, kv_rows, slots, event_rows, event_slots, mask, heads)


def attend_reference(
    query: torch.Tensor,
    kv_rows: torch.Tensor,
    slots: torch.Tensor | None,
    event_rows: torch.Tensor,
    event_slots: torch.Tensor | None,
    mask: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """:func:`attend` in plain torch ops (what the GPU runs, and the kernel's reference)."""
    num_roots, k = mask.shape
    head_dim = query.shape[1] // heads
    key_value = (kv_rows if slots is None else kv_rows[slots]).view(num_roots, k, 2, heads, head_dim)
    event = event_rows
    if event_slots is not None:  # empty slots read an appended zero row
        padded = F.pad(event_rows, (0, 0, 0, 1))
        event = padded[torch.where(mask, event_slots, len(event_rows))]
    key, value = (key_value + event.view(num_roots, k, 1, heads, head_dim)).unbind(2)
    q = query.view(num_roots, 1, heads, head_dim)
    scores = (q * key).sum(-1) / math.sqrt(head_dim)  # [R, k, heads]
    scores = scores.masked_fill(~mask.unsqueeze(-1), float("-inf"))
    weights = torch.softmax(scores, dim=1)
    weights = torch.nan_to_num(weights, nan=0.0)  # a root without neighbours attends to nothing
    return (weights.unsqueeze(-1) * value).sum(1).reshape(num_roots, -1)


class _FusedAttention(torch.autograd.Function):
    """:func:`attend` through the C++ kernels (``temporal_attention`` and its backward, csrc/cpu/temporal.h)."""

    @staticmethod
    def forward(ctx, query, kv_rows, slots, event_rows, event_slots, mask, heads):
        num_roots, k = mask.shape
        width = query.shape[1]
        query, kv, event = query.detach().contiguous(), kv_rows.detach().contiguous(), event_rows.detach().contiguous()
        slots, event_slots = slots.reshape(-1).contiguous(), event_slots.reshape(-1).contiguous()
        filled = mask.reshape(-1).contiguous().view(torch.uint8)
        out = query.new_empty(num_roots, width)
        weight = query.new_empty(num_roots * k, heads)
        scale = 1.0 / math.sqrt(width // heads)
        extension().temporal_attention(
            query.numpy(),
            kv.numpy(),
            slots.numpy(),
            event.numpy(),
            event_slots.numpy(),
            filled.numpy(),
            heads,
            scale,
            out.numpy(),
            weight.numpy(),
            torch.get_num_threads(),
        )
        ctx.save_for_backward(query, kv, slots, event, event_slots, filled, weight)
        ctx.heads, ctx.scale = heads, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, kv, slots, event, event_slots, filled, weight = ctx.saved_tensors
        grad_query, grad_kv, grad_event = torch.empty_like(query), torch.empty_like(kv), torch.empty_like(event)
        extension().temporal_attention_backward(
            query.numpy(),
            kv.numpy(),
            slots.numpy(),
            event.numpy(),
            event_slots.numpy(),
            filled.numpy(),
            weight.numpy(),
            grad_out.contiguous().numpy(),
            ctx.heads,
            ctx.scale,
            grad_query.numpy(),
            grad_kv.numpy(),
            grad_event.numpy(),
            torch.get_num_threads(),
        )
        return grad_query, grad_kv, None, grad_event, None, None, None


class LinkPredictor(nn.Module):
    """``lin(relu(lin_src(z_src) + lin_dst(z_dst)))``: float32 [..., d] pairs -> [...] logits."""

    def __init__(self, dim: int):
        super().__init__()
        self.src = nn.Linear(dim, dim)
        self.dst = nn.Linear(dim, dim)
        self.final = nn.Linear(dim, 1)

    def forward(self, z_src: torch.Tensor, z_dst: torch.Tensor) -> torch.Tensor:
        return self.final(F.relu(self.src(z_src) + self.dst(z_dst))).squeeze(-1)


class TGN(nn.Module):
    """TGN with a GRU memory, identity messages, one attention layer and an MLP link predictor.

    Args:
        num_nodes: N.
        edge_dim: width of the event features d_e (0 without).
        memory_dim, time_dim, embedding_dim: widths (PyG's TGN example uses 100 each).
        heads: attention heads.
        static_dim: DistTGL's static node memory: a learnable [N, static_dim] table whose rows are
            concatenated to the dynamic memory as the attention's node features (0: off).
        learn_time: train the time encoders' frequencies (TGN's and PyG's choice; :class:`TimeEncoder` says
            why they are fixed by default).
        normalize_memory: the attention reads each node's memory row normalised to mean 0 and variance 1 over
            its m entries (a layer norm without parameters; the stored memory stays the GRU's output), so the
            embedding does not follow the memory's scale.
    """

    def __init__(
        self,
        num_nodes: int,
        edge_dim: int = 0,
        memory_dim: int = 100,
        time_dim: int = 100,
        embedding_dim: int = 100,
        heads: int = 2,
        static_dim: int = 0,
        learn_time: bool = False,
        normalize_memory: bool = False,
    ):
        super().__init__()
        self.num_nodes, self.edge_dim, self.memory_dim = num_nodes, edge_dim, memory_dim
        self.memory_norm = nn.LayerNorm(memory_dim, elementwise_affine=False) if normalize_memory else None
        self.updater = MemoryUpdater(memory_dim, edge_dim, time_dim, learn_time)
        self.static = nn.Embedding(num_nodes, static_dim) if static_dim else None
        if self.static is not None:
            nn.init.normal_(self.static.weight, std=0.1)
        self.attention = TemporalAttention(
            memory_dim + static_dim, edge_dim, time_dim, embedding_dim, heads, learn_time
        )
        self.predictor = LinkPredictor(embedding_dim)

    def new_memory(self, device: torch.device | str = "cpu") -> NodeMemory:
        """A zeroed :class:`NodeMemory` sized for this model."""
        return NodeMemory(self.num_nodes, self.memory_dim, self.edge_dim, device)

    def read_memory(self, memory: NodeMemory, nodes: torch.Tensor) -> torch.Tensor:
        """Memory of ``nodes`` (int64 [U]) as a batch reads it: pending mail (of earlier batches) applied
        through the GRU, differentiably; nodes without mail keep their stored memory. -> float32 [U, m]."""
        stored = memory.memory[nodes]
        pending = memory.has_mail[nodes]
        # The GRU runs even on no rows, so its parameters are in every step's graph (DDP expects them).
        index = pending.nonzero().squeeze(1)
        with_mail = nodes[index]
        delta = memory.mail_time[with_mail] - memory.last_update[with_mail]
        updated = self.updater(memory.mail[with_mail], delta, stored[index])
        return stored.index_copy(0, index, updated)

    def read_memory_dense(self, memory: NodeMemory, nodes: torch.Tensor) -> torch.Tensor:
        """:meth:`read_memory` without a data-dependent shape (for a CUDA graph): the GRU runs on every row of
        ``nodes`` (int64 [U], repeats allowed) and rows without pending mail keep their stored memory (the GRU's
        output there gets a zero gradient, so the weight gradients are those of the pending rows alone)."""
        stored = memory.memory[nodes]
        pending = memory.has_mail[nodes]
        delta = memory.mail_time[nodes] - memory.last_update[nodes]
        updated = self.updater(memory.mail[nodes], delta, stored)
        return torch.where(pending.unsqueeze(1), updated, stored)

    def node_features(self, nodes: torch.Tensor, memory_rows: torch.Tensor) -> torch.Tensor:
        """The attention's node features: memory rows [U, m] (normalised with ``normalize_memory``), with the
        static memory [U, s] beside them."""
        if self.memory_norm is not None:
            memory_rows = self.memory_norm(memory_rows)
        if self.static is None:
            return memory_rows
        return torch.cat([memory_rows, self.static(nodes)], 1)

    def embed(
        self,
        features: torch.Tensor,
        updated_at: torch.Tensor,
        root_index: torch.Tensor | None,
        nbr_index: torch.Tensor | None,
        nbr_times: torch.Tensor,
        nbr_feat: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Embeddings of roots: ``features`` [U, f] of the batch's distinct nodes, whose memories were last
        updated at ``updated_at`` float64 [U]; roots' rows ``root_index`` [R], their neighbours' rows
        ``nbr_index`` [R, k] (any valid row where ``mask`` is False) through events at ``nbr_times`` float64
        [R, k] with features ``nbr_feat`` [R, k, d_e]. A neighbour's event is timed by how long before the
        neighbour's last memory update it happened (0: nothing since), as PyG's TGN does. Both indices None:
        the dense layout (:meth:`forward_dense`). -> [R, embedding_dim]."""
        nbr_updated_at = updated_at[len(mask) :].view_as(nbr_times) if nbr_index is None else updated_at[nbr_index]
        delta = (nbr_updated_at - nbr_times).masked_fill(~mask, 0.0)
        return self.attention(features, root_index, nbr_index, nbr_feat, delta, mask)

    def forward(
        self,
        memory: NodeMemory,
        memory_index: torch.Tensor,
        nodes: torch.Tensor,
        root_index: torch.Tensor,
        nbr_index: torch.Tensor,
        nbr_times: torch.Tensor,
        nbr_feat: torch.Tensor,
        mask: torch.Tensor,
        pairs: torch.Tensor,
        num_events: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch: memory of the distinct ``nodes`` [U] read (rows ``memory_index`` [U] of ``memory``: the
        nodes themselves, or 0..U-1 of a view holding just them), the distinct roots embedded (see
        :meth:`embed`), pairs scored: ``pairs`` [B * (2 + q)] gives the root of the B sources, the B
        destinations, then the B * q negative destinations (event by event).

        Returns:
            pos: [B] logits of (source, destination); neg: [B, q] logits of (source, negative);
            memory_rows: [U, m] the memory read (what :meth:`NodeMemory.write_memory` takes after the step).
        """
        memory_rows = self.read_memory(memory, memory_index)
        features = self.node_features(nodes, memory_rows)
        updated_at = memory.updated_at(memory_index)
        z = self.embed(features, updated_at, root_index, nbr_index, nbr_times, nbr_feat, mask)[pairs]
        z_src, z_dst, z_neg = z[:num_events], z[num_events : 2 * num_events], z[2 * num_events :]
        pos = self.predictor(z_src, z_dst)
        z_neg = z_neg.view(num_events, -1, z.shape[1])
        neg = self.predictor(z_src.unsqueeze(1).expand(-1, z_neg.shape[1], -1), z_neg)
        return pos, neg, memory_rows

    def forward_dense(
        self,
        memory: NodeMemory,
        nodes: torch.Tensor,
        nbr_times: torch.Tensor,
        nbr_feat: torch.Tensor,
        mask: torch.Tensor,
        num_events: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward` with no deduplication and no data-dependent shape (what a CUDA graph captures).

        ``nodes`` int64 [R + R * k]: the R = B * (2 + q) roots (B sources, B destinations, B * q negatives, as
        ``pairs`` orders them in :meth:`forward`), then each root's k neighbour slots (the root itself where
        ``mask`` [R, k] is False); ``nbr_times``, ``nbr_feat`` as in :meth:`embed`. A node in several rows gets
        the same memory and embedding in each, and autograd sums the rows' gradients, so the scores and
        gradients are :meth:`forward`'s (up to the order of float additions). Returns ``pos`` [B], ``neg``
        [B, q] and ``memory_rows`` [R + R * k, m], the memory read per row.
        """
        memory_rows = self.read_memory_dense(memory, nodes)
        features = self.node_features(nodes, memory_rows)
        updated_at = memory.updated_at(nodes)
        z = self.embed(features, updated_at, None, None, nbr_times, nbr_feat, mask)
        z_src, z_dst, z_neg = z[:num_events], z[num_events : 2 * num_events], z[2 * num_events :]
        pos = self.predictor(z_src, z_dst)
        z_neg = z_neg.view(num_events, -1, z.shape[1])
        neg = self.predictor(z_src.unsqueeze(1).expand(-1, z_neg.shape[1], -1), z_neg)
        return pos, neg, memory_rows

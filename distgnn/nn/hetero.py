"""Relational layers for heterogeneous graphs: RelGraphConv (R-GCN with basis decomposition), the RGCN
stack, and TypedInput, which builds a block's input features from per-type features and learnable
embeddings for the types that have none.

A typed Block (see ``distgnn.sampling.block``) carries each edge's type (``etypes``) and each source node's
type (``src_ntypes``), so one layer handles every relation of a layer in a few dense ops, as DGL's
RelGraphConv does on a homogeneous view of the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import nn

import distgnn.nn.aggregate as aggregate
from distgnn.nn.fused import relu_dropout
from distgnn.nn.models import LayerStack
from distgnn.partition.book import node_policy
from distgnn.sampling.block import Block


class RelGraphConv(nn.Module):
    """R-GCN (Schlichtkrull et al.): ``h_d = W_0 x_d + sum_r mean_{s in N_r(d)} W_r x_s + b``.

    ``W_r = sum_b a_{rb} V_b`` over ``num_bases`` shared bases (basis decomposition; ``None`` gives
    ``num_rels`` bases). Edges are grouped by (relation, destination), only the groups that have edges, and
    averaged by the mean kernel of ``distgnn.nn.aggregate`` (no per-edge products). Then each relation's
    ``in_feats``-wide means are multiplied by its ``W_r`` (one product per relation, over its groups only:
    a destination has edges of a few of the relations, so a product of every destination with every ``W_r``
    stacked, zero rows included, does several times the work) and added up per destination. Where
    ``out_feats < in_feats`` each source is projected by every ``W_r`` first and the narrower messages are
    averaged (as DGL's GraphConv picks the cheaper side). The work per edge is ``min(in_feats, out_feats)``
    adds. (Mixing the means into the bases before the product does fewer multiply-adds when ``num_bases <
    num_rels`` but measured slower on the CPU at R-GCN's sizes.)

    Args:
        in_feats, out_feats: widths.
        num_rels: number of edge types (``block.etypes`` values are in ``[0, num_rels)``).
        num_bases: bases of the decomposition (``1 <= num_bases <= num_rels``), or None for ``num_rels``.
        self_loop: add ``W_0 x_d``.
        bias: add ``b``.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        num_rels: int,
        num_bases: int | None = None,
        self_loop: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        num_bases = num_rels if num_bases is None else num_bases
        if not 1 <= num_bases <= num_rels:
            raise ValueError(f"num_bases must be in [1, num_rels={num_rels}], got {num_bases}")
        self.in_feats, self.out_feats, self.num_rels, self.num_bases = in_feats, out_feats, num_rels, num_bases
        self.bases = nn.Parameter(torch.empty(in_feats, num_bases * out_feats))
        self.coefficients = nn.Parameter(torch.empty(num_rels, num_bases))
        self.loop_weight = nn.Parameter(torch.empty(in_feats, out_feats)) if self_loop else None
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.bases.view(self.in_feats, self.num_bases, self.out_feats), gain=gain)
        nn.init.xavier_uniform_(self.coefficients, gain=gain)
        if self.loop_weight is not None:
            nn.init.xavier_uniform_(self.loop_weight, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def relation_weights(self) -> torch.Tensor:
        """``(num_rels, in_feats, out_feats)``: every ``W_r`` (for tests and inspection)."""
        bases = self.bases.view(self.in_feats, self.num_bases, self.out_feats)
        return torch.einsum("rb,ibo->rio", self.coefficients, bases)

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(block.num_src, in_feats)``; returns ``(block.num_dst, out_feats)``."""
        if block.etypes is None:
            raise ValueError("RelGraphConv needs a typed block (sampled from a heterogeneous graph)")
        num_rels = self.num_rels
        groups = _relation_groups(block, num_rels)
        weights = self.relation_weights()  # (R, in, out)
        if self.out_feats < self.in_feats:
            # Project every source under every relation, then average out_feats-wide messages per group.
            per_rel = weights.permute(1, 0, 2).reshape(self.in_feats, num_rels * self.out_feats)
            projected = (x @ per_rel).view(-1, self.out_feats)  # row s * R + r: x_s W_r
            rows = groups.src * num_rels + groups.etypes
            messages = aggregate.mean(_rows_block(groups.indptr, rows, len(projected)), projected)
        else:
            # Average in_feats-wide inputs per group, then each relation's groups times its W_r.
            means = aggregate.mean(_rows_block(groups.indptr, groups.src, x.shape[0]), x)  # (groups, in)
            per_rel = means.split(groups.per_relation())
            messages = torch.cat([m @ weights[r] for r, m in enumerate(per_rel)])
        # The self-loop product (with the bias) is the tensor the messages are added into: no zero-filled
        # output, no separate bias pass.
        if self.loop_weight is not None:
            x_dst = x[: block.num_dst]
            out = x_dst @ self.loop_weight if self.bias is None else torch.addmm(self.bias, x_dst, self.loop_weight)
            return out.index_add_(0, groups.dst, messages)
        out = x.new_zeros((block.num_dst, self.out_feats)).index_add_(0, groups.dst, messages)
        return out if self.bias is None else out + self.bias


class _RelationGroups(NamedTuple):
    """A block's edges grouped by (relation, destination), groups with edges only, relation-major."""

    indptr: torch.Tensor  # CSR over the groups
    src: torch.Tensor  # each grouped edge's source position
    etypes: torch.Tensor  # each grouped edge's relation
    relation: torch.Tensor  # each group's relation (ascending)
    dst: torch.Tensor  # each group's destination
    num_rels: int

    def per_relation(self) -> list[int]:
        """Groups per relation, for splitting the groups' rows (a host sync on a GPU)."""
        return torch.bincount(self.relation, minlength=self.num_rels).tolist()


def _relation_groups(block: Block, num_rels: int) -> _RelationGroups:
    key = block.etypes * block.num_dst + block.dst_index()
    key, order = torch.sort(key, stable=True)
    groups, counts = torch.unique_consecutive(key, return_counts=True)
    indptr = torch.zeros(len(groups) + 1, dtype=torch.int64, device=key.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return _RelationGroups(
        indptr,
        block.indices[order],
        block.etypes[order],
        groups // block.num_dst,
        groups % block.num_dst,
        num_rels,
    )


def _rows_block(indptr: torch.Tensor, indices: torch.Tensor, num_src: int) -> Block:
    """A Block whose destinations are (relation, destination) groups, over ``num_src`` source rows."""
    arange = torch.arange(max(num_src, len(indices)), device=indptr.device)
    return Block(arange[:num_src], len(indptr) - 1, indptr, indices, arange[: len(indices)])


class RGCN(LayerStack):
    """``num_layers`` RelGraphConv layers with ReLU and dropout between them."""

    def __init__(
        self,
        in_feats: int,
        hidden: int,
        num_classes: int,
        num_rels: int,
        num_layers: int = 2,
        num_bases: int | None = None,
        dropout: float = 0.5,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        dims = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(
            RelGraphConv(a, b, num_rels, num_bases) for a, b in zip(dims[:-1], dims[1:], strict=True)
        )
        self.dropout = nn.Dropout(dropout)
        self.layer_dims = dims[1:]

    def forward_layer(self, i: int, block: Block, x: torch.Tensor) -> torch.Tensor:
        h = self.layers[i](block, x)
        if i != self.num_layers - 1:
            h = relu_dropout(h, self.dropout.p, self.training)
        return h


class TypedInput(nn.Module):
    """The input features of a typed block: a linear projection of each featured type's features, and a
    learnable embedding for every type without features, all ``embed_dim`` wide.

    Args:
        g: a DistGraph (embeddings become ``DistEmbedding``s held by the servers) or an InProcessGraph
            (``torch.nn.Embedding(sparse=True)``).
        embed_dim: width of every type's input.
        feat_name: the node feature read for the types that have it.
        name: prefix of the DistEmbedding names (all trainers must agree).

    ``forward(input_nodes, src_ntypes, device)`` takes the loader's ``{ntype: per-type ids}`` (a block's source
    nodes: no id repeats within a type, so an embedding's gradient goes to its optimizer as it is) and the first
    block's ``src_ntypes``; returns ``(num_src, embed_dim)``.
    """

    def __init__(self, g, embed_dim: int, feat_name: str = "feat", name: str = "node_emb"):
        super().__init__()
        from distgnn.client.embedding import DistEmbedding

        self.g = g
        self.ntypes = list(g.ntypes)
        self.embed_dim = embed_dim
        self.feat_name = feat_name
        self.features = {t: g.nodes[t].data[feat_name] for t in self.ntypes if feat_name in g.nodes[t].data}
        self.projections = nn.ModuleDict({t: nn.Linear(int(f.shape[1]), embed_dim) for t, f in self.features.items()})
        from distgnn.client.graph import DistGraph  # on first use: distgnn.nn imports no RPC code

        # Embeddings live on the servers (DistEmbedding) for a DistGraph, in this module otherwise.
        self.distributed = isinstance(g, DistGraph)
        self.embeddings: dict[str, object] = {}
        local = {}
        for t in self.ntypes:
            if t in self.features:
                continue
            if self.distributed:
                self.embeddings[t] = DistEmbedding(
                    g.num_nodes(t),
                    embed_dim,
                    f"{name}.{t}",
                    init="uniform",
                    low=-0.1,
                    high=0.1,
                    part_policy=node_policy(t),
                    context=g.context,
                )
            else:
                emb = nn.Embedding(g.num_nodes(t), embed_dim, sparse=True)
                nn.init.uniform_(emb.weight, -0.1, 0.1)
                local[t] = emb
                self.embeddings[t] = emb
        self.local_embeddings = nn.ModuleDict(local)  # trained by sparse_optimizer, not the dense one

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters for the dense optimizer (the projections)."""
        return list(self.projections.parameters())

    def sparse_optimizer(self, kind: str, lr: float):
        """The optimizer of the embeddings: ``"adam"`` or ``"adagrad"`` (None when every type has features)."""
        if not self.embeddings:
            return None
        if kind not in ("adam", "adagrad"):
            raise ValueError(f"sparse optimizer must be 'adam' or 'adagrad', got {kind!r}")
        if self.distributed:
            from distgnn.client.embedding import SparseAdagrad, SparseAdam

            return (SparseAdam if kind == "adam" else SparseAdagrad)(list(self.embeddings.values()), lr)
        params = list(self.local_embeddings.parameters())
        return torch.optim.SparseAdam(params, lr) if kind == "adam" else torch.optim.Adagrad(params, lr)

    def forward(
        self, input_nodes: Mapping[str, torch.Tensor], src_ntypes: torch.Tensor, device: torch.device | str
    ) -> torch.Tensor:
        src_ntypes = src_ntypes.to(device)
        # Every type's remote rows are requested before any is waited for, so their round trips overlap.
        started = {}
        for ntype in self.ntypes:
            ids = input_nodes.get(ntype)
            if ids is None or len(ids) == 0:
                continue
            if ntype in self.features and hasattr(self.features[ntype], "read_async"):
                started[ntype] = self.features[ntype].read_async(ids.cpu()).result
            elif ntype not in self.features and self.distributed:
                started[ntype] = self.embeddings[ntype].lookup_async(ids.cpu(), unique=True)
        pieces: Sequence = []
        where_none = torch.empty(0, dtype=torch.int64, device=device)
        for t, ntype in enumerate(self.ntypes):
            ids = input_nodes.get(ntype)
            if ids is None or len(ids) == 0:
                if ntype in self.projections:  # no rows, but the projection stays in the graph: DDP needs
                    rows = torch.empty(0, self.projections[ntype].in_features, device=device)  # no unused-
                    pieces.append((where_none, self.projections[ntype](rows)))  # parameter search
                continue
            where = torch.nonzero(src_ntypes == t).flatten()
            if ntype in self.features:
                rows = started[ntype]() if ntype in started else self.features[ntype][ids.cpu()]
                pieces.append((where, self.projections[ntype](rows.to(device, torch.float32))))
            elif self.distributed:
                pieces.append((where, started[ntype](device)))
            else:
                pieces.append((where, self.embeddings[ntype](ids.to(device))))
        if not pieces:
            return torch.empty(len(src_ntypes), self.embed_dim, device=device)
        return PlaceRows.apply(len(src_ntypes), tuple(where for where, _ in pieces), *(rows for _, rows in pieces))


class PlaceRows(torch.autograd.Function):
    """``(num_rows, width)`` with piece ``i``'s rows written at positions ``wheres[i]``; every position is in
    exactly one piece (a typed block's sources, one piece per type).

    One write of each row forward and one gather of its gradient backward: a concatenation followed by a
    gather into source order wrote the rows twice and scattered the gradient back through a zero-filled buffer.
    """

    @staticmethod
    def forward(ctx, num_rows: int, wheres: tuple[torch.Tensor, ...], *rows: torch.Tensor) -> torch.Tensor:
        out = rows[0].new_empty((num_rows, rows[0].shape[1]))
        for where, piece in zip(wheres, rows, strict=True):
            out.index_copy_(0, where, piece)
        ctx.wheres = wheres
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (None, None, *(grad.index_select(0, where) for where in ctx.wheres))

"""Recurrent GNN cells over snapshot sequences: GConvGRU, GCLSTM, EvolveGCN-O, and the model around them.

A snapshot's graph enters as a :class:`SparseAdjacency`, normalised once (:func:`normalized_adjacency`) and
held as CSR beside its transpose, so that both the product and its gradient are CSR products (fast on CPU).
Each cell batches its gates: the Chebyshev basis of the input is computed once and every gate's weights sit
side by side in one matrix, so a step is one sparse product per hop and one or two dense matmuls. The input's
convolutions do not read the state (:meth:`GConvGRU.input_gates`), so a sequence's are one product over the
disjoint union of its snapshots, whatever their graphs, and only the state's run snapshot by snapshot
(:meth:`GConvGRU.step`); a zero state (None) skips its convolutions.

The cells keep the math of the published cells (Seo et al. 2018 GConvGRU, Chen et al. 2018 GC-LSTM, Pareja
et al. 2020 EvolveGCN-O); where a cell adds two biases before a nonlinearity, one bias stands for both.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distgnn.nn.link import MLPPredictor


def normalized_adjacency(
    edge_index: np.ndarray, edge_weight: np.ndarray | None, num_nodes: int, self_loops: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric normalisation of a weighted graph as COO ``(rows, cols, values)`` of ``M[dst, src]``, so that
    ``M @ X`` sums over each node's in-neighbours.

    Args:
        edge_index: ``(2, E)`` int64, sources first.
        edge_weight: ``(E,)`` or None for weight 1.
        num_nodes: N.
        self_loops: False: ``-D^{-1/2} A D^{-1/2}``, existing self-loops dropped, degrees summed at the source
            (the scaled Laplacian ``2L/lambda_max - I`` with ``lambda_max = 2`` of a Chebyshev convolution).
            True: ``D~^{-1/2} (A + I) D~^{-1/2}``, degrees summed at the destination (a GCN convolution).

    Returns:
        int64 rows, int64 cols, float32 values, each ``(nnz,)``.
    """
    src, dst = edge_index[0].astype(np.int64), edge_index[1].astype(np.int64)
    w = np.ones(len(src), np.float64) if edge_weight is None else edge_weight.astype(np.float64)
    keep = src != dst
    src, dst, w = src[keep], dst[keep], w[keep]
    if self_loops:
        loop = np.arange(num_nodes, dtype=np.int64)
        src, dst = np.concatenate([src, loop]), np.concatenate([dst, loop])
        w = np.concatenate([w, np.ones(num_nodes)])
        deg = np.bincount(dst, weights=w, minlength=num_nodes)
    else:
        deg = np.bincount(src, weights=w, minlength=num_nodes)
    inv_sqrt = np.zeros(num_nodes)
    positive = deg > 0
    inv_sqrt[positive] = deg[positive] ** -0.5
    values = inv_sqrt[src] * w * inv_sqrt[dst]
    return dst, src, (values if self_loops else -values).astype(np.float32)


def _csr(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    order = np.lexsort((cols, rows))
    crow = np.zeros(shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=shape[0]), out=crow[1:])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(crow),
            torch.from_numpy(np.ascontiguousarray(cols[order])),
            torch.from_numpy(np.ascontiguousarray(values[order])),
            shape,
            check_invariants=False,
        )


@dataclass
class SparseAdjacency:
    """A ``(rows, cols)`` sparse matrix and its transpose, both CSR float32 on one device.

    ``rows`` may be fewer than ``cols``: a trainer holding a vertex partition keeps its rows of the matrix and
    multiplies it with every node's values.
    """

    matrix: torch.Tensor
    transposed: torch.Tensor

    @staticmethod
    def from_coo(
        rows: np.ndarray,
        cols: np.ndarray,
        values: np.ndarray,
        num_nodes: int,
        device: torch.device | str = "cpu",
        num_rows: int | None = None,
    ) -> SparseAdjacency:
        """From COO arrays (duplicates add up); ``num_rows`` defaults to ``num_nodes`` (a square matrix)."""
        r = num_nodes if num_rows is None else num_rows
        return SparseAdjacency(
            _csr(rows, cols, values, (r, num_nodes)).to(device),
            _csr(cols, rows, values, (num_nodes, r)).to(device),
        )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.matrix.shape)  # type: ignore[return-value]


def _block_diagonal_csr(mats: list[torch.Tensor]) -> torch.Tensor:
    crows, cols, vals = [mats[0].crow_indices()[:1]], [], []
    nnz = row = col = 0
    for m in mats:
        crows.append(m.crow_indices()[1:] + nnz)
        cols.append(m.col_indices() + col)
        vals.append(m.values())
        nnz += m.values().shape[0]
        row += m.shape[0]
        col += m.shape[1]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.cat(crows), torch.cat(cols), torch.cat(vals), (row, col), check_invariants=False
        )


def block_diagonal(adjs: list[SparseAdjacency]) -> SparseAdjacency:
    """The disjoint union of graphs: their matrices on the diagonal (graph ``b``'s nodes after the nodes of
    graphs ``0 .. b - 1``)."""
    if len(adjs) == 1:
        return adjs[0]
    return SparseAdjacency(
        _block_diagonal_csr([a.matrix for a in adjs]), _block_diagonal_csr([a.transposed for a in adjs])
    )


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, matrix: torch.Tensor, transposed: torch.Tensor) -> torch.Tensor:
        ctx.transposed = transposed
        return matrix @ x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.transposed @ grad, None, None


def spmm(adj: SparseAdjacency, x: torch.Tensor) -> torch.Tensor:
    """``adj @ x`` for ``x`` ``(cols, d)`` float32, differentiable in ``x``: ``(rows, d)``."""
    return _SpMM.apply(x, adj.matrix, adj.transposed)


def chebyshev_basis(adj: SparseAdjacency, x: torch.Tensor, k: int, gather=None) -> torch.Tensor:
    """``(n, k * d)``: ``[T_0 x, T_1 x, ..., T_{k-1} x]`` side by side, ``T_0 x = x``, ``T_1 x = L x``,
    ``T_j x = 2 L T_{j-1} x - T_{j-2} x`` with ``L = adj``.

    ``gather``, when given, turns a trainer's ``(n, d)`` rows into every node's ``(N, d)`` before each product
    (the vertex-partitioned schedule exchanges boundary rows there).
    """
    terms = [x]
    full = (lambda t: t) if gather is None else gather
    if k > 1:
        terms.append(spmm(adj, full(x)))
    for _ in range(2, k):
        terms.append(2 * spmm(adj, full(terms[-1])) - terms[-2])
    return torch.cat(terms, dim=1) if k > 1 else x


def _glorot_blocks(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


def grow_rows(h: torch.Tensor, n: int) -> torch.Tensor:
    """``h`` ``(m, d)`` padded with zero rows to ``(n, d)`` (new nodes of a growing node set start at zero)."""
    if h.shape[0] == n:
        return h
    return torch.cat([h, h.new_zeros(n - h.shape[0], h.shape[1])])


class GConvGRU(nn.Module):
    """A GRU cell whose input and hidden transforms are Chebyshev convolutions of order ``k`` (GConvGRU).

    ``Z = s(C_xz(X) + C_hz(H))``, ``R = s(C_xr(X) + C_hr(H))``, ``H~ = tanh(C_xh(X) + C_hh(R * H))``,
    ``H' = Z * H + (1 - Z) * H~``. With ``k = 1`` every convolution is a plain linear map.
    """

    def __init__(self, in_channels: int, hidden: int, k: int = 1) -> None:
        super().__init__()
        self.in_channels, self.hidden, self.k = in_channels, hidden, k
        self.weight_x = nn.Parameter(torch.empty(k * in_channels, 3 * hidden))
        self.weight_h_zr = nn.Parameter(torch.empty(k * hidden, 2 * hidden))
        self.weight_h_h = nn.Parameter(torch.empty(k * hidden, hidden))
        self.bias = nn.Parameter(torch.zeros(3 * hidden))
        _glorot_blocks(self.weight_x, in_channels, hidden)
        _glorot_blocks(self.weight_h_zr, hidden, hidden)
        _glorot_blocks(self.weight_h_h, hidden, hidden)

    def initial_state(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(n, self.hidden)

    def input_gates(self, x: torch.Tensor, adj: SparseAdjacency, gather=None) -> torch.Tensor:
        """``(n, 3 * hidden)``: the input's convolutions ``[C_xz(X), C_xr(X), C_xh(X)]`` plus the bias; they do
        not depend on the state, so a sequence's can be computed for all its snapshots at once."""
        return torch.addmm(self.bias, chebyshev_basis(adj, x, self.k, gather), self.weight_x)

    def step(self, gates: torch.Tensor, adj: SparseAdjacency, h: torch.Tensor | None, gather=None) -> torch.Tensor:
        """``gates`` from :meth:`input_gates`, ``h`` ``(n, hidden)`` or None for a zero state -> the new
        ``(n, hidden)`` state."""
        z, r, xh = gates.split(self.hidden, dim=1)
        if h is None:
            # A zero state: its convolutions are zero and the reset gate multiplies zero.
            return (1 - torch.sigmoid(z)) * torch.tanh(xh)
        hz, hr = (chebyshev_basis(adj, h, self.k, gather) @ self.weight_h_zr).split(self.hidden, dim=1)
        z = torch.sigmoid(z + hz)
        r = torch.sigmoid(r + hr)
        candidate = torch.tanh(xh + chebyshev_basis(adj, r * h, self.k, gather) @ self.weight_h_h)
        return z * h + (1 - z) * candidate

    def forward(self, x: torch.Tensor, adj: SparseAdjacency, h: torch.Tensor | None, gather=None) -> torch.Tensor:
        """``x`` ``(n, in)``, ``h`` ``(n, hidden)`` (None: zero) -> the new ``(n, hidden)`` state."""
        return self.step(self.input_gates(x, adj, gather), adj, h, gather)


class GCLSTM(nn.Module):
    """An LSTM cell whose hidden transforms are Chebyshev convolutions (GC-LSTM), with peepholes.

    ``I = s(X W_i + C_i(H) + w_i * C + b_i)``, ``F = s(X W_f + C_f(H) + w_f * C + b_f)``,
    ``T = tanh(X W_c + C_c(H) + b_c)``, ``C' = F * C + I * T``, ``O = s(X W_o + C_o(H) + w_o * C' + b_o)``,
    ``H' = O * tanh(C')``. The state is ``(N, 2 * hidden)``: ``[H, C]``.
    """

    def __init__(self, in_channels: int, hidden: int, k: int = 1) -> None:
        super().__init__()
        self.in_channels, self.hidden, self.k = in_channels, hidden, k
        self.weight_x = nn.Parameter(torch.empty(in_channels, 4 * hidden))
        self.weight_h = nn.Parameter(torch.empty(k * hidden, 4 * hidden))
        self.bias = nn.Parameter(torch.zeros(4 * hidden))
        self.peephole = nn.Parameter(torch.empty(3, hidden))
        _glorot_blocks(self.weight_x, in_channels, hidden)
        _glorot_blocks(self.weight_h, hidden, hidden)
        _glorot_blocks(self.peephole, 1, hidden)

    def initial_state(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(n, 2 * self.hidden)

    def input_gates(self, x: torch.Tensor, adj: SparseAdjacency, gather=None) -> torch.Tensor:
        """``(n, 4 * hidden)``: ``X W + b`` of the four gates (no state in it: computable for all snapshots of
        a sequence at once)."""
        return torch.addmm(self.bias, x, self.weight_x)

    def step(self, gates: torch.Tensor, adj: SparseAdjacency, state: torch.Tensor | None, gather=None) -> torch.Tensor:
        """``gates`` from :meth:`input_gates`, ``state`` ``(n, 2 * hidden)`` ([H, C]) or None for a zero state
        -> the new state."""
        hd = self.hidden
        if state is None:
            # H = C = 0: no hidden convolution, and the forget gate multiplies zero.
            gi, _, gc, go = gates.split(hd, dim=1)
            c = torch.sigmoid(gi) * torch.tanh(gc)
            o = torch.sigmoid(go + self.peephole[2] * c)
            return torch.cat([o * torch.tanh(c), c], dim=1)
        h, c = state[:, :hd], state[:, hd:]
        gi, gf, gc, go = (gates + chebyshev_basis(adj, h, self.k, gather) @ self.weight_h).split(hd, dim=1)
        i = torch.sigmoid(gi + self.peephole[0] * c)
        f = torch.sigmoid(gf + self.peephole[1] * c)
        c = f * c + i * torch.tanh(gc)
        o = torch.sigmoid(go + self.peephole[2] * c)
        return torch.cat([o * torch.tanh(c), c], dim=1)

    def forward(self, x: torch.Tensor, adj: SparseAdjacency, state: torch.Tensor | None, gather=None) -> torch.Tensor:
        """``x`` ``(n, in)``, ``state`` ``(n, 2 * hidden)`` ([H, C]; None: zero) -> the new state."""
        return self.step(self.input_gates(x, adj, gather), adj, state, gather)


class EvolveGCNO(nn.Module):
    """EvolveGCN-O: a GCN whose ``(in, hidden)`` weight is evolved from snapshot to snapshot by a GRU (the
    weight is both the GRU's input and its state, its rows the batch), then ``H = A_gcn X W_t``.

    The recurrent state is the weight, not a per-node vector, so a growing node set changes nothing. ``k`` is
    accepted for a constructor like the other cells' and not used (the convolution is a GCN's).
    """

    def __init__(self, in_channels: int, hidden: int, k: int = 1) -> None:
        super().__init__()
        self.in_channels, self.hidden = in_channels, hidden
        self.initial_weight = nn.Parameter(torch.empty(in_channels, hidden))
        _glorot_blocks(self.initial_weight, in_channels, hidden)
        self.evolve = nn.GRUCell(hidden, hidden)

    def initial_state(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return self.initial_weight

    def forward(self, x: torch.Tensor, adj: SparseAdjacency, weight: torch.Tensor, gather=None) -> torch.Tensor:
        """``x`` ``(n, in)``; ``weight`` ``(in, hidden)``: the evolved weight (the output is
        :meth:`embed`'s)."""
        return self.evolve(weight, weight)

    def embed(self, x: torch.Tensor, adj: SparseAdjacency, weight: torch.Tensor, gather=None) -> torch.Tensor:
        """``(n, hidden)``: ``A_gcn X W``."""
        xw = x @ weight
        return spmm(adj, xw if gather is None else gather(xw))


CELLS = {"gconvgru": GConvGRU, "gclstm": GCLSTM, "evolvegcn": EvolveGCNO}


class SnapshotModel(nn.Module):
    """A recurrent cell over a window of snapshots with a head per snapshot.

    Args:
        cell: ``gconvgru``, ``gclstm`` or ``evolvegcn``.
        in_channels, hidden, k: the cell's input width, state width and Chebyshev order.
        task: ``node`` (regression: ``relu`` then a linear layer to one value per node, as PyTorch Geometric
            Temporal's examples) or ``link`` (an MLP scorer of embedding pairs for next-snapshot links).

    :meth:`forward` runs the cell over snapshots in order and returns one output per snapshot; the state
    passed in continues a sequence (None: start from zero).
    """

    def __init__(self, cell: str, in_channels: int, hidden: int = 32, k: int = 1, task: str = "node") -> None:
        super().__init__()
        self.cell_name, self.task = cell, task
        self.cell = CELLS[cell](in_channels, hidden, k)
        self.hidden = hidden
        self.head = nn.Linear(hidden, 1) if task == "node" else MLPPredictor(hidden, hidden, 2)

    def embedding(self, x, adj, state, gather=None, gates=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``(relu(embedding) (n, hidden), new state)``; ``state`` None starts from zero; ``gates``:
        the cell's input gates of ``x`` when computed beforehand."""
        if isinstance(self.cell, EvolveGCNO):
            state = self.cell(x, adj, self.cell.initial_weight if state is None else state)
            return F.relu(self.cell.embed(x, adj, state, gather)), state
        if gates is None:
            gates = self.cell.input_gates(x, adj, gather)
        state = self.cell.step(gates, adj, None if state is None else grow_rows(state, x.shape[0]), gather)
        return F.relu(state[:, : self.hidden]), state

    def forward(self, snapshots, state: torch.Tensor | None = None, gather=None, stacked=None):
        """``snapshots``: objects with ``x`` ``(n_t, in)`` and ``cheb``/``gcn`` adjacencies. Returns
        (per snapshot: ``(n_t,)`` predictions for ``node``, ``(n_t, hidden)`` embeddings for ``link``; the last
        state).

        ``stacked`` (not with ``gather``): the same snapshots as one disjoint union in order (``x`` concatenated,
        ``cheb`` block-diagonal); the cell's input convolutions, which do not read the state, are then one
        product over all of them, and only the state's convolutions run snapshot by snapshot.
        """
        gates = [None] * len(snapshots)
        if stacked is not None and not isinstance(self.cell, EvolveGCNO):
            gates = self.cell.input_gates(stacked.x, stacked.cheb).split([s.x.shape[0] for s in snapshots])
        outputs = []
        for s, g in zip(snapshots, gates, strict=True):
            adj = s.gcn if isinstance(self.cell, EvolveGCNO) else s.cheb
            h, state = self.embedding(s.x, adj, state, gather, g)
            outputs.append(self.readout(h))
        return outputs, state

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """A step's output from its embedding: ``(n,)`` predictions (``node``) or the embedding (``link``)."""
        return self.head(h).squeeze(-1) if self.task == "node" else h

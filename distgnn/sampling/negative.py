"""Negative samplers for link prediction: corrupted (source, destination) pairs of a batch's edges.

Every sampler draws node ids on the trainer, from the node count alone (uniform) or a
degree table fetched once per process (degree-biased): no round trip per edge. Samplers
are small picklable objects (sampler worker processes get a copy; the degree table is
fetched again there, never pickled).

On a heterogeneous graph (:meth:`NegativeSampler.sample_typed`) a positive edge of type
``src:rel:dst`` gets negatives of the same type: its source with destinations of type ``dst``,
drawn over that type's per-type id range from the partition book and mapped to homogeneous ids.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.partition.book import RangePartitionBook


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise ConfigError(f"a negative sampler needs k >= 1 negatives, got {k!r}")
    return int(k)


class NegativeSampler:
    """Base of the samplers: ``sample(g, src, dst, rng)`` gives the negative pairs' global ids.

    Attributes:
        k: negatives per positive edge (per distinct source for :class:`PerSourceUniform`).
        name: the sampler's name in :func:`negative_sampler`.
    """

    name = ""

    @property
    def typed(self) -> bool:
        """Whether it samples negatives on a heterogeneous graph (its class overrides ``sample_typed``)."""
        return type(self).sample_typed is not NegativeSampler.sample_typed

    def __init__(self, k: int):
        self.k = _check_k(k)

    def sample(self, g, src: np.ndarray, dst: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Negative pairs for the positive edges ``src[i] -> dst[i]``.

        Args:
            g: a DistGraph or InProcessGraph (only its node count and, for some samplers, degrees are read).
            src, dst: ``(P,)`` int64 global node ids of the positive edges.
            rng: this batch's random stream.
        Returns:
            ``(neg_src, neg_dst)``: int64 global node ids, of equal length.
        """
        raise NotImplementedError

    def sample_typed(
        self, g, src: np.ndarray, dst: np.ndarray, etypes: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Negative pairs of typed positive edges: each keeps its edge's type and source.

        Args:
            g: a heterogeneous DistGraph or InProcessGraph (only its partition book is read).
            src, dst: ``(P,)`` int64 homogeneous node ids of the positive edges.
            etypes: ``(P,)`` int64 edge type id of each (the graph's ``canonical_etypes`` order).
            rng: this batch's random stream.
        Returns:
            ``(neg_src, neg_dst, neg_etypes)``: int64, of equal length; homogeneous node ids, edge type ids.
        """
        raise ConfigError(
            f"{self!r} does not sample negatives on a heterogeneous graph; use Uniform or PerSourceUniform"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.k})"


def uniform_of_types(book: RangePartitionBook, ntype_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One homogeneous node id per entry of ``ntype_ids``, uniform over the nodes of that node type."""
    per_type = rng.integers(0, book.nodes.type_counts[ntype_ids], dtype=np.int64)
    out = np.empty(len(ntype_ids), dtype=np.int64)
    for t in np.unique(ntype_ids).tolist():  # one vectorised mapping per node type, no per-id work
        where = ntype_ids == t
        out[where] = book.nodes.to_homogeneous(t, per_type[where])
    return out


class Uniform(NegativeSampler):
    """``k`` negatives per positive edge: its source with destinations uniform over all nodes.

    Negative ``i * k + j`` belongs to positive edge ``i`` (so scores reshape to ``(P, k)``).
    """

    name = "uniform"

    def sample(self, g, src, dst, rng):
        neg_dst = rng.integers(0, g.num_nodes(), size=len(src) * self.k, dtype=np.int64)
        return np.repeat(src, self.k), neg_dst

    def sample_typed(self, g, src, dst, etypes, rng):
        book = g.get_partition_book()
        neg_etypes = np.repeat(etypes, self.k)
        return np.repeat(src, self.k), uniform_of_types(book, book.etype_dst[neg_etypes], rng), neg_etypes


class PerSourceUniform(NegativeSampler):
    """``k`` uniform destinations per distinct source of the batch, shared by all of its positive edges.

    Gives ``k * num_distinct_sources`` negatives: cheaper than :class:`Uniform` where sources repeat.
    Negative ``u * k + j`` belongs to the ``u``-th distinct source in ascending id order.
    """

    name = "per_source"

    def sample(self, g, src, dst, rng):
        sources = np.unique(src)
        neg_dst = rng.integers(0, g.num_nodes(), size=len(sources) * self.k, dtype=np.int64)
        return np.repeat(sources, self.k), neg_dst

    def sample_typed(self, g, src, dst, etypes, rng):
        """``k`` negatives per distinct (source, edge type) pair, in ascending (source, type) order."""
        book = g.get_partition_book()
        pairs = np.unique(np.stack([src, etypes], axis=1), axis=0).reshape(-1, 2)
        neg_etypes = np.repeat(pairs[:, 1], self.k)
        return np.repeat(pairs[:, 0], self.k), uniform_of_types(book, book.etype_dst[neg_etypes], rng), neg_etypes


class DegreeBiased(NegativeSampler):
    """``k`` negatives per positive edge with destinations drawn proportionally to ``in_degree ** power``.

    The in-degrees of all nodes are fetched once per process (one request per machine) and kept as a
    cumulative table; drawing is a binary search per negative. Layout as in :class:`Uniform`. On a
    heterogeneous graph a negative of edge type ``src:rel:dst`` is a node of type ``dst`` drawn by its
    in-degree under ``rel`` (its popularity as that relation's destination), one table per edge type.
    """

    name = "degree"

    def __init__(self, k: int, power: float = 0.75):
        super().__init__(k)
        if not power >= 0:
            raise ConfigError(f"the degree exponent must be >= 0, got {power!r}")
        self.power = float(power)
        self._cdf: np.ndarray | None = None
        self._type_cdfs: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"k": self.k, "power": self.power}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["k"], state["power"])

    def _normalised_cdf(self, degrees: np.ndarray, what: str) -> np.ndarray:
        cdf = np.cumsum(degrees.astype(np.float64) ** self.power)
        if len(cdf) == 0 or cdf[-1] <= 0:
            raise ConfigError(f"degree-biased negative sampling needs {what} with at least one edge")
        return cdf / cdf[-1]

    def cdf(self, g) -> np.ndarray:
        """``(N,)`` float64 cumulative sampling weight of the nodes (fetched on first use)."""
        with self._lock:
            if self._cdf is None or len(self._cdf) != g.num_nodes():
                self._cdf = self._normalised_cdf(all_in_degrees(g), "a graph")
            return self._cdf

    def type_cdf(self, g, etype: int) -> np.ndarray:
        """Cumulative sampling weight of edge type ``etype``'s destination nodes, in per-type id order."""
        with self._lock:
            if etype not in self._type_cdfs:
                book = g.get_partition_book()
                self._type_cdfs[etype] = self._normalised_cdf(
                    type_in_degrees(g, etype), f"edge type {':'.join(book.canonical_etypes[etype])}"
                )
            return self._type_cdfs[etype]

    def sample(self, g, src, dst, rng):
        cdf = self.cdf(g)
        draws = rng.random(len(src) * self.k)
        neg_dst = np.minimum(np.searchsorted(cdf, draws, side="right"), len(cdf) - 1).astype(np.int64)
        return np.repeat(src, self.k), neg_dst

    def sample_typed(self, g, src, dst, etypes, rng):
        book = g.get_partition_book()
        neg_etypes = np.repeat(etypes, self.k)
        draws = rng.random(len(neg_etypes))
        neg_dst = np.empty(len(neg_etypes), dtype=np.int64)
        for t in np.unique(neg_etypes).tolist():  # one table and one vectorised draw per edge type
            where = neg_etypes == t
            cdf = self.type_cdf(g, t)
            per_type = np.minimum(np.searchsorted(cdf, draws[where], side="right"), len(cdf) - 1).astype(np.int64)
            neg_dst[where] = book.nodes.to_homogeneous(int(book.etype_dst[t]), per_type)
        return np.repeat(src, self.k), neg_dst, neg_etypes

    def __repr__(self) -> str:
        return f"DegreeBiased({self.k}, power={self.power})"


def all_in_degrees(g) -> np.ndarray:
    """``(N,)`` int64 in-degree of every node: from the servers for a DistGraph, from the CSC otherwise."""
    in_degrees = getattr(g, "in_degrees", None)
    if in_degrees is not None:
        degrees = in_degrees(torch.arange(g.num_nodes()))
        return degrees.numpy() if isinstance(degrees, torch.Tensor) else np.asarray(degrees)
    local = _whole_csc(g)
    return (local.indptr[local.num_etypes :: local.num_etypes] - local.indptr[: -1 : local.num_etypes]).astype(np.int64)


def type_in_degrees(g, etype: int) -> np.ndarray:
    """In-degree under edge type id ``etype`` of every node of its destination type, in per-type id order."""
    book = g.get_partition_book()
    dst_type = int(book.etype_dst[etype])
    nodes = book.nodes.to_homogeneous(dst_type, np.arange(book.nodes.type_counts[dst_type], dtype=np.int64))
    in_degrees = getattr(g, "in_degrees", None)
    if in_degrees is not None:
        degrees = in_degrees(torch.from_numpy(nodes), etype=book.canonical_etypes[etype])
        return degrees.numpy() if isinstance(degrees, torch.Tensor) else np.asarray(degrees)
    local = _whole_csc(g)
    rows = (nodes - local.node_start) * local.num_etypes + etype
    return (local.indptr[rows + 1] - local.indptr[rows]).astype(np.int64)


def _whole_csc(g):
    """The CSC of a graph held whole in this process (ConfigError for one that is not)."""
    from distgnn.sampling.neighbor import sampling_view

    local, remote = sampling_view(g)
    if remote is not None or (len(local.indptr) - 1) // local.num_etypes != g.num_nodes():
        raise ConfigError(f"cannot read all in-degrees of a {type(g).__name__}: it has no in_degrees()")
    return local


SAMPLERS: dict[str, type[NegativeSampler]] = {cls.name: cls for cls in (Uniform, PerSourceUniform, DegreeBiased)}


def negative_sampler(name: str, k: int) -> NegativeSampler:
    """The sampler called ``name`` (``uniform``, ``per_source`` or ``degree``) with ``k`` negatives."""
    cls = SAMPLERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown negative sampler {name!r}; choose one of {sorted(SAMPLERS)}")
    return cls(k)

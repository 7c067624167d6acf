"""A synthetic heterogeneous graph shaped like OGB-MAG, from ten thousand papers to millions.

Node types ``paper``, ``author``, ``institution`` and ``field_of_study`` come in OGB-MAG's ratios, and so do
the relations ``author:writes:paper``, ``paper:cites:paper``, ``author:affiliated_with:institution`` and
``paper:has_topic:field_of_study``; the reverses ``paper:rev_writes:author``,
``field_of_study:rev_has_topic:paper`` and ``institution:rev_affiliated_with:author`` let messages reach
papers from every type. Every node draws a power-law weight (its expected degree up to a constant) and a
latent class. An edge keeps its anchor's class with probability ``homophily`` (else any class), and picks
the other end by weight within it, so degrees follow a power law and classes cluster through every relation.
A paper's label is its class; its own features are the class centroid under heavy Gaussian noise, a weak
signal. So the label is mostly read off the neighbourhood (the classes of a paper's fields, authors and
their institutions, the papers it cites): a model on paper features alone scores well below one that uses
the graph. Everything is vectorised and deterministic by seed; a million papers (about 49M edges with the
reverses) take well under a minute and a few GiB.
"""

from __future__ import annotations

import numpy as np

from distgnn.data.hetero import CanonicalEtype, HeteroGraph
from distgnn.data.synthetic import class_features, split_masks, unique_sorted
from distgnn.errors import InputError

# Nodes per paper, as in OGB-MAG (736k papers, 1.13M authors, 8.7k institutions, 59.9k fields of study).
NODES_PER_PAPER = {"author": 1.5, "institution": 0.012, "field_of_study": 0.08}
WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")
AFFILIATED_WITH = ("author", "affiliated_with", "institution")
HAS_TOPIC = ("paper", "has_topic", "field_of_study")
# Each relation and the reverse the graph also holds.
REVERSE_ETYPES: dict[CanonicalEtype, CanonicalEtype] = {
    WRITES: ("paper", "rev_writes", "author"),
    HAS_TOPIC: ("field_of_study", "rev_has_topic", "paper"),
    AFFILIATED_WITH: ("institution", "rev_affiliated_with", "author"),
}
# Each node appears about this many times per unit of weight in a draw table.
_TABLE_RESOLUTION = 4


def reverse_etype(etype: CanonicalEtype) -> CanonicalEtype | None:
    """The edge type synthetic-mag holds reversing ``etype`` (either way round: ``writes`` and ``rev_writes``
    name each other), or None where it holds none (``paper:cites:paper``, or a type it does not have)."""
    for forward, backward in REVERSE_ETYPES.items():
        if etype == forward:
            return backward
        if etype == backward:
            return forward
    return None


class _WeightedByClass:
    """Weighted draws of nodes of one type, from one class or from all of them.

    Node ids are laid out by class and each node repeated about ``weight`` times, so a draw is one uniform
    integer into the table (a class is a contiguous slice of it).
    """

    def __init__(self, node_class: np.ndarray, weight: np.ndarray, num_classes: int):
        by_class = np.argsort(node_class, kind="stable")
        copies = np.maximum(np.rint(weight[by_class] * _TABLE_RESOLUTION), 1).astype(np.int64)
        self.table = np.repeat(by_class, copies)
        sizes = np.bincount(np.repeat(node_class[by_class], copies), minlength=num_classes)
        self.hi = np.cumsum(sizes)
        self.lo = self.hi - sizes

    def draw(self, rng: np.random.Generator, classes: np.ndarray, homophily: float) -> np.ndarray:
        """One node per entry of ``classes``: of that class with probability ``homophily``, else of any."""
        inside = rng.random(classes.shape[0]) < homophily
        lo = np.where(inside, self.lo[classes], 0)
        hi = np.where(inside, self.hi[classes], self.table.shape[0])
        return self.table[lo + (rng.random(classes.shape[0]) * (hi - lo)).astype(np.int64)]


def _balanced_classes(rng: np.random.Generator, count: int, num_classes: int) -> np.ndarray:
    """Every class the same size (up to one), in random order: no class is empty when ``count >= C``."""
    return rng.permutation(np.arange(count, dtype=np.int64) % num_classes)


def _power_law(rng: np.random.Generator, count: int, exponent: float) -> np.ndarray:
    # Pareto(a) + 1 has a tail P(w > x) ~ x^-a, so degrees follow a power law with exponent a + 1.
    return rng.pareto(exponent - 1.0, size=count) + 1.0


def _anchors(rng: np.random.Generator, count: int, num_edges: int, weight: np.ndarray) -> np.ndarray:
    """Each anchor node once, then ``num_edges - count`` more drawn by weight: every node has an edge."""
    extra = max(num_edges - count, 0)
    cumulative = np.cumsum(weight)
    drawn = np.searchsorted(cumulative, rng.random(extra) * cumulative[-1], side="right")
    return np.concatenate([np.arange(count, dtype=np.int64), np.minimum(drawn, count - 1)])


def _distinct(src: np.ndarray, dst: np.ndarray, num_dst: int, drop_loops: bool) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``(src, dst)`` pairs sorted by source (and self loops dropped where asked)."""
    keys = src * num_dst + dst
    if drop_loops:
        keys = keys[src != dst]
    keys = unique_sorted(keys)
    return np.divmod(keys, num_dst)


def synthetic_mag(
    num_papers: int,
    seed: int = 0,
    feat_dim: int = 128,
    num_classes: int = 16,
    *,
    homophily: float = 0.4,
    signal: float = 1.0,
    writes_per_paper: float = 10.0,
    cites_per_paper: float = 7.0,
    topics_per_paper: float = 10.0,
    affiliations_per_author: float = 1.0,
    power_law_exponent: float = 2.5,
    train_frac: float = 0.85,
    val_frac: float = 0.09,
    name: str = "synthetic-mag",
) -> HeteroGraph:
    """Generate an OGB-MAG-shaped heterogeneous graph.

    Args:
        num_papers: P (>= 100); the other types have ``NODES_PER_PAPER`` times P nodes (at least C each).
        seed: every array is a deterministic function of the arguments and seed.
        feat_dim: F, width of the papers' ``feat`` (float32).
        num_classes: C, the number of latent classes (= paper labels).
        homophily: probability that an edge's far end has the class of its anchor (a paper's authors, fields
            and cited papers; an author's institution).
        signal: scale of the class centroids in paper features against unit Gaussian noise (entries of
            standard deviation ``signal / sqrt(F)``, so a features-only model's accuracy does not grow with F).
        writes_per_paper, cites_per_paper, topics_per_paper, affiliations_per_author: mean edge counts (every
            paper has at least one author and one field, every author one institution; duplicates and
            self-citations are dropped, so slightly fewer).
        power_law_exponent: exponent of the degree distributions' tails (> 2).
        train_frac, val_frac: fractions of papers in ``train_mask`` and ``val_mask``; the rest form
            ``test_mask`` (OGB-MAG's split is about 85/9/6).

    Returns:
        HeteroGraph with node types ``paper``, ``author``, ``institution``, ``field_of_study``; the four
        relations and their reverses (:data:`REVERSE_ETYPES`), ``(E_t,)`` int64 per-type ids; paper ndata
        ``feat`` float32 ``(P, F)``, ``label`` int64 ``(P,)`` and bool ``train_mask``, ``val_mask``,
        ``test_mask``; ``num_classes = C``.
    """
    _check_mag_args(num_papers, feat_dim, num_classes, homophily, train_frac, val_frac, power_law_exponent)
    if min(writes_per_paper, cites_per_paper, topics_per_paper, affiliations_per_author) < 0:
        raise InputError("synthetic-mag edge rates must be non-negative")
    rng = np.random.default_rng(seed)
    num_nodes = {"paper": int(num_papers)}
    num_nodes.update({t: max(num_classes, round(r * num_papers)) for t, r in NODES_PER_PAPER.items()})
    classes = {t: _balanced_classes(rng, n, num_classes) for t, n in num_nodes.items()}
    label = classes["paper"]
    rates = {WRITES: writes_per_paper, CITES: cites_per_paper, HAS_TOPIC: topics_per_paper}
    rates[AFFILIATED_WITH] = affiliations_per_author
    edges = _mag_edges(rng, num_nodes, classes, num_classes, rates, homophily, power_law_exponent)
    ndata = {
        "feat": class_features(rng, label, num_classes, feat_dim, signal),
        "label": label,
        **split_masks(rng, num_papers, train_frac, val_frac),
    }
    return HeteroGraph(name=name, num_nodes=num_nodes, edges=edges, ndata={"paper": ndata}, num_classes=num_classes)


def _check_mag_args(
    num_papers: int,
    feat_dim: int,
    num_classes: int,
    homophily: float,
    train_frac: float,
    val_frac: float,
    power_law_exponent: float,
) -> None:
    if num_papers < 100 or feat_dim < 1 or num_classes < 2:
        raise InputError(
            f"synthetic-mag needs num_papers >= 100, feat_dim >= 1, num_classes >= 2; got {num_papers}, "
            f"{feat_dim}, {num_classes}"
        )
    if not (0 <= homophily <= 1 and min(train_frac, val_frac) >= 0 and train_frac + val_frac <= 1):
        raise InputError("synthetic-mag needs 0 <= homophily <= 1 and train_frac + val_frac <= 1")
    if power_law_exponent <= 2:
        raise InputError(f"power_law_exponent must be > 2 (finite mean degree), got {power_law_exponent}")


def _mag_edges(
    rng: np.random.Generator,
    num_nodes: dict[str, int],
    classes: dict[str, np.ndarray],
    num_classes: int,
    rates: dict[CanonicalEtype, float],
    homophily: float,
    power_law_exponent: float,
) -> dict[CanonicalEtype, tuple[np.ndarray, np.ndarray]]:
    """The four relations (mean edge counts per anchor in ``rates``) and their reverses."""

    def sampler(ntype: str) -> _WeightedByClass:
        weight = _power_law(rng, num_nodes[ntype], power_law_exponent)
        return _WeightedByClass(classes[ntype], weight, num_classes)

    def anchored(anchor_type: str, rate: float, far: _WeightedByClass) -> tuple[np.ndarray, np.ndarray]:
        count = num_nodes[anchor_type]
        anchor = _anchors(rng, count, round(rate * count), _power_law(rng, count, power_law_exponent))
        return anchor, far.draw(rng, classes[anchor_type][anchor], homophily)

    label = classes["paper"]
    papers, authors = sampler("paper"), sampler("author")
    edges: dict[CanonicalEtype, tuple[np.ndarray, np.ndarray]] = {}
    paper, author = anchored("paper", rates[WRITES], authors)
    edges[WRITES] = _distinct(author, paper, num_nodes["paper"], drop_loops=False)
    # A paper's references: sources uniform (each cites about the same number), targets by citation weight.
    citing = rng.integers(0, num_nodes["paper"], round(rates[CITES] * num_nodes["paper"]), dtype=np.int64)
    edges[CITES] = _distinct(citing, papers.draw(rng, label[citing], homophily), num_nodes["paper"], True)
    del papers, authors, paper, author, citing
    author, institution = anchored("author", rates[AFFILIATED_WITH], sampler("institution"))
    edges[AFFILIATED_WITH] = _distinct(author, institution, num_nodes["institution"], drop_loops=False)
    paper, field = anchored("paper", rates[HAS_TOPIC], sampler("field_of_study"))
    edges[HAS_TOPIC] = _distinct(paper, field, num_nodes["field_of_study"], drop_loops=False)
    for etype in (WRITES, HAS_TOPIC, AFFILIATED_WITH):
        src, dst = edges[etype]
        edges[REVERSE_ETYPES[etype]] = (dst, src)
    return edges

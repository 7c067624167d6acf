"""Datasets by name, as the examples take them: ``cora``, ``citeseer``, ``pubmed``, ``synthetic``, ``npz:PATH``;
event streams for temporal training: ``events:PATH``, ``synthetic-events:NODES:EVENTS``.

A name is a kind, optionally followed by ``:ARGUMENT`` (``npz:graph.npz``); each kind is registered once
(:func:`register`) with its loader and the graph name its partitions get, so heterogeneous kinds
(``synthetic-mag``, ``chunked:PATH/metadata.json``) sit beside these without touching the dispatch.
:func:`distgnn.partition.prepare.ensure_partition` (the partition tool) reuses a matching partition in a work
directory or writes one.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distgnn.data.events import EventStream
from distgnn.errors import ConfigError


@dataclass(frozen=True)
class DatasetSpec:
    """What to load: the dataset name and the options of the kinds that take any.

    Attributes:
        name: ``KIND`` or ``KIND:ARGUMENT`` (``cora``, ``synthetic``, ``npz:PATH``).
        data_dir: directory of the Planetoid ``ind.<name>.*`` files (None: downloaded into the cache).
        num_nodes, avg_degree, feat_dim, num_classes, seed: the synthetic generator's size and seed.
        num_papers: the synthetic-mag generator's paper count (it shares feat_dim, num_classes, seed).
        bipartite: event streams: renumber destinations after sources (JODIE's user/item convention).
        columns: event streams: the file's columns by name (``--columns``; None: its header line says).
    """

    name: str
    data_dir: str | None = None
    num_nodes: int = 20000
    avg_degree: float = 10.0
    feat_dim: int = 100
    num_classes: int = 16
    seed: int = 0
    num_papers: int = 20000
    bipartite: bool = False
    columns: tuple[str, ...] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DatasetSpec:
        """From the flags of :func:`add_dataset_args` (and ``--seed``)."""
        return cls(
            args.dataset,
            args.data_dir,
            args.num_nodes,
            args.avg_degree,
            args.feat_dim,
            args.synthetic_classes,
            args.seed,
            getattr(args, "num_papers", cls.num_papers),
            getattr(args, "bipartite", False),
            getattr(args, "columns", None),
        )

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def argument(self) -> str | None:
        """What follows ``KIND:`` in the name (a path), or None."""
        return self.name.split(":", 1)[1] if ":" in self.name else None


@dataclass(frozen=True)
class DatasetKind:
    """A registered kind: ``load(spec)`` returns the graph, ``graph_name(spec)`` the name it gets."""

    load: Callable[[DatasetSpec], Any]
    graph_name: Callable[[DatasetSpec], str]
    takes_argument: bool


_KINDS: dict[str, DatasetKind] = {}


def register(
    kind: str,
    load: Callable[[DatasetSpec], Any],
    graph_name: Callable[[DatasetSpec], str] | None = None,
    *,
    takes_argument: bool = False,
) -> None:
    """Make ``kind`` loadable by name. ``graph_name`` defaults to the kind; ``takes_argument``: ``KIND:ARG``."""
    if kind in _KINDS:
        raise ConfigError(f"dataset kind {kind!r} is already registered")
    _KINDS[kind] = DatasetKind(load, graph_name or (lambda spec: spec.kind), takes_argument)


def kinds() -> list[str]:
    """Registered kinds as the help text shows them (``npz:PATH`` for one that takes an argument)."""
    return [f"{k}:PATH" if entry.takes_argument else k for k, entry in _KINDS.items()]


def _lookup(spec: DatasetSpec) -> DatasetKind:
    entry = _KINDS.get(spec.kind)
    if entry is None or entry.takes_argument != (spec.argument is not None) or spec.argument == "":
        raise ConfigError(f"unknown dataset {spec.name!r}: expected one of {'|'.join(kinds())}")
    return entry


def graph_name(spec: DatasetSpec) -> str:
    """The name the dataset's graph and partitions get (synthetic graphs carry their size and seed)."""
    return _lookup(spec).graph_name(spec)


def load_dataset(spec: DatasetSpec) -> Any:
    """The dataset's in-memory graph (a ``distgnn.data.Graph`` for the built-in graph kinds; an
    :class:`~distgnn.data.events.EventStream` for the event kinds), named by ``graph_name``."""
    g = _lookup(spec).load(spec)
    if isinstance(g, EventStream):  # frozen
        return dataclasses.replace(g, name=graph_name(spec))
    g.name = graph_name(spec)
    return g


def add_dataset_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The dataset flags every example takes (``--dataset``, ``--data-dir`` and the synthetic sizes)."""
    group = parser.add_argument_group("dataset")
    group.add_argument("--dataset", default="cora", help="|".join(kinds()))
    group.add_argument(
        "--data-dir", help="directory of the Planetoid files (default: downloaded once into ~/.cache/distgnn/datasets)"
    )
    group.add_argument("--num-nodes", type=int, default=20000, help="synthetic: nodes")
    group.add_argument("--avg-degree", type=float, default=10.0, help="synthetic: mean in-degree")
    group.add_argument("--feat-dim", type=int, default=100, help="synthetic: feature width")
    group.add_argument("--synthetic-classes", type=int, default=16, help="synthetic, synthetic-mag: classes")
    group.add_argument("--num-papers", type=int, default=20000, help="synthetic-mag: papers")
    return group


def canonical_etype_arg(value: str) -> str:
    """An argparse ``type``: ``value`` if it reads ``src:rel:dst``, else a usage error saying so."""
    if len(value.split(":")) != 3:
        raise argparse.ArgumentTypeError(f"must be a canonical edge type src:rel:dst, got {value!r}")
    return value


def add_link_split_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags of a link-prediction split of the dataset (:func:`load_link_split`)."""
    group = parser.add_argument_group("link split")
    group.add_argument("--val-fraction", type=float, default=0.05)
    group.add_argument("--test-fraction", type=float, default=0.1)
    group.add_argument("--eval-negatives", type=int, default=100, help="negatives per held-out pair (fixed by seed)")
    group.add_argument(
        "--target-etype", type=canonical_etype_arg, help="edge type to predict, src:rel:dst (a typed dataset needs it)"
    )
    group.add_argument(
        "--reverse-etype", type=canonical_etype_arg, help="its reverse edge type (default: synthetic-mag's, if any)"
    )
    return group


def link_reverse_etype(args: argparse.Namespace, target: tuple[str, str, str]) -> tuple[str, str, str] | None:
    """``--reverse-etype``, or synthetic-mag's reverse of ``target``, or None."""
    from distgnn.data.hetero import parse_etype
    from distgnn.data.synthetic_mag import reverse_etype

    if args.reverse_etype:
        return parse_etype(args.reverse_etype)
    return reverse_etype(target) if DatasetSpec.from_args(args).kind == "synthetic-mag" else None


def load_link_split(args: argparse.Namespace) -> Any:
    """The dataset's :class:`~distgnn.data.link_split.LinkSplit` by the flags of :func:`add_dataset_args` and
    :func:`add_link_split_args`: its undirected pairs, or with ``--target-etype`` that type's directed pairs."""
    from distgnn.data.hetero import parse_etype
    from distgnn.data.link_split import split_links, split_typed_links

    graph = load_dataset(DatasetSpec.from_args(args))
    fractions = (args.val_fraction, args.test_fraction, args.eval_negatives, args.seed)
    if not args.target_etype:
        return split_links(graph, *fractions)
    target = parse_etype(args.target_etype)
    return split_typed_links(graph, target, link_reverse_etype(args, target), *fractions)


def _planetoid(spec: DatasetSpec) -> Any:
    from distgnn.data import load_planetoid

    g = load_planetoid(spec.kind, spec.data_dir)
    # Row-normalised bag-of-words features, as in the GCN/GraphSAGE Planetoid setups.
    feat = g.ndata["feat"]
    g.ndata["feat"] = (feat / np.maximum(feat.sum(1, keepdims=True), 1e-12)).astype(np.float32)
    return g


def _synthetic(spec: DatasetSpec) -> Any:
    from distgnn.data import synthetic

    return synthetic(spec.num_nodes, spec.avg_degree, spec.feat_dim, spec.num_classes, seed=spec.seed)


def _synthetic_name(spec: DatasetSpec) -> str:
    return f"synthetic-n{spec.num_nodes}-d{spec.avg_degree:g}-f{spec.feat_dim}-c{spec.num_classes}-s{spec.seed}"


def _npz(spec: DatasetSpec) -> Any:
    from distgnn.data import load_npz

    return load_npz(spec.argument)


def _synthetic_mag(spec: DatasetSpec) -> Any:
    from distgnn.data.synthetic_mag import synthetic_mag

    return synthetic_mag(spec.num_papers, seed=spec.seed, feat_dim=spec.feat_dim, num_classes=spec.num_classes)


def _synthetic_mag_name(spec: DatasetSpec) -> str:
    return f"synthetic-mag-p{spec.num_papers}-f{spec.feat_dim}-c{spec.num_classes}-s{spec.seed}"


def _chunked(spec: DatasetSpec) -> Any:
    from distgnn.data.chunked import read_chunked

    return read_chunked(spec.argument)


def _chunked_name(spec: DatasetSpec) -> str:
    from distgnn.data.chunked import read_chunked_graph_name

    return read_chunked_graph_name(spec.argument)


for _name in ("cora", "citeseer", "pubmed"):
    register(_name, _planetoid)


def _events(spec: DatasetSpec) -> Any:
    """An event stream (:class:`~distgnn.data.events.EventStream`), not a graph: for temporal training."""
    from distgnn.data.events import read_events

    return read_events(spec.argument, bipartite=spec.bipartite, columns=spec.columns)


def _synthetic_events_size(spec: DatasetSpec) -> tuple[int, int]:
    try:
        nodes, events = (int(v) for v in spec.argument.split(":"))
    except ValueError:
        raise ConfigError(
            f"--dataset {spec.name}: expected synthetic-events:NODES:EVENTS, e.g. synthetic-events:2000:60000"
        ) from None
    return nodes, events


def _synthetic_events(spec: DatasetSpec) -> Any:
    """A synthetic event stream of ``synthetic-events:NODES:EVENTS`` (seeded by ``--seed``)."""
    from distgnn.data.events import synthetic_events

    return synthetic_events(*_synthetic_events_size(spec), seed=spec.seed)


def _synthetic_events_name(spec: DatasetSpec) -> str:
    nodes, events = _synthetic_events_size(spec)
    return f"synthetic-events-n{nodes}-e{events}-s{spec.seed}"


register("synthetic", _synthetic, _synthetic_name)
register("npz", _npz, lambda spec: Path(spec.argument).stem, takes_argument=True)
register("synthetic-mag", _synthetic_mag, _synthetic_mag_name)
register("chunked", _chunked, _chunked_name, takes_argument=True)
register("events", _events, lambda spec: Path(spec.argument).stem, takes_argument=True)
register("synthetic-events", _synthetic_events, _synthetic_events_name, takes_argument=True)

"""ExecutionGraph: the typed DAG of one training step (all ranks merged), columnar."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bottleneck_oracle.atomic import atomic_path, uninterrupted
from bottleneck_oracle.errors import GraphError, OracleError
from bottleneck_oracle.files import check_archive
from bottleneck_oracle.graph_pipeline.gaps import empty_gaps
from bottleneck_oracle.graph_pipeline.regions import empty_regions
from bottleneck_oracle.graph_pipeline.schema import (
    EDGE_COLUMNS,
    GAP_COLUMNS,
    NODE_COLUMNS,
    REGION_COLUMNS,
    SCHEMA_VERSION,
    Category,
    EdgeKind,
    NodeType,
)

MAX_GRAPH_BYTES = 16 * 2**30  # what a saved graph's arrays may declare (a 4096-rank step's take a few GiB)


@dataclass(slots=True, repr=False)
class ExecutionGraph:
    """Nodes and edges as numpy columns (see schema.NODE_COLUMNS / EDGE_COLUMNS).

    ``window_start`` is the absolute trace time (µs) of time zero; ``measured``
    maps each rank to its measured step span (µs) in this window.
    """

    names: list[str]
    nodes: dict[str, np.ndarray]
    edges: dict[str, np.ndarray]
    release: np.ndarray  # float64 µs: earliest start of nodes with no predecessor (-inf otherwise)
    window_start: float
    step: int | None
    measured: dict[int, float]
    meta: dict = field(default_factory=dict)
    gaps: dict[str, np.ndarray] = field(default_factory=empty_gaps)
    """The time between consecutive ops of each CPU thread, in pieces (schema.GAP_COLUMNS)."""
    regions: dict[str, np.ndarray] = field(default_factory=empty_regions)
    """The CPU events enclosing leaf ops, each with its range of leaf nodes (schema.REGION_COLUMNS)."""

    @property
    def n_nodes(self) -> int:
        return len(self.nodes["start"])

    @property
    def n_edges(self) -> int:
        return len(self.edges["src"])

    @property
    def ranks(self) -> list[int]:
        return sorted(self.measured)

    def __repr__(self) -> str:
        return f"ExecutionGraph(step {self.step}, ranks {self.ranks}, {self.n_nodes} nodes, {self.n_edges} edges)"

    def rank_origin(self, rank: int) -> float:
        """Where ``rank``'s step time starts (µs from the window start): the later of its step start
        and the end of the device work queued before the step (facts.py); its step start if unknown."""
        origin = self.meta.get("rank_origin_us", {}).get(str(rank))
        return float(origin) if origin is not None else self.rank_start(rank)

    def rank_start(self, rank: int) -> float:
        """When ``rank`` started this step, µs from the window start."""
        return float(self.meta.get("rank_start_us", {}).get(str(rank), 0.0))

    def node_name(self, i: int) -> str:
        return self.names[int(self.nodes["name"][i])]

    def validate(self) -> None:
        """Raise GraphError naming the column whose shape or values are wrong."""
        n = self.n_nodes
        for col in NODE_COLUMNS:
            if col not in self.nodes:
                raise GraphError(f"node column {col!r} is missing")
            if len(self.nodes[col]) != n:
                raise GraphError(f"node column {col!r} has {len(self.nodes[col])} rows (expected {n})")
        for col in EDGE_COLUMNS:
            if col not in self.edges or len(self.edges[col]) != self.n_edges:
                raise GraphError(f"edge column {col!r} is missing or has the wrong length")
        if self.n_edges and (self.edges["src"].max() >= n or self.edges["dst"].max() >= n or self.edges["src"].min() < 0):
            raise GraphError("an edge points outside the node table")
        lengths = {len(self.gaps.get(col, ())) for col in GAP_COLUMNS}
        if len(lengths) != 1:
            raise GraphError(f"gap columns are missing or of different lengths ({sorted(lengths)})")
        if len(self.gaps["node"]) and (self.gaps["node"].min() < 0 or self.gaps["node"].max() >= n):
            raise GraphError("a gap piece points outside the node table")
        lengths = {len(self.regions.get(col, ())) for col in REGION_COLUMNS}
        if len(lengths) != 1:
            raise GraphError(f"region columns are missing or of different lengths ({sorted(lengths)})")
        rg = self.regions
        if len(rg["first"]) and (rg["first"].min() < 0 or rg["last"].max() >= n or (rg["last"] < rg["first"]).any()):
            raise GraphError("a region points outside the node table")
        if (self.nodes["mdur"] < -1e-6).any():
            i = int(np.argmin(self.nodes["mdur"]))
            raise GraphError(f"node {self.node_name(i)!r} has a negative modelled duration")

    def to_networkx(self):
        """A networkx.DiGraph with node and edge attributes (for interop only)."""
        import networkx as nx

        g = nx.DiGraph()
        cols = {k: v.tolist() for k, v in self.nodes.items()}
        for i in range(self.n_nodes):
            attrs = {k: cols[k][i] for k in cols}
            attrs["label"] = self.names[attrs["name"]]
            g.add_node(i, **attrs)
        for s, d, k, w in zip(
            self.edges["src"].tolist(), self.edges["dst"].tolist(), self.edges["kind"].tolist(), self.edges["weight"].tolist()
        ):
            g.add_edge(s, d, kind=EdgeKind(k).name.lower(), weight=w)
        return g

    # -- safe persistence: plain arrays in an .npz, metadata as JSON, no pickles --

    def save(self, path: str | Path, compress: bool = True) -> None:
        """Write the graph to ``path`` (.npz); ``compress=False`` for a file read back at once."""
        path = Path(path)
        arrays = {f"node__{k}": v for k, v in self.nodes.items()}
        arrays.update({f"edge__{k}": v for k, v in self.edges.items()})
        arrays.update({f"gap__{k}": v for k, v in self.gaps.items()})
        arrays.update({f"region__{k}": v for k, v in self.regions.items()})
        arrays["release"] = self.release
        header = {
            "schema_version": SCHEMA_VERSION,
            "names": self.names,
            "window_start": self.window_start,
            "step": self.step,
            "measured": {str(k): v for k, v in self.measured.items()},
            "meta": self.meta,
        }
        arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh, uninterrupted():  # (a signal: raised once the archive is closed)
            if compress:
                np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # numpy's stubs take a ** key for allow_pickle
            else:
                np.savez(fh, **arrays)  # type: ignore[arg-type]  # (the same)

    @classmethod
    def load(cls, path: str | Path) -> ExecutionGraph:
        try:
            check_archive(path, "saved ExecutionGraph", max_bytes=MAX_GRAPH_BYTES)
        except OracleError as exc:
            raise GraphError(str(exc)) from None
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
            header = json.loads(bytes(data.pop("header")).decode())
        except (OSError, ValueError, KeyError) as exc:
            raise GraphError(f"{path}: not a saved ExecutionGraph ({exc})") from None
        if header.get("schema_version") != SCHEMA_VERSION:
            raise GraphError(
                f"{path}: graph schema version {header.get('schema_version')} does not match this version ({SCHEMA_VERSION}); re-run parse"
            )
        g = cls(
            names=header["names"],
            nodes={k[6:]: v for k, v in data.items() if k.startswith("node__")},
            edges={k[6:]: v for k, v in data.items() if k.startswith("edge__")},
            release=data["release"],
            window_start=header["window_start"],
            step=header["step"],
            measured={int(k): v for k, v in header["measured"].items()},
            meta=header["meta"],
            gaps={k[5:]: v for k, v in data.items() if k.startswith("gap__")},
            regions={k[8:]: v for k, v in data.items() if k.startswith("region__")} or empty_regions(),  # saved before regions: none
        )
        g.validate()
        return g

    def summary_counts(self) -> dict[str, int]:
        nt = self.nodes["node_type"]
        cat = self.nodes["category"]
        kinds = np.bincount(self.edges["kind"][self.edges["kind"] >= 0].astype(np.int64), minlength=len(EdgeKind))
        return {
            "nodes": self.n_nodes,
            "edges": self.n_edges,
            "compute_nodes": int((nt == NodeType.COMPUTE).sum()),
            "network_nodes": int(((nt == NodeType.NETWORK) & (cat != Category.BARRIER)).sum()),
            "barriers": int((cat == Category.BARRIER).sum()),
            **{f"edges_{k.name.lower()}": int(kinds[k]) for k in EdgeKind},
        }

"""The embedded default dataset: a homophilous random graph, generated in seconds, no download.

Labels are planted classes. Each node's features are a weak, noisy copy of its class centroid,
so a features-only MLP does poorly, while its neighbours (mostly of the same class) average the
noise away: a GNN that aggregates them does far better. Degrees are skewed (a few hubs, many
leaves) like real graphs, and edges are symmetric, as in Reddit or ogbn-products.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from pyg_mgpu.data.csc import CHUNK_EDGES
from pyg_mgpu.data.graph import ConvertedGraph


@dataclass(frozen=True)
class SyntheticSpec:
    """Size and difficulty of a synthetic graph. ``num_edges`` counts directed edges."""

    num_nodes: int = 50_000
    num_edges: int = 1_000_000
    num_features: int = 64
    num_classes: int = 16
    homophily: float = 0.7
    feature_signal: float = 0.12
    train_fraction: float = 0.5
    val_fraction: float = 0.1
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.num_nodes < 10 or self.num_edges < 2 or self.num_features < 1:
            raise ValueError(f"synthetic graph too small: {self.num_nodes} nodes, "
                             f"{self.num_edges} edges, {self.num_features} features; "
                             "use at least 10 nodes, 2 edges and 1 feature.")
        if self.num_classes < 2:
            raise ValueError(f"synthetic graph needs >= 2 classes, got {self.num_classes}.")
        total = self.train_fraction + self.val_fraction + self.test_fraction
        if min(self.train_fraction, self.val_fraction, self.test_fraction) <= 0 or total > 1:
            raise ValueError("synthetic split fractions must be positive and sum to <= 1, got "
                             f"{self.train_fraction}/{self.val_fraction}/{self.test_fraction}.")


def make_synthetic(spec: SyntheticSpec = SyntheticSpec(), seed: int = 0) -> ConvertedGraph:
    """Generates the graph deterministically from ``seed``.

    Edges are generated a chunk at a time, each chunk from its own seed, and go straight into
    the CSC conversion (which reads them twice, so a chunk is generated twice rather than
    kept); features are written a block of rows at a time into their final tensor. The peak
    is therefore the finished graph plus one chunk, whatever the size.
    """
    gen = torch.Generator().manual_seed(seed)
    n, c = spec.num_nodes, spec.num_classes
    label = torch.randint(0, c, (n,), generator=gen)
    hub_order = torch.randperm(n, generator=gen)
    by_class = torch.argsort(label)
    class_count = torch.bincount(label, minlength=c)
    class_start = torch.cumsum(class_count, 0) - class_count
    centroids = torch.randn(c, spec.num_features, generator=gen) * spec.feature_signal
    perm = torch.randperm(n, generator=gen)

    half = spec.num_edges // 2
    pairs_per_chunk = CHUNK_EDGES // 2

    def pairs(part: int) -> tuple[Tensor, Tensor]:
        """Chunk ``part``'s (source, destination) pairs; the reverse edges are added later."""
        g = torch.Generator().manual_seed(_derived_seed(seed, "edges", part))
        size = min(pairs_per_chunk, half - part * pairs_per_chunk)
        # Skewed source degrees: u**3 piles draws onto low ids, a permutation scatters the hubs.
        src = hub_order[(torch.rand(size, generator=g) ** 3 * n).long().clamp_(max=n - 1)]
        # With probability `homophily` the partner is a uniform node of the same class.
        src_class = label[src]
        same = class_start[src_class] + (torch.rand(size, generator=g)
                                         * class_count[src_class]).long()
        same = by_class[same.clamp_(max=n - 1)]
        other = torch.randint(0, n, (size,), generator=g)
        dst = torch.where(torch.rand(size, generator=g) < spec.homophily, same, other)
        return src, dst

    def edges() -> Iterator[tuple[Tensor, Tensor]]:
        for part in range(-(-half // pairs_per_chunk)):
            src, dst = pairs(part)
            yield torch.cat([src, dst]), torch.cat([dst, src])  # symmetric

    # Features: a weak, noisy copy of the class centroid, one block of rows at a time.
    x = torch.empty(n, spec.num_features)
    g = torch.Generator().manual_seed(_derived_seed(seed, "features", 0))
    step = max(1, (1 << 22) // spec.num_features)
    for start in range(0, n, step):
        rows = x[start:start + step]
        torch.randn(rows.shape, generator=g, out=rows)
        rows += centroids[label[start:start + step]]

    n_train = max(1, int(spec.train_fraction * n))
    n_val = max(1, int(spec.val_fraction * n))
    n_test = max(1, int(spec.test_fraction * n))
    return ConvertedGraph.from_edge_chunks(
        name="synthetic",
        edges=edges,
        x=x,
        y=label,
        train_idx=perm[:n_train],
        val_idx=perm[n_train:n_train + n_val],
        test_idx=perm[n_train + n_val:n_train + n_val + n_test],
        num_classes=c,
    )


def _derived_seed(seed: int, stream: str, part: int) -> int:
    """A seed for one independent random stream of the graph (the same on every machine)."""
    digest = hashlib.blake2b(f"{seed}/{stream}/{part}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch seeds are < 2**63 here

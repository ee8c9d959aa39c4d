"""An embedded heterogeneous graph (no download): papers, their authors, and citations.

Papers carry the labels. A paper cites a paper of its own class with probability
``homophily``, and an author, who has a field (a class), writes papers of that field with the
same probability. Features are a weak copy of the class (or field) centroid under noise, so a
paper's features alone classify it poorly and its citations and authors tell much more: a
heterogeneous model should beat a features-only one by a clear margin.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import HeteroData

PAPER, AUTHOR = "paper", "author"
CITES, WRITES, REV_WRITES = ((PAPER, "cites", PAPER), (AUTHOR, "writes", PAPER),
                              (PAPER, "rev_writes", AUTHOR))


@dataclass(frozen=True)
class SyntheticHeteroSpec:
    """Size and difficulty of the synthetic heterogeneous graph."""

    num_papers: int = 20_000
    num_authors: int = 10_000
    num_cites: int = 100_000
    num_writes: int = 60_000
    num_features: int = 64
    num_classes: int = 8
    homophily: float = 0.8
    feature_signal: float = 0.1
    train_fraction: float = 0.5
    val_fraction: float = 0.1
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        if min(self.num_papers, self.num_authors) < 10 or self.num_classes < 2:
            raise ValueError("the synthetic heterogeneous graph needs at least 10 papers, 10 "
                             "authors and 2 classes.")


def _same_class_partner(label_of_partner: Tensor, wanted: Tensor, homophily: float,
                        gen: torch.Generator) -> Tensor:
    """For each entry of ``wanted`` (a class), a node whose label is that class with
    probability ``homophily``, else a uniform node."""
    n = label_of_partner.numel()
    by_class = torch.argsort(label_of_partner)
    count = torch.bincount(label_of_partner, minlength=int(wanted.max()) + 1)
    start = torch.cumsum(count, 0) - count
    pick = start[wanted] + (torch.rand(wanted.numel(), generator=gen) * count[wanted]).long()
    same = by_class[pick.clamp(max=n - 1)]
    other = torch.randint(0, n, (wanted.numel(),), generator=gen)
    return torch.where(torch.rand(wanted.numel(), generator=gen) < homophily, same, other)


def make_synthetic_hetero(spec: SyntheticHeteroSpec = SyntheticHeteroSpec(),
                          seed: int = 0) -> HeteroData:
    """The graph, deterministically from ``seed``: ``paper`` nodes with ``x``, ``y`` and
    ``train_mask``/``val_mask``/``test_mask``; ``author`` nodes with ``x``; edge types
    ``(paper, cites, paper)``, ``(author, writes, paper)`` and its reverse
    ``(paper, rev_writes, author)``; ``num_classes``."""
    gen = torch.Generator().manual_seed(seed)
    c, f = spec.num_classes, spec.num_features
    label = torch.randint(0, c, (spec.num_papers,), generator=gen)
    field = torch.randint(0, c, (spec.num_authors,), generator=gen)
    centroids = torch.randn(c, f, generator=gen) * spec.feature_signal

    citing = torch.randint(0, spec.num_papers, (spec.num_cites,), generator=gen)
    cited = _same_class_partner(label, label[citing], spec.homophily, gen)
    writer = torch.randint(0, spec.num_authors, (spec.num_writes,), generator=gen)
    written = _same_class_partner(label, field[writer], spec.homophily, gen)

    data = HeteroData()
    data[PAPER].x = torch.randn(spec.num_papers, f, generator=gen) + centroids[label]
    data[PAPER].y = label
    data[AUTHOR].x = torch.randn(spec.num_authors, f, generator=gen) + centroids[field]
    data[CITES].edge_index = torch.stack([citing, cited])
    data[WRITES].edge_index = torch.stack([writer, written])
    data[REV_WRITES].edge_index = torch.stack([written, writer])

    order = torch.randperm(spec.num_papers, generator=gen)
    bounds = torch.tensor([spec.train_fraction, spec.val_fraction, spec.test_fraction])
    ends = (torch.cumsum(bounds, 0) * spec.num_papers).long().tolist()
    for name, lo, hi in (("train_mask", 0, ends[0]), ("val_mask", ends[0], ends[1]),
                         ("test_mask", ends[1], ends[2])):
        mask = torch.zeros(spec.num_papers, dtype=torch.bool)
        mask[order[lo:hi]] = True
        data[PAPER][name] = mask
    data.num_classes = c
    return data

"""Every seed derived from a run's ``seed``: one function per random stream.

A run records only its ``seed`` (``--seed``); every other generator is seeded from it here. The
formulas are part of what a seed means: the same seed must give the same samples, dropout masks
and evaluation batches in every release, and a resumed run re-derives the streams a checkpoint
does not hold from them. Changing a formula silently changes every recorded run's results and
makes ``--resume`` of an earlier run diverge from the uninterrupted one; never change one, add a
new function for a new stream instead.
"""
from __future__ import annotations


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s own generators: ``seed * 1009 + rank``.

    Seeds a loader's :class:`~pyg_mgpu.NeighborSampler` (its neighbour draws and, in
    :class:`~pyg_mgpu.LinkNeighborLoader`, its negatives), so that each rank draws its own
    samples while the epochs' permutation, seeded by ``seed`` itself, is shared; and the CLI
    loaders' ``DataLoader`` generator, which is not checkpointed and is rebuilt from this value
    on resume. No two (seed, rank) pairs give one value while a job has fewer than 1009 ranks. The formula must never change (see the module's docstring).

    Example:
        >>> rank_seed(3, 1)
        3028
    """
    return seed * 1009 + rank


def eval_loader_seed(seed: int) -> int:
    """The seed of the evaluation loaders: ``seed + 7919``, the same on every rank.

    Evaluation samples its own batches (fanouts other than -1), from a generator apart from the
    training ranks' so that evaluating never shifts training's streams. A resumed run rebuilds
    the evaluation loaders from this value, so its accuracies match the uninterrupted run's
    only while the formula is unchanged; it must never change (see the module's docstring).

    Example:
        >>> eval_loader_seed(3)
        7922
    """
    return seed + 7919


def dropout_seed(seed: int, rank: int) -> int:
    """The seed of torch's global generator once a rank's model is built:
    ``seed * 7919 + 1 + rank``.

    Every rank builds its model from ``seed`` (identical initial weights), then reseeds with
    this value so that each rank draws independent dropout masks. Checkpoints hold the
    generator's state from then on, but a run started with the same seed reproduces an earlier
    one only while the formula is unchanged; it must never change (see the module's
    docstring).

    Example:
        >>> dropout_seed(3, 1)
        23759
    """
    return seed * 7919 + 1 + rank

"""A digest of the data a run trains on, kept in its checkpoints: a resume on other data (a
dataset file rewritten in place, splits drawn anew) is refused instead of mixing the two."""
from __future__ import annotations

import hashlib
from typing import Callable, Optional

import torch
from torch import Tensor

# Tensors up to this many elements are hashed whole (pointers, labels, splits); larger ones
# (features, edges) as BLOCKS evenly spaced runs of BLOCK elements: a few thousand pages of a
# memory-mapped graph are read, not the whole file.
WHOLE = 1 << 22
BLOCKS, BLOCK = 1024, 1024


def block_starts(numel: int) -> Tensor:
    """Where the hashed runs of a tensor of ``numel > WHOLE`` elements start: ``BLOCKS``
    evenly spaced, the first at 0 and the last at ``numel - BLOCK``, in exact integer
    arithmetic at any size."""
    return torch.arange(BLOCKS, dtype=torch.long) * (numel - BLOCK) // (BLOCKS - 1)


def float32_block_starts(numel: int) -> Optional[Tensor]:
    """The starts that releases before 2026-12 computed, through a float32 ``linspace``: None
    where the last one rounded past ``numel - BLOCK`` (those sizes crashed), so only the
    digests those releases could write are recomputed (:func:`earlier_fingerprint`)."""
    starts = torch.linspace(0, numel - BLOCK, BLOCKS).long()
    return starts if int(starts[-1]) <= numel - BLOCK else None


def data_fingerprint(tensors: dict[str, Tensor]) -> str:
    """A hex digest of the graph's tensors: names, dtypes, shapes and values (all of the
    small ones, evenly spaced runs of the large)."""
    return _digest(tensors, block_starts)


def earlier_fingerprint(tensors: dict[str, Tensor]) -> Optional[str]:
    """The digest a release before 2026-12 wrote into its checkpoints for the same tensors
    (its float32 starts could differ from :func:`block_starts` on large tensors), or None where
    it equals :func:`data_fingerprint` or that release could not compute one: a checkpoint
    holding it resumes on the same data."""
    earlier = _float32_digest(tensors)
    return None if earlier == data_fingerprint(tensors) else earlier


def same_data(saved: Optional[str], tensors: dict[str, Tensor],
              current: Optional[str] = None) -> bool:
    """Whether ``saved``, a digest a checkpoint or a run's ``metrics.json`` kept, names these
    tensors: the digest of this release (``current``, if already computed) or of an earlier
    one. None (kept before digests were) passes."""
    if saved is None:
        return True
    if saved == (current or data_fingerprint(tensors)):
        return True
    return saved == _float32_digest(tensors)


class _NoDigest(Exception):
    pass


def _float32_digest(tensors: dict[str, Tensor]) -> Optional[str]:
    """The digest with the float32 starts, or None where they overran a tensor."""
    try:
        return _digest(tensors, float32_block_starts)
    except _NoDigest:
        return None


def _digest(tensors: dict[str, Tensor], starts_of: Callable[[int], Optional[Tensor]]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        flat = tensor.reshape(-1)
        if flat.numel() > WHOLE:
            starts = starts_of(flat.numel())
            if starts is None:
                raise _NoDigest
            starts = starts.to(flat.device)
            flat = flat[(starts[:, None] + torch.arange(BLOCK, device=flat.device)).view(-1)]
        digest.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

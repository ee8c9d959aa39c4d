"""A digest of the data a run trains on, kept in its checkpoints: a resume on other data (a
dataset file rewritten in place, splits drawn anew) is refused instead of mixing the two."""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor

# Tensors up to this many elements are hashed whole (pointers, labels, splits); larger ones
# (features, edges) as BLOCKS evenly spaced runs of BLOCK elements: a few thousand pages of a
# memory-mapped graph are read, not the whole file.
WHOLE = 1 << 22
BLOCKS, BLOCK = 1024, 1024


def data_fingerprint(tensors: dict[str, Tensor]) -> str:
    """A hex digest of the graph's tensors: names, dtypes, shapes and values (all of the
    small ones, evenly spaced runs of the large)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        flat = tensor.reshape(-1)
        if flat.numel() > WHOLE:
            starts = torch.linspace(0, flat.numel() - BLOCK, BLOCKS, device=flat.device).long()
            flat = flat[(starts[:, None] + torch.arange(BLOCK, device=flat.device)).view(-1)]
        digest.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()

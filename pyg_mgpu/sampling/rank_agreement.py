"""Whether the ranks' distributed loaders agree: the same seed, inputs and epoch.

A distributed loader's shards are cut from one permutation that every rank draws itself, so
together they hold every input exactly once only when every rank built the loader alike and
sets the same epoch. Nothing in the batches shows a disagreement: with ``seed=seed + rank``
or input nodes from an unseeded random split, each rank still runs its batches, and inputs are
silently lost and repeated. So a loader whose rank and world size are the process group's
compares its settings with rank 0's, when it is built and at each ``set_epoch``.

The comparison goes through the group's store (the key-value store its ranks met through), not
a collective: it needs no device, so it works before ``torch.cuda.set_device`` under NCCL, and
only ranks other than 0 wait. Rank 0 posts its settings and goes on; every other rank reads
them and raises on a difference, which ends the job as a failed rank does. A rank that waits
for a post rank 0 never makes (a loader only rank 0 built) waits as long as the group's store
would (its timeout), then raises; it polls, so a stop signal still ends it at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

# Distributed loaders built in this process that check their ranks (their keys' numbers).
_checked_loaders = 0


# Seeds the digest hashes, evenly spaced: enough to tell another split or order apart without
# copying a billion seed edges on every rank.
_DIGEST_SAMPLE = 1 << 20


def inputs_digest(inputs: Tensor) -> str:
    """A digest of the seeds' values and order, whatever their integer type and device: their
    count, their sum, and up to ``_DIGEST_SAMPLE`` of them, evenly spaced, in order."""
    flat = inputs.detach().reshape(-1)
    step = max(1, -(-flat.numel() // _DIGEST_SAMPLE))
    sample = flat[::step].to("cpu", torch.int64).contiguous()
    total = int(flat.sum(dtype=torch.int64)) if flat.numel() else 0
    digest = hashlib.blake2b(sample.numpy(), digest_size=16)
    digest.update(f"{flat.numel()}:{total}".encode())
    return digest.hexdigest()


def _attempt() -> str:
    """torchrun's attempt, where every rank counts it alike: on one machine. A machine counts
    its own restarts, so over several the count can differ; there torchrun must give every
    attempt a fresh store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, docs/multinode.md), and
    the keys need no attempt."""
    if os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return "0"
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


class RankAgreement:
    """One loader's check that its settings equal rank 0's: :meth:`check_built` once, then
    :meth:`check_epoch` at each ``set_epoch`` (not when iterating: a rank may look at a batch
    the others do not draw)."""

    def __init__(self, what: str, store: dist.Store, rank: int, number: int):
        """The check of a ``what`` (the loader's class) on rank ``rank``, the ``number``-th
        distributed loader the rank has built: the same number on every rank when they build
        their loaders in the same order."""
        self.what, self.store, self.rank = what, store, rank
        # A restarted torchrun attempt may find the keys of the last one in its store.
        self.key = f"pyg_mgpu/loader_agreement/{_attempt()}/{number}"
        self.number = number
        self.epochs_set = 0

    @classmethod
    def from_group(cls, what: str, rank: int, world_size: int) -> Optional["RankAgreement"]:
        """The check for a loader of rank ``rank`` of ``world_size``, where those are the
        initialized default process group's (None otherwise: a loader for a subgroup, or one
        rank's shards looked at in one process)."""
        if not (dist.is_available() and dist.is_initialized()) or \
                (rank, world_size) != (dist.get_rank(), dist.get_world_size()):
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, KeyError, RuntimeError, ValueError):  # a group without one
            return None
        global _checked_loaders
        _checked_loaders += 1
        return cls(what, store, rank, _checked_loaders - 1)

    def __getstate__(self) -> dict:
        # A copy in another process (a DataLoader worker started by spawn, which pickles the
        # loader) has no store: stores do not pickle, and the rank's own loader checks.
        return dict(self.__dict__, store=None)

    def check_built(self, settings: dict) -> None:
        self._compare("built", settings, "when built")

    def check_epoch(self, epoch: int, start_step: int) -> None:
        self.epochs_set += 1
        self._compare(f"set_epoch_{self.epochs_set}", {"epoch": epoch, "start_step": start_step},
                      f"at its set_epoch call {self.epochs_set}")

    def _wait_for(self, key: str) -> bytes:
        """Rank 0's post under ``key``, polled so that a stop signal is handled while waiting
        (a blocking ``get`` would hold the rank in the store until its timeout)."""
        deadline = time.monotonic() + self.store.timeout.total_seconds()
        pause = 0.001
        while not self.store.check([key]):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {self.rank}'s distributed {self.what} waited "
                    f"{self.store.timeout.total_seconds():.0f}s in vain for rank 0's settings. "
                    "Every rank must build the same distributed loaders, in the same order, "
                    "and call their set_epoch alike.")
            time.sleep(pause)
            pause = min(2 * pause, 0.1)
        return self.store.get(key)

    def _compare(self, name: str, settings: dict, when: str) -> None:
        key = f"{self.key}/{name}"
        if self.store is None:
            return
        try:
            if self.rank == 0:
                self.store.set(key, json.dumps(settings))
                return
            theirs = json.loads(self._wait_for(key))
        except dist.DistNetworkError:
            # The store's host is gone (torchrun's agent was killed): the job is ending, and
            # the stop reaches this rank at its next step, which checkpoints. Raising here
            # would end it without that checkpoint; the check itself is moot.
            return
        differences = [f"{name}={value!r} where rank 0 has {theirs.get(name)!r}"
                       for name, value in settings.items()
                       if name != "inputs" and theirs.get(name) != value]
        if settings.get("inputs") != theirs.get("inputs") and \
                settings.get("num_inputs") == theirs.get("num_inputs"):
            differences.append("other inputs (as many, but other values or another order)")
        if differences:
            raise ValueError(
                f"rank {self.rank}'s distributed {self.what} differs from rank 0's {when}: "
                f"{'; '.join(differences)}. Every rank cuts its shard from one permutation it "
                "draws itself, so every rank must pass the same seed, inputs (the same values "
                "in the same order), batch_size and shuffle, and call set_epoch with the same "
                "epoch; otherwise inputs are lost and repeated. (The ranks' neighbour draws "
                "differ already: each rank's sampler is seeded from seed and its rank.) This "
                f"is distributed loader {self.number + 1} that each rank built; if one rank "
                "built a distributed loader the others did not, their loaders are compared "
                "out of step: build distributed loaders on every rank, in the same order.")

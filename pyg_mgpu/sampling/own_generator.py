"""A sampler's own random stream: a generator seeded once, carried to DataLoader workers and
spawned processes with the sampler, and reseeded once in each worker.
"""
from __future__ import annotations

from typing import Optional

import torch


class OwnGenerator:
    """Mixin of a sampler that draws from :attr:`generator` on its :attr:`device` (which the
    sampler defines) instead of torch's global random state."""

    generator: torch.Generator

    def _start_generator(self, seed: Optional[int]) -> None:
        """This sampler's own random generator on :attr:`device`, seeded with ``seed`` (default:
        drawn from torch's global generator)."""
        self.generator = torch.Generator(device=self.device)
        if seed is None:
            seed = int(torch.randint(2**62, (), dtype=torch.long))
        self.generator.manual_seed(seed)
        self._seeded_for_worker: Optional[int] = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        # As bytes: a tensor made here would go to a spawned worker as shared memory that is
        # freed when pickling ends, before the worker maps it.
        state["generator"] = self.generator.get_state().numpy().tobytes()
        return state

    def __setstate__(self, state: dict) -> None:
        gen_state = torch.frombuffer(bytearray(state.pop("generator")), dtype=torch.uint8)
        self.__dict__.update(state)
        self.generator = torch.Generator(device=self.device)
        self.generator.set_state(gen_state)

    def _reseed_in_worker(self) -> None:
        # Every DataLoader worker starts from a copy of this sampler, generator state included:
        # unseeded, all workers would replay one random stream on their different batches. Each
        # takes, once, the seed DataLoader derives for it (new each epoch, reproducible from the
        # loader's generator) mixed with this sampler's own: DataLoader draws its seeds from
        # torch's global state by default, which ranks seed alike for equal weights.
        info = torch.utils.data.get_worker_info()
        if info is not None and self._seeded_for_worker != info.id:
            self.generator.manual_seed((info.seed ^ self.generator.initial_seed()) % 2**63)
            self._seeded_for_worker = info.id

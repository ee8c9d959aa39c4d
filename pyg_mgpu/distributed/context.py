"""What a rank function receives (:class:`RankContext`) and how a job's end is reported to
the caller (:class:`RankFailed`, :class:`JobStopped`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pyg_mgpu.distributed import stop


class RankFailed(RuntimeError):
    """A rank died; the message names the rank and carries its traceback or signal.

    :func:`spawn` raises it in the parent once the other ranks have been ended.

    Example::

        try:
            pyg_mgpu.spawn(train, args=(data,))
        except pyg_mgpu.RankFailed as failure:
            print(failure)  # "rank 1 failed:" and that rank's traceback
            raise SystemExit(1)
    """


class JobStopped(KeyboardInterrupt):
    """A stop signal ended the job before its ranks finished.

    A ``KeyboardInterrupt`` (as Ctrl-C was before), so ``except Exception`` around a job does
    not swallow a stop. ``signum``: the signal; ``killed_after_grace``: the ranks that had not
    ended within the grace period and were killed.

    Example:
        >>> import signal
        >>> stopped = pyg_mgpu.JobStopped(signal.SIGTERM)
        >>> str(stopped), isinstance(stopped, KeyboardInterrupt)
        ('stopped by SIGTERM', True)

        Around a job: the exit code a shell expects after a signal::

            try:
                pyg_mgpu.spawn(train, args=(data,))
            except pyg_mgpu.JobStopped as stop:
                raise SystemExit(128 + stop.signum)
    """

    def __init__(self, signum: int, killed_after_grace: Sequence[int] = (),
                 grace_s: float = stop.DEFAULT_GRACE_S):
        self.signum = signum
        self.killed_after_grace = list(killed_after_grace)
        message = f"stopped by {stop.signal_name(signum)}"
        if self.killed_after_grace:
            ranks = ", ".join(map(str, self.killed_after_grace))
            many = len(self.killed_after_grace) > 1
            message += (f" ({'ranks' if many else 'rank'} {ranks} had not ended within "
                        f"{grace_s:g}s and {'were' if many else 'was'} killed)")
        super().__init__(message)


@dataclass(frozen=True)
class RankContext:
    """Runtime facts of one rank, passed explicitly to the code that needs them.

    :func:`spawn` (and the torchrun entry) hand one to the rank function as its first argument.

    Args:
        rank: This rank's number, ``0 .. world_size - 1``.
        world_size: The number of ranks in the job.
        local_rank: The rank's number on this machine (its GPU index on GPU ranks).
        device: The rank's device: ``cuda:<local_rank>``, or ``cpu``.
        backend: The process group's backend, ``nccl`` or ``gloo``.

    Example::

        def train(ctx: pyg_mgpu.RankContext, data):
            model = GraphSAGE(...).to(ctx.device)
            if ctx.is_main:  # rank 0
                print(f"{ctx.world_size} ranks on {ctx.device.type}")
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def collective_device(self) -> torch.device:
        """Where this rank's small collectives (counts, flags, scalars) put their tensors.

        NCCL reduces CUDA tensors only; gloo reduces host tensors everywhere but only a few
        collectives on CUDA tensors, so with gloo they stay on the host even on a GPU rank.
        """
        return self.device if self.backend == "nccl" else torch.device("cpu")

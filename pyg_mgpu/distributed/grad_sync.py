"""DDP's gradient all-reduce, left running while the next batch loads (CPU ranks).

On gloo, DDP's all-reduce blocks ``backward()`` until every rank has sent its gradients. Here
that took 2.5 ms for this model's 82k parameters between two idle ranks, plus however long the
slower rank still computes: time in which the core idles. With a deferred all-reduce as DDP's
communication hook, ``backward()`` returns once the exchange has started; the training loop
loads the next batch (sampling, gathering) and then calls ``wait()`` before the optimizer step.

:func:`deferred_all_reduce` picks the exchange: through shared memory when the ranks share a
machine (:class:`SharedMemoryAllReduce`), else gloo's (:class:`DeferredAllReduce`). Both do
DDP's default hook's arithmetic (each bucket divided by the world size, then summed): gloo's
deferred all-reduce trains exactly as the blocking one, and so does the shared-memory one with
two ranks; with more, its sums add the ranks in another order than gloo's (the same on every
rank, so the replicas stay identical).
"""
# No "from __future__ import annotations": DDP checks the hook's return annotation as an object.
from typing import Union

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pyg_mgpu.distributed.timeouts import DEFAULT_TIMEOUT_S
from pyg_mgpu.distributed.shared_rounds import SharedRounds, open_shared_rounds


def _check_bucket_views(ddp: DistributedDataParallel) -> None:
    if not ddp.gradient_as_bucket_view:
        raise ValueError("a deferred all-reduce needs DistributedDataParallel(..., "
                         "gradient_as_bucket_view=True): otherwise DDP copies the buckets "
                         "into .grad before the all-reduce has finished.")


def _started(buffer: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    # DDP copies a hook's result into the gradients; the result being the bucket itself (which
    # the gradients view), that copy is skipped, and backward() need not wait.
    started = torch.futures.Future()
    started.set_result(buffer)
    return started


class DeferredAllReduce:
    """Registers itself as ``ddp``'s communication hook; :meth:`wait` before using gradients.

    ``ddp`` must be built with ``gradient_as_bucket_view=True``: the parameters' ``.grad`` are
    then views of the buckets the all-reduce writes into, so they hold the averaged gradients
    as soon as :meth:`wait` returns.
    """

    def __init__(self, ddp: DistributedDataParallel):
        _check_bucket_views(ddp)
        self._group = ddp.process_group
        self._pending: list = []
        ddp.register_comm_hook(None, self._hook)

    def _hook(self, _state, bucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size(self._group))
        self._pending.append(dist.all_reduce(buffer, group=self._group, async_op=True))
        return _started(buffer)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def wait(self) -> None:
        """Blocks until every started all-reduce has finished."""
        for work in self._pending:
            work.wait()
        self._pending.clear()


class SharedMemoryAllReduce:
    """The same as :class:`DeferredAllReduce`, through shared memory (:class:`SharedRounds`).

    A step is one round: each bucket, divided by the world size, goes to this rank's slot at
    the bucket's place (DDP hands the buckets over in the same order on every rank), and the
    last one posts the round. :meth:`wait` sums the ranks' slots into the buckets, rank 0's
    first, on every rank alike: the replicas stay identical, and with two ranks the sums are
    gloo's bit for bit.
    """

    def __init__(self, ddp: DistributedDataParallel, rounds: SharedRounds):
        _check_bucket_views(ddp)
        self._rounds = rounds
        self._pending: list = []  # (offset, bucket buffer) of this step's buckets
        self._filled = 0
        ddp.register_comm_hook(None, self._hook)

    def _hook(self, _state, bucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        if self._filled + buffer.numel() > self._rounds.numel:
            raise RuntimeError(f"the gradient buckets hold more than the "
                               f"{self._rounds.numel} values the exchange was sized for")
        slot = self._rounds.slot()[self._filled:self._filled + buffer.numel()]
        torch.div(buffer, self._rounds.world_size, out=slot)
        self._pending.append((self._filled, buffer))
        self._filled += buffer.numel()
        if bucket.is_last():
            self._rounds.post()
        return _started(buffer)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def wait(self) -> None:
        """Blocks until every rank has posted this step's gradients, then sums them."""
        if not self._pending:
            return
        if not self._rounds.unread:  # else wait() would hand back the last step's round
            raise RuntimeError("DDP handed over some gradient buckets but not its last one; "
                               "every bucket must be ready before wait()")
        ranks = self._rounds.wait()
        for offset, buffer in self._pending:
            rows = ranks[:, offset:offset + buffer.numel()]
            if len(rows) == 1:
                buffer.copy_(rows[0])
                continue
            torch.add(rows[0], rows[1], out=buffer)
            for row in rows[2:]:
                buffer.add_(row)
        self._pending.clear()
        self._filled = 0


GradSync = Union[SharedMemoryAllReduce, DeferredAllReduce]


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Every rank takes rank 0's parameters and buffers, as DDP does when it is built (for a
    module trained without DDP's wrapper). A collective."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def deferred_all_reduce(ddp: DistributedDataParallel, timeout_s: float = DEFAULT_TIMEOUT_S
                        ) -> GradSync:
    """``ddp``'s deferred all-reduce: through shared memory where every rank of its process
    group can map one segment (one x86-64 machine) and its gradients share a dtype, else
    gloo's. A collective."""
    _check_bucket_views(ddp)
    params = [p for p in ddp.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    numel = sum(p.numel() for p in params)
    rounds = None
    if len(dtypes) == 1:
        rounds = open_shared_rounds(numel, dtypes.pop(), ddp.process_group, timeout_s)
    return (SharedMemoryAllReduce(ddp, rounds) if rounds is not None
            else DeferredAllReduce(ddp))

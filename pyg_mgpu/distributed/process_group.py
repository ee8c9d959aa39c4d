"""The only place that creates and destroys ``torch.distributed`` process groups: for a rank of
:func:`~pyg_mgpu.distributed.launch.spawn`, or for a ``torchrun`` rank."""
from __future__ import annotations

import contextlib
import datetime
import os
from typing import Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist

from pyg_mgpu.distributed import stop
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.devices import resolve_backend, torchrun_device
from pyg_mgpu.distributed.host import set_thread_budget, tune_cpu_allocator
from pyg_mgpu.distributed.timeouts import DEFAULT_TIMEOUT_S, RENDEZVOUS_TIMEOUT_S

T = TypeVar("T")

# How long the other ranks wait for work rank 0 does alone: exact inference over a large graph
# on CPU takes hours. A rank 0 that fails ends the wait at once (its connections close), and a
# stop signal reaches every rank through the launcher.
ALONE_TIMEOUT = datetime.timedelta(days=1)


@contextlib.contextmanager
def process_group(rank: int, world_size: int, device: torch.device, *, init_method: str,
                  timeout_s: float, local_rank: int | None = None,
                  backend: str = "auto") -> Iterator[RankContext]:
    """Joins the process group for the body and always leaves it, on success and on error.

    ``backend``: ``auto`` (NCCL on a GPU, gloo on the CPU), ``nccl`` or ``gloo``.
    """
    backend = resolve_backend(backend, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if (init_method == "env://" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and os.environ.get("GROUP_WORLD_SIZE") == "1"):
        # torchrun's workers share its store across restarts, and a group's keys do not name
        # the attempt: a restarted rank could read its peer's address from the attempt before
        # and fail ("connectFullMesh failed ... Connection refused").
        # Each attempt's keys get a prefix of their own. Only with one machine: each machine's
        # torchrun counts its own restarts, so counts can differ between machines (there,
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every attempt a fresh store instead).
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"pyg_mgpu/attempt_{attempt}/", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    elif init_method.startswith("tcp://"):
        # The ranks' start-up can be many seconds apart on a loaded machine: the rendezvous
        # waits at least RENDEZVOUS_TIMEOUT_S for them, whatever the collectives' timeout.
        host, port = init_method[len("tcp://"):].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0,
                              timeout=max(timeout, datetime.timedelta(
                                  seconds=RENDEZVOUS_TIMEOUT_S)))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timeout)
    try:
        yield RankContext(rank=rank, world_size=world_size,
                          local_rank=rank if local_rank is None else local_rank,
                          device=device, backend=backend)
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def torchrun_process_group(devices: "str | torch.device" = "auto", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                           tune_allocator: bool = True, backend: str = "auto",
                           grace_s: float = stop.DEFAULT_GRACE_S) -> Iterator[RankContext]:
    """Joins the ``torchrun`` job as the rank its environment names, for the body.

    The rank's device comes from ``devices``
    (:func:`~pyg_mgpu.distributed.devices.torchrun_device`): GPU ``LOCAL_RANK`` by default
    where CUDA is available, else the CPU; a ``torch.device`` is that device, resolved
    already. Like a spawned rank, it gets its share of the
    machine's cores as torch threads (``LOCAL_WORLD_SIZE`` ranks per machine), with
    ``tune_allocator`` the allocator settings of :func:`tune_cpu_allocator`, and the
    stop-signal handling of :mod:`pyg_mgpu.distributed.stop` (torchrun forwards SIGTERM to its
    workers).
    """
    stop.install_rank_handlers(grace_s)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = (devices if isinstance(devices, torch.device)
              else torchrun_device(devices, local_rank, backend))
    if tune_allocator:
        tune_cpu_allocator()
    set_thread_budget(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    with process_group(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device,
                       init_method="env://", timeout_s=timeout_s, local_rank=local_rank,
                       backend=backend) as ctx:
        yield ctx


def on_rank0_alone(ctx: RankContext, work: Callable[[], T]) -> Optional[T]:
    """``work()`` on rank 0 while the other ranks wait for it as long as it takes; its result
    there, None on the others.

    A collective waits at most the group's timeout (``--timeout``), which the steps' exchanges
    need short: a rank left waiting in one while rank 0 works alone for longer (PyG's own
    whole-graph inference of a large graph) would fail a finished run. The others wait instead
    in a barrier of a gloo group of the ranks' own, whose timeout is :data:`ALONE_TIMEOUT`.
    """
    group = dist.new_group(backend="gloo", timeout=ALONE_TIMEOUT)
    try:
        result = work() if ctx.is_main else None
        dist.barrier(group=group)
        return result
    finally:
        dist.destroy_process_group(group)


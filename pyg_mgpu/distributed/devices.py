"""Which devices a job's ranks run on, which backend joins them, and where the rendezvous
listens."""
from __future__ import annotations

import os
import socket
import warnings
from typing import TYPE_CHECKING

from pyg_mgpu.errors import ArgumentError

if TYPE_CHECKING:  # torch is imported where a device is made: a config is checked without it
    import torch

BACKENDS = ("auto", "nccl", "gloo")
"""``auto``: NCCL on GPU ranks, gloo on CPU ranks. ``gloo`` on GPU ranks lets several ranks
share one GPU (NCCL refuses two ranks on one device): for testing multi-rank logic on one GPU."""


def resolve_backend(backend: str, device: torch.device) -> str:
    """The process-group backend for a rank on ``device``: ``auto`` = NCCL on GPUs, else gloo."""
    return backend_for(backend, device.type)


def backend_for(backend: str, device_type: str) -> str:
    """:func:`resolve_backend` for a device type (``"cuda"``, ``"cpu"``)."""
    choice = (backend or "auto").strip().lower()
    if choice not in BACKENDS:
        raise ArgumentError(f"{{backend}} must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if choice == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if choice == "nccl" and device_type != "cuda":
        raise ArgumentError("{backend=nccl} needs GPU ranks ({devices=cuda}...); CPU ranks use "
                            "gloo ({backend=auto} or gloo).")
    return choice


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it; never hard-coded)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


RANK_MEMORY_GB = 0.3
"""A CPU rank's memory of its own before its batches: its interpreter with torch and PyG, gloo,
the allocator's pools (docs/benchmarks.md, "Memory": about 290 MB of PSS per rank). The shared
graph comes on top, once for all ranks."""

RANKS_PER_CORE_LIMIT = 4
"""The most CPU ranks per usable core the training and benchmark commands start. Ranks beyond
the cores take turns on them, so they train no faster, while each costs a process's memory,
its start-up, and its share of every stop."""


def cpu_ranks_memory(ranks: int) -> str:
    """What ``ranks`` CPU ranks take of memory of their own, in words, said to be an
    estimate."""
    return (f"about {ranks * RANK_MEMORY_GB:.1f} GB of memory (an estimate: "
            f"{RANK_MEMORY_GB} GB a rank before its batches, and the shared graph once)")


def resolve_devices(devices: str, nprocs: int | None, backend: str = "auto", *,
                    max_per_core: int | None = None) -> list[torch.device]:
    """Turns ``devices``/``nprocs`` into one device per rank.

    ``auto``: every visible GPU, or ``nprocs`` (default 2) CPU ranks without CUDA.
    ``cpu``: ``nprocs`` CPU ranks (default 2). ``cuda`` or ``cuda:0,1``: those GPUs.
    A GPU listed twice (``cuda:0,0``: two ranks sharing GPU 0) needs ``backend="gloo"``.
    More CPU ranks than usable cores get a warning with the memory they take; more than
    ``max_per_core`` per core (None: no limit) are refused.
    """
    import torch

    gloo = backend_for(backend, "cuda") == "gloo"  # also refuses an unknown name
    spec = devices.strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if nprocs is not None and nprocs < 1:
        raise ArgumentError(f"{{nprocs={nprocs}}}: a job needs at least 1 rank.")
    if spec == "cpu":
        backend_for(backend, "cpu")  # nccl: say why not
        ranks = nprocs or 2
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        if max_per_core is not None and ranks > max_per_core * cores:
            raise ArgumentError(
                f"{{nprocs={ranks}}}: more than {max_per_core} CPU ranks per core ({cores} "
                f"core(s) here: at most {max_per_core * cores}). Ranks beyond the cores only "
                f"take turns on them, and {ranks} would take {cpu_ranks_memory(ranks)}; "
                f"use {{nprocs={cores}}} (one per core) for the fastest epochs.")
        if ranks > cores:
            warnings.warn(f"{ranks} CPU ranks on {cores} core(s): ranks beyond the cores only "
                          f"take turns on them, and each is a process of its own: "
                          f"{cpu_ranks_memory(ranks)}; up to {cores} train as fast.",
                          stacklevel=2)
        return [torch.device("cpu")] * ranks
    if not spec.startswith("cuda"):
        raise ArgumentError(f"{{devices}} must be auto, cpu, cuda or cuda:0,1,...; got "
                            f"{devices!r}.")
    available = torch.cuda.device_count()
    if available == 0:
        raise ArgumentError(f"{{devices={devices}}} asks for GPUs but CUDA sees none; use "
                            "{devices=cpu} {nprocs=N}.")
    if spec == "cuda":
        ids = list(range(nprocs or available))
    else:
        try:
            ids = [int(part) for part in spec.split(":", 1)[1].split(",")]
        except ValueError:
            raise ArgumentError(f"{{devices={devices}}}: expected cuda:0,1,... with integer ids.")
    if len(set(ids)) != len(ids) and not gloo:
        raise ArgumentError(f"{{devices={devices}}} lists a GPU twice: NCCL refuses two ranks "
                            "on one GPU; add {backend=gloo} to share a GPU between ranks (for "
                            "testing multi-rank logic on one GPU).")
    if max(ids) >= available or min(ids) < 0:
        raise ArgumentError(f"{{devices={devices}}} asks for GPU {max(ids)} but only "
                            f"{available} GPU(s) are visible (ids 0..{available - 1}).")
    if nprocs is not None and nprocs != len(ids):
        raise ArgumentError(f"{{nprocs={nprocs}}} disagrees with {{devices={devices}}} "
                            f"({len(ids)} GPU(s)); drop {{nprocs}} or list {nprocs} GPUs.")
    return [torch.device("cuda", i) for i in ids]


def torchrun_device(devices: str, local_rank: int, backend: str = "auto") -> torch.device:
    """A torchrun rank's device, from the ``devices`` a spawned job would take: ``auto``, GPU
    ``local_rank`` where CUDA is available, else the CPU; ``cpu``; ``cuda``, GPU
    ``local_rank``; ``cuda:2,3``, the ``local_rank``-th GPU listed. Checked as for a spawned
    job (torchrun decides the rank count, so ``nprocs`` plays no part)."""
    import torch

    spec = devices.strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        backend_for(backend, "cpu")
        return torch.device("cpu")
    listed = resolve_devices(devices, None, backend)
    if local_rank >= len(listed):
        raise ArgumentError(f"{{devices={devices}}} names {len(listed)} GPU(s), but torchrun "
                            f"started local rank {local_rank}: name one GPU per rank on each "
                            "machine (torchrun's --nproc-per-node).")
    return listed[local_rank]

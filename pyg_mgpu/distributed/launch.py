"""Starts ranks and runs a rank function in each, inside the process group that
:mod:`.process_group` (the only module that creates and destroys them) sets up for it.

Two launchers run the same rank function:
- our own spawner (``launch_local``): one process per device, the graph passed to every rank
  through shared memory, a free port picked automatically; a rank that fails ends the whole job;
- ``torchrun`` (multi-node): detected from ``RANK``/``WORLD_SIZE`` in the environment.

:func:`spawn` is the public entry for PyG users: it picks between the two and shares the
arguments' graphs and tensors once, before any rank starts.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.multiprocessing as mp
from torch import Tensor

from pyg_mgpu.data.csc import share_data
from pyg_mgpu.distributed import stop
from pyg_mgpu.distributed.devices import (
    free_port,
    launched_by_torchrun,
    resolve_backend,
    resolve_devices,
)
from pyg_mgpu.distributed.host import (exit_without_teardown, set_thread_budget,
                                      tune_cpu_allocator)
from pyg_mgpu.distributed.process_group import process_group, torchrun_process_group
from pyg_mgpu.distributed.reports import exit_stopped, new_report_dir, reported
from pyg_mgpu.distributed.timeouts import DEFAULT_TIMEOUT_S
from pyg_mgpu.distributed.watch import LauncherSignals, raise_for, watch_ranks


def _rank_entry(rank: int, fn: Callable, devices: Sequence[torch.device], init_method: str,
                timeout_s: float, report_dir: str, tune_allocator: bool, args: tuple,
                backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S,
                launcher_pid: Optional[int] = None, skip_teardown: bool = False) -> None:
    """One rank: ``fn`` in the process group, and a file in ``report_dir`` saying how it ended
    (``done``, ``stop`` or ``rank``: failed), which the launcher reads. A failure or stop before
    ``fn`` starts (joining the group) is reported the same way. ``skip_teardown``: see
    :func:`launch_local`."""
    stop.install_rank_handlers(grace_s, launcher_pid)
    with reported(report_dir, rank):  # before fn started, or while leaving the group
        stop.release_sigint()  # a Ctrl-C held while this rank started: a stop now
        if tune_allocator:
            tune_cpu_allocator()
        set_thread_budget(len(devices))
        with process_group(rank, len(devices), devices[rank], init_method=init_method,
                           timeout_s=timeout_s, backend=backend) as ctx:
            # Inside the group: a stopped rank leaves it normally after its report, a failed
            # one exits at once.
            with reported(report_dir, rank):
                fn(ctx, *args)
                Path(report_dir, f"done{rank}").touch()
    if stop.requested():  # reported, out of the group: the job is ending, end promptly
        exit_stopped()
    if skip_teardown:
        exit_without_teardown(0)


def launch_local(fn: Callable, devices: Sequence[torch.device], args: tuple = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S, tune_allocator: bool = True,
                 backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S, *,
                 skip_teardown: bool = False,
                 signals: Optional[LauncherSignals] = None) -> None:
    """Runs ``fn(ctx, *args)`` on one spawned process per device and waits for all of them.

    Tensors in ``args`` that live in shared memory are mapped, not copied, by every rank.
    If any rank fails, the others are killed and :class:`RankFailed` names it. A stop signal
    (SIGTERM, SIGINT, SIGHUP) to this process is forwarded to the ranks, which get ``grace_s``
    seconds to end (see :mod:`pyg_mgpu.distributed.stop`); then :class:`JobStopped` names it.
    ``tune_allocator=False`` leaves the ranks' memory allocator as a plain script has it (for
    baselines: see :func:`tune_cpu_allocator`). ``backend``: see :data:`BACKENDS`.
    ``skip_teardown=True`` ends each rank whose ``fn`` returned without the interpreter's
    teardown of its modules (:func:`~pyg_mgpu.distributed.host.exit_without_teardown`), for a
    ``fn`` that leaves nothing to it: the package's own rank functions, not a user's.
    ``signals``: the caller's own handlers, entered already and kept after the ranks end (the
    CLI's launcher handles stop signals for its whole life); by default ones for the ranks'
    lifetime.
    """
    owned = signals is None
    signals = LauncherSignals(grace_s) if owned else signals
    signals.start_forwarding()  # from here a stop is the ranks' to take, not raised here
    for device in devices:  # a bad backend fails here, not in every rank
        resolve_backend(backend, device)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    # CLOCK_MONOTONIC is system-wide, so stamps from different ranks compare.
    report_dir = new_report_dir()
    # torch reads this once, at its first allocation: it must be in the ranks' starting
    # environment. A baseline runs without it (whatever this process was given), a tuned run
    # with it unless the user chose otherwise.
    thp_before = os.environ.get("THP_MEM_ALLOC_ENABLE")
    os.environ["THP_MEM_ALLOC_ENABLE"] = (thp_before or "1") if tune_allocator else "0"
    try:
        with signals if owned else contextlib.nullcontext():
            stop.start_resource_tracker()
            with stop.children_start_holding_sigint():
                context = mp.start_processes(
                    _rank_entry, args=(fn, list(devices), init_method, timeout_s, report_dir,
                                       tune_allocator, args, backend, grace_s, os.getpid(),
                                       skip_teardown),
                    nprocs=len(devices), join=False, start_method="spawn")
            signals.processes = context.processes
            if signals.signum:  # it came while the ranks were starting
                signals.forward()
            outcome = watch_ranks(context.processes, signals)
            signum = signals.ranks_ended()
        raise_for(outcome, signum, report_dir, grace_s)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
        if thp_before is None:
            os.environ.pop("THP_MEM_ALLOC_ENABLE", None)
        else:
            os.environ["THP_MEM_ALLOC_ENABLE"] = thp_before


def share_args(args: Sequence) -> None:
    """Moves the PyG graphs and CPU tensors in ``args`` to shared memory, in place.

    A ``Data`` gets its CSC built first, a ``HeteroData`` one per edge type
    (:func:`~pyg_mgpu.data.csc.share_data`), so ranks map one copy of the graph and its CSCs
    instead of each building their own. Other
    arguments, and tensors nested in containers, are pickled to each rank as they are.
    """
    from torch_geometric.data import Data, HeteroData

    for arg in args:
        if isinstance(arg, (Data, HeteroData)):
            share_data(arg)
        elif isinstance(arg, Tensor) and not arg.is_cuda:
            arg.share_memory_()


def check_rank_function(fn: Callable, args) -> None:
    """Spawned ranks import ``fn`` by name and receive ``args`` as a tuple: say so before
    starting them, rather than with a pickling traceback from each."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args takes a tuple of fn's arguments after ctx, got a "
                        f"{type(args).__name__}: for one argument, args=(x,).")
    try:
        pickle.dumps(fn)  # a function pickles as its module and name
        # ... which a rank can import only from a file, not from an interactive session.
        importable = (getattr(fn, "__module__", None) != "__main__"
                      or bool(getattr(sys.modules.get("__main__"), "__file__", None)))
    except (pickle.PicklingError, AttributeError, TypeError):
        importable = False
    if not importable:
        raise TypeError(f"fn={getattr(fn, '__qualname__', fn)!r} cannot be started in a new "
                        "process, which imports it by name: define it with def at the top "
                        "level of a .py file (not a lambda, a nested function or a notebook "
                        "cell), or run under torchrun.")
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main_file, str) and main_file.startswith("<"):  # python - < script.py
        raise TypeError(f"the main script is read from {main_file}, which the new processes "
                        "run again to start and cannot: save it as a .py file and run "
                        "python FILE, or run under torchrun.")


def spawn(fn: Callable[..., None], args: tuple = (), devices: str = "auto",
          nprocs: int | None = None, timeout_s: float | None = None,
          backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S, *,
          tune_allocator: bool = True) -> None:
    """Runs ``fn(ctx, *args)`` on one rank per device, in a process group, and waits for them.

    ``ctx`` is a :class:`RankContext`: ``rank``, ``world_size``, ``device`` (already the
    current CUDA device on a GPU rank) and ``is_main``. The process group (NCCL on GPUs, gloo
    on CPUs) is up when ``fn`` starts and torn down when it returns or raises (see the
    example below).

    Run under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` set), this process
    is one rank of that job: ``fn`` runs here, on the device ``devices`` gives local rank
    ``LOCAL_RANK`` (by default GPU ``LOCAL_RANK``, or the CPU where no GPU is visible; see
    :func:`~pyg_mgpu.distributed.devices.torchrun_device`), ``nprocs`` is ignored (torchrun
    decides), and an exception from ``fn`` propagates as it is (torchrun then ends the other
    ranks).

    Otherwise the ranks are new processes, so ``fn`` must be importable (defined at module
    level of a file, not typed into an interactive session). Before they start, every
    ``torch_geometric.data.Data`` in ``args`` gets its CSC built and, with all its tensors,
    moved to shared memory, and so do plain CPU tensors: every rank maps the parent's copy
    (writes to it are seen by all) instead of receiving its own.

    Args:
        fn: The rank's work, called as ``fn(ctx, *args)``.
        args: Arguments for ``fn``, the same for every rank.
        devices: ``"auto"`` (every visible GPU, else CPU ranks), ``"cpu"``, ``"cuda"`` (every
            visible GPU) or ``"cuda:0,1"`` (those GPUs).
        nprocs: Number of CPU ranks (default 2), or how many of the visible GPUs ``"cuda"``
            takes.
        timeout_s: Seconds a collective may wait for a peer before it fails; default
            :data:`DEFAULT_TIMEOUT_S`.
        backend: ``"auto"`` (NCCL on GPUs, gloo on CPUs), ``"nccl"`` or ``"gloo"``; with
            ``"gloo"`` a GPU may be listed more than once (``devices="cuda:0,0"``: two ranks
            sharing GPU 0). ``ctx.backend`` tells ``fn`` which one runs; NCCL collectives
            take CUDA tensors, gloo's host tensors (``ctx.collective_device``).

        grace_s: Seconds the ranks have to end after a stop signal (SIGTERM, SIGINT, SIGHUP)
            before they are killed. In a rank, the signal raises
            :class:`~pyg_mgpu.distributed.stop.StopSignal` (a ``KeyboardInterrupt``, raised
            once), or, inside ``with stop.graceful():``, is only recorded for
            ``fn`` to poll (``stop.requested()``) and end cleanly.
        tune_allocator: Spawned ranks keep glibc's freed large blocks for reuse and use
            transparent huge pages (:func:`~pyg_mgpu.distributed.host.tune_cpu_allocator`);
            False leaves the allocator as a plain script has it (for baselines).

    Raises:
        RankFailed: when a rank raises or dies; the other ranks are killed at once and
            the message names the failing rank with its traceback (or signal).
        JobStopped: when a stop signal ended the job before ``fn`` returned on every rank.
        ValueError: when ``devices`` or ``nprocs`` cannot be satisfied (the message says why).
        TypeError: when ``fn`` cannot be imported by a new process (a lambda, a nested
            function, a notebook cell's) or ``args`` is not a tuple; nothing is started.

    Example:
        A script whose ranks each print where they run (``fn`` is defined at module level)::

            def work(ctx, data):
                print(f"rank {ctx.rank} of {ctx.world_size} on {ctx.device}: {data}")

            if __name__ == "__main__":
                pyg_mgpu.spawn(work, args=(pyg_mgpu.load_dataset("cora"),))
    """
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if launched_by_torchrun():
        with torchrun_process_group(devices, timeout_s=timeout_s, backend=backend,
                                    grace_s=grace_s) as ctx:
            fn(ctx, *args)
        return
    check_rank_function(fn, args)
    rank_devices = resolve_devices(devices, nprocs, backend)
    share_args(args)
    launch_local(fn, rank_devices, args=tuple(args), timeout_s=timeout_s, backend=backend,
                 grace_s=grace_s, tune_allocator=tune_allocator)

"""The only module that sets up and tears down ``torch.distributed``, and starts ranks.

Two launchers run the same rank function:
- our own spawner (``launch_local``): one process per device, the graph passed to every rank
  through shared memory, a free port picked automatically; a rank that fails ends the whole job;
- ``torchrun`` (multi-node): detected from ``RANK``/``WORLD_SIZE`` in the environment.

:func:`spawn` is the public entry for PyG users: it picks between the two and shares the
arguments' graphs and tensors once, before any rank starts.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from pyg_mgpu.data.csc import share_data
from pyg_mgpu.distributed import stop

DEFAULT_TIMEOUT_S = 300.0
"""How long a collective waits for a peer before the process group gives up."""

RENDEZVOUS_TIMEOUT_S = 120.0
"""The least time ``spawn``'s ranks wait for each other to join the group."""

BACKENDS = ("auto", "nccl", "gloo")
"""``auto``: NCCL on GPU ranks, gloo on CPU ranks. ``gloo`` on GPU ranks lets several ranks
share one GPU (NCCL refuses two ranks on one device): for testing multi-rank logic on one GPU."""


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


def resolve_backend(backend: str, device: torch.device) -> str:
    """The process-group backend for a rank on ``device``: ``auto`` = NCCL on GPUs, else gloo."""
    choice = (backend or "auto").strip().lower()
    if choice not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if choice == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if choice == "nccl" and device.type != "cuda":
        raise ValueError("--backend nccl needs GPU ranks (--devices cuda...); CPU ranks use "
                         "gloo (--backend auto or gloo).")
    return choice


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it; never hard-coded)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def resolve_devices(devices: str, nprocs: int | None,
                    backend: str = "auto") -> list[torch.device]:
    """Turns ``--devices``/``--nprocs`` into one device per rank.

    ``auto``: every visible GPU, or ``nprocs`` (default 2) CPU ranks without CUDA.
    ``cpu``: ``nprocs`` CPU ranks (default 2). ``cuda`` or ``cuda:0,1``: those GPUs.
    A GPU listed twice (``cuda:0,0``: two ranks sharing GPU 0) needs ``backend="gloo"``.
    """
    if (backend or "auto").strip().lower() not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    gloo = (backend or "auto").strip().lower() == "gloo"
    spec = devices.strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if nprocs is not None and nprocs < 1:
        raise ValueError(f"--nprocs {nprocs}: a job needs at least 1 rank.")
    if spec == "cpu":
        resolve_backend(backend, torch.device("cpu"))  # --backend nccl: say why not
        return [torch.device("cpu")] * (nprocs or 2)
    if not spec.startswith("cuda"):
        raise ValueError(f"--devices must be auto, cpu, cuda or cuda:0,1,...; got {devices!r}.")
    available = torch.cuda.device_count()
    if available == 0:
        raise ValueError(f"--devices {devices} asks for GPUs but CUDA sees none; use "
                         "--devices cpu --nprocs N.")
    if spec == "cuda":
        ids = list(range(nprocs or available))
    else:
        try:
            ids = [int(part) for part in spec.split(":", 1)[1].split(",")]
        except ValueError:
            raise ValueError(f"--devices {devices!r}: expected cuda:0,1,... with integer ids.")
    if len(set(ids)) != len(ids) and not gloo:
        raise ValueError(f"--devices {devices} lists a GPU twice: NCCL refuses two ranks on "
                         "one GPU; add --backend gloo to share a GPU between ranks (for "
                         "testing multi-rank logic on one GPU).")
    if max(ids) >= available or min(ids) < 0:
        raise ValueError(f"--devices {devices} asks for GPU {max(ids)} but only {available} "
                         f"GPU(s) are visible (ids 0..{available - 1}).")
    if nprocs is not None and nprocs != len(ids):
        raise ValueError(f"--nprocs {nprocs} disagrees with --devices {devices} "
                         f"({len(ids)} GPU(s)); drop --nprocs or list {nprocs} GPUs.")
    return [torch.device("cuda", i) for i in ids]


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
        # and fail ("connectFullMesh failed ... Connection refused", 2 of 5 restarts here).
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
def torchrun_process_group(devices: str = "auto", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                           tune_allocator: bool = True, backend: str = "auto",
                           grace_s: float = stop.DEFAULT_GRACE_S) -> Iterator[RankContext]:
    """Joins the ``torchrun`` job as the rank its environment names, for the body.

    The rank runs on GPU ``LOCAL_RANK`` when CUDA is available and ``devices`` is not ``cpu``,
    else on the CPU. Like a spawned rank, it gets its share of the machine's cores as torch
    threads (``LOCAL_WORLD_SIZE`` ranks per machine), with ``tune_allocator`` the allocator
    settings of :func:`tune_cpu_allocator`, and the stop-signal handling of
    :mod:`pyg_mgpu.distributed.stop` (torchrun forwards SIGTERM to its workers).
    """
    stop.install_rank_handlers(grace_s)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() and devices.strip().lower() != "cpu"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if tune_allocator:
        tune_cpu_allocator()
    set_thread_budget(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    with process_group(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device,
                       init_method="env://", timeout_s=timeout_s, local_rank=local_rank,
                       backend=backend) as ctx:
        yield ctx


def usable_cores() -> int:
    """Cores this process may run on (CPU affinity: Slurm, taskset), not all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def set_thread_budget(world_size_on_node: int) -> int:
    """Gives each rank its share of the cores, so ranks do not oversubscribe them."""
    threads = max(1, usable_cores() // world_size_on_node)
    torch.set_num_threads(threads)
    return threads


def tune_cpu_allocator() -> bool:
    """Keeps freed memory in the process for the next batch instead of returning it to the OS.

    A training step allocates and frees tensors of tens of MB (feature gathers, layer outputs,
    their gradients). glibc serves blocks that large with fresh mmaps and unmaps them on free
    (its largest mmap threshold, 32 MiB, is below a batch's feature gather), so every batch paid
    a page fault per 4 KiB page: an elementwise op on a 15k x 256 layer took 2.5 ms on fresh
    memory and 0.6 ms on reused memory here, and the model step went from 86 to 68 ms together
    with the fused ops. So large blocks come from the heap, and the heap is not trimmed: freed
    memory stays in the process for reuse and is not handed back before exit (peak memory of
    a training job did not change). Transparent huge pages (torch's ``THP_MEM_ALLOC_ENABLE``,
    set by the launcher) cut the fault count for what is still mapped fresh.

    Returns whether glibc took the settings (False with another allocator or libc).
    """
    mallopt = _glibc_function("mallopt")
    if mallopt is None:  # not glibc (macOS, musl): leave its allocator alone
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def release_free_heap() -> None:
    """Hands the loading temporaries' freed heap back to the OS (glibc keeps it otherwise),
    so the parent holds little more than the shared graph while the ranks train."""
    gc.collect()
    malloc_trim = _glibc_function("malloc_trim")
    if malloc_trim is not None:  # not glibc: nothing to trim
        malloc_trim(0)


def _glibc_function(name: str) -> Callable | None:
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def _rank_entry(rank: int, fn: Callable, devices: Sequence[torch.device], init_method: str,
                timeout_s: float, report_dir: str, tune_allocator: bool, args: tuple,
                backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S,
                launcher_pid: Optional[int] = None) -> None:
    """One rank: ``fn`` in the process group, and a file in ``report_dir`` saying how it ended
    (``done``, ``stop`` or ``rank``: failed), which the launcher reads. A failure or stop before
    ``fn`` starts (joining the group) is reported the same way."""
    stop.install_rank_handlers(grace_s, launcher_pid)
    with _reported(report_dir, rank):  # before fn started, or while leaving the group
        if tune_allocator:
            tune_cpu_allocator()
        set_thread_budget(len(devices))
        with process_group(rank, len(devices), devices[rank], init_method=init_method,
                           timeout_s=timeout_s, backend=backend) as ctx:
            # Inside the group: a stopped rank leaves it normally after its report, a failed
            # one exits at once.
            with _reported(report_dir, rank):
                fn(ctx, *args)
                Path(report_dir, f"done{rank}").touch()


@contextlib.contextmanager
def _reported(report_dir: str, rank: int) -> Iterator[None]:
    """Reports a stop (stopped, not failed: the parent reports the signal and the trainer's
    checkpoint instead of a traceback) or a failure of the body, for the launcher."""
    try:
        yield
    except stop.StopSignal as e:
        _report_stop(report_dir, rank, e.signum)
    except BaseException:
        _report_failure_and_exit(report_dir, rank)


def _report_stop(report_dir: str, rank: int, signum: int) -> None:
    stop.finishing()
    Path(report_dir, f"stop{rank}").write_text(str(signum))


def _report_failure_and_exit(report_dir: str, rank: int) -> None:
    """Writes the traceback being handled, stamped, and ends the process at once.

    The stamp lets the parent name the earliest failure (the cause), not whichever rank
    happened to exit first. A graceful teardown (leaving the group, finalizing the
    interpreter) can block until a peer's collective times out, which is minutes. Exiting
    closes this rank's connections, so a peer blocked in a collective fails too, strictly
    after this report.
    """
    stop.finishing()  # a stop signal now must not cut the report short
    Path(report_dir, f"rank{rank}").write_text(f"{time.monotonic()!r}\n{traceback.format_exc()}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _failure_reports(report_dir: str) -> dict[int, tuple[float, str]]:
    """rank -> (monotonic stamp, traceback) of every rank that reported a failure."""
    reports = {}
    for path in Path(report_dir).glob("rank*"):
        stamp, _, trace = path.read_text().partition("\n")
        with contextlib.suppress(ValueError):  # a rank terminated mid-write: not the first
            reports[int(path.name[len("rank"):])] = (float(stamp), trace)
    return reports


def _stop_reports(report_dir: str) -> dict[int, int]:
    """rank -> the stop signal that ended its work, for every rank that stopped on one."""
    reports = {}
    for path in Path(report_dir).glob("stop*"):
        with contextlib.suppress(ValueError):
            reports[int(path.name[len("stop"):])] = int(path.read_text())
    return reports


def _done_reports(report_dir: str) -> set[int]:
    """The ranks whose function returned."""
    return {int(path.name[len("done"):]) for path in Path(report_dir).glob("done*")}


LAUNCHER_GRACE_MARGIN_S = 2.0


class _LauncherSignals:
    """The launcher's stop-signal handlers, for the time its ranks run.

    The first SIGTERM, SIGINT or SIGHUP is forwarded to every rank and starts the grace period;
    a second one ends the grace period at once.
    """

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signum = 0
        self.deadline: Optional[float] = None
        self.processes: list = []
        self._previous: dict = {}

    def __enter__(self) -> "_LauncherSignals":
        # Python runs handlers in the main thread only; spawn() called from another thread
        # keeps the process's own handling (the ranks still stop when the process dies).
        if threading.current_thread() is threading.main_thread():
            for signum in stop.handled_signals():
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum:  # a second signal: no more waiting
            self.deadline = time.monotonic()
            return
        self.signum = signum
        # Each rank's own watchdog ends it after grace_s; this is the backstop for a rank whose
        # watchdog cannot run (a C call that never releases the GIL).
        self.deadline = time.monotonic() + self.grace_s + LAUNCHER_GRACE_MARGIN_S
        self.forward()

    def forward(self) -> None:
        for process in self.processes:
            if process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, self.signum)


class _Outcome:
    """How the ranks ended: the first that failed (index, exit code) and the ones killed."""

    def __init__(self):
        self.first_failed: Optional[tuple[int, int]] = None
        self.killed_after_grace: list[int] = []
        self.exit_codes: list[Optional[int]] = []
        # Ranks already dead by a signal when the first failure was seen (none the launcher
        # sent): the kernel's OOM killer, a user's kill -9, a crash.
        self.killed_by_signal: list[int] = []


def _watch_ranks(processes: list, signals: _LauncherSignals) -> _Outcome:
    """Waits for every rank. The first to fail takes the others with it at once (they cannot
    finish without it); after a stop signal, ranks still running past the grace period are
    killed."""
    outcome = _Outcome()
    while True:
        running = [p for p in processes if p.exitcode is None]
        if running:
            multiprocessing.connection.wait([p.sentinel for p in running], timeout=0.25)
        # Scanned after `running` was taken, so ranks that all end at once are still seen.
        for index, process in enumerate(processes):
            if process.exitcode not in (None, 0) and outcome.first_failed is None:
                outcome.first_failed = (index, process.exitcode)
                outcome.killed_by_signal = [i for i, p in enumerate(processes)
                                            if p.exitcode is not None and p.exitcode < 0]
                _kill(processes)
        if not running:
            outcome.exit_codes = [p.exitcode for p in processes]
            return outcome
        if signals.deadline is not None and time.monotonic() >= signals.deadline:
            outcome.killed_after_grace += [i for i, p in enumerate(processes)
                                           if p.exitcode is None]
            _kill(processes)


def _kill(processes: list) -> None:
    for process in processes:
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    for process in processes:
        process.join()


def launch_local(fn: Callable, devices: Sequence[torch.device], args: tuple = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S, tune_allocator: bool = True,
                 backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S) -> None:
    """Runs ``fn(ctx, *args)`` on one spawned process per device and waits for all of them.

    Tensors in ``args`` that live in shared memory are mapped, not copied, by every rank.
    If any rank fails, the others are killed and :class:`RankFailed` names it. A stop signal
    (SIGTERM, SIGINT, SIGHUP) to this process is forwarded to the ranks, which get ``grace_s``
    seconds to end (see :mod:`pyg_mgpu.distributed.stop`); then :class:`JobStopped` names it.
    ``tune_allocator=False`` leaves the ranks' memory allocator as a plain script has it (for
    baselines: see :func:`tune_cpu_allocator`). ``backend``: see :data:`BACKENDS`.
    """
    for device in devices:  # a bad backend fails here, not in every rank
        resolve_backend(backend, device)
    init_method = f"tcp://127.0.0.1:{free_port()}"
    # CLOCK_MONOTONIC is system-wide, so stamps from different ranks compare.
    report_dir = tempfile.mkdtemp(prefix="pyg_mgpu-failures-")
    # torch reads this once, at its first allocation: it must be in the ranks' starting
    # environment. A baseline runs without it (whatever this process was given), a tuned run
    # with it unless the user chose otherwise.
    thp_before = os.environ.get("THP_MEM_ALLOC_ENABLE")
    os.environ["THP_MEM_ALLOC_ENABLE"] = (thp_before or "1") if tune_allocator else "0"
    try:
        with _LauncherSignals(grace_s) as signals:
            context = mp.start_processes(
                _rank_entry, args=(fn, list(devices), init_method, timeout_s, report_dir,
                                   tune_allocator, args, backend, grace_s, os.getpid()),
                nprocs=len(devices), join=False, start_method="spawn")
            signals.processes = context.processes
            if signals.signum:  # it came while the ranks were starting
                signals.forward()
            outcome = _watch_ranks(context.processes, signals)
        _raise_for(outcome, signals.signum, report_dir, grace_s)
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
        if thp_before is None:
            os.environ.pop("THP_MEM_ALLOC_ENABLE", None)
        else:
            os.environ["THP_MEM_ALLOC_ENABLE"] = thp_before


def _raise_for(outcome: _Outcome, launcher_signal: int, report_dir: str,
               grace_s: float) -> None:
    """Turns how the ranks ended into RankFailed, JobStopped, or nothing (all finished).

    A rank that raised is reported even during a stop: its error (a full disk while writing
    the stop's checkpoint, say) is what the user must see.
    """
    reports = _failure_reports(report_dir)
    during = f" (while stopping on {stop.signal_name(launcher_signal)})" \
        if launcher_signal else ""
    killed = [i for i in outcome.killed_by_signal if i not in reports]
    if killed:  # the cause: a peer's report is then the lost connection it left behind
        index = killed[0]
        then = "".join(f"; then rank {r} failed: {reports[r][1].strip().splitlines()[-1]}"
                       for r in sorted(reports))
        raise RankFailed(_killed_message(index, outcome.exit_codes[index]) + during + then)
    if reports:  # it raised: name the earliest of the ranks that did
        rank = min(reports, key=lambda r: reports[r][0])
        raise RankFailed(f"rank {rank} failed{during}:\n{reports[rank][1]}")
    stopped = _stop_reports(report_dir)
    # Ranks whose own watchdog ended them after the grace period (exit code 128 + signal).
    overdue = {i: code - 128 for i, code in enumerate(outcome.exit_codes)
               if code is not None and code - 128 in stop.STOP_SIGNALS}
    signum = (launcher_signal or next(iter(stopped.values()), 0)
              or next(iter(overdue.values()), 0))
    if signum:
        if len(_done_reports(report_dir)) == len(outcome.exit_codes):
            # The signal came as the ranks finished: the job did all its work.
            print(f"pyg_mgpu: {stop.signal_name(signum)} arrived as the ranks finished; the "
                  "job completed", file=sys.stderr, flush=True)
            return
        raise JobStopped(signum, sorted(set(outcome.killed_after_grace) | set(overdue)),
                         grace_s)
    if outcome.first_failed is None:
        return
    index, code = outcome.first_failed
    if code < 0:
        raise RankFailed(_killed_message(index, code))
    raise RankFailed(f"rank {index} exited with code {code}")


def _killed_message(index: int, code: int) -> str:
    name = signal.Signals(-code).name
    hint = " (out of memory is a common cause of SIGKILL)" if name == "SIGKILL" else ""
    return f"rank {index} was killed by signal {name}{hint}"


def share_args(args: Sequence) -> None:
    """Moves the PyG graphs and CPU tensors in ``args`` to shared memory, in place.

    A ``Data`` gets its CSC built first, a ``HeteroData`` one per edge type
    (:func:`~pyg_mgpu.data.csc.share_data`), so ranks map one copy of the graph and its CSCs
    instead of each building their own. Other
    arguments, and tensors nested in containers, are pickled to each rank as they are.
    """
    for arg in args:
        if isinstance(arg, (Data, HeteroData)):
            share_data(arg)
        elif isinstance(arg, Tensor) and not arg.is_cuda:
            arg.share_memory_()


def spawn(fn: Callable[..., None], args: tuple = (), devices: str = "auto",
          nprocs: int | None = None, timeout_s: float | None = None,
          backend: str = "auto", grace_s: float = stop.DEFAULT_GRACE_S) -> None:
    """Runs ``fn(ctx, *args)`` on one rank per device, in a process group, and waits for them.

    ``ctx`` is a :class:`RankContext`: ``rank``, ``world_size``, ``device`` (already the
    current CUDA device on a GPU rank) and ``is_main``. The process group (NCCL on GPUs, gloo
    on CPUs) is up when ``fn`` starts and torn down when it returns or raises::

        def work(ctx, data):
            print(f"rank {ctx.rank} of {ctx.world_size} on {ctx.device}: {data}")

        if __name__ == "__main__":
            spawn(work, args=(load_dataset("cora"),))

    Run under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` set), this process
    is one rank of that job: ``fn`` runs here, on GPU ``LOCAL_RANK`` unless ``devices`` is
    ``"cpu"`` or no GPU is visible, ``nprocs`` is ignored (torchrun decides), and an
    exception from ``fn`` propagates as it is (torchrun then ends the other ranks).

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

    Raises:
        RankFailed: when a rank raises or dies; the other ranks are killed at once and
            the message names the failing rank with its traceback (or signal).
        JobStopped: when a stop signal ended the job before ``fn`` returned on every rank.
        ValueError: when ``devices`` or ``nprocs`` cannot be satisfied (the message says why).
    """
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if launched_by_torchrun():
        with torchrun_process_group(devices, timeout_s=timeout_s, backend=backend,
                                    grace_s=grace_s) as ctx:
            fn(ctx, *args)
        return
    rank_devices = resolve_devices(devices, nprocs, backend)
    share_args(args)
    launch_local(fn, rank_devices, args=tuple(args), timeout_s=timeout_s, backend=backend,
                 grace_s=grace_s)

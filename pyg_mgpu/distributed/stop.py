"""Stop signals: SIGTERM, SIGINT or SIGHUP end a job cleanly, however it was started.

Where a signal lands, and what follows:

- **The launcher** (:func:`~pyg_mgpu.distributed.launch.launch_local`) forwards it to every rank,
  gives them ``grace_s`` seconds to end, then kills those still running; a second signal kills
  them at once. The CLI's launcher handles it before and after its ranks run too
  (:class:`~pyg_mgpu.distributed.watch.LauncherSignals`): while it loads the data the signal
  ends it at once, cleanly; once the ranks have ended, the run completes.
- **A rank** records it. Code that opted in with :func:`graceful` (the trainer) finishes its
  step, agrees with the other ranks to stop (:class:`StopAgreement`), writes a checkpoint and
  raises :class:`StopSignal`. Other code gets :class:`StopSignal` at once, as it would get a
  ``KeyboardInterrupt``.
- **A rank's watchdog thread** sees the signal even while the main thread is blocked in C (a
  collective, a long kernel), because the C-level handler writes it to a pipe: the rank ends
  ``grace_s`` after the signal if it has not ended by then. The watchdog also treats the death
  of the rank's launcher as a stop signal (SIGTERM), whatever became of the parent-death signal.

The handlers are installed explicitly, so a SIGINT that the shell starting the job set to
ignored (``&``, many batch scripts) is handled like any other signal; a SIGHUP ignored by
``nohup`` stays ignored. The CLI's DataLoader workers ignore stop signals: their rank ends them
when it stops.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from pyg_mgpu.distributed.shared_rounds import open_shared_rounds
from pyg_mgpu.distributed.timeouts import DEFAULT_TIMEOUT_S

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_GRACE_S = 30.0
"""Seconds a rank has to end after a stop signal (Kubernetes' and torchrun's default wait)."""


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def stopped_exit_code(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number."""
    return 128 + signum


class StopSignal(KeyboardInterrupt):
    """A stop signal ended this rank's work.

    A ``KeyboardInterrupt``: ``except Exception`` in user code does not swallow it, and code
    that cleans up on Ctrl-C (``except KeyboardInterrupt``) does so on any stop signal.
    """

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum = signum


class _State:
    signum = 0  # the first stop signal this process received, 0 if none
    graceful = False
    raised = False  # StopSignal raised once already: a repeated signal must not interrupt cleanup
    installed = False
    previous: dict = {}  # the dispositions before install_rank_handlers, for forked children


_state = _State()


def requested() -> int:
    """The stop signal this rank received (its number), or 0."""
    return _state.signum


def _record(signum: int) -> None:
    if not _state.signum:
        _state.signum = signum


def _on_signal(signum: int, frame) -> None:
    _record(signum)
    if not _state.graceful and not _state.raised:
        # Once: a signal often arrives twice (to the process group, then forwarded by the
        # launcher), and the second must not interrupt the cleanup the first started.
        _state.raised = True
        raise StopSignal(_state.signum)


def finishing() -> None:
    """From here on a stop signal is only recorded: the process is already ending (writing
    its report), which an interruption would cut short."""
    _state.raised = True


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """Within the body a stop signal is only recorded: the body polls :func:`requested` (or a
    :class:`StopAgreement`) and stops where it can stop cleanly."""
    before = _state.graceful
    _state.graceful = True
    try:
        yield
    finally:
        _state.graceful = before


def handled_signals() -> tuple:
    """The stop signals to handle: all three, except a SIGHUP that ``nohup`` set to ignored
    (a job started that way is meant to outlive its terminal). An ignored SIGINT (``&``) is
    handled all the same."""
    return tuple(signum for signum in STOP_SIGNALS
                 if not (signum == signal.SIGHUP and
                         signal.getsignal(signum) == signal.SIG_IGN))


def start_resource_tracker() -> None:
    """Starts multiprocessing's resource tracker, which every spawned rank shares, deaf to
    hangups and quiet about what killed ranks left it to clean up.

    It ignores SIGINT and SIGTERM itself, but a SIGHUP to the job's process group (a closed
    terminal) killed it, and each rank relaunched its own with a warning and a ``KeyError``
    traceback before the job's one ``error:`` line: so it starts with SIGHUP blocked (a signal
    mask survives exec, and a SIGHUP that reaches this process meanwhile waits, blocked,
    rather than being lost). A rank killed outright (SIGKILL, or its peers killed after it
    failed) cannot unregister its semaphores (tqdm's lock, DataLoader queues); the tracker
    unlinks them when the job ends, as it should, but also warned "There appear to be N
    leaked semaphore objects" after the error line: its warnings are ignored (its
    environment's ``PYTHONWARNINGS``), not its cleanup. A no-op if it runs already.
    """
    from multiprocessing import resource_tracker

    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    before_env = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before_env, quiet]))
    try:
        with _blocked({signal.SIGHUP}):
            resource_tracker.ensure_running()  # started with this environment and mask
    finally:
        if before_env is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = before_env


@contextlib.contextmanager
def children_start_holding_sigint() -> Iterator[None]:
    """Processes started in the body begin with SIGINT blocked (a signal mask survives exec),
    until :func:`release_sigint` after their handlers exist.

    A Ctrl-C reaches the terminal's whole process group. A spawned rank that is still starting
    (importing torch, unpickling its arguments) would otherwise raise ``KeyboardInterrupt``
    there: a traceback per rank, or an abort inside a C++ import. Blocked, the signal waits,
    pending, and the rank stops on it as soon as it can handle it. This thread holds SIGINT for
    the body too, and handles a Ctrl-C that came meanwhile when the body ends: nothing is lost.
    Start the resource tracker first (:func:`start_resource_tracker`): starting it unblocks
    SIGINT in this thread.
    """
    with _blocked({signal.SIGINT}):
        yield


@contextlib.contextmanager
def _blocked(signals: set) -> Iterator[None]:
    """``signals`` blocked in this thread for the body, and in processes it starts (a signal
    mask survives exec); one that arrives meanwhile waits, pending, and is handled after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def release_sigint() -> None:
    """Delivers a SIGINT that :func:`children_start_holding_sigint` held while this process
    started (to the handlers now installed), and every later one."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def install_rank_handlers(grace_s: float = DEFAULT_GRACE_S,
                          launcher_pid: Optional[int] = None) -> None:
    """Makes this process a rank that stops on SIGTERM, SIGINT and SIGHUP, and on the death
    of ``launcher_pid`` (default: its parent when this is called; a launcher that passes its
    own pid is also watched when it died before).

    Idempotent. The handlers replace whatever the process inherited (see
    :func:`handled_signals`). Python sets handlers from the main thread only: called from
    another thread (a ``spawn`` under torchrun from a thread) it installs nothing, and the
    process keeps its own signal handling.
    """
    if _state.installed or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for fd in (read_fd, write_fd):
        os.set_inheritable(fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in handled_signals():
        _state.previous[signum] = signal.signal(signum, _on_signal)
    launcher_pid = os.getppid() if launcher_pid is None else launcher_pid
    threading.Thread(target=_watchdog, args=(read_fd, launcher_pid, grace_s),
                     name="pyg_mgpu-stop-watchdog", daemon=True).start()
    os.register_at_fork(after_in_child=_forked_child)
    _state.installed = True


def _watchdog(read_fd: int, parent_pid: int, grace_s: float) -> None:
    """Ends the rank ``grace_s`` after its first stop signal; turns the launcher's death into
    a SIGTERM."""
    deadline: Optional[float] = None
    while True:
        wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        ready, _, _ = select.select([read_fd], [], [], wait)
        if ready:  # the C handler wrote each caught signal's number as one byte
            for signum in os.read(read_fd, 64):
                if signum in STOP_SIGNALS:
                    _record(signum)
        if deadline is None and not _state.signum and os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)  # through the handler: the main thread sees it
            continue
        if deadline is None and _state.signum:
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() >= deadline:
            print(f"pyg_mgpu: process {os.getpid()} did not end within {grace_s:g}s of "
                  f"{signal_name(_state.signum)} (grace_s, --grace-s on the command line); "
                  "ending it now", file=sys.stderr, flush=True)
            os._exit(stopped_exit_code(_state.signum))


def _forked_child() -> None:
    """A forked child (a DataLoader worker, a helper) is not a rank: it gets the signal handling
    the rank had before :func:`install_rank_handlers`, and writes to no watchdog's pipe.
    (DataLoader workers of the CLI's loaders then ignore stop signals: their rank ends them.)"""
    with contextlib.suppress(ValueError):  # not the main thread: nothing was inherited there
        signal.set_wakeup_fd(-1)
        for signum, handler in _state.previous.items():
            signal.signal(signum, handler)
    _state.installed = False


@dataclass(frozen=True)
class Decision:
    """What every rank agreed on at one step: stop (the signal's number, or 0) and whether a
    timed checkpoint is due."""

    stop: int = 0
    checkpoint: bool = False


class StopAgreement:
    """Lets every rank stop, or checkpoint, at the same step.

    Each step sends this rank's flags (its stop signal, a timed checkpoint due) and reads the
    result of the previous step's exchange: every rank reads the same result at the same step,
    so no rank leaves the others waiting in a gradient all-reduce, and no step waits for the
    exchange (on a GPU rank it never touches the device). The flags go through shared memory
    where the ranks share a machine (:mod:`~pyg_mgpu.distributed.shared_rounds`), else in one
    small asynchronous all-reduce on a gloo group of its own. A collective: every rank creates
    one, in the same order. ``timeout_s``: how long a rank waits for the others' flags, as
    the process group's collectives do.
    """

    def __init__(self, checkpoint_every_s: Optional[float] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.checkpoint_every_s = checkpoint_every_s
        self._last_checkpoint = time.monotonic()
        self._rounds = open_shared_rounds(2, torch.int64, self.group, timeout_s)
        self._pending: Optional[tuple] = None

    def _send(self) -> None:
        due = (self.checkpoint_every_s is not None and
               time.monotonic() - self._last_checkpoint >= self.checkpoint_every_s)
        if self._rounds is not None:
            slot = self._rounds.slot()
            slot[0], slot[1] = requested(), int(due)
            self._rounds.post()
            self._pending = (None, None)
            return
        flags = torch.tensor([requested(), int(due)], dtype=torch.int64)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, flags)

    def _collect(self) -> Decision:
        if self._pending is None:
            return Decision()
        work, flags = self._pending
        self._pending = None
        if work is None:
            flags = self._rounds.wait().amax(0)
        else:
            work.wait()
        decision = Decision(stop=int(flags[0]), checkpoint=bool(flags[1]))
        if decision.checkpoint:  # every rank resets its clock at the same step
            self.checkpoint_written()
        return decision

    def after_step(self) -> Decision:
        """The previous step's agreement; sends this step's flags."""
        decision = self._collect()
        self._send()
        return decision

    def now(self) -> Decision:
        """Agrees on the flags as they are now (blocking), e.g. between epochs."""
        self._collect()  # flags are sticky: the fresh exchange says at least as much
        self._send()
        return self._collect()

    def checkpoint_written(self) -> None:
        self._last_checkpoint = time.monotonic()

    def close(self) -> None:
        """Waits for a gloo exchange in flight, so none is left when the group goes."""
        if self._pending is not None:
            if self._pending[0] is not None:
                self._pending[0].wait()
            self._pending = None

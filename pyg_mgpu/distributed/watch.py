"""The launcher's side of a running job: stop signals forwarded to the ranks, the ranks watched
until all have ended or one failed, and the outcome turned into :class:`RankFailed` or
:class:`JobStopped`."""
from __future__ import annotations

import contextlib
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from typing import Optional

from pyg_mgpu.distributed import stop
from pyg_mgpu.distributed.context import JobStopped, RankFailed
from pyg_mgpu.distributed.reports import done_reports, failure_reports, stop_reports

LAUNCHER_GRACE_MARGIN_S = 2.0
# The same signal again this soon is one stop delivered twice, not a second one: GNU timeout
# signals its child, then the child's whole process group.
REPEAT_WINDOW_S = 0.5


class StoppedBeforeRanks(JobStopped):
    """A stop signal reached the launcher before it started any rank (while it loaded the data):
    nothing trained, so there is no checkpoint to name."""


class LauncherSignals:
    """The launcher's stop-signal handlers (SIGTERM, SIGINT and SIGHUP, see
    :func:`~pyg_mgpu.distributed.stop.handled_signals`), for as long as it is entered.

    ``raising``: until :meth:`start_forwarding` (no rank exists yet), the first signal raises
    :class:`StoppedBeforeRanks` where the launcher is, as Ctrl-C raises ``KeyboardInterrupt``,
    so that its cleanup runs (a run folder made for the run, the graph's ``/dev/shm`` copy,
    which ``finally`` blocks and exit handlers delete); later ones are only recorded, so they
    cannot cut that cleanup short.

    Forwarding (from the start without ``raising``): the first signal is forwarded to every rank
    and starts the grace period; a second one (not the first delivered again, see
    :data:`REPEAT_WINDOW_S`) ends the grace period at once. Once the ranks have ended
    (:meth:`ranks_ended`), a signal finds none to stop: it is recorded for the caller
    (:meth:`after_ranks`), which finishes its work and says so.
    """

    def __init__(self, grace_s: float, *, raising: bool = False):
        self.grace_s = grace_s
        self.raising = raising
        self.signum = 0
        self.signalled_at: Optional[float] = None
        self.deadline: Optional[float] = None
        self.processes: list = []
        self._previous: dict = {}
        self._answered: Optional[int] = None  # the signal the ranks' outcome answered for

    def __enter__(self) -> "LauncherSignals":
        # Python runs handlers in the main thread only; spawn() called from another thread
        # keeps the process's own handling (the ranks still stop when the process dies).
        if threading.current_thread() is threading.main_thread():
            for signum in stop.handled_signals():
                self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum:
            if signum != self.signum or now - self.signalled_at > REPEAT_WINDOW_S:
                self.deadline = now  # a second signal: no more waiting
            return
        self.signum, self.signalled_at = signum, now
        # Each rank's own watchdog ends it after grace_s; this is the backstop for a rank whose
        # watchdog cannot run (a C call that never releases the GIL).
        self.deadline = now + self.grace_s + LAUNCHER_GRACE_MARGIN_S
        if self.raising:
            raise StoppedBeforeRanks(signum)
        self.forward()

    def start_forwarding(self) -> None:
        """From here on the ranks start: a signal is forwarded to them, not raised here."""
        self.raising = False

    def forward(self) -> None:
        for process in self.processes:
            if process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, self.signum)

    def ranks_ended(self) -> int:
        """The stop signal that the ranks' outcome answers for (0: none); one that comes later
        is the caller's to report (:meth:`after_ranks`)."""
        self._answered = self.signum
        return self._answered

    def after_ranks(self) -> int:
        """A stop signal that came after every rank had ended (0: none)."""
        return self.signum if self._answered == 0 else 0


class Outcome:
    """How the ranks ended: the first that failed (index, exit code) and the ones killed."""

    def __init__(self):
        self.first_failed: Optional[tuple[int, int]] = None
        self.killed_after_grace: list[int] = []
        self.exit_codes: list[Optional[int]] = []
        self.waited_s: Optional[float] = None  # from the stop signal to killing the rest
        # Ranks already dead by a signal when the first failure was seen (none the launcher
        # sent): the kernel's OOM killer, a user's kill -9, a crash.
        self.killed_by_signal: list[int] = []


def watch_ranks(processes: list, signals: LauncherSignals) -> Outcome:
    """Waits for every rank. The first to fail takes the others with it at once (they cannot
    finish without it); after a stop signal, ranks still running past the grace period are
    killed."""
    outcome = Outcome()
    while True:
        running = [p for p in processes if p.exitcode is None]
        if running:
            multiprocessing.connection.wait([p.sentinel for p in running], timeout=0.25)
        # Scanned after `running` was taken, so ranks that all end at once are still seen.
        for index, process in enumerate(processes):
            if (process.exitcode not in (None, 0, *stop_exit_codes(signals.signum))
                    and index not in outcome.killed_after_grace  # killed here: stopped
                    and outcome.first_failed is None):
                outcome.first_failed = (index, process.exitcode)
                outcome.killed_by_signal = [i for i, p in enumerate(processes)
                                            if p.exitcode is not None and p.exitcode < 0]
                kill(processes)
        if not running:
            outcome.exit_codes = [p.exitcode for p in processes]
            return outcome
        if signals.deadline is not None and time.monotonic() >= signals.deadline:
            outcome.killed_after_grace += [i for i, p in enumerate(processes)
                                           if p.exitcode is None]
            outcome.waited_s = time.monotonic() - (signals.signalled_at or time.monotonic())
            kill(processes)


def stopped_by(signum: int) -> Optional[int]:
    """The exit code of a rank that the launcher's stop signal ended before (still importing)
    or after (exiting) its handler: a stop, not a failure. None without a signal."""
    return -signum if signum else None


def stop_exit_codes(signum: int) -> tuple:
    """The exit codes of a rank that the launcher's stop signal ended: by the signal itself
    (:func:`stopped_by`), or by the rank's own watchdog at the end of the grace period
    (128 + the signal). Neither is a failure that should end the other ranks at once: they
    have until the launcher's own deadline, and those still running then are named as killed.
    Empty without a signal."""
    return (-signum, stop.stopped_exit_code(signum)) if signum else ()


def kill(processes: list) -> None:
    for process in processes:
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    for process in processes:
        process.join()


def raise_for(outcome: Outcome, launcher_signal: int, report_dir: str,
               grace_s: float) -> None:
    """Turns how the ranks ended into RankFailed, JobStopped, or nothing (all finished).

    A rank that raised is reported even during a stop: its error (a full disk while writing
    the stop's checkpoint, say) is what the user must see.
    """
    reports = failure_reports(report_dir)
    abnormal = [i for i, code in enumerate(outcome.exit_codes) if code not in (0, None)]
    if (abnormal and not reports and not launcher_signal
            and len(done_reports(report_dir)) == len(outcome.exit_codes)):
        # Every rank's function returned and reported it: the job did all its work. A crash
        # after that, in a library's teardown at interpreter exit, loses nothing.
        endings = ", ".join(f"rank {i} {_ending(outcome.exit_codes[i])}" for i in abnormal)
        print(f"pyg_mgpu: every rank finished its work; then, while exiting, {endings}",
              file=sys.stderr, flush=True)
        return
    during = (f" (while stopping on {stop.signal_name(launcher_signal)})"
              if launcher_signal else "")
    # Ended by the very signal the launcher forwarded: stopped, not failed (see stopped_by).
    killed = [i for i in outcome.killed_by_signal if i not in reports
              and outcome.exit_codes[i] != stopped_by(launcher_signal)]
    # Exited with code 0 with no report: its function neither returned, raised nor stopped
    # (os._exit(0), a library that ends the process). Not a success; like a killed rank, the
    # cause of its peers' lost connections. (During the launcher's stop, a rank interrupted
    # before its function ran exits 0 too: torch's wrapper swallows the interrupt.)
    accounted = reports.keys() | done_reports(report_dir) | stop_reports(report_dir).keys()
    vanished = [] if launcher_signal else [i for i, code in enumerate(outcome.exit_codes)
                                           if code == 0 and i not in accounted]
    lost = killed or vanished
    if lost:  # the cause: a peer's report is then the lost connection it left behind
        index = lost[0]
        then = "".join(f"; then rank {r} failed: {reports[r][1].strip().splitlines()[-1]}"
                       for r in sorted(reports))
        cause = (_killed_message(index, outcome.exit_codes[index]) if killed else
                 f"rank {index} exited with code 0 before its function returned (os._exit, "
                 "or a library that ends the process)")
        raise RankFailed(cause + during + then)
    if reports:  # it raised: name the earliest of the ranks that did
        rank = min(reports, key=lambda r: reports[r][0])
        raise RankFailed(f"rank {rank} failed{during}:\n{reports[rank][1]}")
    stopped = stop_reports(report_dir)
    # Ranks whose own watchdog ended them after the grace period (exit code 128 + signal).
    overdue = {i: code - 128 for i, code in enumerate(outcome.exit_codes)
               if code is not None and code - 128 in stop.STOP_SIGNALS}
    signum = (launcher_signal or next(iter(stopped.values()), 0)
              or next(iter(overdue.values()), 0))
    if signum:
        if len(done_reports(report_dir)) == len(outcome.exit_codes):
            report_completed(signum)  # the signal came as the ranks finished
            return
        waited = grace_s if outcome.waited_s is None else min(grace_s, outcome.waited_s)
        raise JobStopped(signum, sorted(set(outcome.killed_after_grace) | set(overdue)),
                         round(waited, 1))
    if outcome.first_failed is None:
        return
    index, code = outcome.first_failed
    if code < 0:
        raise RankFailed(_killed_message(index, code))
    raise RankFailed(f"rank {index} exited with code {code}")


def report_completed(signum: int) -> None:
    """Says that a stop signal came too late to stop anything: the job did all its work."""
    print(f"pyg_mgpu: {stop.signal_name(signum)} arrived as the ranks finished; the job "
          "completed", file=sys.stderr, flush=True)


def _killed_message(index: int, code: int) -> str:
    name = signal.Signals(-code).name
    hint = " (out of memory is a common cause of SIGKILL)" if name == "SIGKILL" else ""
    return f"rank {index} was killed by signal {name}{hint}"


def _ending(code: int) -> str:
    return (f"was killed by signal {signal.Signals(-code).name}" if code < 0
            else f"exited with code {code}")

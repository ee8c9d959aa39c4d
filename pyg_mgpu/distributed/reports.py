"""How a spawned rank tells the launcher how it ended: a file per rank in a report folder
(``done<rank>``, ``stop<rank>`` with the signal, ``rank<rank>`` with the traceback, stamped
with a system-wide monotonic clock so the earliest failure is named)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Iterator

from pyg_mgpu.distributed import stop
from pyg_mgpu.distributed.host import exit_without_teardown, flush_output


REPORT_DIR_PREFIX = "pyg_mgpu-failures-"


def new_report_dir() -> str:
    """A new report folder, named after this launcher's pid.

    A job killed outright (SIGKILL to its whole process group) cannot remove its folder, so
    each launch first removes the folders of launchers that no longer exist.
    """
    for path in Path(tempfile.gettempdir()).glob(f"{REPORT_DIR_PREFIX}*-*"):
        try:
            os.kill(int(path.name[len(REPORT_DIR_PREFIX):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (ValueError, PermissionError):  # not named by a pid, or another user's job
            pass
    return tempfile.mkdtemp(prefix=f"{REPORT_DIR_PREFIX}{os.getpid()}-")


@contextlib.contextmanager
def reported(report_dir: str, rank: int) -> Iterator[None]:
    """Reports a stop (stopped, not failed: the parent reports the signal and the trainer's
    checkpoint instead of a traceback) or a failure of the body, for the launcher."""
    try:
        yield
    except stop.StopSignal as e:
        report_stop(report_dir, rank, e.signum)
    except BaseException:
        report_failure_and_exit(report_dir, rank)


def report_stop(report_dir: str, rank: int, signum: int) -> None:
    stop.finishing()
    Path(report_dir, f"stop{rank}").write_text(str(signum))


def report_failure_and_exit(report_dir: str, rank: int) -> None:
    """Writes the traceback being handled, stamped, and ends the process at once.

    The stamp lets the parent name the earliest failure (the cause), not whichever rank
    happened to exit first. A graceful teardown (leaving the group, finalizing the
    interpreter) can block until a peer's collective times out, which is minutes. Exiting
    closes this rank's connections, so a peer blocked in a collective fails too, strictly
    after this report.
    """
    stop.finishing()  # a stop signal now must not cut the report short
    Path(report_dir, f"rank{rank}").write_text(f"{time.monotonic()!r}\n{traceback.format_exc()}")
    flush_output()
    os._exit(1)


def exit_stopped() -> None:
    """Ends a rank that stopped on a signal, once its report is written, without the
    interpreter's teardown (:func:`~pyg_mgpu.distributed.host.exit_without_teardown`): ranks
    sharing few cores would pay it one after another between the stop and the end of the
    job."""
    stop.finishing()
    exit_without_teardown(0)


def failure_reports(report_dir: str) -> dict[int, tuple[float, str]]:
    """rank -> (monotonic stamp, traceback) of every rank that reported a failure."""
    reports = {}
    for path in Path(report_dir).glob("rank*"):
        stamp, _, trace = path.read_text().partition("\n")
        with contextlib.suppress(ValueError):  # a rank terminated mid-write: not the first
            reports[int(path.name[len("rank"):])] = (float(stamp), trace)
    return reports


def stop_reports(report_dir: str) -> dict[int, int]:
    """rank -> the stop signal that ended its work, for every rank that stopped on one."""
    reports = {}
    for path in Path(report_dir).glob("stop*"):
        with contextlib.suppress(ValueError):
            reports[int(path.name[len("stop"):])] = int(path.read_text())
    return reports


def done_reports(report_dir: str) -> set[int]:
    """The ranks whose function returned."""
    return {int(path.name[len("done"):]) for path in Path(report_dir).glob("done*")}

"""Rank functions for the stop-signal tests (module level, so spawned ranks import them)."""
import os
import signal
import sys
import time

from pyg_mgpu.distributed import stop


def agree_on_a_stop(ctx, signal_at_step, steps_out, shared=True):
    """Rank 1 gets SIGTERM during step ``signal_at_step``; both ranks record the step at which
    the agreement told them to stop. ``shared=False``: rank 1 cannot map the shared segment,
    so the flags go through gloo."""
    if not shared:
        from _ranks import elsewhere
        elsewhere(ctx, 1, "cannot map")
    agreement = stop.StopAgreement()
    assert (agreement._rounds is not None) == shared
    with stop.graceful():
        for step in range(1, 1000):
            if ctx.rank == 1 and step == signal_at_step:
                os.kill(os.getpid(), signal.SIGTERM)
            if agreement.after_step().stop:
                steps_out[ctx.rank] = step
                break
    agreement.close()


def sleep_until_stopped(ctx):
    """A user's rank function that never polls: the signal interrupts it."""
    print(f"rank {ctx.rank} ready", flush=True)
    while True:
        time.sleep(0.05)


def ignore_the_stop(ctx):
    """Opts into graceful stops, then never looks: the grace period must end it."""
    with stop.graceful():
        print(f"rank {ctx.rank} ready (pid {os.getpid()})", flush=True)
        while True:
            time.sleep(0.05)


class SlowToStart:
    """An argument whose unpickling takes ``seconds``: a rank receives it before its stop
    handlers are installed, as a rank still importing a large library would."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __reduce__(self):
        return _arrive_after, (self.seconds,)


def _arrive_after(seconds: float) -> "SlowToStart":
    print("rank starting", flush=True)
    time.sleep(seconds)
    return SlowToStart(seconds)


def start_slowly(ctx, slow, *payload):
    sleep_until_stopped(ctx)


if __name__ == "__main__":  # the launcher as a user's script runs it
    from pyg_mgpu.distributed.context import JobStopped
    from pyg_mgpu.distributed.launch import spawn

    target = {"sleep": sleep_until_stopped, "ignore": ignore_the_stop,
              "slow_start": start_slowly}[sys.argv[1]]
    start_s = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    # "big": 4 MiB more behind the slow argument, more than a pipe holds, so the launcher is
    # still writing a rank's arguments (starting the ranks) while that rank unpickles slowly.
    payload = (bytes(4 << 20),) if "big" in sys.argv[4:] else ()
    args = (SlowToStart(start_s), *payload) if target is start_slowly else ()
    try:
        spawn(target, args=args, devices="cpu", nprocs=2, grace_s=float(sys.argv[2]))
    except JobStopped as e:
        print(f"JobStopped: {e}", flush=True)
        sys.exit(stop.stopped_exit_code(e.signum))

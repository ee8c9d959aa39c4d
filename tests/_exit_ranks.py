"""A rank function for the exit tests, in a module that imports nothing heavy: its ranks start
in the time torch takes to import."""
import atexit
from pathlib import Path


class _MarksTeardown:
    """Writes ``finalized`` into ``path`` when the interpreter's teardown finalizes it (the
    file is opened now: while modules are torn down, their globals may be gone)."""

    def __init__(self, path):
        self.file = open(path, "w")

    def __del__(self):
        self.file.write("finalized")
        self.file.close()


_kept_to_the_end = []  # a module global: only the interpreter's teardown finalizes it


def mark_exit_and_teardown(ctx, folder):
    """Leaves a file from the rank's exit handlers and one from its interpreter's teardown."""
    atexit.register(Path(folder, f"atexit{ctx.rank}").touch)
    _kept_to_the_end.append(_MarksTeardown(Path(folder, f"teardown{ctx.rank}")))

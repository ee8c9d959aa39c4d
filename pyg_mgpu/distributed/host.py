"""A rank's share of the host: torch threads per rank, glibc's allocator kept from returning
large blocks to the kernel between steps, and a process's exit without the interpreter's
teardown."""
from __future__ import annotations

import atexit
import ctypes
import gc
import os
import sys
import threading
from typing import Callable, NoReturn


def usable_cores() -> int:
    """Cores this process may run on (CPU affinity: Slurm, taskset), not all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def set_thread_budget(world_size_on_node: int) -> int:
    """Gives each rank its share of the cores, so ranks do not oversubscribe them."""
    import torch  # here: the commands end through this module, and a --help never loads torch

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


def exit_without_teardown(code: int) -> NoReturn:
    """Ends this process as the interpreter's exit would, less its teardown of every module.

    Its threads' shutdown hooks run and the threads that are not daemons are waited for (an
    idle ``ThreadPoolExecutor``'s workers, inductor's compile pool among them, quit on those
    hooks: a plain join would wait for them forever), its exit handlers run (``atexit``:
    multiprocessing's, logging's, ``weakref.finalize``'s, a library's) and its output is
    flushed. What is skipped: with torch and PyG loaded, finalizing the modules is a garbage
    collection over millions of objects, 1.5 s of CPU here (2026-12-02, 2 cores), paid by a
    job's parent and by each rank after the work is done. Only for code that leaves nothing to
    that teardown: an object that flushes a file in its ``__del__`` would not be finalized.
    """
    threading._shutdown()  # the interpreter's own first step of its exit, hooks then joins
    atexit._run_exitfuncs()
    if not flush_output():
        code = code or 120  # CPython's own exit code when its final flush fails
    os._exit(code)


def flush_output() -> bool:
    """Flushes stdout and stderr before an ``os._exit``; False if one could not be written.

    A stream is None when the process started with it closed (``>&-``), and a flush fails on
    a pipe whose reader has gone (``| head``): neither may stop the exit that follows.
    """
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            flushed = False
    return flushed

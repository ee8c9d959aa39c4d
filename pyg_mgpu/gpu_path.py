"""Which branch code takes where the GPU and the CPU differ: :func:`takes_gpu_path`.

Some steps have a GPU form that avoids a host read (a binary search instead of ``bincount``)
and a CPU form that is faster there. Counting a GPU step's kernels and host reads on the CPU
(``python -m pyg_mgpu.bench --step-costs``) must follow the GPU forms: inside
:func:`counting_gpu_path`, every tensor takes them.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import torch
from torch import Tensor

_counting = False
_host_work = threading.local()  # .active inside host_work, per thread
_read_hooks: list[Callable[[], None]] = []  # told of every host_ints read (step counting)


def takes_gpu_path(tensor: Tensor) -> bool:
    """Whether code working on ``tensor`` takes its GPU form."""
    return _counting or tensor.is_cuda


@contextlib.contextmanager
def counting_gpu_path() -> Iterator[None]:
    """Every tensor takes the GPU forms inside (for counting a GPU step on the CPU)."""
    global _counting
    before, _counting = _counting, True
    try:
        yield
    finally:
        _counting = before


@contextlib.contextmanager
def host_work() -> Iterator[None]:
    """Marks ops that run on host tensors on a GPU too (work the host does before it copies
    the result over): they launch no kernel, and the step counter leaves them out."""
    before = on_host()
    _host_work.active = True
    try:
        yield
    finally:
        _host_work.active = before


def on_host() -> bool:
    """Whether this thread's current ops are :func:`host_work`."""
    return getattr(_host_work, "active", False)


def host_ints(values: Tensor) -> list[int]:
    """The values of a small integer tensor, read to the host at once: on a GPU, one wait
    for the work queued before it, however many values. The code reads sizes that the host
    needs (an output's length) this way, gathered into as few reads as it can."""
    for hook in _read_hooks:
        hook()
    return values.tolist()


@contextlib.contextmanager
def reading_hook(hook: Callable[[], None]) -> Iterator[None]:
    """Calls ``hook`` at every :func:`host_ints` read inside (a tensor's ``tolist`` is no
    aten op that a dispatch mode would see)."""
    _read_hooks.append(hook)
    try:
        yield
    finally:
        _read_hooks.remove(hook)


def positions_of(mask: Tensor, count: int) -> Tensor:
    """The positions of ``mask``'s ``count`` True entries, in order. ``nonzero`` reads the
    count back from the GPU; on the GPU's path the count is given and a search over the
    running count finds the positions without that wait."""
    if not takes_gpu_path(mask):
        return mask.nonzero().squeeze(1)
    running = torch.cumsum(mask, 0)
    return torch.searchsorted(running, iota(count + 1, mask.device)[1:])


def to_device(values, device: torch.device, dtype: torch.dtype = torch.long) -> Tensor:
    """``values`` (host ints, or a tensor) as ``dtype`` on ``device``, without making the host
    wait: a copy from pageable host memory to a GPU waits for the work queued on its stream,
    so a host tensor bound for a GPU goes through pinned memory, asynchronously."""
    tensor = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype)
    tensor = tensor.to(dtype)
    if torch.device(device).type != "cuda" or tensor.is_cuda:
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


_IOTA: dict = {}  # (device, dtype) -> 0, 1, 2, ..., grown as needed
_IOTA_OUTGROWN: list = []  # never freed: see iota
_IOTA_GROWING = threading.Lock()  # the loader's thread and the training thread both grow it


def iota(size: int, device: torch.device, dtype: torch.dtype = torch.long) -> Tensor:
    """``torch.arange(size, dtype=dtype)`` on ``device`` as a view of one kept tensor: no
    kernel per call.

    The kept tensor only grows, and an outgrown one is never freed: the loader's thread and
    the training thread read them on different CUDA streams, and a freed block could be
    handed to one stream while the other still reads it. On a GPU a new one is written before
    this returns, so no stream reads it unwritten. The memory stays bounded: each growth at
    least doubles, so the outgrown ones add up to less than the kept one, itself at most
    twice the largest ``size`` asked for (per device and dtype: under 4 x 8 bytes per element
    of the largest walk's output for int64).
    """
    device = torch.device(device)
    kept = _IOTA.get((device, dtype))
    if kept is None or kept.numel() < size:
        with _IOTA_GROWING:
            kept = _IOTA.get((device, dtype))  # another thread may have grown it
            if kept is None or kept.numel() < size:
                # Made inside a capture, it would be written only when the graph replays.
                assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), (
                    "iota grew inside a CUDA graph capture: warm up at the captured sizes first")
                if kept is not None:
                    _IOTA_OUTGROWN.append(kept)
                kept = torch.arange(max(size, 2 * (0 if kept is None else kept.numel()), 1024),
                                    dtype=dtype, device=device)
                if device.type == "cuda":  # this stream only: not a wait on the whole device
                    torch.cuda.current_stream(device).synchronize()
                _IOTA[device, dtype] = kept
    return kept[:size]

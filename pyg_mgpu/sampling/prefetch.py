"""The next batch for the training loop: loaded when asked (depth 0), or prepared in a
background thread while the current one trains (depth 1 or more).

Either way the :class:`Prefetcher` records, for a checkpoint, the sampler's state from before
the batch it hands out was drawn, and times the loading on the loop's stage clock.

The loader's work per batch (sampling, gathering features, and on a GPU rank the copy to the
device) runs in one thread of the rank's own process, ``depth`` batches ahead. Unlike DataLoader
workers it needs no second process and no pickling of each batch: torch kernels release the GIL.
It pays off where loading and training use different hardware (CPU sampling feeding a GPU) or
spare cores; where every core already trains, the thread only takes turns with training, so
CPU ranks leave it off by default (measurements in docs/architecture.md).

On a GPU, the copy runs on a side CUDA stream, which first waits for the work already queued on
the training stream; the training stream waits only for that batch's copy (an event), and the
batch's memory is marked as used by the training stream so the caching allocator never hands it
back early.
"""
from __future__ import annotations

import contextlib
import functools
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class Prefetcher:
    """The batches of ``batches`` on ``device``, one per :meth:`next` call.

    ``depth`` 0 loads each batch when it is asked for, in this thread. ``depth`` 1 or more
    prepares them in a daemon thread, up to ``depth`` waiting in a queue while the thread
    prepares one more; exceptions in the thread re-raise here at the batch that failed, and
    leaving the loop early stops the thread at its next batch (use it as a context manager or
    call :meth:`close`).

    Args:
        snapshot: Called before each batch is drawn (the sampler's generator state);
            :attr:`last_snapshot` is the value that came with the batch handed out last, which
            a resumed run restores to draw the next batch again.
        timer: The loop's stage clock (``add(stage, seconds)``, ``lap(stage)``): loading is
            timed as ``load`` (the wait for the batch), or, at depth 0 with
            ``sampling_clock``, as ``sample`` plus ``gather``.
        sampling_clock: Seconds this thread has spent sampling so far (the sampler's own
            clock), when the sampler runs in this thread.
    """

    def __init__(self, batches: Iterable, device: torch.device, depth: int = 1,
                 snapshot: Optional[Callable[[], Any]] = None, timer: Any = None,
                 sampling_clock: Optional[Callable[[], float]] = None):
        if depth < 0:
            raise ValueError(f"depth must be at least 0, got {depth}.")
        self.device, self.depth = device, depth
        self._snapshot = snapshot
        self.last_snapshot: Any = None
        self._timer, self._sampling_clock = timer, sampling_clock
        self._thread: Optional[threading.Thread] = None
        if depth == 0:
            self._batches = iter(batches)
            return
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._loading = threading.Lock()  # held by the thread while it prepares a batch
        self._stream = _side_stream(device) if device.type == "cuda" else None
        if self._stream is not None:
            # What the side stream reads (the graph, the feature cache's rows) may still be
            # being written on this thread's stream: its first batch waits for that work.
            self._stream.wait_stream(torch.cuda.current_stream(device))
        self._thread = threading.Thread(target=self._produce, args=(iter(batches),),
                                        name="pyg_mgpu-prefetch", daemon=True)
        self._thread.start()
        self._consumed = self._consume()

    def next(self) -> Any:
        """The next batch on ``device``, or None after the last."""
        if self.depth == 0:
            if self._snapshot is not None:
                self.last_snapshot = self._snapshot()
            sampled_before = self._sampling_clock() if self._sampling_clock else None
            batch = next(self._batches, None)
            if batch is not None:
                batch = batch.to(self.device, non_blocking=True)
            if self._timer is not None:
                if sampled_before is not None:
                    self._timer.add("sample", self._sampling_clock() - sampled_before)
                self._timer.lap("gather" if sampled_before is not None else "load")
            return batch
        batch = next(self._consumed, None)
        if self._timer is not None:
            self._timer.lap("load")
        return batch

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No batch is being prepared inside this block: it waits for the one in progress and
        keeps the thread from starting the next. A CUDA graph is captured inside it, since no
        other thread may issue CUDA work (or wait on the device) during a capture."""
        if self._thread is None:
            yield
            return
        with self._loading:
            yield

    def __iter__(self) -> Iterator:
        while True:
            batch = self.next()
            if batch is None:
                return
            yield batch

    def _produce(self, batches: Iterator) -> None:
        try:
            if self._stream is not None:
                # A new thread starts on GPU 0: without this, every rank would open a CUDA
                # context there (as DataLoader's pin-memory thread also does).
                torch.cuda.set_device(self.device)
            while True:
                with self._loading:
                    snapshot = self._snapshot() if self._snapshot is not None else None
                    item = self._next_on_device(batches)
                if item is None:
                    self._put((_DONE, snapshot))
                    return
                if not self._put((item, snapshot)):
                    return
        except BaseException as error:  # handed to the consumer, which re-raises it
            self._put(_Failure(error))

    def _next_on_device(self, batches: Iterator) -> Any:
        """The next batch on the device and the event marking it ready; None at the end."""
        if self._stream is None:
            batch = next(batches, None)
            return None if batch is None else (batch.to(self.device), None)
        # Everything for this batch goes on the side stream: sampling when the graph is on the
        # GPU, the feature cache's gather, the copy. (The current stream is per thread.)
        with torch.cuda.stream(self._stream):
            batch = next(batches, None)
            if batch is None:
                return None
            moved = batch.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return moved, ready

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _consume(self) -> Iterator:
        while True:
            item = self._queue.get()
            if isinstance(item, _Failure):
                raise item.error
            item, self.last_snapshot = item
            if item is _DONE:
                return
            batch, ready = item
            if ready is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(ready)
                batch.record_stream(stream)  # made on the side stream, used on this one
            yield batch

    def close(self) -> None:
        """Stops the thread after the batch it is preparing (a daemon: never blocks exit)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=60)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    """One side stream per device for the rank's lifetime: every epoch's loading (and the
    sampler's scratch buffers) stays ordered on the same stream."""
    return torch.cuda.Stream(device)

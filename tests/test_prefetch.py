"""The background prefetcher: same batches in the same order, errors surface, early exit stops it."""
import threading

import pytest
import torch
from torch_geometric.data import Data

from pyg_mgpu.sampling.prefetch import Prefetcher

CPU = torch.device("cpu")


def batches(n):
    for i in range(n):
        yield Data(x=torch.full((3, 2), float(i)), batch_size=3)


def test_yields_every_batch_in_order():
    with Prefetcher(batches(7), CPU, depth=2) as prefetcher:
        got = [int(b.x[0, 0]) for b in prefetcher]
    assert got == list(range(7))


def test_runs_ahead_in_another_thread():
    seen, second_drawn = [], threading.Event()

    def recording(n):
        for b in batches(n):
            seen.append(threading.current_thread().name)
            if len(seen) == 2:
                second_drawn.set()
            yield b
    with Prefetcher(recording(3), CPU, depth=1) as prefetcher:
        # Nothing consumed yet: one batch queued, the next one in hand, and no third drawn.
        assert second_drawn.wait(5)
        assert len(seen) == 2
        assert list(prefetcher) and len(seen) == 3
    assert set(seen) == {"pyg_mgpu-prefetch"}


# How long a test waits for what must not happen: a correct prefetcher never does it, so a
# slow machine can only let a broken one pass, never fail a correct one.
QUIET_S = 0.1


def test_no_batch_is_prepared_while_paused():
    # A CUDA graph is captured inside paused(): the loader's thread must not work meanwhile.
    started = [threading.Event() for _ in range(4)]
    finish_first = threading.Event()

    def gated(n):  # batch 0 waits to be let finish
        for i, b in enumerate(batches(n)):
            started[i].set()
            if i == 0 and not finish_first.wait(5):
                raise TimeoutError("batch 0 was never let finish")
            yield b
    entered, leave = threading.Event(), threading.Event()

    def pause(prefetcher):
        with prefetcher.paused():
            entered.set()
            leave.wait(5)
    with Prefetcher(gated(4), CPU, depth=1) as prefetcher:
        assert started[0].wait(5)
        pausing = threading.Thread(target=pause, args=(prefetcher,))
        pausing.start()
        assert not entered.wait(QUIET_S), "paused() did not wait for the batch in progress"
        finish_first.set()
        assert entered.wait(5)
        begun = sum(event.is_set() for event in started)  # batch 1 may precede the pause
        # Taking a batch makes room in the queue: the thread's next step would be the next batch.
        got = [int(prefetcher.next().x[0, 0])]
        assert not started[begun].wait(QUIET_S), "a batch was prepared while paused"
        leave.set()
        pausing.join(5)
        got += [int(batch.x[0, 0]) for batch in prefetcher]
    assert got == [0, 1, 2, 3]


def test_an_error_while_loading_reaches_the_training_loop():
    def failing():
        yield from batches(2)
        raise RuntimeError("sampler broke")
    got = []
    with pytest.raises(RuntimeError, match="sampler broke"):
        with Prefetcher(failing(), CPU) as prefetcher:
            for b in prefetcher:
                got.append(int(b.x[0, 0]))
    assert got == [0, 1]  # the batches before the failure were all delivered


def test_leaving_early_stops_the_thread():
    def endless():
        i = 0
        while True:
            yield Data(x=torch.tensor([float(i)]))
            i += 1
    prefetcher = Prefetcher(endless(), CPU, depth=2)
    for b in prefetcher:
        if float(b.x) == 3:
            break
    prefetcher.close()
    assert not prefetcher._thread.is_alive()


def test_rejects_a_negative_depth():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(batches(1), CPU, depth=-1)


class Clock:
    """A stage clock that records its calls."""

    def __init__(self):
        self.calls = []

    def add(self, stage, seconds):
        self.calls.append(("add", stage))

    def lap(self, stage):
        self.calls.append(("lap", stage))


@pytest.mark.parametrize("depth", [0, 2])
def test_snapshots_come_with_the_batch_drawn_after_them(depth):
    drawn = []

    def counting(n):
        for b in batches(n):
            drawn.append(threading.current_thread().name)
            yield b
    with Prefetcher(counting(4), CPU, depth, snapshot=lambda: len(drawn)) as prefetcher:
        got = []
        while (batch := prefetcher.next()) is not None:
            got.append((int(batch.x[0, 0]), prefetcher.last_snapshot))
    # Batch i was drawn when i batches had been drawn before it.
    assert got == [(i, i) for i in range(4)]
    in_thread = threading.current_thread().name
    assert set(drawn) == ({in_thread} if depth == 0 else {"pyg_mgpu-prefetch"})


def test_depth_0_splits_loading_into_sampling_and_gathering():
    clock, sampled = Clock(), [0.0]

    def sampling(n):
        for b in batches(n):
            sampled[0] += 1.0
            yield b
    prefetcher = Prefetcher(sampling(2), CPU, 0, timer=clock, sampling_clock=lambda: sampled[0])
    assert list(prefetcher) and len(clock.calls) == 3 * 2  # two batches and the end
    assert clock.calls[:2] == [("add", "sample"), ("lap", "gather")]
    waiting = Clock()
    assert list(Prefetcher(batches(2), CPU, 1, timer=waiting))
    assert waiting.calls == [("lap", "load")] * 3


@pytest.mark.gpu
def test_copies_to_the_gpu_on_a_side_stream():
    device = torch.device("cuda", 0)
    with Prefetcher(batches(5), device, depth=2) as prefetcher:
        got = list(prefetcher)
    assert all(b.x.is_cuda for b in got)
    assert [int(b.x[0, 0]) for b in got] == list(range(5))

"""SharedRounds: the ranks' exchange through shared memory (its rounds, double buffer and
timeout), in one process, with two ranks' views of one segment."""
import errno
import os

import pytest
import torch

from pyg_mgpu.distributed.shared_rounds import SharedRounds, _data_bytes, _header_bytes


def two_ranks(numel=3, dtype=torch.float32, timeout_s=30.0):
    size = _header_bytes(2) + _data_bytes(2, numel, dtype)
    storage = torch.zeros(size, dtype=torch.uint8)  # both "ranks" see the same bytes
    return [SharedRounds(storage, rank, 2, numel, dtype, timeout_s) for rank in range(2)]


def test_each_round_shows_every_ranks_vector():
    ranks = two_ranks()
    for round_ in range(1, 6):  # past both buffers, twice
        for rank, rounds in enumerate(ranks):
            rounds.slot().copy_(torch.tensor([round_, rank, round_ * 10 + rank]))
            rounds.post()
        for rounds in ranks:
            seen = rounds.wait()
            assert seen.tolist() == [[round_, 0, round_ * 10], [round_, 1, round_ * 10 + 1]]


def test_a_rank_ahead_does_not_overwrite_the_round_a_peer_still_reads():
    fast, slow = two_ranks()
    for rounds, value in ((fast, 1.0), (slow, 2.0)):
        rounds.slot().fill_(value)
        rounds.post()
    assert fast.wait()[:, 0].tolist() == [1.0, 2.0]
    fast.slot().fill_(3.0)  # round 2 goes to the other buffer
    fast.post()
    assert slow.wait()[:, 0].tolist() == [1.0, 2.0]  # round 1 is intact


def test_the_next_round_waits_for_reading_the_last():
    rounds = two_ranks()[0]
    rounds.slot().fill_(1.0)
    rounds.post()
    with pytest.raises(RuntimeError, match="before writing the next one"):
        rounds.slot()
    with pytest.raises(RuntimeError, match="post\\(\\) twice"):
        rounds.post()


def test_a_missing_peer_times_out_with_its_rank_named():
    lone, _absent = two_ranks(timeout_s=0.05)
    lone.slot().fill_(1.0)
    lone.post()
    with pytest.raises(RuntimeError, match=r"rank\(s\) 1 to reach exchange round 1"):
        lone.wait()


def test_the_stop_flags_round_of_int64():
    ranks = two_ranks(numel=2, dtype=torch.int64)
    for rank, rounds in enumerate(ranks):
        slot = rounds.slot()
        slot[0], slot[1] = 15 * rank, 1 - rank  # rank 1 got SIGTERM, rank 0's checkpoint is due
        rounds.post()
    assert ranks[0].wait().amax(0).tolist() == [15, 1]


def test_a_full_dev_shm_gives_no_segment_and_leaves_no_file(monkeypatch):
    from pyg_mgpu.distributed import shared_rounds
    if not (shared_rounds.shares_memory_here() and os.path.isdir("/dev/shm")):
        pytest.skip("needs /dev/shm on x86-64")
    before = set(os.listdir("/dev/shm"))

    def no_room(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared_rounds.os, "posix_fallocate", no_room)
    assert shared_rounds._create(1 << 20) is None
    assert set(os.listdir("/dev/shm")) == before
    monkeypatch.undo()
    made = shared_rounds._create(4096)  # with room: a file of that size, the token first
    try:
        path, token = made
        assert os.path.getsize(path) == 4096 and open(path, "rb").read(16) == token
        assert shared_rounds._map(path, 4096, token) is not None
        assert shared_rounds._map(path, 4096, b"x" * 16) is None  # someone else's segment
        assert shared_rounds._map(path + "-elsewhere", 4096, token) is None
        assert not os.path.exists(path + "-elsewhere")  # looking never creates a file
    finally:
        os.unlink(made[0])


class FakeBucket:
    def __init__(self, values, last):
        self.values, self.last = values, last

    def buffer(self):
        return self.values

    def is_last(self):
        return self.last


class FakeDDP:
    gradient_as_bucket_view = True

    def register_comm_hook(self, state, hook):
        self.hook = hook


def test_the_shared_all_reduce_refuses_a_step_whose_last_bucket_never_came():
    from pyg_mgpu.distributed.grad_sync import SharedMemoryAllReduce
    size = _header_bytes(1) + _data_bytes(1, 5, torch.float32)
    rounds = SharedRounds(torch.zeros(size, dtype=torch.uint8), 0, 1, 5, torch.float32, 30.0)
    ddp = FakeDDP()
    sync = SharedMemoryAllReduce(ddp, rounds)
    first, second = torch.arange(3.0), torch.arange(3.0, 5.0)
    ddp.hook(None, FakeBucket(first, last=False))
    ddp.hook(None, FakeBucket(second, last=True))
    sync.wait()  # one rank: each bucket is its own mean
    assert first.tolist() == [0.0, 1.0, 2.0] and second.tolist() == [3.0, 4.0]
    ddp.hook(None, FakeBucket(torch.ones(3), last=False))
    with pytest.raises(RuntimeError, match="not its last one"):
        sync.wait()  # would have summed the step before's round into this step's bucket


def test_a_peer_that_exited_ends_the_wait_long_before_the_timeout():
    import subprocess
    import sys
    import time

    lone, peer = two_ranks(timeout_s=300.0)
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    peer._processes[1] = exited.pid, peer._processes[1][1]  # rank 1 was that process
    lone.slot().fill_(1.0)
    lone.post()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 1 \(pid {exited.pid}\) .* has exited"):
        lone.wait()
    assert time.monotonic() - start < 30


def test_a_live_peer_is_waited_for():
    import threading
    lone, peer = two_ranks(timeout_s=300.0)  # both are this process: alive
    lone.slot().fill_(1.0)
    lone.post()

    def late_post():
        peer.slot().fill_(2.0)
        peer.post()

    threading.Timer(1.5, late_post).start()  # past the first liveness check
    assert lone.wait()[:, 0].tolist() == [1.0, 2.0]

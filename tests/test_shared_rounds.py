"""SharedRounds: the ranks' exchange through shared memory (its rounds, double buffer and
timeout), in one process, with two ranks' views of one segment."""
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

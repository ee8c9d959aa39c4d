"""The ranks' distributed loaders agree, or rank 1 says what differs: the seed, the inputs, the
epoch. Otherwise each rank would cut its shard from another permutation, and inputs would be
lost and repeated without a sign."""
import datetime
import pickle

import pytest
import torch
import torch.distributed as dist
from torch_geometric.data import Data

from pyg_mgpu.distributed.context import RankFailed
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.sampling import rank_agreement
from pyg_mgpu.sampling.neighbor_loader import NeighborLoader
from pyg_mgpu.sampling.rank_agreement import RankAgreement, inputs_digest

import _spawn_ranks

SETTINGS = {"seed": 0, "world_size": 2, "batch_size": 4, "shuffle": True, "num_inputs": 8,
            "inputs": inputs_digest(torch.arange(8))}


def a_store(timeout_s=10.0):
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    return store


def pair(store=None):
    """Rank 0's and rank 1's checks of one loader, over one store."""
    store = store or a_store()
    return (RankAgreement("NeighborLoader", store, 0, 0),
            RankAgreement("NeighborLoader", store, 1, 0))


def test_settings_alike_pass_and_each_difference_is_named():
    zero, one = pair()
    zero.check_built(SETTINGS)
    one.check_built(dict(SETTINGS))
    for change, named in [({"seed": 1}, "seed=1 where rank 0 has 0"),
                          ({"batch_size": 8}, "batch_size=8 where rank 0 has 4"),
                          ({"inputs": inputs_digest(torch.arange(8).flip(0))},
                           "other inputs (as many, but other values or another order)"),
                          ({"num_inputs": 9, "inputs": inputs_digest(torch.arange(9))},
                           "num_inputs=9 where rank 0 has 8")]:
        zero, one = pair()
        zero.check_built(SETTINGS)
        with pytest.raises(ValueError, match="rank 1's distributed NeighborLoader differs from "
                                             "rank 0's when built") as error:
            one.check_built(dict(SETTINGS, **change))
        assert named in str(error.value)
        assert "other inputs" not in str(error.value) or "inputs" in change


def test_each_set_epoch_is_compared_with_rank_0s_call_of_the_same_number():
    zero, one = pair()
    for epoch in range(3):
        zero.check_epoch(epoch, 0)
    one.check_epoch(0, 0)
    one.check_epoch(1, 0)
    with pytest.raises(ValueError, match=r"at its set_epoch call 3: epoch=5 where rank 0 has 2"):
        one.check_epoch(5, 0)
    zero.check_epoch(3, 2)
    with pytest.raises(ValueError, match="start_step=0 where rank 0 has 2"):
        one.check_epoch(3, 0)


def test_the_digest_weighs_values_and_order_not_dtype_or_device():
    nodes = torch.tensor([5, 1, 3])
    assert inputs_digest(nodes) == inputs_digest(nodes.int())
    assert inputs_digest(nodes) != inputs_digest(nodes.flip(0))
    assert inputs_digest(nodes) != inputs_digest(torch.tensor([5, 1, 4]))


def test_a_rank_waiting_for_a_post_rank_0_never_makes_gives_up_at_the_stores_timeout():
    _, one = pair(a_store(timeout_s=0.3))
    with pytest.raises(RuntimeError, match="waited 0s in vain for rank 0's settings. Every rank "
                                           "must build the same distributed loaders"):
        one.check_built(SETTINGS)



class GoneStore:
    """A store whose host has ended (torchrun's agent, killed)."""
    timeout = datetime.timedelta(seconds=10)

    def _gone(self, *args):
        raise dist.DistNetworkError("Failed to recv, got 0 bytes")

    set = check = get = _gone


def test_a_store_gone_with_its_host_leaves_the_stop_to_the_ranks_next_step():
    # The rank's stop watchdog ends it at its next step with a checkpoint; a store error
    # raised from set_epoch ended it first, without one.
    for rank in (0, 1):
        agreement = RankAgreement("NeighborLoader", GoneStore(), rank, 0)
        agreement.check_built(SETTINGS)
        agreement.check_epoch(1, 0)


def test_loaders_numbered_alike_on_every_rank_use_their_own_keys():
    store = a_store()
    RankAgreement("NeighborLoader", store, 0, 0).check_built(SETTINGS)
    RankAgreement("NeighborLoader", store, 0, 1).check_built(dict(SETTINGS, seed=7))
    RankAgreement("NeighborLoader", store, 1, 0).check_built(SETTINGS)
    with pytest.raises(ValueError, match="seed=0 where rank 0 has 7"):
        RankAgreement("NeighborLoader", store, 1, 1).check_built(SETTINGS)


def test_a_checked_loader_still_runs_workers_started_by_spawn(tmp_path):
    # Spawn pickles the loader (its collate_fn) into every worker; a store does not pickle.
    data = Data(x=torch.randn(40, 2), edge_index=torch.randint(0, 40, (2, 100)))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        loader = NeighborLoader(data, [2], batch_size=8, distributed=True, num_workers=1,
                                multiprocessing_context="spawn")
        assert loader.epoch_sampler.agreement is not None
        loader.set_epoch(1)
        seeds = torch.cat([batch.n_id[:batch.batch_size] for batch in loader])
        assert sorted(seeds.tolist()) == list(range(40))
        copy = pickle.loads(pickle.dumps(loader.epoch_sampler))
        assert copy.agreement.store is None and loader.epoch_sampler.agreement.store is not None
        copy.set_epoch(2)  # a copy checks nothing
    finally:
        dist.destroy_process_group()


def test_a_loader_for_other_ranks_than_the_groups_checks_nothing(tmp_path):
    data = Data(x=torch.randn(8, 2), edge_index=torch.randint(0, 8, (2, 20)))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        loader = NeighborLoader(data, [2], batch_size=2, distributed=True, rank=1, world_size=2)
        assert loader.epoch_sampler.agreement is None
        numbered = rank_agreement._checked_loaders
        loader = NeighborLoader(data, [2], batch_size=2, distributed=True)
        assert loader.epoch_sampler.agreement is not None
        assert rank_agreement._checked_loaders == numbered + 1
        loader.set_epoch(1)
        assert len(list(loader)) == 4
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("loader_name, differ, named", [
    ("NeighborLoader", "seed", "seed=1 where rank 0 has 0"),
    ("NeighborLoader", "inputs", "other inputs"),
    ("LinkNeighborLoader", "epoch", "at its set_epoch call 1: epoch=4 where rank 0 has 3"),
])
def test_ranks_that_disagree_end_the_job_with_what_differs(loader_name, differ, named):
    data = Data(x=torch.randn(16, 2), edge_index=torch.randint(0, 16, (2, 16)))
    with pytest.raises(RankFailed) as error:
        spawn(_spawn_ranks.build_disagreeing_loader, args=(data, loader_name, differ),
              devices="cpu", nprocs=2, timeout_s=60)
    message = str(error.value)
    assert "rank 1 failed" in message
    assert f"rank 1's distributed {loader_name} differs from rank 0's" in message
    assert named in message


@pytest.mark.slow
def test_ranks_that_agree_train_their_shards():
    data = Data(x=torch.randn(16, 2), edge_index=torch.randint(0, 16, (2, 16)))
    spawn(_spawn_ranks.build_disagreeing_loader, args=(data, "NeighborLoader", "nothing"),
          devices="cpu", nprocs=2, timeout_s=60)


def test_keys_name_torchruns_attempt_only_where_every_rank_counts_it_alike(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")  # one machine: one count for every rank
    assert RankAgreement("NeighborLoader", a_store(), 1, 0).key.split("/")[-2] == "2"
    # Each machine counts its own restarts: the ranks of a restarted machine would look for
    # keys the others never post. Over machines torchrun gives every attempt a fresh store.
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    store = a_store()
    RankAgreement("NeighborLoader", store, 0, 0).check_built(SETTINGS)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    RankAgreement("NeighborLoader", store, 1, 0).check_built(SETTINGS)


def test_the_message_names_which_loader_and_the_out_of_step_cause():
    zero, one = pair()
    zero.check_built(SETTINGS)
    with pytest.raises(ValueError, match="distributed loader 1 that each rank built; if one "
                                         "rank built a distributed loader the others did not"):
        one.check_built(dict(SETTINGS, shuffle=False))


def test_the_digest_of_many_seeds_reads_a_sample_and_their_sum(monkeypatch):
    monkeypatch.setattr(rank_agreement, "_DIGEST_SAMPLE", 4)
    seeds = torch.arange(100)
    assert inputs_digest(seeds) != inputs_digest(seeds.flip(0))
    moved = seeds.clone()
    moved[1] = 1000  # not in the sample of 4 (every 25th): the sum tells
    assert inputs_digest(seeds) != inputs_digest(moved)
    swapped = seeds.clone()
    swapped[[1, 2]] = swapped[[2, 1]]  # neither sampled nor summed differently: alike
    assert inputs_digest(seeds) == inputs_digest(swapped)

"""torchrun with 2 simulated nodes x 1 rank on localhost (gloo, env rendezvous)."""
import json
import shutil
import subprocess

import pytest

from pyg_mgpu.distributed.devices import free_port

pytestmark = pytest.mark.slow


SMALL = ["--num-nodes", "3000", "--num-edges", "30000", "--num-features", "8"]
# The heterogeneous path: each node reads the dataset itself (no graph cache).
HETERO = ["--dataset", "synthetic-hetero", "--model", "rgcn"]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
@pytest.mark.parametrize("dataset", [SMALL, HETERO], ids=["synthetic", "synthetic-hetero"])
def test_two_nodes_one_rank_each(tmp_path, dataset):
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "pyg_mgpu.distributed_sampling", "--epochs", "2", *dataset,
               "--out", str(tmp_path / f"n{node}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    metrics = json.loads((tmp_path / "n0" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["launcher"] == "torchrun"
    assert (tmp_path / "n0" / "curves.png").exists()
    assert not list((tmp_path / "n1").glob("metrics.json")), "only rank 0 writes results"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_nodes_given_other_settings_stop_at_once_naming_the_flag(tmp_path):
    # Without the check, the node with fewer epochs left the other waiting in a collective
    # until --timeout.
    port = free_port()
    procs = []
    for node, epochs in ((0, "2"), (1, "3")):
        cmd = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "pyg_mgpu.distributed_sampling", "--epochs", epochs, *SMALL,
               "--timeout", "600", "--out", str(tmp_path / f"n{node}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode != 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    assert "error: --epochs is 3 on this node and 2 on rank 0's" in logs[1], logs[1][-3000:]
    assert "its error line names the flag" in logs[0], logs[0][-3000:]
    assert not (tmp_path / "n0" / "metrics.json").exists()


def test_settings_that_mean_the_same_are_the_same_command():
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.multinode import shared_settings
    node0 = TrainConfig.from_flags(dataset="/data/a/g.npz", sampler="auto", epochs=2)
    assert shared_settings(node0) == shared_settings(
        TrainConfig.from_flags(dataset="/mnt/b/g.npz", sampler="native", epochs=2,
                               out="elsewhere", num_workers=2))
    for change in ({"epochs": 3}, {"dataset": "synthetic"}, {"fanout": "15,10"}):
        other = shared_settings(TrainConfig.from_flags(
            **{"dataset": "/data/a/g.npz", "epochs": 2, **change}))
        assert [name for name in other if other[name] != shared_settings(node0)[name]] == \
            [next(iter(change))], change


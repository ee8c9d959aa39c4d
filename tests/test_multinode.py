"""torchrun with 2 simulated nodes x 1 rank on localhost (gloo, env rendezvous)."""
import json
import shutil
import subprocess
import sys

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

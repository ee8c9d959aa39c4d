"""Measured batch sizes: per hop the new nodes and sampled edges, and the feature bytes a
batch gathers, from the loader the CLI builds."""
from types import SimpleNamespace

import pytest
import torch

from pyg_mgpu.tools.batch_sizes import batch_sizes, format_sizes, main, measure_batches
from pyg_mgpu.train.config import TrainConfig

SMALL = dict(num_nodes=1500, num_edges=15000, num_features=8, num_classes=4, fanout="5,3",
             batch_size=64, devices="cpu")


def fake_batch(nodes, edges, features=3):
    return SimpleNamespace(num_sampled_nodes=nodes, num_sampled_edges=edges,
                           x=torch.zeros(sum(nodes), features))


def test_means_over_the_batches_drawn():
    loader = [fake_batch([4, 10, 20], [12, 30]), fake_batch([4, 6, 10], [8, 20]),
              fake_batch([4, 1, 1], [1, 1])]  # past the batches asked for
    result = measure_batches(loader, batches=2)
    assert result["batches"] == 2
    assert result["nodes_per_hop"] == [4, 8, 15] and result["edges_per_hop"] == [10, 25]
    assert (result["nodes"], result["edges"]) == (27, 35)
    assert result["feature_bytes"] == 27 * 3 * 4 and result["feature_row_bytes"] == 12
    with pytest.raises(ValueError, match="no batch"):
        measure_batches([], batches=2)


class InPlaceLoader(list):
    """Batches without x, whose rows the model reads from the loader's feature table."""
    feature_table = torch.zeros(100, 5, dtype=torch.bfloat16)


def test_batches_read_in_place_count_the_rows_their_node_ids_name():
    loader = InPlaceLoader([SimpleNamespace(num_sampled_nodes=[2, 3], num_sampled_edges=[6],
                                            n_id=torch.arange(5), x=None)])
    result = measure_batches(loader, batches=1)
    assert result["feature_bytes"] == 5 * 5 * 2 and result["feature_row_bytes"] == 10


@pytest.mark.parametrize("amp, row_bytes", [("none", 8 * 4), ("bf16", 8 * 2)])
def test_the_clis_loader_is_measured(amp, row_bytes):
    result = batch_sizes(TrainConfig.from_flags(**SMALL, amp=amp), batches=3)
    assert result["batches"] == 3 and result["plan"]["graph_on"] == "cpu"
    seeds, hop1, hop2 = result["nodes_per_hop"]
    assert 0 < seeds <= 64 and hop1 > 0 and hop2 > 0
    # Each frontier node draws at most its hop's fanout.
    assert 0 < result["edges_per_hop"][0] <= 5 * seeds
    assert 0 < result["edges_per_hop"][1] <= 3 * hop1
    assert result["feature_row_bytes"] == row_bytes
    assert result["feature_bytes"] == pytest.approx(result["nodes"] * row_bytes)
    text = format_sizes(result)
    assert "| 0 (seeds) |" in text and "| 2 |" in text and "bytes per node" in text


def test_the_command_refuses_no_batches(capsys):
    assert main(["--batches", "0"]) == 2
    assert "--batches must be a positive number" in capsys.readouterr().err


def test_the_header_names_the_seeds_a_batch_held():
    result = {"batches": 4, "batch_size": 256, "fanout": [10, 5], "device": "cpu",
              "plan": {"graph_on": "cpu", "sample_batches": 8}, "nodes_per_hop": [250.0, 9.0],
              "edges_per_hop": [12.0], "nodes": 259.0, "edges": 12.0, "feature_bytes": 10.0,
              "feature_row_bytes": 4.0}
    assert format_sizes(result).startswith(
        "4 training batches of 250 seeds (--batch-size 256: each rank's shard is cut into "
        "equal batches), fanout 10,5")
    result["nodes_per_hop"][0] = 256.0
    assert format_sizes(result).startswith("4 training batches of 256 seeds, fanout 10,5")


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "synthetic-hetero"], "--dataset synthetic-hetero is heterogeneous"),
    (["--json", "/nonexistent-folder/sizes.json"],
     "--json /nonexistent-folder/sizes.json: cannot write there (No such file or directory)"),
])
def test_the_command_refuses_what_it_cannot_measure_or_write_before_measuring(
        capsys, monkeypatch, argv, message):
    from pyg_mgpu.tools import batch_sizes as module

    def measured(*args, **kwargs):
        raise AssertionError("measured")
    monkeypatch.setattr(module, "batch_sizes", measured)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, err

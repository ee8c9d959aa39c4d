"""The benchmark command: ratios, its JSON, and a tiny real run of the training and sampler modes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyg_mgpu.tools import bench, sampler_bench
from pyg_mgpu.sampling.sampler_choice import pyg_sampler_available

TINY = ["--num-nodes", "3000", "--num-edges", "30000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "256"]


def test_ratios_are_epoch_times_over_pyg_mgpu_and_dgl():
    results = {"pyg_mgpu": {"epoch_time_s": 2.0}, "pyg_mgpu_bf16": {"epoch_time_s": 1.5},
               "pyg_recipe": {"skipped": "no sampler"}, "dgl": {"epoch_time_s": 2.5}}
    bench.add_ratios(results)
    assert results["pyg_mgpu_bf16"]["epoch_time_vs_pyg_mgpu"] == 0.75
    assert results["pyg_mgpu_bf16"]["epoch_time_vs_dgl"] == 0.6
    assert results["dgl"]["epoch_time_vs_pyg_mgpu"] == 1.25
    assert "epoch_time_vs_dgl" not in results["pyg_recipe"]
    for r in results.values():
        r.update(seeds_per_s=1.0, test_acc=0.5)
    table = bench.format_training(results).splitlines()
    assert "vs pyg_mgpu" in table[0] and "vs dgl" in table[0]
    assert "0.75x" in table[2] and "0.60x" in table[2]
    assert "no sampler" in table[3]


def test_rank_count_defaults_to_two_cpu_ranks_or_every_visible_gpu(tmp_path, monkeypatch):
    import torch
    commands = []
    monkeypatch.setattr(bench, "_run", lambda cmd, out, *rest, **kw: commands.append(cmd) or
                        {"epoch_time_s": 1.0, "seeds_per_s": 1.0, "test_acc": 0.5})
    for devices, gpus, expected in (("cpu", 0, "2"), ("cuda", 1, "1"), ("auto", 3, "3")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        commands.clear()
        assert bench.main(TINY + ["--devices", devices, "--systems", "pyg_mgpu",
                                  "--out", str(tmp_path)]) == 0
        assert commands[0][commands[0].index("--nprocs") + 1] == expected
    # More ranks than GPUs is refused up front, with the reason.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert bench.main(TINY + ["--devices", "cuda", "--nprocs", "2", "--systems", "pyg_mgpu",
                              "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "error: --batch-size must be a positive integer, got 0."),
    (["--sampler-only", "--batches", "0"], "error: --batches must be a positive number"),
    (["--num-nodes", "5"], "error: synthetic graph too small: 5 nodes"),
    (["--fanout", "5,x"], "error: --fanout takes comma-separated integers such as 25,10"),
    (["--epochs", "0"], "error: --epochs must be a positive integer"),
    (["--systems", "pyg_mgpu,nope"], "error: --systems pyg_mgpu,nope: unknown system 'nope'"),
    (["--sampler-only", "--batch-size", "5000"], "use more nodes than --batch-size"),
    (["--step-costs"], "error: --step-costs measures 32 batches (with --sample-batches 8)"),
    (["--devices", "cpu", "--nprocs", "9999"], "error: --nprocs 9999: more than 4 CPU ranks"),
    (["--predict", "--repeats", "0"], "error: --repeats must be a positive number of rounds"),
])
def test_every_flag_is_checked_before_any_work(tmp_path, capsys, monkeypatch, argv, message):
    def work(*args, **kwargs):
        raise AssertionError("work started before every flag was checked")
    for name in ("synthetic_graph", "count_steps", "run_sampler_bench", "_run"):
        monkeypatch.setattr(bench, name, work)
    assert bench.main(TINY + argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git checkout")
def test_baseline_runs_the_revisions_own_package_right_after_ours(tmp_path, monkeypatch):
    runs = []

    def fake_run(cmd, out, *rest, env=None, cwd=None):
        runs.append((out.name, env and env["PYTHONPATH"], cwd))
        return {"epoch_time_s": 2.0 if env else 1.0, "seeds_per_s": 1.0, "test_acc": 0.5}

    monkeypatch.setattr(bench, "_run", fake_run)
    first = subprocess.run(["git", "-C", str(REPO), "rev-list", "--max-parents=0", "HEAD"],
                           capture_output=True, text=True).stdout.split()[0][:10]
    at_first = subprocess.run(["git", "-C", str(REPO), "show", f"{first}:pyg_mgpu/__init__.py"],
                              capture_output=True, text=True).stdout
    assert bench.main(TINY + ["--systems", "pyg_model_native_sampler,pyg_mgpu",
                              "--baseline", first, "--out", str(tmp_path)]) == 0
    source = (tmp_path / "baseline_source").resolve()
    assert [name for name, _, _ in runs] == ["pyg_model_native_sampler", "pyg_mgpu", "baseline"]
    assert runs[2][1].split(os.pathsep)[0] == str(source) and runs[2][2] == source
    # The revision's own package (the first commit's; unlike this checkout's, unless a shallow
    # clone's first commit is its last).
    assert (source / "pyg_mgpu" / "__init__.py").read_text() == at_first
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["results"][f"pyg_mgpu@{first}"]["epoch_time_vs_pyg_mgpu"] == 2.0
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", first], capture_output=True,
                            text=True).stdout.strip()
    assert report["args"]["baseline_commit"] == commit  # the commit measured, in full


def test_an_unknown_baseline_is_refused_with_the_reason(tmp_path, capsys):
    out = tmp_path / "out"
    assert bench.main(TINY + ["--systems", "pyg_mgpu", "--baseline", "no-such-rev",
                              "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --baseline no-such-rev: no such commit in ") and \
        len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # refused before anything is made
    assert bench.main(TINY + ["--step-costs", "--baseline", "HEAD"]) == 2
    assert "--baseline compares training runs" in capsys.readouterr().err


@pytest.mark.slow
def test_training_bench_runs_each_system_and_writes_json(tmp_path, capsys):
    systems = "pyg_mgpu,pyg_model_native_sampler,pyg_recipe"
    assert bench.main(TINY + ["--epochs", "2", "--systems", systems,
                              "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    results = report["results"]
    ours, pyg_model = results["pyg_mgpu"], results["pyg_model_native_sampler"]
    assert ours["epoch_time_vs_pyg_mgpu"] == 1.0
    assert pyg_model["epoch_time_vs_pyg_mgpu"] == pytest.approx(
        pyg_model["epoch_time_s"] / ours["epoch_time_s"])
    # 1,500 training nodes (the synthetic split's half) per epoch.
    assert ours["seeds_per_s"] == pytest.approx(1500 / ours["epoch_time_s"])
    assert 0.0 <= ours["test_acc"] <= 1.0
    assert (tmp_path / "pyg_mgpu" / "metrics.json").exists()
    if pyg_sampler_available():
        assert "epoch_time_s" in results["pyg_recipe"]
    else:
        assert "skipped" in results["pyg_recipe"]
    assert "vs pyg_mgpu" in capsys.readouterr().out


def test_interleaved_turns_let_each_sampler_follow_each_other_equally_often():
    """Every sampler runs on every batch, with the cache eviction before every turn; each
    timed turn follows each other sampler equally often, and a batch's first timed turn
    follows an untimed turn of the same sampler."""
    import torch
    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def sample(self, batch):
            calls.append((self.name, batch))
            return type("Out", (), {"row": torch.zeros(10)})()
    for names in (["a", "b", "c"], ["a", "b", "c", "d"]):
        calls.clear()
        evictions = []
        batches = len(sampler_bench.balanced_orders(len(names)))
        rates = sampler_bench._interleaved_edges_per_s({n: Recorder(n) for n in names},
                                               range(batches + 1), batches,
                                               evict=lambda: evictions.append(len(calls)))
        assert set(rates) == set(names) and all(r > 0 for r in rates.values())
        turns = calls[len(names):]  # after one warm-up batch each
        assert len(evictions) == len(turns) == batches * (len(names) + 1)
        followers = []
        for batch in range(1, batches + 1):
            lead_in, *timed = [n for n, b in turns if b == batch]
            assert sorted(timed) == names and lead_in == timed[0]
            followers += zip(timed, timed[1:])
        counts = {(x, y): followers.count((x, y)) for x in names for y in names if x != y}
        assert len(set(counts.values())) == 1, counts


def test_last_level_cache_is_read_from_sysfs(tmp_path):
    for index, (level, size) in enumerate([(1, "48K"), (2, "1280K"), (3, "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert sampler_bench._cpu_last_level_cache_bytes(tmp_path) == 32 << 20
    assert sampler_bench._cpu_last_level_cache_bytes(tmp_path / "absent") == 0


@pytest.mark.parametrize("cache_mb, evicted_mb", [(0, 64), (16, 64), (48, 96)])
def test_cache_eviction_covers_twice_the_last_level_cache(monkeypatch, cache_mb, evicted_mb):
    import torch
    monkeypatch.setattr(sampler_bench, "_cpu_last_level_cache_bytes", lambda: cache_mb << 20)
    assert sampler_bench._eviction_bytes(torch.device("cpu")) == evicted_mb << 20


class StepClock:
    """A ``perf_counter`` that advances one second a call: every timed span is one second, so
    a rate is the edges its spans sampled, and a rate computed wrong shows as a wrong count."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 1.0
        return self.now


@pytest.mark.slow
def test_sampler_bench_rates_are_the_edges_sampled_over_the_time_taken(tmp_path, monkeypatch):
    # Every neighbour (fanout -1): each batch's edges are fixed, whichever mode or generator.
    monkeypatch.setattr(sampler_bench, "time", StepClock())
    batches = 3
    assert bench.main(TINY + ["--sampler-only", "--fanout=-1,-1", "--batches", str(batches),
                              "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench.json").read_text())["results"]
    # One span per batch and mode in the interleaved turns, one span over every batch through
    # the loader: the same edges of the same batches both ways.
    per_batch = results["directional_1_thread"]
    assert per_batch > 0
    assert per_batch * batches == pytest.approx(results["directional_loader_0_workers"])
    assert results["directional_loader_1_workers"] == results["directional_loader_0_workers"]
    # A disjoint tree per seed holds at least the joint batch's edges.
    assert results["disjoint_1_thread"] >= per_batch
    for mode in sampler_bench.SAMPLER_MODES:
        assert results[f"{mode}_1_thread"] > 0, mode
        assert results[f"{mode}_vs_directional"] == pytest.approx(
            results[f"{mode}_1_thread"] / per_batch), mode
    for name in ("temporal", "hetero", "hetero_temporal"):
        assert results[f"{name}_1_thread"] > 0, name
        assert results[f"{name}_vs_directional"] == pytest.approx(
            results[f"{name}_1_thread"] / per_batch), name
        assert results[f"{name}_vs_disjoint"] == pytest.approx(
            results[f"{name}_1_thread"] / results["disjoint_1_thread"]), name
    # One edge type dealt into three, each with every neighbour: the same edges as one.
    assert results["hetero_1_thread"] == per_batch
    assert results["directional_8_per_walk_1_thread"] > 0  # walks of 8 batches
    assert results["directional_8_per_walk_vs_directional"] == pytest.approx(
        results["directional_8_per_walk_1_thread"] / per_batch)


GPU_SUITE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_suite.sh"
GPU_SUITE_PARTS = {
    "tests": ["env", "pytest_gpu"],
    "sampler": ["sampler_1m", "sampler_2_4m", "profile_products", "trace_products"],
    "variants": ["graph_gpu", "graph_host", "walk_1", "graph_cpu_cache", "graph_cpu_mmap",
                 "amp_bf16", "cuda_graph", "compile", "prefetch2", "layerwise", "eval_all", "resume",
                 "stop_resume", "hetero_example", "hetero_cli", "gloo_2ranks", "host_memory"],
    "full": ["products"],
    "recipe": ["recipe_env", "products_recipe"],
}


def gpu_suite_steps(out, part, **env):
    """The step names a dry run of the GPU suite's ``part`` lists, in order."""
    done = subprocess.run(["bash", str(GPU_SUITE), str(out), part], capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1", **env}, check=True)
    return [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")]


@pytest.mark.parametrize("part", ["tests", "sampler", "variants", "full", "recipe", "quick",
                                  "all"])
def test_gpu_suite_parts_together_run_every_step_once(tmp_path, part):
    """The GPU suite's parts, each run on its own, together run every step once."""
    expected = {"quick": sum((GPU_SUITE_PARTS[p] for p in ("tests", "sampler", "variants")),
                             []),
                "all": sum(GPU_SUITE_PARTS.values(), [])}.get(part) or GPU_SUITE_PARTS[part]
    assert gpu_suite_steps(tmp_path, part) == expected


def test_the_lean_part_runs_the_first_calls_steps_with_the_gpus_modes(tmp_path):
    assert gpu_suite_steps(tmp_path, "lean") == [
        "env", "pytest_gpu", "sampler_2_4m", "trace_products", "host_memory", "products"]
    done = subprocess.run(["bash", str(GPU_SUITE), str(tmp_path), "lean"], capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1"}, check=True)
    products = next(line for line in done.stdout.splitlines() if line.startswith("== products"))
    assert "--epochs 2" in products and "pyg_recipe" not in products
    assert "pyg_mgpu_cuda_graph" in products
    full = subprocess.run(["bash", str(GPU_SUITE), str(tmp_path), "full"], capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1"}, check=True).stdout
    assert "--epochs 3" in full and "pyg_recipe" in full


def test_the_dgl_side_gets_the_same_loader_settings(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(bench, "_run", lambda cmd, out, train_nodes: commands.append(cmd) or {})
    args = bench.build_parser().parse_args(
        ["--num-nodes", "300", "--num-edges", "3000", "--num-workers", "2", "--nprocs", "1",
         "--batch-size", "32", "--dgl-python", sys.executable, "--out", str(tmp_path)])
    bench._run_dgl(args, tmp_path / "dgl")
    flags = dict(zip(commands[0][2::2], commands[0][3::2]))
    assert flags["--num-workers"] == "2" and flags["--batch-size"] == "32"
    assert flags["--nprocs"] == "1"


def test_every_system_the_gpu_suite_names_is_the_benchs(tmp_path):
    done = subprocess.run(["bash", str(GPU_SUITE), str(tmp_path), "all"], capture_output=True,
                          text=True, env={**os.environ, "DRY_RUN": "1"}, check=True).stdout
    named = [line.split("--systems ")[1].split()[0].split(",")
             for line in done.splitlines() if "--systems " in line]
    assert len(named) == 2  # products, products_recipe
    for systems in named:
        unknown = set(systems) - set(bench.SYSTEMS)
        assert not unknown and set(systems) - {"pyg_recipe", "dgl"} <= set(bench.SYSTEM_FLAGS)


def test_gpu_suite_runs_only_the_named_steps(tmp_path):
    assert gpu_suite_steps(tmp_path, "variants", SUITE_STEPS="resume compile") == [
        "compile", "resume"]


def test_gpu_suite_refuses_an_unknown_part(tmp_path):
    done = subprocess.run(["bash", str(GPU_SUITE), str(tmp_path), "fast"], capture_output=True,
                          text=True)
    assert done.returncode == 2 and "part must be" in done.stderr


def test_gpu_suite_runs_the_products_systems_it_is_given(tmp_path):
    done = subprocess.run(["bash", str(GPU_SUITE), str(tmp_path), "full"], capture_output=True,
                          text=True, check=True,
                          env={**os.environ, "DRY_RUN": "1",
                               "SUITE_SYSTEMS": "pyg_mgpu,pyg_mgpu_cuda_graph"})
    products = [line for line in done.stdout.splitlines() if line.startswith("== products")]
    assert len(products) == 1 and "--systems pyg_mgpu,pyg_mgpu_cuda_graph --out" in products[0]


def test_predict_rounds_alternate_and_the_ratio_is_the_median_of_each_rounds():
    from pyg_mgpu.tools import predict_bench
    assert predict_bench.round_orders(3) == [predict_bench.SIDES, predict_bench.SIDES[::-1],
                                             predict_bench.SIDES]
    summary = predict_bench.summarize({"pyg_inference": [30.0, 80.0, 20.0],
                                       "pyg_mgpu_predict": [10.0, 20.0, 10.0]})
    assert summary["ratios"] == [3.0, 4.0, 2.0] and summary["ratio_median"] == 3.0
    assert summary["pyg_inference_median_s"] == 30.0
    assert summary["pyg_mgpu_predict_median_s"] == 10.0


@pytest.mark.slow
def test_predict_bench_times_both_on_one_graph_with_equal_outputs(tmp_path, capsys):
    assert bench.main(TINY + ["--predict", "--repeats", "2", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    results = report["results"]
    assert report["mode"] == "predict" and len(results["ratios"]) == 2
    assert results["max_abs_difference"] < 1e-4 and results["num_nodes"] == 3000
    assert "PyG / pyg_mgpu: median" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]

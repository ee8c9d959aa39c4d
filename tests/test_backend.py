"""--backend: validation, which devices each backend accepts, and the collective device."""
import pytest
import torch

import pyg_mgpu.distributed.launch as launch
from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed.devices import resolve_backend, resolve_devices, torchrun_device
from pyg_mgpu.distributed.launch import spawn
from pyg_mgpu.distributed_sampling import build_parser, main
from pyg_mgpu.train.config import ConfigError, TrainConfig

import _spawn_ranks

TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8",
        "--num-classes", "4", "--hidden", "16", "--batch-size", "128"]


@pytest.fixture
def one_gpu(monkeypatch):
    """CUDA as resolve_devices sees it on a one-GPU machine (nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_a_torchrun_rank_takes_its_device_from_devices(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert torchrun_device("auto", 1) == torchrun_device("cpu", 1) == cpu
    with pytest.raises(ValueError, match="asks for GPUs but CUDA sees none"):
        torchrun_device("cuda", 0)  # once, it ran on the CPU without a word
    with pytest.raises(ValueError, match="must be auto, cpu, cuda"):
        torchrun_device("bogus", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert torchrun_device("auto", 1) == torchrun_device("cuda", 1) == torch.device("cuda", 1)
    assert torchrun_device("cuda:2,3", 1) == torch.device("cuda", 3)  # once, cuda:1
    with pytest.raises(ValueError, match="names 2 GPU\\(s\\), but torchrun started local rank 2"):
        torchrun_device("cuda:2,3", 2)
    assert torchrun_device("cpu", 3) == cpu


def test_auto_is_nccl_on_gpus_and_gloo_on_cpus():
    assert resolve_backend("auto", torch.device("cuda", 0)) == "nccl"
    assert resolve_backend("auto", torch.device("cpu")) == "gloo"
    assert resolve_backend("gloo", torch.device("cuda", 0)) == "gloo"
    assert resolve_backend("nccl", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ValueError, match="backend=nccl needs GPU ranks"):
        resolve_backend("nccl", torch.device("cpu"))
    with pytest.raises(ValueError, match="^backend must be one of auto, nccl, gloo"):
        resolve_backend("mpi", torch.device("cpu"))


def test_a_gpu_listed_twice_only_with_gloo(one_gpu):
    gpu0 = torch.device("cuda", 0)
    assert resolve_devices("cuda:0,0", None, "gloo") == [gpu0, gpu0]
    assert resolve_devices("cuda:0,0,0", 3, "gloo") == [gpu0] * 3
    for backend in ("auto", "nccl"):
        with pytest.raises(ValueError, match="lists a GPU twice.*add backend=gloo"):
            resolve_devices("cuda:0,0", None, backend)
    assert resolve_devices("cuda", None) == [gpu0]  # today's rules unchanged
    with pytest.raises(ValueError, match="only 1 GPU"):
        resolve_devices("cuda:0,1", None, "gloo")  # gloo shares GPUs, it does not invent them
    with pytest.raises(ValueError, match="^backend must be one of"):
        resolve_devices("cuda:0", None, "mpi")


def test_cpu_ranks_refuse_nccl():
    assert resolve_devices("cpu", 2, "gloo") == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="backend=nccl needs GPU ranks"):
        resolve_devices("cpu", 2, "nccl")


def test_collectives_use_host_tensors_with_gloo():
    def ctx(device, backend):
        return RankContext(rank=0, world_size=2, local_rank=0, device=torch.device(device),
                           backend=backend)
    assert ctx("cuda:0", "nccl").collective_device == torch.device("cuda", 0)
    assert ctx("cuda:0", "gloo").collective_device == torch.device("cpu")
    assert ctx("cpu", "gloo").collective_device == torch.device("cpu")


def test_config_and_cli_validate_the_backend():
    assert TrainConfig().ranks.backend == "auto"
    assert build_parser().parse_args(["--backend", "gloo"]).backend == "gloo"
    # The config checks the choice, for the command line and for code alike.
    with pytest.raises(ConfigError, match="--backend must be one of auto, nccl, gloo"):
        TrainConfig.from_flags(**vars(build_parser().parse_args(["--backend", "mpi"])))
    with pytest.raises(ConfigError, match="--backend must be one of"):
        TrainConfig.from_flags(backend="mpi")
    with pytest.raises(ConfigError, match="--backend nccl needs GPU ranks"):
        TrainConfig.from_flags(devices="cpu", backend="nccl")


@pytest.mark.parametrize("argv,message", [
    (["--devices", "cpu", "--backend", "nccl"], "--backend nccl needs GPU ranks"),
    (["--devices", "cuda:0,0"], "--backend gloo"),
])
def test_cli_backend_errors_are_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(TINY + argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_spawn_checks_the_backend_before_starting_ranks(monkeypatch):
    started = []
    monkeypatch.setattr(launch, "launch_local", lambda *a, **k: started.append(1))
    with pytest.raises(ValueError, match="backend=nccl needs GPU ranks"):
        spawn(_spawn_ranks.record_context, devices="cpu", nprocs=2, backend="nccl")
    with pytest.raises(ValueError, match="^backend must be one of"):
        spawn(_spawn_ranks.record_context, devices="cpu", nprocs=2, backend="mpi")
    assert not started


def test_launch_local_refuses_nccl_on_cpu_ranks():
    with pytest.raises(ValueError, match="backend=nccl needs GPU ranks"):
        launch.launch_local(_spawn_ranks.record_context, [torch.device("cpu")] * 2,
                            args=(torch.zeros(2, 4),), backend="nccl")


def test_library_errors_name_arguments_and_the_cli_names_flags(tmp_path, capsys,
                                                               monkeypatch):
    # spawn(devices=..., nprocs=...) is told about its arguments; the CLI about its flags.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match=r"^nprocs=0: a job needs at least 1 rank"):
        resolve_devices("cpu", 0)
    with pytest.raises(ValueError, match=r"^devices=cuda:0,1 asks for GPUs but CUDA sees none; "
                                         r"use devices=cpu nprocs=N\.$"):
        resolve_devices("cuda:0,1", None)
    assert main(TINY + ["--devices", "cuda:0,1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: --devices cuda:0,1 asks for GPUs but CUDA sees "
                                       "none; use --devices cpu --nprocs N.\n")


def test_more_cpu_ranks_than_cores_are_warned_of_with_their_memory(monkeypatch):
    import warnings
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    with pytest.warns(UserWarning, match=r"3 CPU ranks on 2 core\(s\).* about 0.9 GB of "
                                         r"memory \(an estimate"):
        assert resolve_devices("cpu", 3) == [torch.device("cpu")] * 3
    with pytest.raises(ValueError, match="more than 4 CPU ranks per core"):
        resolve_devices("cpu", 9, max_per_core=4)
    with pytest.warns(UserWarning):  # the library's spawn has no limit
        assert len(resolve_devices("cpu", 9)) == 9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_devices("cpu", 2) == [torch.device("cpu")] * 2

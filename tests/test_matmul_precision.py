"""``--matmul-precision``: strict fp32 or TF32 matmuls, accepted and refused like every choice,
set on each rank before its model computes, and recorded in the run plan."""
import pytest
import torch
import torch.distributed as dist

from pyg_mgpu.distributed.context import RankContext
from pyg_mgpu.distributed_sampling import build_parser, main
from pyg_mgpu.train.config import ConfigError, TrainConfig
from pyg_mgpu.train.dataset import load_configured
from pyg_mgpu.train.trainee import build_ddp, set_matmul_precision


@pytest.fixture
def restored_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def config(*argv: str) -> TrainConfig:
    return TrainConfig.from_flags(**vars(build_parser().parse_args(list(argv))))


def test_the_flag_takes_highest_by_default_and_high():
    assert config().performance.matmul_precision == "highest"
    assert config("--matmul-precision", "high").performance.matmul_precision == "high"


def test_other_precisions_are_refused(capsys):
    with pytest.raises(ConfigError, match="--matmul-precision must be one of highest, high, "
                                          "got 'medium'"):
        TrainConfig.from_flags(matmul_precision="medium")
    assert main(["--matmul-precision", "medium", "--devices", "cpu"]) == 2
    assert "error: --matmul-precision must be one of highest, high" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["high", "highest"])
def test_setting_it_sets_torch_precision(restored_precision, precision):
    torch.set_float32_matmul_precision("medium")  # neither choice: the call must change it
    set_matmul_precision(TrainConfig.from_flags(matmul_precision=precision))
    assert torch.get_float32_matmul_precision() == precision


def test_a_rank_sets_it_when_its_model_is_built(restored_precision, tmp_path):
    cfg = TrainConfig.from_flags(num_nodes=300, num_edges=2000, num_features=4, num_classes=3,
                                 hidden=8, batch_size=32, matmul_precision="high")
    graph = load_configured(cfg)
    torch.set_float32_matmul_precision("highest")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        build_ddp(cfg, graph, RankContext(rank=0, world_size=1, local_rank=0,
                                          device=torch.device("cpu"), backend="gloo"))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        dist.destroy_process_group()

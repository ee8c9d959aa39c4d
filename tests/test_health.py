"""A collapsed run says so: a NaN loss, one predicted class, a loss that stopped moving."""
import json
import math

import pytest

from pyg_mgpu.distributed_sampling import main
from pyg_mgpu.train.config import MODEL_RECIPES, ConfigError, TrainConfig
from pyg_mgpu.train.health import SINGLE_CLASS_EPOCHS, collapse_warnings


def history(losses, classes):
    return [{"epoch": e, "train_loss": loss, "classes_predicted": c}
            for e, (loss, c) in enumerate(zip(losses, classes), start=1)]


def kinds(warnings):
    return [(w["epoch"], w["kind"]) for w in warnings]


def test_a_learning_run_has_no_warning():
    assert collapse_warnings(history([2.0, 1.4, 1.1, 0.9, 0.85], [5, 7, 7, 7, 7]), lr=0.01,
                             norm="none") == []


def test_a_nan_loss_is_reported_at_once():
    warnings = collapse_warnings(history([2.0, math.nan, math.nan], [7, 1, 1]), lr=0.5,
                                 norm="none")
    assert kinds(warnings)[0] == (2, "nan_loss")
    assert "--lr (now 0.5)" in warnings[0]["message"]


def test_one_class_for_several_epochs_is_a_collapse():
    few = history([1.9, 1.8], [1, 1])
    assert collapse_warnings(few, lr=0.01, norm="none") == []
    many = history([1.9, 1.8, 1.7, 1.6, 1.5], [7, 1, 1, 1, 1])
    warnings = collapse_warnings(many, lr=0.01, norm="none", model="gin")
    assert kinds(warnings) == [(1 + SINGLE_CLASS_EPOCHS, "single_class")]
    assert "--norm batch" in warnings[0]["message"]
    # With normalization on already, or for our GraphSAGE (none to turn on), the hint is the
    # learning rate alone.
    for norm, model in (("batch", "gin"), ("none", "sage")):
        message = collapse_warnings(many, lr=0.01, norm=norm, model=model)[0]["message"]
        assert "--norm" not in message and "--lr (now 0.01)" in message


def test_a_loss_that_stopped_moving_is_reported():
    frozen = history([1.9, 1.9459101, 1.9459101, 1.9459101, 1.9459101], [7, 2, 2, 2, 2])
    assert kinds(collapse_warnings(frozen, lr=0.01, norm="none")) == [(5, "flat_loss")]
    moving = history([1.9, 1.9459101, 1.9459, 1.9458, 1.9457], [7, 2, 2, 2, 2])
    assert collapse_warnings(moving, lr=0.01, norm="none") == []
    # A loss that reached ~0 has fitted the training seeds (GraphSAGE on Cora's 140 nodes).
    fitted = history([0.3, 1e-7, 0.0, 0.0, 0.0, 1e-7], [7] * 6)
    assert collapse_warnings(fitted, lr=0.01, norm="none") == []


def test_recipes_fill_only_what_the_user_left_out():
    cfg = TrainConfig.from_flags(model="gat", lr=0.01)
    assert cfg.model.lr == 0.01 and cfg.model.recipe_sources["lr"] == "flag"
    for name in ("hidden", "dropout", "weight_decay", "heads", "norm"):
        assert getattr(cfg.model, name) == MODEL_RECIPES["gat"][name]
        assert cfg.model.recipe_sources[name] == "recipe"
    assert TrainConfig.from_flags(model="gin").model.norm == "layer"
    assert TrainConfig.from_flags(model="gin", norm="none").model.norm == "none"
    assert "lr 0.01, hidden 64*" in cfg.recipe_summary()
    with pytest.raises(ConfigError, match="--norm batch is for PyG's models"):
        TrainConfig.from_flags(model="sage", norm="batch")


TINY = ["--num-nodes", "1500", "--num-edges", "15000", "--num-features", "8", "--num-classes",
        "4", "--batch-size", "128", "--devices", "cpu", "--nprocs", "2"]


@pytest.mark.slow
def test_a_collapsed_run_is_reported(tmp_path, capfd):
    # GIN without normalization, wide and at a high learning rate: from epoch 2 on it predicts
    # one class for every seed (the collapse GIN had on Cora before its recipe).
    assert main(TINY + ["--epochs", "5", "--model", "gin", "--norm", "none", "--hidden", "256",
                        "--weight-decay", "0", "--lr", "0.05", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [w["kind"] for w in metrics["warnings"]] == ["single_class"], metrics["epochs"]
    assert [e["classes_predicted"] for e in metrics["epochs"]][1:] == [1, 1, 1, 1]
    out = capfd.readouterr().out
    assert out.count("warning: epoch") == 1 and "--norm batch" in out
    sources = metrics["config"]["recipe_sources"]
    assert sources["lr"] == sources["norm"] == "flag" and sources["dropout"] == "recipe"



def test_a_nan_loss_is_written_as_json_null(tmp_path):
    # Python's json writes NaN, which is not JSON: jq and JSON.parse refuse the whole file.
    from pyg_mgpu.files import save_json
    save_json({"epochs": [{"epoch": 1, "train_loss": float("nan")},
                          {"epoch": 2, "train_loss": (float("inf"), 0.5)}]},
              tmp_path / "metrics.json")
    strict = json.loads((tmp_path / "metrics.json").read_text(),
                        parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert strict["epochs"] == [{"epoch": 1, "train_loss": None},
                                {"epoch": 2, "train_loss": [None, 0.5]}]


@pytest.mark.parametrize("flags, message", [
    ({"seed": 2 ** 43}, "--seed must lie between -2**43 and 2**43"),
    ({"seed": -2 ** 43}, "--seed must lie between -2**43 and 2**43"),
    ({"timeout_s": 1e13}, "--timeout must be finite positive seconds, at most 1e+09"),
    ({"split_fractions": "nan,0.1,0.2"}, "--split-fractions takes three positive shares"),
    ({"split_fractions": "0.5,nan,0.2"}, "--split-fractions takes three positive shares"),
])
def test_numbers_that_would_fail_inside_the_ranks_are_refused_naming_the_flag(flags, message):
    # Accepted, each would fail inside a rank with a traceback (the epochs' permutation seed
    # overflowing int64, torch's millisecond timeout) or with an error naming no flag (NaN).
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("+", r"\+")):
        TrainConfig.from_flags(**flags)
    TrainConfig.from_flags(seed=2 ** 43 - 1, timeout_s=1e9)  # the largest accepted


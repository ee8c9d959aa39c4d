"""Atomic writes and resume: a crash never corrupts the last good checkpoint."""
import json
import os
import stat
import zipfile

import pytest
import torch

from pyg_mgpu import files
from pyg_mgpu.train import checkpoint
from pyg_mgpu.distributed_sampling import main


def test_crash_mid_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save_torch({"epoch": 1}, path)

    def torn_save(obj, f):
        f.write(b"partial bytes")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError):
        checkpoint.save_torch({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"], "temp file left behind"


def test_a_write_syncs_the_file_then_the_folder_that_holds_its_new_name(tmp_path, monkeypatch):
    synced = []

    def fsync(fd):
        synced.append(("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file",
                       (tmp_path / "checkpoint.pt").exists()))
    monkeypatch.setattr(os, "fsync", fsync)
    checkpoint.save_torch({"epoch": 1}, tmp_path / "checkpoint.pt")
    # The data before the rename, the folder's entry after it.
    assert synced == [("file", False), ("folder", True)]


TINY = ["--num-nodes", "2000", "--num-edges", "20000", "--num-features", "8", "--num-classes",
        "4", "--hidden", "16", "--batch-size", "256", "--devices", "cpu", "--nprocs", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    # As open() would make them: readable by a team on a shared machine where the umask says so.
    before = os.umask(umask)
    try:
        path = files.save_json({"a": 1}, tmp_path / "metrics.json")
    finally:
        os.umask(before)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert json.loads(path.read_text()) == {"a": 1}


def test_resume_reaches_the_uninterrupted_result(tmp_path):
    assert main(TINY + ["--epochs", "3", "--out", str(tmp_path / "full")]) == 0
    assert main(TINY + ["--epochs", "2", "--out", str(tmp_path / "cut")]) == 0
    assert main(TINY + ["--epochs", "3", "--resume", str(tmp_path / "cut")]) == 0
    full = json.loads((tmp_path / "full" / "metrics.json").read_text())
    resumed = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in full["epochs"]]
    for key in ("best_val_acc", "best_epoch", "test_acc"):
        assert resumed[key] == full[key]
    assert resumed["plan"] == full["plan"]


def test_a_resume_names_each_planned_setting_that_differs(tmp_path, capfd):
    """A default resolved anew (here --eval-batch-size, left to --batch-size) is named, and the
    run continues; the checkpoint records the plan the run had."""
    assert main(TINY + ["--epochs", "1", "--out", str(tmp_path)]) == 0
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["plan"]
    assert saved["eval_batch_size"] == 256  # TINY's --batch-size
    capfd.readouterr()
    assert main(TINY + ["--epochs", "2", "--eval-batch-size", "7", "--cuda-graph", "--resume",
                        str(tmp_path)]) == 0
    err = capfd.readouterr().err  # rank 0's warning, from its own process, as the CLI's lines
    assert ("warning: the resumed run's plan differs from its checkpoint's: --eval-batch-size "
            "256 -> 7; --cuda-graph False -> True; it continues") in err, err[-2000:]
    assert "UserWarning" not in err, err[-2000:]
    assert json.loads((tmp_path / "metrics.json").read_text())["plan"]["eval_batch_size"] == 7


@pytest.mark.parametrize("change,message", [
    ([], "no checkpoint.pt"),
])
def test_resume_from_a_folder_without_checkpoint(tmp_path, capsys, change, message):
    assert main(TINY + ["--resume", str(tmp_path)] + change) == 2
    assert message in capsys.readouterr().err
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # the file named instead of its folder
    assert main(TINY + ["--resume", str(tmp_path / "checkpoint.pt"), "--out",
                        str(tmp_path / "next")] + change) == 2
    assert f"pass its folder, --resume {tmp_path}" in capsys.readouterr().err
    # ... also without --out, where the file was taken for the output folder to write into.
    assert main(TINY + ["--resume", str(tmp_path / "checkpoint.pt")] + change) == 2
    assert f"pass its folder, --resume {tmp_path}" in capsys.readouterr().err


@pytest.mark.parametrize("content, why", [
    ({"state_dict": {}}, "it has no epoch, step, world_size, ..."),
    ([1, 2, 3], "it holds a list, not a checkpoint's dict"),
    ({"epoch": 1, "step": None, "world_size": 2, "config": ["not", "a", "dict"], "model": {},
      "optimizer": {}, "history": [], "best": {}, "rng": []}, "its config is a list"),
])
def test_a_checkpoint_pyg_mgpu_did_not_write_is_refused_in_one_line(tmp_path, capsys, content,
                                                                    why):
    torch.save(content, tmp_path / "checkpoint.pt")
    assert main(TINY + ["--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: --resume {tmp_path}: checkpoint.pt was not written by "
                           f"pyg_mgpu ({why}); pass the --out folder of a pyg_mgpu run.")


def test_a_checkpoint_damaged_inside_its_weights_is_refused_before_the_ranks_start(tmp_path,
                                                                                 capsys):
    from pyg_mgpu.train.config import TrainConfig
    config = TrainConfig.from_flags(num_nodes=2000, num_edges=20000, num_features=8,
                                    num_classes=4, hidden=16, batch_size=256).to_dict()
    torch.save({"config": config, "world_size": 2, "epoch": 1, "step": None,
                "model": {"w": torch.randn(100_000)}, "optimizer": {}, "history": [],
                "best": {}, "rng": []}, tmp_path / "checkpoint.pt")
    damaged = bytearray((tmp_path / "checkpoint.pt").read_bytes())
    middle = len(damaged) // 2  # inside the weights, which a mapped load never reads
    damaged[middle:middle + 4096] = bytes(4096)
    (tmp_path / "checkpoint.pt").write_bytes(damaged)
    assert main(TINY + ["--resume", str(tmp_path), "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "/data/0 fails its checksum" in err, err



def test_a_checkpoint_saved_with_torchs_crcs_turned_off_is_written_with_them_and_resumes(
        tmp_path):
    from pyg_mgpu.train.checkpoint import damaged_entry, save_torch
    weights = {"w": torch.randn(1000)}
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(weights, tmp_path / "by_torch.pt")  # every CRC 0: not damage
        save_torch(weights, tmp_path / "by_us.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    assert damaged_entry(tmp_path / "by_torch.pt") is None
    with zipfile.ZipFile(tmp_path / "by_us.pt") as archive:
        assert all(info.CRC for info in archive.infolist() if info.file_size)
    damaged = bytearray((tmp_path / "by_us.pt").read_bytes())
    damaged[len(damaged) // 2] ^= 1  # inside the weights
    (tmp_path / "by_us.pt").write_bytes(damaged)
    assert damaged_entry(tmp_path / "by_us.pt").endswith("/data/0")


def test_resume_with_other_amp_names_it_before_loading_the_data(tmp_path, capsys):
    # --amp bf16 stores the features in bf16: the data fingerprint would differ too, and the
    # refusal would blame the data.
    from pyg_mgpu.train.config import TrainConfig
    config = TrainConfig.from_flags(num_nodes=2000, num_edges=20000, num_features=8,
                                    num_classes=4, hidden=16, batch_size=256).to_dict()
    torch.save({"config": config, "world_size": 2, "epoch": 1, "step": None, "model": {},
                "optimizer": {}, "history": [], "best": {}, "rng": []},
               tmp_path / "checkpoint.pt")
    assert main(TINY + ["--resume", str(tmp_path), "--epochs", "2", "--amp", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "trained with amp='none' but this run asks for 'bf16'" in err, err


@pytest.mark.slow
def test_resume_with_other_settings_is_refused(tmp_path, capsys):
    assert main(TINY + ["--epochs", "2", "--out", str(tmp_path)]) == 0
    assert main(TINY + ["--epochs", "3", "--fanout", "5,5", "--resume", str(tmp_path)]) == 2
    assert "fanout" in capsys.readouterr().err
    assert main(TINY[:-1] + ["3", "--epochs", "3", "--resume", str(tmp_path)]) == 2
    assert "ranks" in capsys.readouterr().err
    # --epochs is the total: fewer than the checkpoint has finished would train nothing.
    assert main(TINY + ["--epochs", "1", "--resume", str(tmp_path)]) == 2
    assert "the checkpoint is after epoch 2, beyond --epochs 1; pass --epochs 2 or more" in \
        capsys.readouterr().err


def test_resume_counts_the_epoch_a_step_checkpoint_stopped_in(tmp_path):
    from pyg_mgpu.train.checkpoint import check_resumable
    from pyg_mgpu.train.config import TrainConfig

    torch.save({"config": TrainConfig().to_dict(), "world_size": 2, "epoch": 2,
                "step": {"epoch": 3, "done": 40}, "model": {}, "optimizer": {}, "history": [],
                "best": {}, "rng": []}, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="is epoch 3, 40 steps in, beyond --epochs 2; pass "
                                         "--epochs 3 or more"):
        check_resumable(TrainConfig.from_flags(epochs=2, resume=str(tmp_path)), 2)
    assert check_resumable(TrainConfig.from_flags(epochs=3, resume=str(tmp_path)), 2)["epoch"] == 2


@pytest.mark.slow
def test_resume_on_other_data_is_refused(tmp_path, capsys, monkeypatch):
    # The same file, rewritten in place with its splits swapped: resuming would mix
    # the old data's best validation with the new data's test, or leak one split into another.
    import numpy as np

    from pyg_mgpu.data import SyntheticSpec, make_synthetic
    from pyg_mgpu.train.checkpoint import check_resumable
    from pyg_mgpu.train.config import TrainConfig
    from pyg_mgpu.train.dataset import load_checked

    path = make_synthetic(SyntheticSpec(num_nodes=600, num_edges=6000, num_features=8,
                                        num_classes=4), seed=0).save_npz(tmp_path / "g.npz")
    run = ["--dataset", str(path), "--cache-dir", str(tmp_path / "cache"), "--hidden", "16",
           "--batch-size", "64", "--devices", "cpu", "--nprocs", "2"]
    assert main(run + ["--epochs", "1", "--out", str(tmp_path / "run")]) == 0
    # The same data resumes, also named by another path, or moved: the fingerprint, not the
    # text, decides.
    monkeypatch.chdir(tmp_path)
    assert main(run[:1] + ["g.npz"] + run[2:] + ["--epochs", "2", "--resume", "run",
                                                "--out", "relative"]) == 0
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "g.npz").write_bytes(path.read_bytes())
    moved = TrainConfig.from_flags(dataset="moved/g.npz", cache_dir=str(tmp_path / "cache"),
                                   hidden=16, batch_size=64, epochs=2, resume=str(tmp_path / "run"))
    load_checked(moved, 2, check_resumable(moved, 2))  # checked as the CLI checks, no ranks
    arrays = dict(np.load(path))
    arrays["train_idx"], arrays["test_idx"] = arrays["test_idx"], arrays["train_idx"]
    np.savez(path, **arrays)
    capsys.readouterr()
    assert main(run + ["--epochs", "2", "--resume", str(tmp_path / "run"),
                       "--out", str(tmp_path / "other")]) == 2
    assert "the checkpoint was trained on other data" in capsys.readouterr().err


def test_the_data_fingerprint_sees_labels_splits_shapes_and_dtypes():
    from pyg_mgpu.data.fingerprint import WHOLE, data_fingerprint

    base = {"y": torch.arange(10), "train_idx": torch.tensor([1, 2]), "x": torch.ones(3, 2)}
    digest = data_fingerprint(base)
    assert data_fingerprint({k: v.clone() for k, v in base.items()}) == digest
    for change in ({"y": torch.arange(10).flip(0)}, {"train_idx": torch.tensor([1, 3])},
                   {"x": torch.ones(2, 3)}, {"x": torch.ones(3, 2, dtype=torch.bfloat16)},
                   {"z": torch.ones(1)}):
        assert data_fingerprint({**base, **change}) != digest, change
    big = torch.zeros(WHOLE + 1)
    changed = big.clone()
    changed[0] = 1  # the first run of a sampled tensor is always read
    assert data_fingerprint({"big": big}) != data_fingerprint({"big": changed})


def test_resume_auto_is_not_taken_for_a_file_of_that_name(tmp_path, monkeypatch):
    from pyg_mgpu.train.checkpoint import check_resume_names_a_folder

    monkeypatch.chdir(tmp_path)
    (tmp_path / "auto").write_text("")
    check_resume_names_a_folder("auto")
    (tmp_path / "checkpoint.pt").write_text("")
    with pytest.raises(ValueError, match=r"a file; pass its folder, --resume \.$"):
        check_resume_names_a_folder("checkpoint.pt")

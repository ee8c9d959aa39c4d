"""Resuming a fit of pyg_mgpu's Lightning data modules from a checkpoint.

The training loader is resumable: Lightning saves its place in the epoch with a checkpoint and
restores it, so a fit resumed in the middle of an epoch runs the batches the interrupted one had
not, and Lightning's batch index and step count go on as in the uninterrupted fit. Checked on
the loader itself, in one Lightning process, and under ``ddp`` on 2 gloo ranks (a script, which
Lightning starts once per rank).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyg_mgpu.distributed.devices import free_port

pl = pytest.importorskip("lightning.pytorch")

from test_lightning import lightning_trainer, link_module, node_graph, node_module  # noqa: E402

TESTS = Path(__file__).resolve().parent


def seeds_of(loader) -> list[list[int]]:
    return [batch.n_id[:batch.batch_size].tolist() for batch in loader]


def test_a_loader_restored_from_its_state_yields_the_rest_of_the_epoch():
    data = node_graph()
    loader = node_module(data).train_dataloader()
    loader.sampler.set_epoch(1)
    epoch = seeds_of(loader)
    assert len(epoch) == len(loader) == 8
    taken = []
    for batch in loader:
        taken.append(batch.n_id[:batch.batch_size].tolist())
        if len(taken) == 3:
            break
    state = loader.state_dict()
    assert state == {"epoch": 1, "step": 3, "steps_per_epoch": 8}
    resumed = node_module(data).train_dataloader()
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)  # as Lightning calls it after restoring the loader
    assert len(resumed) == 8  # the epoch's batches, as Lightning's batch index counts them
    assert taken + seeds_of(resumed) == epoch
    assert resumed.state_dict() == {"epoch": 1, "step": 8, "steps_per_epoch": 8}
    resumed.sampler.set_epoch(2)  # the next epoch starts at its first batch
    assert len(seeds_of(resumed)) == 8


def test_a_state_at_an_epochs_end_resumes_at_the_next_epochs_first_batch():
    data = node_graph()
    loader = link_module(data).train_dataloader()
    loader.load_state_dict({"epoch": 0, "step": len(loader), "steps_per_epoch": len(loader)})
    expected = link_module(data).train_dataloader()
    expected.sampler.set_epoch(1)
    assert [b.input_id.tolist() for b in loader] == [b.input_id.tolist() for b in expected]


def test_a_state_of_another_epoch_length_is_refused():
    loader = node_module(batch_size=16).train_dataloader()
    with pytest.raises(ValueError, match="ran 8 batches per epoch.*this one runs 4"):
        loader.load_state_dict({"epoch": 0, "step": 3, "steps_per_epoch": 8})


class Steps(pl.LightningModule):
    """Records every training step: its epoch, batch index, global step and seeds."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.steps = []

    def training_step(self, batch, batch_idx):
        seeds = batch.n_id[:batch.batch_size]
        self.steps.append((self.current_epoch, batch_idx, self.global_step, seeds.tolist()))
        return self.lin(batch.x[:batch.batch_size] / 100).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture(scope="module")
def uninterrupted() -> list:
    """The steps of a fit of 2 epochs of 8 batches."""
    module = Steps()
    lightning_trainer(devices=1).fit(module, node_module(node_graph()))
    return module.steps


# Step 8 is the epoch's last batch; with a DataLoader worker, batches are drawn ahead of the loop.
@pytest.mark.parametrize("num_workers,step", [(0, 3), (0, 8), (1, 3)])
def test_a_fit_resumed_mid_epoch_runs_the_rest_of_the_epoch(uninterrupted, tmp_path,
                                                           num_workers, step):
    from lightning.pytorch.callbacks import ModelCheckpoint
    data = node_graph()
    first = Steps()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=step, save_top_k=-1)
    lightning_trainer(devices=1, max_steps=step, enable_checkpointing=True,
                      callbacks=[checkpoint]).fit(first, node_module(data,
                                                                     num_workers=num_workers))
    resumed = Steps()
    trainer = lightning_trainer(devices=1)
    trainer.fit(resumed, node_module(data, num_workers=num_workers),
                ckpt_path=checkpoint.best_model_path)
    assert len(first.steps) == step
    assert first.steps + resumed.steps == uninterrupted
    assert (trainer.global_step, trainer.num_training_batches) == (16, 8)


DDP_SCRIPT = """
import json
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from lightning.pytorch.callbacks import ModelCheckpoint
from test_lightning import lightning_trainer, node_graph, node_module
from test_lightning_resume import Steps

phase, out = sys.argv[1], Path({out!r})
module = Steps()
if phase == "first":  # 2 of the epoch's 4 steps, and a checkpoint
    checkpoint = ModelCheckpoint(dirpath=out, filename="mid", every_n_train_steps=2)
    lightning_trainer(strategy="ddp", devices=2, max_epochs=1, max_steps=2,
                      enable_checkpointing=True, callbacks=[checkpoint]).fit(
        module, node_module(node_graph()))
else:
    trainer = lightning_trainer(strategy="ddp", devices=2, max_epochs=1)
    trainer.fit(module, node_module(node_graph()), ckpt_path=str(out / "mid.ckpt"))
    assert trainer.global_step == 4, trainer.global_step
(out / f"{{phase}}{{module.global_rank}}.json").write_text(json.dumps(module.steps))
"""


@pytest.mark.slow
def test_a_ddp_fit_resumed_mid_epoch_runs_every_seed_once(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(DDP_SCRIPT.format(tests=str(TESTS), out=str(tmp_path)))
    for phase in ("first", "resumed"):
        env = {**os.environ, "MASTER_PORT": str(free_port()),
               "PYTHONPATH": str(TESTS.parent)}
        proc = subprocess.run([sys.executable, str(script), phase], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, \
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    seeds = []
    for rank in range(2):
        first, resumed = (json.loads((tmp_path / f"{phase}{rank}.json").read_text())
                          for phase in ("first", "resumed"))
        # Lightning's batch index and step count go on from the checkpoint's.
        assert [step[1:3] for step in first + resumed] == [[i, i] for i in range(4)]
        seeds += [s for step in first + resumed for s in step[3]]
    train = node_graph().train_mask.nonzero().view(-1).tolist()
    assert sorted(seeds) == train  # the epoch's every seed once over the ranks

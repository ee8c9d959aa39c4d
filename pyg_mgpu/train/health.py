"""Signs that a run has collapsed, read from its epochs: a loss that is NaN or infinite, one
class predicted for every training seed, or a loss that no longer moves.

A collapsed run otherwise ends normally with a poor accuracy (GIN without normalization at lr
0.01 on Cora: its ReLUs died in the first epoch, it predicted one class, test accuracy 0.32). The
trainer calls :func:`collapse_warnings` after every epoch; rank 0 prints each new warning once
and ``metrics.json`` lists them under ``warnings``. It reads only the history, so a resumed run
sees what the uninterrupted one would.
"""
from __future__ import annotations

import math

SINGLE_CLASS_EPOCHS = 3
"""Epochs in a row with one predicted class before the run is reported as collapsed."""
FLAT_LOSS_EPOCHS = 3
"""Epochs in a row whose loss changed by at most :data:`FLAT_LOSS_RTOL` (relative)."""
FLAT_LOSS_RTOL = 1e-6
# A model that still learns moves its loss by far more between epochs, if only through dropout
# and the batches' order; a model whose every ReLU died repeats it to ~1e-7.
FLAT_LOSS_FLOOR = 1e-3
"""A loss below this has fitted the training seeds (GraphSAGE on Cora's 140 reaches ~1e-8):
not moving any more is then no sign of a collapse."""


def collapse_warnings(history: list[dict], *, lr: float, norm: str,
                      model: str = "sage") -> list[dict]:
    """Every warning the epochs so far call for, each kind at the first epoch it applies.

    ``history``: the trainer's epoch records (``epoch``, ``train_loss``, ``classes_predicted``).
    Returns dicts with ``epoch``, ``kind`` (``nan_loss``, ``single_class``, ``flat_loss``) and a
    one-line ``message`` with a hint (``--norm`` only for PyG's models, which take it).
    """
    can_norm = norm == "none" and model != "sage"
    hint = f"try a lower --lr (now {lr:g})" + (", or --norm batch" if can_norm else "")
    found: dict[str, dict] = {}
    single = flat = 0
    previous = None
    for record in history:
        epoch, loss = record["epoch"], record["train_loss"]
        if not math.isfinite(loss) and "nan_loss" not in found:
            found["nan_loss"] = _warning(epoch, "nan_loss", f"the training loss is {loss} (the "
                                         f"run diverged); {hint}")
        single = single + 1 if record.get("classes_predicted") == 1 else 0
        if single == SINGLE_CLASS_EPOCHS and "single_class" not in found:
            found["single_class"] = _warning(
                epoch, "single_class", f"the model has predicted one class for every training "
                f"seed for {single} epochs: it has collapsed (dead ReLUs, a too high learning "
                f"rate); {hint}")
        steady = (previous is not None and math.isfinite(loss) and loss > FLAT_LOSS_FLOOR
                  and abs(loss - previous) <= FLAT_LOSS_RTOL * max(1.0, abs(loss)))
        flat = flat + 1 if steady else 0
        if flat == FLAT_LOSS_EPOCHS and "flat_loss" not in found:
            found["flat_loss"] = _warning(
                epoch, "flat_loss", f"the training loss has not changed for {flat} epochs "
                f"({loss:.6g}): the model has stopped learning; {hint}")
        previous = loss
    return sorted(found.values(), key=lambda w: w["epoch"])


def _warning(epoch: int, kind: str, message: str) -> dict:
    return {"epoch": epoch, "kind": kind, "message": f"epoch {epoch}: {message}"}

"""The project's metrics against torchmetrics' on the same predictions: the same counts, and
values equal to float32's rounding (torchmetrics divides in float32); where torchmetrics
scores otherwise (logits outside [0, 1] in AUROC, ties in MRR), the difference the metrics'
docstrings give as the reason for the project's own code."""
import pytest
import torch
from torch_geometric.data import Data

import _metric_ranks
import pyg_mgpu
from pyg_mgpu.distributed.launch import launch_local

torchmetrics = pytest.importorskip("torchmetrics")
from torchmetrics.classification import BinaryAUROC, MulticlassAccuracy  # noqa: E402
from torchmetrics.retrieval import RetrievalMRR  # noqa: E402


def batches(logits: torch.Tensor, labels: torch.Tensor, size: int) -> list[Data]:
    """``logits`` and ``labels`` as a loader's batches whose seeds are every row."""
    return [Data(logits=lg, y=y, batch_size=y.numel())
            for lg, y in zip(logits.split(size), labels.split(size))]


@pytest.mark.parametrize("seed", range(3))
def test_accuracy_counts_what_torchmetrics_counts(seed):
    gen = torch.Generator().manual_seed(seed)
    logits, labels = torch.randn(1001, 5, generator=gen), torch.randint(5, (1001,), generator=gen)
    ours = pyg_mgpu.accuracy(torch.nn.Linear(1, 1), batches(logits, labels, 64),
                             sum_over_ranks=False, forward=lambda model, batch: batch.logits)
    theirs = MulticlassAccuracy(num_classes=5, average="micro")
    for batch in batches(logits, labels, 64):
        theirs.update(batch.logits, batch.y)
    assert round(ours * 1001) == theirs.tp.item()
    # Its ratio is ours rounded to float32, and nothing more.
    assert torch.tensor(ours, dtype=torch.float32) == theirs.compute()


@pytest.mark.parametrize("seed", range(3))
def test_auc_is_binary_auroc_with_every_score_kept(seed):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(5000, generator=gen) < 0.3).long()
    # Probabilities (in [0, 1], which torchmetrics keeps as they are), with many ties.
    scores = ((torch.rand(5000, generator=gen) + 0.4 * labels) / 1.4 * 50).round() / 50
    auroc = BinaryAUROC(thresholds=None)
    auroc.update(scores, labels)
    ours = pyg_mgpu.global_auc(scores, labels, sum_over_ranks=False)
    assert ours == pytest.approx(auroc.compute().item(), abs=1e-6)  # float32's curve


def test_binary_auroc_turns_large_logits_into_ties():
    # Scores outside [0, 1] go through a sigmoid first, which rounds large ones to 1.0: the
    # positives at 60 and 70 tie with the negative at 50 there. Ours ranks the scores as given.
    scores = torch.tensor([60.0, 70.0, 50.0, -1.0])
    labels = torch.tensor([1, 1, 0, 0])
    auroc = BinaryAUROC(thresholds=None)
    auroc.update(scores, labels)
    assert pyg_mgpu.global_auc(scores, labels, sum_over_ranks=False) == 1.0
    assert auroc.compute().item() == 0.75


def test_mrr_counts_ties_half_where_torchmetrics_ranks_the_positive_first():
    pos = torch.tensor([0.9, 0.5])
    neg = torch.tensor([[0.1, 0.2], [0.7, 0.5]])  # the second positive ties with a negative
    preds = torch.cat([pos[:, None], neg], 1).reshape(-1)
    target = torch.tensor([1, 0, 0] * 2)
    indexes = torch.arange(2).repeat_interleave(3)
    ours = pyg_mgpu.ranking_metrics(pos, neg, ks=(1,), sum_over_ranks=False)["mrr"]
    assert ours == pytest.approx((1 + 1 / 2.5) / 2)  # OGB's rank: 2.5
    assert RetrievalMRR()(preds, target, indexes=indexes).item() == pytest.approx((1 + 1 / 2) / 2)


@pytest.mark.slow
def test_over_two_ranks_torchmetrics_sums_what_ours_sums():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(301, 4, generator=gen).share_memory_()  # 151 and 150 nodes per rank
    labels = torch.randint(4, (301,), generator=gen).share_memory_()
    edge_labels = (torch.rand(401, generator=gen) < 0.5).long().share_memory_()
    scores = ((torch.rand(401, generator=gen) + 0.3 * edge_labels) / 1.3).share_memory_()
    result = torch.full((2, 5), float("nan"), dtype=torch.float64).share_memory_()
    launch_local(_metric_ranks.ours_and_torchmetrics, [torch.device("cpu")] * 2,
                 args=(logits, labels, scores, edge_labels, result))
    correct = int((logits.argmax(-1) == labels).sum())
    whole_auc = pyg_mgpu.global_auc(scores, edge_labels, sum_over_ranks=False)
    assert result[:, 2].sum().item() == correct  # each rank's own count, after compute()
    for rank in range(2):
        ours, theirs, _, our_auc, their_auc = result[rank].tolist()
        assert ours == correct / 301
        assert torch.tensor(ours, dtype=torch.float32).item() == theirs
        assert our_auc == whole_auc and their_auc == pytest.approx(whole_auc, abs=1e-6)

"""Rank functions of tests/test_metrics_torchmetrics.py (spawned ranks import them from here)."""
import torch


def ours_and_torchmetrics(ctx, logits, labels, scores, edge_labels, result):
    """Rank r scores every other node and edge from r (uneven shards); ``result[r]``: our
    accuracy, torchmetrics', this rank's correct count in torchmetrics (its state stays the
    rank's own after a compute), our AUC, torchmetrics'."""
    from torchmetrics.classification import BinaryAUROC, MulticlassAccuracy

    import pyg_mgpu
    mine = slice(ctx.rank, None, ctx.world_size)
    correct = (logits[mine].argmax(-1) == labels[mine]).sum()
    ours = pyg_mgpu.global_ratio(correct, labels[mine].numel())
    accuracy = MulticlassAccuracy(num_classes=logits.size(1), average="micro")
    for part in torch.split(torch.arange(logits.size(0))[mine], 7):  # in batches
        accuracy.update(logits[part], labels[part])
    theirs = accuracy.compute()  # sums the counts over the ranks, then divides
    auroc = BinaryAUROC(thresholds=None)
    auroc.update(scores[mine], edge_labels[mine])
    result[ctx.rank] = torch.tensor([ours, theirs.item(), accuracy.tp.item(),
                                     pyg_mgpu.global_auc(scores[mine], edge_labels[mine]),
                                     auroc.compute().item()], dtype=result.dtype)

"""Rank functions for the prediction tests (module level, so spawned ranks import them)."""
import torch

from pyg_mgpu.inference import predictions


def predict_on_every_rank(ctx, data, model, out, fail_at_layer, computed):
    """Every rank predicts into ``out``; rank 1 raises before computing layer
    ``fail_at_layer`` (0-based; -1: never). ``computed[rank, i]`` counts the
    layers this rank finished."""
    run_layer = predictions._Run._run_layer

    def counted(run, i):
        if ctx.rank == 1 and i == fail_at_layer:
            raise RuntimeError(f"injected failure before layer {i + 1}")
        run_layer(run, i)
        if i >= 0:
            computed[ctx.rank, i] += 1

    predictions._Run._run_layer = counted
    torch.set_num_threads(1)
    predictions.predict(model, data, out, outputs=["logits", "labels"], embeddings=1,
                        batch_size=50, resume=fail_at_layer < 0)

"""What a rank does: the training loop, evaluation, layer-wise inference, checkpoints, config."""

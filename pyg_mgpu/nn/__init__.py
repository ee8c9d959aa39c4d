"""Models: the trimmed GraphSAGE fast path, and PyG's GNNs for ``--model``."""

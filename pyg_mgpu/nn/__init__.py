"""Models: the trimmed GraphSAGE fast path, and PyG's GNNs for ``--model``."""

# The convolutions of the heterogeneous models (nn/hetero.py). Named here, where nothing imports
# torch, so that the CLI refuses another --model on a heterogeneous dataset at once.
HETERO_MODELS = ("sage", "rgcn")

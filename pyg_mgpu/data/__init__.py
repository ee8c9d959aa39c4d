"""Datasets, the graph store every dataset is converted to, and its PyG ``Data`` form."""
from .datasets import DATASETS, load_dataset, load_graph
from .graph import ConvertedGraph
from .stores import CachedGraph, open_stores
from .synthetic import SyntheticSpec, make_synthetic
from .validation import DatasetError

__all__ = ["CachedGraph", "DATASETS", "DatasetError", "ConvertedGraph", "SyntheticSpec",
           "load_dataset", "load_graph", "make_synthetic", "open_stores"]

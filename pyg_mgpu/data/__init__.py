"""Datasets and the graph store every dataset is converted to."""
from .datasets import DATASETS, load_dataset
from .graph import DatasetError, GraphStore
from .synthetic import SyntheticSpec, make_synthetic

__all__ = ["DATASETS", "DatasetError", "GraphStore", "SyntheticSpec", "load_dataset",
           "make_synthetic"]

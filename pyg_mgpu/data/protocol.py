"""What training reads of a dataset, whatever its kind: the :class:`TrainingGraph` protocol that
:class:`~pyg_mgpu.data.graph.ConvertedGraph` (homogeneous) and
:class:`~pyg_mgpu.data.hetero_graph.HeteroGraph` (heterogeneous) both declare."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, Union, runtime_checkable

from torch import Tensor

if TYPE_CHECKING:
    from torch_geometric.data import Data, HeteroData


@runtime_checkable
class TrainingGraph(Protocol):
    """A dataset as the trainer reads it: its splits, sizes, sharing and the PyG object its
    loaders sample from."""

    # Data members only as annotations: a class attribute here would become a default of the
    # dataclass fields that implement them.
    is_hetero: ClassVar[bool]  # HeteroData batches, and models with a conv per edge type
    name: str
    num_classes: int
    train_idx: Tensor  # node ids of the labelled type, per split
    val_idx: Tensor
    test_idx: Tensor
    num_nodes: int

    def tensors(self) -> dict[str, Tensor]:
        """Its tensors by name: what a copy of the dataset holds."""

    def nbytes(self) -> int:
        """The bytes its tensors hold."""

    def share_memory_(self): ...

    def summary(self) -> str:
        """One line for the log: name, sizes, splits."""

    def loader_data(self, with_features: bool = True) -> Union[Data, HeteroData]:
        """What a ``NeighborLoader`` samples from: the graph's own tensors and CSCs, no copy."""

    def loader_nodes(self, nodes: Tensor):
        """``nodes`` of the labelled type as a loader's ``input_nodes``."""

"""What one :func:`~pyg_mgpu.inference.predict` call computes, and where it goes.

:class:`Plan` holds the call's arguments, checked alike on every rank (and by the command
before any rank starts), the model as the run computes it, and for every layer and node type it
outputs the rows it computes (every node in id order, the requested nodes in their order, or
the nodes the next layer reads) and their files: ``out/layers/layer{k}.npy`` (``layer{k}.{type}
.npy`` per node type), ``nodes{k}.npy`` for a layer computed for some nodes, and the outputs
where :mod:`pyg_mgpu.inference.outputs` puts them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference import store
from pyg_mgpu.inference.arguments import Graph, check_embeddings, check_nodes, graph_of
from pyg_mgpu.inference.closure import needed_nodes
from pyg_mgpu.inference.layers import stack_of
from pyg_mgpu.inference.outputs import LAYERS, OUTPUT_DTYPES, OUTPUTS, type_folder


class Plan:
    """One call's checked arguments, its model's layers, and each layer's rows and files.

    Raises:
        ArgumentError: for outputs, embeddings, nodes, batch sizes or dtypes it cannot take.
        TypeError: for a model or graph it does not support.
    """

    def __init__(self, model: torch.nn.Module, data, out: Path, *, outputs: Sequence[str],
                 embeddings: Optional[int], nodes: Optional[Tensor], batch_size: int,
                 hidden_dtype: str):
        self.stack = stack_of(model)
        self.graph: Graph = graph_of(data, *(self.stack.input_types() if self.stack.hetero
                                             else ()))
        unknown = sorted(set(outputs) - set(OUTPUTS))
        if unknown or (not outputs and embeddings is None):
            raise ArgumentError(f"{{outputs}} takes any of {', '.join(OUTPUTS)}, got "
                                f"{', '.join(unknown) or 'none (and no embeddings)'}.")
        check_embeddings(embeddings, self.stack.num_layers)
        if batch_size < 1:
            raise ArgumentError(f"{{batch_size={batch_size}}}: a step needs at least 1 node.")
        if hidden_dtype not in store.HIDDEN_DTYPES:
            raise ArgumentError(f"{{hidden_dtype={hidden_dtype}}}: expected one of "
                                f"{', '.join(store.HIDDEN_DTYPES)}.")
        self.target = self.stack.target
        if nodes is not None:
            nodes = check_nodes(nodes, self.graph.num_nodes(self.target))
        self.out, self.outputs, self.embeddings, self.nodes = out, list(outputs), embeddings, nodes
        self.batch_size, self.hidden_dtype = batch_size, hidden_dtype
        self.widths = self.stack.widths({t: x.size(1) for t, x in self.graph.x.items()})
        self.folder = out / LAYERS
        self.num_layers = self.stack.num_layers
        self.num_out = (self.graph.num_nodes(self.target) if nodes is None else nodes.numel())
        self.gcn = getattr(self.stack, "gcn", None)
        # Per hidden layer and node type it outputs: the ids it computes, or None for all.
        self.needed: list[dict[str, Optional[np.ndarray]]] = []

    def manifest(self, model: torch.nn.Module, key: Optional[dict]) -> dict:
        """What the layers on disk are computed from; a resumed call must share all of it."""
        return {**(key or {}), "model": store.model_digest(model),
                "num_nodes": {t: self.graph.num_nodes(t) for t in self.graph.x},
                "num_edges": self.graph.num_edges, "widths": self.widths,
                "hidden_dtype": self.hidden_dtype, "nodes": store.node_digest(self.nodes),
                "outputs": sorted(self.outputs), "embeddings": self.embeddings}

    def _name(self, stem: str, node_type: str) -> str:
        return f"{stem}.{node_type}.npy" if self.stack.hetero else f"{stem}.npy"

    def layer_file(self, k: int, node_type: str) -> Path:
        """Hidden layer ``k``'s output (1-based, as ``embeddings`` counts) for ``node_type``."""
        return self.folder / self._name(f"layer{k}", node_type)

    def ids_file(self, k: int, node_type: str) -> Path:
        """The nodes hidden layer ``k`` computes, where not every node of ``node_type``."""
        return self.folder / self._name(f"nodes{k}", node_type)

    def out_folder(self, node_type: str) -> Path:
        """Where ``node_type``'s outputs go."""
        return type_folder(self.out, node_type, self.stack.hetero)

    def last_files(self) -> dict[str, Path]:
        """The file of each of ``outputs``, by name."""
        return {name: self.out_folder(self.target) / f"{name}.npy" for name in self.outputs}

    def out_shape(self, name: str) -> tuple[int, ...]:
        return (self.num_out,) if name == "labels" else (self.num_out, self.widths[-1])

    def num_rows(self, i: int, node_type: str) -> int:
        """Rows of layer ``i``'s output (0-based) for ``node_type``."""
        if i == self.num_layers - 1:
            return self.num_out
        ids = self.needed[i].get(node_type)
        return self.graph.num_nodes(node_type) if ids is None else len(ids)

    def write_needed(self) -> set[tuple[int, str]]:
        """The nodes each hidden layer computes for ``nodes``, as files (none for all)."""
        if self.nodes is None:
            return set()
        needed = needed_nodes(self.graph, self.num_layers, self.stack.outputs, self.stack.reads,
                              self.target, self.nodes)
        subsets = set()
        for i, per_type in enumerate(needed[:-1]):
            for t, ids in per_type.items():
                if ids is None:
                    continue
                subsets.add((i, t))
                path = self.ids_file(i + 1, t)
                if not path.exists():  # a resumed call's are the same
                    store.create(path, (ids.numel(),), np.int64)
                    store.open_rows(path, writable=True)[:] = ids.numpy()
                    store.finalize(path)
        return subsets

    def open_needed(self, subsets: set[tuple[int, str]]) -> None:
        """Maps the lists :meth:`write_needed` wrote (``subsets``: their layers and types)."""
        self.needed = [{t: (store.open_rows(self.ids_file(i + 1, t))
                            if (i, t) in subsets else None)
                        for t in self.stack.outputs(i)} for i in range(self.num_layers - 1)]

    def outputs_whole(self) -> bool:
        """Whether the last layer's files are whole on disk."""
        return all(store.is_whole(path, self.out_shape(name), OUTPUT_DTYPES[name])
                   for name, path in self.last_files().items())

    def output_folders(self) -> list[Path]:
        """Every folder this call writes outputs in."""
        return list(dict.fromkeys(self.out_folder(t) for i in range(self.num_layers)
                                  for t in self.stack.outputs(i)))

    def finished_layers(self) -> int:
        """How many layers are whole on disk (the next one to compute)."""
        if self.outputs_whole():
            return self.num_layers
        dtype = store.HIDDEN_DTYPES[self.hidden_dtype]
        for k in range(self.num_layers - 1, 0, -1):
            if all(store.is_whole(self.layer_file(k, t), (self.num_rows(k - 1, t),
                                                         self.widths[k - 1]), dtype)
                   for t in self.stack.outputs(k - 1)):
                return k
        return 0

    def files(self, i: int) -> list[tuple[str, Path, tuple, object]]:
        """(node type, path, shape, dtype) of each file layer ``i`` writes."""
        if i == -1:
            return [(self.target, self.folder / "gcn_norm.npy",
                     (self.graph.num_nodes(self.target),), np.float32)]
        if i < self.num_layers - 1:
            return [(t, self.layer_file(i + 1, t), (self.num_rows(i, t), self.widths[i]),
                     store.HIDDEN_DTYPES[self.hidden_dtype]) for t in self.stack.outputs(i)]
        return [(self.target, path, self.out_shape(name), OUTPUT_DTYPES[name])
                for name, path in self.last_files().items()]

    def destinations(self, i: int, node_type: str):
        """Layer ``i``'s destination ids in row order, or None for every node in id order."""
        if i == self.num_layers - 1:
            return self.nodes
        return None if i == -1 else self.needed[i][node_type]

    def embedded_types(self) -> list[str]:
        """The node types whose ``embeddings`` are written."""
        if self.embeddings is None:
            return []
        return ([self.target] if self.nodes is not None
                else self.stack.outputs(self.embeddings - 1))

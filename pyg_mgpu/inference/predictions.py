"""Every node's prediction and embedding, exact, layer by layer, in files every rank shares.

Layer ``i`` is computed once for every node from all its in-neighbours' outputs of layer
``i - 1``. The ranks split each layer's nodes into contiguous shards
(:func:`~pyg_mgpu.sampling.sharding.shard_bounds`); each rank writes its shard's rows into the
layer's ``.npy`` file through a mapping and reads the rows it needs of the layer before from
that layer's file. No rank holds a whole layer, and no layer is gathered: what a rank holds is
one batch's block. Between layers the ranks meet at a barrier, and rank 0 renames the finished
file into place (:mod:`pyg_mgpu.inference.store`), which is also where a resumed run starts.

The folder ``out`` ends up with ``node_ids.npy`` and the requested outputs (``logits.npy``,
``probabilities.npy``, ``labels.npy``, ``embeddings.npy``), one row per node id, in its order;
``out/layers/`` holds the hidden layers while they are needed and is removed at the end.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data
from tqdm import tqdm

from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference import store
from pyg_mgpu.inference.arguments import Graph, check_embeddings, check_nodes, graph_of
from pyg_mgpu.inference.blocks import BLOCK_BYTES, Rows, batches, make_block
from pyg_mgpu.inference.layers import (Layer, gcn_degrees, inverse_sqrt,
                                       layer_widths, model_layers)
from pyg_mgpu.sampling.sharding import shard_bounds

OUTPUTS = ("logits", "probabilities", "labels")
_OUTPUT_DTYPES = {"logits": np.float32, "probabilities": np.float32, "labels": np.int64}
LAYERS = "layers"  # the subfolder of out holding the hidden layers while they are needed


@dataclass
class Predictions:
    """What :func:`predict` wrote, opened read-only (``numpy.load(mmap_mode="r")``).

    Row ``j`` of every array is node ``node_ids[j]``. Outputs not asked for are None.
    ``embeddings_dtype`` names how ``embeddings`` is stored (``bfloat16``: as ``uint16`` bit
    patterns, see :func:`pyg_mgpu.inference.store.decode`).
    """
    folder: Path
    node_ids: np.ndarray
    logits: Optional[np.ndarray] = None
    probabilities: Optional[np.ndarray] = None
    labels: Optional[np.ndarray] = None
    embeddings: Optional[np.ndarray] = None
    embeddings_dtype: Optional[str] = None

    def files(self) -> dict[str, dict]:
        """Each file written: its name, shape and stored dtype."""
        described = {}
        for name in ("node_ids", *OUTPUTS, "embeddings"):
            array = getattr(self, name)
            if array is not None:
                dtype = self.embeddings_dtype if name == "embeddings" else str(array.dtype)
                described[name] = {"file": f"{name}.npy", "shape": list(array.shape),
                                   "dtype": dtype}
        return described


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()


def _from_rank0(value, world_size: int):
    if world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def predict(model: torch.nn.Module, data: Union[Data, ConvertedGraph], out: Union[str, Path], *,
            outputs: Sequence[str] = ("logits",), embeddings: Optional[int] = None,
            nodes: Optional[Tensor] = None, batch_size: int = 4096,
            hidden_dtype: str = "float32", device: Optional[torch.device] = None,
            resume: bool = False, progress_bar: bool = False,
            key: Optional[dict] = None) -> Predictions:
    """The model's outputs for every node (or ``nodes``), exact, written to ``.npy`` files.

    Each layer runs once for every node on all its in-neighbours (evaluation mode: no
    dropout), so the outputs equal the full-graph ``model(data.x, data.edge_index)``, on
    graphs of any size: a layer's rows go to a file in ``out`` that all ranks map, never to
    memory. Inside a process group (e.g. under :func:`pyg_mgpu.spawn`) every rank must call it
    with the same arguments; they share each layer's work, and ``out`` must be one folder all
    of them see.

    Args:
        model: pyg_mgpu's GraphSAGE or GCN, or PyG's ``GraphSAGE``, ``GCN``, ``GAT``, ``GIN``
            (unwrapped from DDP), on ``device``.
        data: The graph: a ``Data`` with ``x`` and ``edge_index`` (its cached CSC is reused),
            or a ``ConvertedGraph``.
        out: The folder to write; created if needed.
        outputs: Any of ``logits``, ``probabilities`` (softmax), ``labels`` (argmax).
        embeddings: Also keep hidden layer ``embeddings``'s output (1 to layers - 1: what the
            next layer reads, after activation and normalization).
        nodes: Ids of the nodes to write rows for (distinct); default every node. Hidden
            layers are computed for every node either way.
        batch_size: Destination nodes per step (a step also reads all their in-edges).
        hidden_dtype: How hidden layers are stored: ``float32``, ``float16`` or ``bfloat16``
            (half the disk and reads; see :mod:`pyg_mgpu.inference.store`). Logits are float32.
        device: Where to compute; default the model's device.
        resume: Continue from the last layer finished in ``out`` by an earlier call with the
            same model, graph and arguments; otherwise start afresh there.
        progress_bar: Show a bar per layer (pass it on one rank).
        key: More facts a resumed call must share with the earlier one (e.g. a data digest).

    Returns:
        :class:`Predictions`, the written arrays mapped read-only.

    Raises:
        ArgumentError: for outputs, embeddings, nodes, batch sizes or dtypes it cannot take.
        TypeError: for a model or graph it does not support.
        ValueError: with ``resume``, when ``out`` holds layers of another model or graph.

    Example:
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.nn import GraphSAGE
        >>> import tempfile
        >>> data = Data(x=torch.randn(4, 8), edge_index=torch.tensor([[1, 2, 3, 0],
        ...                                                           [0, 0, 0, 1]]))
        >>> model = GraphSAGE(8, 16, num_layers=2, out_channels=3).eval()
        >>> out = pyg_mgpu.predict(model, data, tempfile.mkdtemp(), outputs=["logits"])
        >>> torch.allclose(torch.tensor(out.logits), model(data.x, data.edge_index),
        ...                atol=1e-5)
        True
    """
    graph = graph_of(data)
    layers = model_layers(model)
    unknown = sorted(set(outputs) - set(OUTPUTS))
    if unknown or (not outputs and embeddings is None):
        raise ArgumentError(f"{{outputs}} takes any of {', '.join(OUTPUTS)}, got "
                            f"{', '.join(unknown) or 'none (and no embeddings)'}.")
    check_embeddings(embeddings, len(layers))
    if batch_size < 1:
        raise ArgumentError(f"{{batch_size={batch_size}}}: a step needs at least 1 node.")
    if hidden_dtype not in store.HIDDEN_DTYPES:
        raise ArgumentError(f"{{hidden_dtype={hidden_dtype}}}: expected one of "
                            f"{', '.join(store.HIDDEN_DTYPES)}.")
    if nodes is not None:
        nodes = check_nodes(nodes, graph.num_nodes)
    device = device or next(model.parameters()).device
    rank, world_size = _rank_and_world()
    run = _Run(layers, graph, Path(out), list(outputs), embeddings, nodes, batch_size,
               hidden_dtype, device, rank, world_size, progress_bar)
    was_training = model.training
    model.eval()
    try:
        run.prepare(resume, {**(key or {}), "model": store.model_digest(model)})
        run.compute()
        run.finish()
    finally:
        model.train(was_training)
    return run.opened()


class _Run:
    """One call of :func:`predict`: its files, and the layers still to compute."""

    def __init__(self, layers: list[Layer], graph: Graph, out: Path, outputs: list[str],
                 embeddings: Optional[int], nodes: Optional[Tensor], batch_size: int,
                 hidden_dtype: str, device: torch.device, rank: int, world_size: int,
                 progress_bar: bool):
        self.layers, self.graph, self.out = layers, graph, out
        self.outputs, self.embeddings, self.nodes = outputs, embeddings, nodes
        self.batch_size, self.hidden_dtype, self.device = batch_size, hidden_dtype, device
        self.rank, self.world_size, self.progress_bar = rank, world_size, progress_bar
        self.widths = layer_widths(layers, graph.x.size(1))
        self.folder = out / LAYERS
        self.num_out = graph.num_nodes if nodes is None else nodes.numel()
        self.gcn = next((layer.gcn for layer in layers if layer.gcn and layer.gcn.normalize), None)
        self.start = 0

    def layer_file(self, k: int) -> Path:
        """Hidden layer ``k``'s output (1-based, as ``embeddings`` counts)."""
        return self.folder / f"layer{k}.npy"

    def _last_files(self) -> dict[str, Path]:
        return {name: self.out / f"{name}.npy" for name in self.outputs}

    def _last_done(self) -> bool:
        return all(store.is_whole(path, self._out_shape(name), _OUTPUT_DTYPES[name])
                   for name, path in self._last_files().items())

    def _out_shape(self, name: str) -> tuple[int, ...]:
        return (self.num_out,) if name == "labels" else (self.num_out, self.widths[-1])

    def prepare(self, resume: bool, key: dict) -> None:
        """Rank 0 checks or starts the folder; every rank learns which layer to start at."""
        manifest = {**key, "num_nodes": self.graph.num_nodes,
                    "num_edges": self.graph.row.numel(), "widths": self.widths,
                    "hidden_dtype": self.hidden_dtype, "nodes": store.node_digest(self.nodes),
                    "outputs": sorted(self.outputs), "embeddings": self.embeddings}
        answer = (0, None)
        if self.rank == 0:
            try:
                answer = (self._prepare_folder(resume, manifest), None)
            except (OSError, ValueError) as e:
                answer = (0, e)
        self.start, error = _from_rank0(answer, self.world_size)
        if error is not None:
            raise error

    def _prepare_folder(self, resume: bool, manifest: dict) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(exist_ok=True)
        store.remove_partials(self.out)
        store.remove_partials(self.folder)
        if resume:
            before = store.read_manifest(self.folder)
            if before is not None and before != manifest:
                differ = sorted(k for k in manifest.keys() | before.keys()
                                if manifest.get(k) != before.get(k))
                raise ValueError(f"{self.out} holds layers computed with other "
                                 f"{', '.join(differ)}; start afresh there (without resume) or "
                                 "write to another folder.")
            if before is not None:
                return self._finished_layers()
        shutil.rmtree(self.folder)
        self.folder.mkdir()
        store.remove(*(self.out / f"{name}.npy" for name in ("node_ids", *OUTPUTS, "embeddings")))
        store.write_manifest(self.folder, manifest)
        return 0

    def _finished_layers(self) -> int:
        """How many layers are whole on disk (the next one to compute)."""
        if self._last_done():
            return len(self.layers)
        for k in range(len(self.layers) - 1, 0, -1):
            if store.is_whole(self.layer_file(k), (self.graph.num_nodes, self.widths[k - 1]),
                              store.HIDDEN_DTYPES[self.hidden_dtype]):
                return k
        return 0

    def compute(self) -> None:
        norm = self.folder / "gcn_norm.npy"
        if (self.gcn is not None and self.start < len(self.layers)
                and not store.is_whole(norm, (self.graph.num_nodes,), np.float32)):
            self._run_layer(-1)
        for i in range(self.start, len(self.layers)):
            self._run_layer(i)
            if self.rank == 0 and i >= 1 and i != self.embeddings:
                store.remove(self.layer_file(i))  # read by layer i alone
            _barrier(self.world_size)

    def _run_layer(self, i: int) -> None:
        """Layer ``i`` for this rank's shard (-1: GCN's degrees), then its files made final."""
        last = i == len(self.layers) - 1
        num_rows = self.num_out if last else self.graph.num_nodes
        files = self._files(i)
        if self.rank == 0:
            for path, shape, dtype in files:
                store.create(path, shape, dtype)
        _barrier(self.world_size)
        start, end = shard_bounds(num_rows, self.world_size, self.rank)
        if end > start:
            mapped = [store.open_rows(path, writable=True) for path, _, _ in files]
            self._write_shard(i, start, end, mapped)
            for array in mapped:
                array.flush()
            del mapped
        _barrier(self.world_size)
        if self.rank == 0:
            for path, _, _ in files:
                store.finalize(path)

    def _files(self, i: int) -> list[tuple[Path, tuple, object]]:
        if i == -1:
            return [(self.folder / "gcn_norm.npy", (self.graph.num_nodes,), np.float32)]
        if i < len(self.layers) - 1:
            return [(self.layer_file(i + 1), (self.graph.num_nodes, self.widths[i]),
                     store.HIDDEN_DTYPES[self.hidden_dtype])]
        return [(path, self._out_shape(name), _OUTPUT_DTYPES[name])
                for name, path in self._last_files().items()]

    def _input(self, i: int) -> Rows:
        if i <= 0:
            return Rows(self.graph.x)
        return Rows(store.open_rows(self.layer_file(i)), self.hidden_dtype)

    def _write_shard(self, i: int, start: int, end: int, mapped: list[np.ndarray]) -> None:
        last = i == len(self.layers) - 1
        rows = self._input(i)
        inv_sqrt_deg = (Rows(store.open_rows(self.folder / "gcn_norm.npy"))
                        if self.gcn is not None and i >= 0 else None)
        by_position = last and self.nodes is not None  # rows are positions in self.nodes
        colptr = self.graph.colptr

        def degrees(b0: int, b1: int) -> Tensor:
            if by_position:
                ids = self.nodes[b0:b1]
                return colptr[ids + 1] - colptr[ids]
            return colptr[b0 + 1:b1 + 1] - colptr[b0:b1]

        width = max([self.graph.x.size(1)] + self.widths[max(i - 1, 0):i + 1])
        bar = tqdm(total=end - start, desc="degrees" if i == -1 else
                   f"layer {i + 1}/{len(self.layers)}", disable=not self.progress_bar, leave=False)
        for b0, b1 in batches(start, end, self.batch_size,
                              max(1, BLOCK_BYTES // (4 * width)), degrees):
            bar.update(b1 - b0)
            dst = self.nodes[b0:b1] if by_position else (b0, b1)
            block = make_block(self.graph.colptr, self.graph.row, dst)
            if i == -1:
                mapped[0][b0:b1] = store.encode(inverse_sqrt(gcn_degrees(
                    block.edge_index[0], block.edge_index[1], b1 - b0, self.gcn)), "float32")
                continue
            scale = None if inv_sqrt_deg is None else inv_sqrt_deg.block_rows(block).to(self.device)
            y = self.layers[i](rows.block_rows(block).to(self.device),
                               block.edge_index.to(self.device), block.num_dst, scale)
            if not last:
                mapped[0][b0:b1] = store.encode(y, self.hidden_dtype)
                continue
            for name, array in zip(self.outputs, mapped):
                value = {"logits": lambda: y, "labels": lambda: y.argmax(dim=-1),
                         "probabilities": lambda: torch.softmax(y, dim=-1)}[name]()
                array[b0:b1] = value.cpu().numpy()
        bar.close()

    def finish(self) -> None:
        """The embeddings and node ids into place; the hidden layers removed."""
        if self.embeddings is not None:
            target = self.out / "embeddings.npy"
            source = self.layer_file(self.embeddings)
            if self.nodes is None:
                if self.rank == 0 and source.exists():
                    source.replace(target)
            else:
                self._gather_rows(source, target)
        if self.rank == 0:
            ids = self.out / "node_ids.npy"
            if not ids.exists():
                store.create(ids, (self.num_out,), np.int64)
                array = store.open_rows(ids, writable=True)
                array[:] = (np.arange(self.num_out) if self.nodes is None
                            else self.nodes.numpy())
                array.flush()
                del array
                store.finalize(ids)
            shutil.rmtree(self.folder, ignore_errors=True)
        _barrier(self.world_size)

    def _gather_rows(self, source: Path, target: Path) -> None:
        """``target``: the rows of ``source`` for the requested nodes, in their order."""
        if not source.exists() and target.exists():  # moved before a resume
            return
        width, dtype = self.widths[self.embeddings - 1], store.HIDDEN_DTYPES[self.hidden_dtype]
        if self.rank == 0:
            store.create(target, (self.num_out, width), dtype)
        _barrier(self.world_size)
        start, end = shard_bounds(self.num_out, self.world_size, self.rank)
        if end > start:
            rows, array = store.open_rows(source), store.open_rows(target, writable=True)
            for b0 in range(start, end, self.batch_size):
                b1 = min(b0 + self.batch_size, end)
                array[b0:b1] = rows[self.nodes[b0:b1].numpy()]
            array.flush()
            del array
        _barrier(self.world_size)
        if self.rank == 0:
            store.finalize(target)

    def opened(self) -> Predictions:
        def load(name: str) -> np.ndarray:
            return np.load(self.out / f"{name}.npy", mmap_mode="r")
        return Predictions(self.out, load("node_ids"),
                           **{name: load(name) for name in self.outputs},
                           embeddings=load("embeddings") if self.embeddings is not None else None,
                           embeddings_dtype=(self.hidden_dtype if self.embeddings is not None
                                             else None))

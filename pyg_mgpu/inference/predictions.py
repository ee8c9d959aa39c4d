"""Every node's prediction and embedding, exact, layer by layer, in files every rank shares.

Layer ``i`` is computed once for every node (of every node type it outputs) from all its
in-neighbours' outputs of layer ``i - 1``; asked for some nodes only, each layer computes the
nodes the next one reads (:mod:`pyg_mgpu.inference.closure`). The ranks split each layer's nodes
of each type into contiguous shards (:func:`~pyg_mgpu.sampling.sharding.shard_bounds`); each rank
writes its shard's rows into the layer's ``.npy`` file through a mapping and reads the rows it
needs of the layer before from that layer's file. No rank holds a whole layer, and no layer is
gathered: what a rank holds is one batch's block. Between layers the ranks meet at a barrier,
and rank 0 renames the finished files into place (:mod:`pyg_mgpu.inference.store`), which is
also where a resumed run starts.

The folder ``out`` ends up with the files :mod:`pyg_mgpu.inference.outputs` describes;
``out/layers/`` holds the hidden layers while they are needed and is removed at the end. A call
replaces what an earlier one left in ``out`` only when told to (``overwrite``), and never
removes what predict did not write.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm

from pyg_mgpu.errors import ArgumentError
from pyg_mgpu.inference import store
from pyg_mgpu.inference.arguments import EDGE
from pyg_mgpu.inference.blocks import BLOCK_BYTES, Rows, batches, make_block
from pyg_mgpu.inference.layers import gcn_degrees, inverse_sqrt
from pyg_mgpu.inference.outputs import (FILES, OUTPUTS, Predictions, check_layers_folder,
                                        in_the_way, listed, remove_outputs)
from pyg_mgpu.inference.plan import LAYERS, Plan
from pyg_mgpu.sampling.sharding import shard_bounds

__all__ = ["LAYERS", "OUTPUTS", "Predictions", "check_out", "check_resume", "predict"]


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
def predict(model: torch.nn.Module, data, out: Union[str, Path], *,
            outputs: Sequence[str] = ("logits",), embeddings: Optional[int] = None,
            nodes=None, batch_size: int = 4096,
            hidden_dtype: str = "float32", device: Optional[torch.device] = None,
            resume: bool = False, overwrite: bool = False, progress_bar: bool = False,
            key: Optional[dict] = None) -> Predictions:
    """The model's outputs for every node (or ``nodes``), exact, written to ``.npy`` files.

    Each layer runs once for every node on all its in-neighbours (evaluation mode: no
    dropout), so the outputs equal the full-graph ``model(data.x, data.edge_index)``, on
    graphs of any size: a layer's rows go to a file in ``out`` that all ranks map, never to
    memory. Inside a process group (e.g. under :func:`pyg_mgpu.spawn`) every rank must call it
    with the same arguments; they share each layer's work, and ``out`` must be one folder all
    of them see.

    Args:
        model: pyg_mgpu's GraphSAGE or GCN, PyG's ``GraphSAGE``, ``GCN``, ``GAT``, ``GIN``, or
            pyg_mgpu's heterogeneous :class:`~pyg_mgpu.nn.hetero.HeteroGNN` (unwrapped from
            DDP), on ``device``.
        data: The graph: a ``Data`` with ``x`` and ``edge_index`` (its cached CSC is reused)
            or a ``ConvertedGraph``; for a ``HeteroGNN`` a ``HeteroData`` (or pyg_mgpu's
            ``HeteroGraph``) with ``x`` for every node type it reads.
        out: The folder to write; created if needed. A heterogeneous model's outputs go to one
            subfolder per node type (``out/paper/logits.npy``). Outputs already there (an
            earlier call's, or files at their names) are refused unless ``overwrite`` or
            ``resume``; a ``layers/`` folder there that predict did not write is always refused.
        outputs: Any of ``logits``, ``probabilities`` (softmax), ``labels`` (argmax).
        embeddings: Also keep hidden layer ``embeddings``'s output (1 to layers - 1: what the
            next layer reads, after activation and normalization), of every node type it has.
        nodes: Ids of the nodes to write rows for (a tensor, numpy array or list; distinct;
            for a ``HeteroGNN`` of its target type, whose embeddings alone are then written);
            default every node. Each hidden layer computes only the nodes the next layer reads
            for them.
        batch_size: Destination nodes per step (a step also reads all their in-edges).
        hidden_dtype: How hidden layers are stored: ``float32``, ``float16`` or ``bfloat16``
            (half the disk and reads; see :mod:`pyg_mgpu.inference.store`). Logits are float32.
        device: Where to compute; default the model's device.
        resume: Continue from the last layer finished in ``out`` by an earlier call with the
            same model, graph and arguments; where there is none, start afresh there.
        overwrite: Start afresh in ``out`` even where it holds outputs: the earlier call's
            outputs (by its manifest) and files at the names predict writes are deleted, nothing
            else.
        progress_bar: Show a bar per layer (pass it on one rank).
        key: More facts a resumed call must share with the earlier one (e.g. a data digest).

    Returns:
        :class:`~pyg_mgpu.inference.outputs.Predictions`, the written arrays mapped read-only.

    Raises:
        ArgumentError: for outputs, embeddings, nodes, batch sizes or dtypes it cannot take,
            or an ``out`` holding outputs already (without ``overwrite`` or ``resume``).
        TypeError: for a model or graph it does not support.
        ValueError: with ``resume``, when ``out`` holds layers of another model or graph; when
            ``out/layers`` is a folder predict did not write.

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
    plan = Plan(model, data, Path(out), outputs=outputs, embeddings=embeddings, nodes=nodes,
                batch_size=batch_size, hidden_dtype=hidden_dtype)
    run = _Run(plan, device or next(model.parameters()).device, progress_bar)
    was_training = model.training
    model.eval()
    try:
        run.prepare(resume, overwrite, plan.manifest(model, key))
        run.compute()
        run.finish()
    finally:
        model.train(was_training)
    return run.opened()


def check_out(model: torch.nn.Module, data, out: Union[str, Path], *, resume: bool = False,
              overwrite: bool = False, key: Optional[dict] = None, **options) -> bool:
    """Refuses ``out`` as :func:`predict` would, before any rank starts (``options``: its other
    arguments): a ``layers/`` folder predict did not write, outputs already there (see
    :func:`~pyg_mgpu.inference.outputs.in_the_way`), and with ``resume`` layers or outputs
    computed with another model, graph or options. Returns whether a resumed call finds its
    outputs whole already (and computes nothing).

    Raises:
        ArgumentError: for outputs in the way.
        ValueError: naming what differs, or the folder predict did not write.
    """
    plan = Plan(model, data, Path(out), **options)
    if not _check_out(plan, resume, overwrite, plan.manifest(model, key)):
        return False
    return _recorded_manifest(plan)[1] and plan.outputs_whole()


def check_resume(model: torch.nn.Module, data, out: Union[str, Path], *,
                 key: Optional[dict] = None, **options) -> bool:
    """:func:`check_out` for a resumed call: refuses layers or outputs in ``out`` computed with
    another model, graph or options; returns whether they are this call's, whole."""
    return check_out(model, data, out, resume=True, overwrite=True, key=key, **options)


def _check_out(plan: Plan, resume: bool, overwrite: bool, manifest: dict) -> bool:
    """:func:`check_out`'s refusals; returns whether the call resumes (a manifest is there)."""
    check_layers_folder(plan.out)
    found = in_the_way(plan.out, resume=resume, overwrite=overwrite)
    if found:
        raise ArgumentError(f"{{out}} {plan.out} holds predictions already ({listed(found)}); "
                            "pass overwrite=True to replace them, resume=True to continue a "
                            "stopped call with the same arguments, or another folder.")
    before, _ = _recorded_manifest(plan)
    if resume and before is not None:
        _same_manifest(plan.out, before, manifest)
        return True
    return False


def _recorded_manifest(plan: Plan) -> tuple[Optional[dict], bool]:
    """What the layers in ``out`` were computed from, or, once they are done and removed,
    the finished outputs; and whether it is the outputs' alone (finished: the outputs'
    manifest is written before the layers folder goes, so a folder that still has its layers'
    manifest stopped before the end, with embeddings and node ids still to move)."""
    layers, outputs = store.read_manifest(plan.folder), store.read_manifest(plan.out)
    return layers or outputs, layers is None and outputs is not None


def _same_manifest(out: Path, before: Optional[dict], manifest: dict) -> None:
    if before is not None and before != manifest:
        differ = sorted(k for k in manifest.keys() | before.keys()
                        if manifest.get(k) != before.get(k))
        raise ValueError(f"{out} holds layers or outputs computed with other "
                         f"{', '.join(differ)}; start afresh there (without resume) or write "
                         "to another folder.")


class _Run:
    """One call of :func:`predict` on this rank: the plan's layers computed, its files."""

    def __init__(self, plan: Plan, device: torch.device, progress_bar: bool):
        self.plan, self.device, self.progress_bar = plan, device, progress_bar
        self.rank, self.world_size = _rank_and_world()
        self.start = 0
        self.manifest: Optional[dict] = None

    def prepare(self, resume: bool, overwrite: bool, manifest: dict) -> None:
        """Rank 0 checks or starts the folder and writes which nodes each layer computes;
        every rank learns where to start and opens those lists."""
        answer = (0, set(), None)
        self.manifest = manifest
        if self.rank == 0:
            try:
                resumed = self._prepare_folder(resume, overwrite, manifest)
                subsets = self.plan.write_needed()
                self.plan.open_needed(subsets)
                answer = (self.plan.finished_layers() if resumed else 0, subsets, None)
            except (OSError, ValueError) as e:
                answer = (0, set(), e)
        self.start, subsets, error = _from_rank0(answer, self.world_size)
        if error is not None:
            raise error
        self.plan.open_needed(subsets)

    def _prepare_folder(self, resume: bool, overwrite: bool, manifest: dict) -> bool:
        """Whether it resumes: the folder checked against ``manifest``, or started afresh."""
        resumes = _check_out(self.plan, resume, overwrite, manifest)
        self.plan.out.mkdir(parents=True, exist_ok=True)
        if resumes:
            self.plan.folder.mkdir(exist_ok=True)
            store.remove_partials(self.plan.folder)
            store.remove(store.partial(self.plan.out / store.MANIFEST), *(
                store.partial(folder / f"{name}.npy")
                for folder in self.plan.output_folders() for name in FILES))
            if store.read_manifest(self.plan.folder) is None:  # resumed from the outputs'
                store.write_manifest(self.plan.folder, manifest)
            return True
        remove_outputs(self.plan.out, self.plan.output_folders())
        self.plan.folder.mkdir()
        store.write_manifest(self.plan.folder, manifest)
        return False

    def compute(self) -> None:
        norm = self.plan.folder / "gcn_norm.npy"
        num_nodes = self.plan.graph.num_nodes(self.plan.target)
        if (self.plan.gcn is not None and self.start < self.plan.num_layers
                and not store.is_whole(norm, (num_nodes,), np.float32)):
            self._run_layer(-1)
        for i in range(self.start, self.plan.num_layers):
            self._run_layer(i)
            if self.rank == 0 and i >= 1 and i != self.plan.embeddings:
                store.remove(*(self.plan.layer_file(i, t) for t in self.plan.stack.outputs(i - 1)))
            _barrier(self.world_size)

    def _run_layer(self, i: int) -> None:
        """Layer ``i`` for this rank's shards (-1: GCN's degrees), then its files made final."""
        files = self.plan.files(i)
        if self.rank == 0:
            for _, path, shape, dtype in files:
                path.parent.mkdir(exist_ok=True)
                store.create(path, shape, dtype)
        _barrier(self.world_size)
        for t in dict.fromkeys(t for t, _, _, _ in files):
            start, end = shard_bounds(files[0][2][0] if i == -1 else self.plan.num_rows(i, t),
                                      self.world_size, self.rank)
            if end > start:
                mapped = [store.open_rows(path, writable=True)
                          for u, path, _, _ in files if u == t]
                self._write_shard(i, t, start, end, mapped)
                for array in mapped:
                    array.flush()
                del mapped
        _barrier(self.world_size)
        if self.rank == 0:
            for _, path, _, _ in files:
                store.finalize(path)

    def _inputs(self, i: int) -> dict[str, Rows]:
        """Layer ``i``'s input rows per node type: the features, or layer ``i``'s files."""
        if i <= 0:
            return {t: Rows(x) for t, x in self.plan.graph.x.items()}
        return {t: Rows(store.open_rows(self.plan.layer_file(i, t)), self.plan.hidden_dtype,
                        self.plan.needed[i - 1][t]) for t in self.plan.stack.outputs(i - 1)}

    def _write_shard(self, i: int, t: str, start: int, end: int,
                     mapped: list[np.ndarray]) -> None:
        last = i == self.plan.num_layers - 1
        inputs = self._inputs(i)
        scale = (Rows(store.open_rows(self.plan.folder / "gcn_norm.npy"))
                 if self.plan.gcn is not None and i >= 0 else None)
        ids = self.plan.destinations(i, t)
        reads = [EDGE] if i == -1 else self.plan.stack.reads(i, t)

        def destinations(b0: int, b1: int):
            if ids is None:
                return b0, b1
            return ids[b0:b1] if isinstance(ids, Tensor) else torch.from_numpy(np.array(ids[b0:b1]))

        def degrees(b0: int, b1: int) -> Tensor:
            return self.plan.graph.in_degrees(reads, destinations(b0, b1))

        width = max([x.size(1) for x in self.plan.graph.x.values()]
                    + self.plan.widths[max(i - 1, 0):i + 1])
        where = f" {t}" if self.plan.stack.hetero else ""
        bar = tqdm(total=end - start, desc="degrees" if i == -1 else
                   f"layer {i + 1}/{self.plan.num_layers}{where}", disable=not self.progress_bar,
                   leave=False)
        for b0, b1 in batches(start, end, self.plan.batch_size,
                              max(1, BLOCK_BYTES // (4 * width)), degrees):
            bar.update(b1 - b0)
            dst = destinations(b0, b1)
            if i == -1:
                block = make_block(*self.plan.graph.csc[EDGE], dst)
                mapped[0][b0:b1] = store.encode(inverse_sqrt(gcn_degrees(
                    block.edge_index[0], block.edge_index[1], b1 - b0, self.plan.gcn)), "float32")
                continue
            y = self.plan.stack.step(i, t, dst, inputs, self.plan.graph, self.device, scale)
            if not last:
                mapped[0][b0:b1] = store.encode(y, self.plan.hidden_dtype)
                continue
            for name, array in zip(self.plan.outputs, mapped):
                value = {"logits": lambda: y, "labels": lambda: y.argmax(dim=-1),
                         "probabilities": lambda: torch.softmax(y, dim=-1)}[name]()
                array[b0:b1] = value.cpu().numpy()
        bar.close()

    def finish(self) -> None:
        """The embeddings and node ids into place; the hidden layers removed."""
        for t in self.plan.embedded_types():
            target = self.plan.out_folder(t) / "embeddings.npy"
            source = self.plan.layer_file(self.plan.embeddings, t)
            if self.plan.nodes is None:
                if self.rank == 0 and source.exists():
                    target.parent.mkdir(exist_ok=True)
                    source.replace(target)
            else:
                self._gather_rows(source, target)
        if self.rank == 0:
            for t in dict.fromkeys([self.plan.target, *self.plan.embedded_types()]):
                ids = self.plan.out_folder(t) / "node_ids.npy"
                if not ids.exists():
                    count = self.plan.num_out if t == self.plan.target else self.plan.graph.num_nodes(t)
                    store.create(ids, (count,), np.int64)
                    array = store.open_rows(ids, writable=True)
                    array[:] = (np.arange(count) if self.plan.nodes is None or t != self.plan.target
                                else self.plan.nodes.numpy())
                    array.flush()
                    del array
                    store.finalize(ids)
            # What the outputs were computed from: a resumed call on them computes nothing.
            store.write_manifest(self.plan.out, self.manifest)
            shutil.rmtree(self.plan.folder, ignore_errors=True)
        _barrier(self.world_size)

    def _gather_rows(self, source: Path, target: Path) -> None:
        """``target``: the rows of ``source`` for the requested nodes, in their order."""
        if not source.exists() and target.exists():  # moved before a resume
            return
        width, dtype = self.plan.widths[self.plan.embeddings - 1], store.HIDDEN_DTYPES[self.plan.hidden_dtype]
        if self.rank == 0:
            store.create(target, (self.plan.num_out, width), dtype)
        _barrier(self.world_size)
        start, end = shard_bounds(self.plan.num_out, self.world_size, self.rank)
        if end > start:
            rows, array = store.open_rows(source), store.open_rows(target, writable=True)
            ids = self.plan.needed[self.plan.embeddings - 1][self.plan.target]
            for b0 in range(start, end, self.plan.batch_size):
                b1 = min(b0 + self.plan.batch_size, end)
                wanted = self.plan.nodes[b0:b1].numpy()
                array[b0:b1] = rows[wanted if ids is None else np.searchsorted(ids, wanted)]
            array.flush()
            del array
        _barrier(self.world_size)
        if self.rank == 0:
            store.finalize(target)

    def opened(self) -> Predictions:
        return Predictions.load(self.plan.out, self.plan.stack.outputs(0) if self.plan.stack.hetero else None)

"""What :func:`~pyg_mgpu.inference.predict` leaves in its folder, and :class:`Predictions`, which
opens it.

A homogeneous model's files lie in the folder itself; a heterogeneous model's in one subfolder
per node type (``out/paper/logits.npy``): its last layer outputs the labelled type alone, and a
hidden layer (``embeddings``) each type it outputs. In every folder ``node_ids.npy`` names the
node of each row of the others. ``manifest.json`` records what they were computed from, and
``layers/`` holds the hidden layers while a call runs.

A call starting afresh replaces only files at these names, and a ``layers/`` folder only where
it holds a manifest of predict's own (:func:`existing_outputs` lists what it would replace).
"""
from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from pyg_mgpu.inference import store
from pyg_mgpu.inference.arguments import NODE

LAYERS = "layers"  # the subfolder of out holding the hidden layers while they are needed
OUTPUTS = ("logits", "probabilities", "labels")
OUTPUT_DTYPES = {"logits": np.float32, "probabilities": np.float32, "labels": np.int64}
FILES = ("node_ids", *OUTPUTS, "embeddings")
# How a hidden layer's numpy dtype names its storage (bfloat16 is kept as uint16 bit patterns).
_STORED_AS = {"float32": "float32", "float16": "float16", "uint16": "bfloat16"}

Arrays = Union[np.ndarray, dict[str, np.ndarray]]


def type_folder(out: Path, node_type: str, hetero: bool) -> Path:
    """Where the outputs of ``node_type`` go."""
    return out / node_type if hetero else out


def recorded_folders(out: Path, manifest: dict) -> list[Path]:
    """The folders the call that wrote ``manifest`` (a manifest of predict's) put its outputs
    in: ``out`` for a homogeneous model, else one per node type."""
    types = list(manifest["num_nodes"])
    return [out] if types == [NODE] else [out / t for t in types]


def existing_outputs(out: Path) -> list[str]:
    """What in ``out`` a call started afresh there would replace, by path in ``out``: its
    ``manifest.json`` and ``layers/``, and outputs (files named as :data:`FILES`) in it or in
    a folder in it."""
    if not out.is_dir():
        return []
    found = [path for path in (out / store.MANIFEST, out / LAYERS) if path.exists()]
    folders = [out, *sorted(p for p in out.iterdir() if p.is_dir() and p.name != LAYERS)]
    found += [folder / f"{name}.npy" for folder in folders for name in FILES
              if (folder / f"{name}.npy").exists()]
    return [path.relative_to(out).as_posix() for path in found]


def in_the_way(out: Union[str, Path], *, resume: bool, overwrite: bool) -> list[str]:
    """What in ``out`` a call would replace, and so refuses (by path in ``out``): nothing with
    ``overwrite``, nor with ``resume`` where an earlier call's manifest is there to continue
    from; else :func:`existing_outputs`."""
    out = Path(out)
    if overwrite or (resume and any(store.read_manifest(folder) is not None
                                    for folder in (out / LAYERS, out))):
        return []
    return existing_outputs(out)


def listed(found: list[str], most: int = 4) -> str:
    """``found`` (:func:`in_the_way`'s paths) for a refusal: the first ``most``, then ``...``."""
    return ", ".join(found[:most]) + (", ..." if len(found) > most else "")


def check_layers_folder(out: Path) -> None:
    """Refuses an ``out/layers`` that predict did not write: it keeps its hidden layers there,
    and deletes the folder when done. Its own holds a manifest (or, just created, no more than
    a half-written one).

    Raises:
        ValueError: naming the folder.
    """
    folder = out / LAYERS
    if not folder.exists() or (folder.is_dir() and (
            store.read_manifest(folder) is not None
            or all(store.is_partial(path) for path in folder.iterdir()))):
        return
    raise ValueError(f"{folder} was not written by pyg_mgpu.predict (it holds no manifest of a "
                     "prediction), which keeps its hidden layers there and deletes them when "
                     "done; move it away, or write to another folder.")


def remove_outputs(out: Path, folders: Iterable[Path]) -> None:
    """Deletes what earlier calls left in ``out``: the outputs their manifests record and those
    in ``folders`` (where this call writes), with their half-written files; the layers folder
    (predict's own: see :func:`check_layers_folder`); and the manifest last, so that whatever
    is left is recorded. Other files stay, and so does a type's folder that holds them."""
    recorded = [m for m in (store.read_manifest(out / LAYERS), store.read_manifest(out))
                if m is not None]
    folders = dict.fromkeys([out, *folders,
                             *(f for m in recorded for f in recorded_folders(out, m))])
    files = [folder / f"{name}.npy" for folder in folders for name in FILES]
    store.remove(*files, *map(store.partial, files))
    for folder in folders:
        if folder != out:
            with contextlib.suppress(OSError):  # only where empty
                folder.rmdir()
    shutil.rmtree(out / LAYERS, ignore_errors=True)
    store.remove(out / store.MANIFEST, store.partial(out / store.MANIFEST))


@dataclass
class Predictions:
    """What :func:`~pyg_mgpu.inference.predict` wrote, opened read-only
    (``numpy.load(mmap_mode="r")``).

    Row ``j`` of every array is node ``node_ids[j]``. Outputs not asked for are None. For a
    heterogeneous model every field is a dict by node type (``logits["paper"]``), holding the
    types that have the output. ``embeddings_dtype`` names how ``embeddings`` is stored
    (``bfloat16``: as ``uint16`` bit patterns, see :func:`pyg_mgpu.inference.store.decode`).
    """
    folder: Path
    node_ids: Arrays
    logits: Optional[Arrays] = None
    probabilities: Optional[Arrays] = None
    labels: Optional[Arrays] = None
    embeddings: Optional[Arrays] = None
    embeddings_dtype: Optional[str] = None

    @classmethod
    def load(cls, folder: Path, node_types: Optional[list[str]] = None) -> "Predictions":
        """Opens what ``folder`` holds: the files of a homogeneous model, or with
        ``node_types`` those of each type's subfolder."""
        folders = ({None: folder} if node_types is None
                   else {t: folder / t for t in node_types if (folder / t).is_dir()})
        found: dict[str, dict] = {name: {} for name in FILES}
        for t, where in folders.items():
            for name in FILES:
                if (where / f"{name}.npy").is_file():
                    found[name][t] = np.load(where / f"{name}.npy", mmap_mode="r")
        fields = {name: arrays.get(None) if node_types is None else (arrays or None)
                  for name, arrays in found.items()}
        embedded = next(iter(found["embeddings"].values()), None)
        return cls(folder, **fields, embeddings_dtype=(
            None if embedded is None else _STORED_AS[str(embedded.dtype)]))

    def files(self) -> dict[str, dict]:
        """Each file written: its name (``paper/logits`` per type), shape and stored dtype."""
        described = {}
        for name in FILES:
            arrays = getattr(self, name)
            for t, array in (arrays.items() if isinstance(arrays, dict)
                             else [(None, arrays)] if arrays is not None else []):
                key = name if t is None else f"{t}/{name}"
                dtype = self.embeddings_dtype if name == "embeddings" else str(array.dtype)
                described[key] = {"file": f"{key}.npy", "shape": list(array.shape),
                                  "dtype": dtype}
        return described

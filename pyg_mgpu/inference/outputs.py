"""What :func:`~pyg_mgpu.inference.predict` leaves in its folder, and :class:`Predictions`, which
opens it.

A homogeneous model's files lie in the folder itself; a heterogeneous model's in one subfolder
per node type (``out/paper/logits.npy``): its last layer outputs the labelled type alone, and a
hidden layer (``embeddings``) each type it outputs. In every folder ``node_ids.npy`` names the
node of each row of the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

OUTPUTS = ("logits", "probabilities", "labels")
OUTPUT_DTYPES = {"logits": np.float32, "probabilities": np.float32, "labels": np.int64}
FILES = ("node_ids", *OUTPUTS, "embeddings")
# How a hidden layer's numpy dtype names its storage (bfloat16 is kept as uint16 bit patterns).
_STORED_AS = {"float32": "float32", "float16": "float16", "uint16": "bfloat16"}

Arrays = Union[np.ndarray, dict[str, np.ndarray]]


def type_folder(out: Path, node_type: str, hetero: bool) -> Path:
    """Where the outputs of ``node_type`` go."""
    return out / node_type if hetero else out


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

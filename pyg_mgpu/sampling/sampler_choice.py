"""Which neighbour sampler a run uses: pyg_mgpu's own (``native``) unless PyG's was asked for,
which needs pyg-lib or torch-sparse. Kept apart from the loaders so that a job's parent can
refuse ``--sampler pyg`` before any rank starts without importing PyG itself."""
from __future__ import annotations


def pyg_sampler_available() -> bool:
    """PyG's own neighbour sampler needs pyg-lib or torch-sparse (neither is on the registry)."""
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
    return bool(WITH_PYG_LIB or WITH_TORCH_SPARSE)


def resolve_sampler(choice: str) -> str:
    """``native`` or ``pyg`` for ``--sampler`` (``auto`` is ``native``); ``pyg`` is refused
    where neither pyg-lib nor torch-sparse is installed."""
    if choice == "pyg" and not pyg_sampler_available():
        raise ValueError("--sampler pyg needs pyg-lib or torch-sparse installed (see "
                         "docs/benchmarks.md); use --sampler native.")
    return "native" if choice == "auto" else choice

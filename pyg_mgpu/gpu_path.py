"""Which branch code takes where the GPU and the CPU differ: :func:`takes_gpu_path`.

Some steps have a GPU form that avoids a host read (a binary search instead of ``bincount``)
and a CPU form that is faster there. Counting a GPU step's kernels and host reads on the CPU
(``python -m pyg_mgpu.bench --step-costs``) must follow the GPU forms: inside
:func:`counting_gpu_path`, every tensor takes them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from torch import Tensor

_counting = False


def takes_gpu_path(tensor: Tensor) -> bool:
    """Whether code working on ``tensor`` takes its GPU form."""
    return _counting or tensor.is_cuda


@contextlib.contextmanager
def counting_gpu_path() -> Iterator[None]:
    """Every tensor takes the GPU forms inside (for counting a GPU step on the CPU)."""
    global _counting
    before, _counting = _counting, True
    try:
        yield
    finally:
        _counting = before

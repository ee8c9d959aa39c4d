"""Exact predictions for every node, layer by layer, in ``.npy`` files the ranks share:
:func:`predict` (``pyg_mgpu.predict``) and what it returns, :class:`Predictions`."""
from pyg_mgpu.inference.outputs import OUTPUTS, Predictions
from pyg_mgpu.inference.predictions import predict
from pyg_mgpu.inference.store import HIDDEN_DTYPES, decode

__all__ = ["HIDDEN_DTYPES", "OUTPUTS", "Predictions", "decode", "predict"]

"""PyTorch Lightning data modules on pyg_mgpu's loaders (the optional extra ``lightning``).

``LightningNodeData`` and ``LightningLinkData`` are PyG's data modules with sharded loaders that
need neither pyg-lib nor torch-sparse; see :mod:`pyg_mgpu.lightning.datamodules`.
"""
from pyg_mgpu.lightning.datamodules import LightningLinkData, LightningNodeData

__all__ = ["LightningLinkData", "LightningNodeData"]

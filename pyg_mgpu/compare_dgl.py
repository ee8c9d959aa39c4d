"""``python -m pyg_mgpu.compare_dgl``: kept short; the tool lives in :mod:`pyg_mgpu.tools.compare_dgl`."""
import sys

from pyg_mgpu.tools.compare_dgl import main

if __name__ == "__main__":
    sys.exit(main())

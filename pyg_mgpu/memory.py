"""``python -m pyg_mgpu.memory``: kept short; the tool lives in :mod:`pyg_mgpu.tools.memory`."""
import sys

from pyg_mgpu.tools.memory import main

if __name__ == "__main__":
    sys.exit(main())

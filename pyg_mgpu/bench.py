"""``python -m pyg_mgpu.bench``: kept short; the tool lives in :mod:`pyg_mgpu.tools.bench`."""
import sys

from pyg_mgpu.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())

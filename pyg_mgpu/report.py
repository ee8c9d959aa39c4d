"""``python -m pyg_mgpu.report``: kept short; the tool lives in :mod:`pyg_mgpu.tools.report`."""
import sys

from pyg_mgpu.tools.report import main

if __name__ == "__main__":
    sys.exit(main())

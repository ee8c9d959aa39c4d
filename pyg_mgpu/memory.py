"""``python -m pyg_mgpu.memory``: kept short; the tool lives in :mod:`pyg_mgpu.tools.memory`."""
from pyg_mgpu.distributed.host import exit_without_teardown
from pyg_mgpu.tools.memory import main

if __name__ == "__main__":
    exit_without_teardown(main())

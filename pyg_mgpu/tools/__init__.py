"""Command-line tools around training runs: bench, report, memory, compare_dgl."""

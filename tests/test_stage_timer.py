"""Per-stage timing: a stage timed inside a lap (sampling) is carved out of that lap."""
import torch

from pyg_mgpu.train import loop


def test_nested_stages_are_not_counted_twice(monkeypatch):
    clock = iter([10.0, 10.5, 11.5, 13.0, 13.25])
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    timer = loop.StageTimer(torch.device("cpu"))
    timer.start()                    # t = 10.0
    timer.add("sample", 0.25)        # measured by the sampler inside the first lap
    timer.lap("gather")              # t = 10.5: 0.5 s in all, 0.25 of it sampling
    timer.lap("forward")             # t = 11.5
    timer.lap("backward")            # t = 13.0
    timer.lap("allreduce")           # t = 13.25
    assert timer.seconds == {"sample": 0.25, "gather": 0.25, "forward": 1.0, "backward": 1.5,
                             "allreduce": 0.25}
    assert sum(timer.seconds.values()) == 3.25

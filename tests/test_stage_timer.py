"""Per-stage timing: nested stages (sampling, all-reduce) are carved out of the enclosing lap."""
import torch

from pyg_mgpu import trainer


def test_nested_stages_are_not_counted_twice(monkeypatch):
    clock = iter([10.0, 10.5, 11.5, 13.0])
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: next(clock))
    timer = trainer.StageTimer(torch.device("cpu"))
    timer.start()                    # t = 10.0
    timer.add("sample", 0.3)         # measured by the sampler inside the first lap
    timer.lap("gather")              # t = 10.5: 0.5 s in all, 0.3 of it sampling
    timer.lap("forward")             # t = 11.5
    timer.add("allreduce", 0.4)      # inside backward
    timer.lap("backward")            # t = 13.0
    assert timer.seconds == {"sample": 0.3, "gather": 0.2, "forward": 1.0, "allreduce": 0.4,
                             "backward": 1.1}
    assert abs(sum(timer.seconds.values()) - 3.0) < 1e-12

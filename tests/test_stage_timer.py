"""Per-stage timing: nested stages (sampling, all-reduce) are carved out of the enclosing lap."""
import torch

from pyg_mgpu import trainer


def test_nested_stages_are_not_counted_twice(monkeypatch):
    clock = iter([10.0, 10.5, 11.5, 13.0])
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: next(clock))
    timer = trainer.StageTimer(torch.device("cpu"))
    timer.start()                    # t = 10.0
    timer.add("sample", 0.25)        # measured by the sampler inside the first lap
    timer.lap("gather")              # t = 10.5: 0.5 s in all, 0.25 of it sampling
    timer.lap("forward")             # t = 11.5
    # Two gradient buckets' all-reduces inside backward, overlapping: their union counts once.
    timer.add_interval(12.0, 12.5)
    timer.add_interval(12.25, 12.75)
    timer.lap("backward")            # t = 13.0
    assert timer.seconds == {"sample": 0.25, "gather": 0.25, "forward": 1.0, "allreduce": 0.75,
                             "backward": 0.75}
    assert sum(timer.seconds.values()) == 3.0


def test_union_length_of_disjoint_nested_and_overlapping_intervals():
    assert trainer._union_length([(0, 1), (2, 3)]) == 2
    assert trainer._union_length([(0, 4), (1, 2)]) == 4
    assert trainer._union_length([(3, 5), (0, 2), (1, 4)]) == 5

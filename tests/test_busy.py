"""The GPU busy share: the mean of the readings taken while an epoch trains."""
import threading

import torch

from pyg_mgpu.tools.bench import _steady_gpu_busy
from pyg_mgpu.train.busy import BusyShare, nvml_reader


def test_busy_share_is_the_mean_of_the_readings_between_start_and_stop():
    readings = iter([10.0, 30.0, 50.0] + [90.0] * 1000)
    three = threading.Event()
    taken = []

    def read():
        value = next(readings)
        taken.append(value)
        if len(taken) == 3:
            three.set()
        return value

    busy = BusyShare(read, interval_s=0.001)
    busy.start()
    assert three.wait(10)
    share = busy.stop()
    assert share == sum(taken) / len(taken)  # every reading taken, and none after stop()
    assert len(taken) >= 3
    after = len(taken)
    threading.Event().wait(0.02)
    assert len(taken) == after


def test_no_reader_no_reading():
    busy = BusyShare(None)
    busy.start()
    assert busy.stop() is None
    assert nvml_reader(torch.device("cpu")) is None


def test_bench_reports_the_busy_share_of_the_epochs_after_the_first():
    metrics = {"epochs": [{"gpu_busy_pct": 5.0}, {"gpu_busy_pct": 60.0}, {"gpu_busy_pct": 80.0}]}
    assert _steady_gpu_busy(metrics) == 70.0
    assert _steady_gpu_busy({"epochs": [{"gpu_busy_pct": None}, {"gpu_busy_pct": None}]}) is None

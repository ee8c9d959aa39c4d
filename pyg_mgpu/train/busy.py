"""The GPU's busy share over a training epoch, as ``nvidia-smi`` reports it.

NVML's utilisation is the share of its last sample period (1/6 s to 1 s, by product) in which
at least one kernel ran. A thread reads it every ``interval_s`` while the epoch trains, and the
epoch's busy share is the mean of those readings. It needs ``nvidia-ml-py`` (``pynvml``); where
that or a GPU is missing, there is no reading and the epoch records ``None``.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import torch


def nvml_reader(device: torch.device) -> Optional[Callable[[], float]]:
    """A function that reads ``device``'s utilisation in percent, or None where NVML can't."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.utilization(device)
    except Exception:  # no pynvml, or no NVML on this machine: record nothing
        return None
    return lambda: float(torch.cuda.utilization(device))


class BusyShare:
    """``start()`` before an epoch, ``stop()`` after it: the mean busy percent between them."""

    def __init__(self, read: Optional[Callable[[], float]], interval_s: float = 0.1):
        self.read, self.interval_s = read, interval_s
        self._readings: list[float] = []
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self.read is None:
            return
        self._readings, self._stopped = [], threading.Event()
        self._thread = threading.Thread(target=self._poll, name="gpu-busy", daemon=True)
        self._thread.start()

    def stop(self) -> Optional[float]:
        """The mean of the readings since ``start()``; None without a reader or a reading."""
        if self._thread is None:
            return None
        self._stopped.set()
        self._thread.join()
        self._thread = None
        return sum(self._readings) / len(self._readings) if self._readings else None

    def _poll(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self._readings.append(self.read())
            except Exception:  # NVML went away: the epoch keeps the readings it has
                return

"""Small exchanges between the ranks of one machine through shared memory, without gloo.

A gloo all-reduce between two CPU ranks of one machine costs a TCP round trip through each
rank's gloo thread, which has to wait for a core while the ranks compute. A step of a small
model then waits longer for its gradients than it takes to compute them. Here each rank writes
its vector into its own slot of a shared segment and raises its round number; a rank that reads
a round waits (spinning, then sleeping) until every rank has raised its number that far.

:func:`open_shared_rounds` opens one for the ranks of a process group when they all see the
same segment, i.e. share a machine, and on x86-64 only: there a store is never seen before the
stores that preceded it (TSO), so a rank that sees a peer's round number sees its data. On
other machines, and across machines, the callers keep gloo.
"""
from __future__ import annotations

import contextlib
import os
import platform
import secrets
import time
import uuid
from typing import Optional

import torch
import torch.distributed as dist


_LINE = 64  # bytes: each rank's round number on a cache line of its own
_TOKEN = 16  # random bytes at the segment's start, by which each rank checks it opened the same
_SPIN_S = 5e-3  # a wait yields the core for this long, then sleeps in growing steps
_FOLDER = "/dev/shm"  # memory, never a disk or a network filesystem


class SharedRounds:
    """Rounds of one vector per rank, in shared memory.

    Each round, every rank writes its vector (:meth:`slot`, :meth:`post`), then reads every
    rank's (:meth:`wait`). A rank posts its next round only after reading the previous one, so
    two buffers suffice: when a rank writes round ``k + 2`` into round ``k``'s buffer, every
    rank has posted ``k + 1`` and so finished reading ``k``.
    """

    def __init__(self, storage: torch.Tensor, rank: int, world_size: int, numel: int,
                 dtype: torch.dtype, timeout_s: float):
        self.rank, self.world_size, self.numel, self.timeout_s = rank, world_size, numel, timeout_s
        header = _header_bytes(world_size)
        lines = storage[_LINE:header].view(torch.int64).view(world_size, _LINE // 8)
        self._rounds = lines[:, 0].numpy()  # a view: reads the peers' numbers as they change
        # Each rank's process and pid namespace, by which a waiting peer tells it has exited.
        self._processes = lines[:, 1:3].numpy()
        self._processes[rank] = os.getpid(), _pid_namespace()
        self._buffers = storage[header:header + _data_bytes(world_size, numel, dtype)].view(
            dtype).view(2, world_size, numel)
        self._storage = storage  # keeps the mapping alive
        self._posted = int(self._rounds[rank])
        self._read = self._posted

    @property
    def unread(self) -> bool:
        """Whether this rank has posted a round it has not read yet."""
        return self._read != self._posted

    def slot(self) -> torch.Tensor:
        """This rank's slot of the next round, to write its vector into."""
        if self.unread:
            raise RuntimeError("SharedRounds: read the round posted last (wait()) before "
                               "writing the next one; a peer may still be reading its buffer")
        return self._buffers[(self._posted + 1) % 2, self.rank]

    def post(self) -> None:
        """Publishes this rank's slot as the next round."""
        if self.unread:
            raise RuntimeError("SharedRounds: post() twice without wait() in between")
        self._posted += 1
        self._rounds[self.rank] = self._posted  # after the slot's stores, so seen after them

    def wait(self) -> torch.Tensor:
        """Every rank's vector of this rank's last posted round, ``[world_size, numel]``, once
        all have posted it. The view is valid until this rank posts again."""
        self._wait_for(self._posted)
        self._read = self._posted
        return self._buffers[self._posted % 2]

    def _wait_for(self, round_: int) -> None:
        rounds = self._rounds
        if rounds.min() >= round_:
            return
        start = time.monotonic()
        check_at = start + 1.0
        pause = 0.0
        while rounds.min() < round_:
            now = time.monotonic()
            waited = now - start
            if waited < _SPIN_S:
                os.sched_yield()
                continue
            if waited > self.timeout_s:
                late = [r for r in range(self.world_size) if rounds[r] < round_]
                raise RuntimeError(
                    f"rank {self.rank} waited {waited:.0f}s for rank(s) "
                    f"{', '.join(map(str, late))} to reach exchange round {round_}, past the "
                    f"timeout of {self.timeout_s:g}s (the CLI's --timeout)")
            if now >= check_at:
                self._check_alive(round_)
                check_at = now + 1.0
            pause = min(max(2 * pause, 20e-6), 1e-3)
            time.sleep(pause)

    def _check_alive(self, round_: int) -> None:
        """Raises if a rank that has not reached ``round_`` has exited (a job whose launcher
        does not end the others when one dies would otherwise wait out the timeout)."""
        namespace = _pid_namespace()
        for rank in range(self.world_size):
            pid, its_namespace = (int(v) for v in self._processes[rank])
            if (self._rounds[rank] >= round_ or not pid or not namespace
                    or its_namespace != namespace):
                continue  # arrived, not started, or its pid means nothing here
            if not _running(pid):
                raise RuntimeError(f"rank {self.rank} waited for rank {rank} (pid {pid}) to "
                                   f"reach exchange round {round_}, but that process has exited")


def _pid_namespace() -> int:
    """This process's pid namespace (its inode), 0 where /proc does not say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _header_bytes(world_size: int) -> int:
    return _LINE * (1 + world_size)  # the token's line, then one line per rank


def _data_bytes(world_size: int, numel: int, dtype: torch.dtype) -> int:
    return 2 * world_size * numel * torch.empty((), dtype=dtype).element_size()


def shares_memory_here() -> bool:
    """Whether this machine's ranks may exchange through :class:`SharedRounds` (x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _map(path: str, size: int, token: bytes) -> Optional[torch.Tensor]:
    """The segment rank 0 made, mapped, or None where this rank cannot see it (another
    machine, or another ``/dev/shm``). Never creates a file."""
    try:
        if os.path.getsize(path) != size:
            return None
    except OSError:
        return None  # not there
    storage = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    if bytes(storage[:_TOKEN].numpy()) != token:
        return None  # a file of that name, but not the one rank 0 wrote
    return storage


def _create(size: int) -> Optional[tuple[str, bytes]]:
    """A fresh segment of ``size`` bytes in ``/dev/shm`` (its path and token), its pages
    reserved up front, or None where that fails: a ``/dev/shm`` too small for it would
    otherwise end the process with SIGBUS at its first write."""
    if not shares_memory_here() or not os.path.isdir(_FOLDER):
        return None
    path = os.path.join(_FOLDER, f"pyg_mgpu-rounds-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    token = secrets.token_bytes(_TOKEN)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # zeros: every rank's round number starts at 0
            os.pwrite(fd, token, 0)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return path, token


def open_shared_rounds(numel: int, dtype: torch.dtype, group, timeout_s: float
                       ) -> Optional[SharedRounds]:
    """A :class:`SharedRounds` over the ranks of ``group`` (a gloo group; None: the default
    group) whose waits give up after ``timeout_s``, or None on every rank when they cannot
    share one: they are on several machines (or do not share ``/dev/shm``), ``/dev/shm`` has
    no room for it, or the machine is not x86-64. A collective: every rank of ``group`` calls
    it, in the same order as its other collectives.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    size = _header_bytes(world_size) + _data_bytes(world_size, numel, dtype)
    named = [None, None]
    if rank == 0:
        named = list(_create(size) or named)
    try:
        source = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(named, src=source, group=group)
        path, token = named
        storage = None if path is None else _map(path, size, token)
        everyone = torch.tensor([int(storage is not None)])
        dist.all_reduce(everyone, op=dist.ReduceOp.MIN, group=group)  # also: all have mapped it
    finally:
        if rank == 0 and named[0] is not None:
            os.unlink(named[0])  # the mappings stay; nothing is left in /dev/shm
    if not everyone.item():
        return None
    return SharedRounds(storage, rank, world_size, numel, dtype, timeout_s)

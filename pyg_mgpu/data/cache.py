"""The converted-graph cache: a dataset is converted once; later runs read or map the result.

Converting a large edge list to CSC is most of a load (and the moment of peak memory). The first
run therefore writes the converted :class:`ConvertedGraph` to a folder in a raw layout, one file per
tensor plus ``meta.json``::

    <cache_dir>/<dataset>-<id>/meta.json     format, key, name, num_classes, dtype and shape
                               colptr.bin    of each tensor
                               row.bin ...   the tensor's bytes, nothing else

Later runs with the same key read it back (:data:`PLACEMENTS`): copied to ``/dev/shm``, or
memory-mapped, when ranks share the pages through the page cache and the graph need not fit in
``/dev/shm``. The key covers the source files (path, size, modification time) and the
conversion options, so a changed source makes the cache stale; a stale, truncated or unreadable
cache is rebuilt, with one line saying why. A new cache is written to a temporary folder and
renamed into place, so a crash mid-write never leaves a cache that looks complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import weakref
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

from pyg_mgpu.data.graph import ConvertedGraph
from pyg_mgpu.data.sharing import MappedFile, check_shm_room
from pyg_mgpu.data.validation import SPLITS

FORMAT = 2  # bump when the layout or the conversion changes: every older cache goes stale
META = "meta.json"
CACHE_ENV = "PYG_MGPU_CACHE"


class CacheInvalid(Exception):
    """The cache folder cannot be used; the message says why (for the one-line notice)."""


def default_cache_dir() -> Path:
    """``$PYG_MGPU_CACHE/graphs``, default ``~/.cache/pyg_mgpu/graphs``."""
    base = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pyg_mgpu"
    return Path(base) / "graphs"


def _digest(value: object) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def cache_folder(cache_dir: Path, label: str, identity: dict) -> Path:
    """The folder of one dataset configuration (``identity``: what the data is, e.g. name,
    root, seed and dtype): its own folder, so configurations never evict each other."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:40]
    return Path(cache_dir) / f"{safe}-{_digest(identity)[:12]}"


def source_key(identity: dict, sources: Iterable[Path]) -> str:
    """The cache key: the configuration, the format and each source file's path, size and
    modification time (a content hash would read every byte of a many-GB dataset per run)."""
    stats = []
    for path in sorted(Path(p) for p in sources):
        if path.is_file():
            st = path.stat()
            stats.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return _digest({"format": FORMAT, "identity": identity, "sources": stats})


def save_store(graph: ConvertedGraph, folder: Path, key: str) -> None:
    """Writes ``graph`` to ``folder`` atomically (temporary folder, then rename), unless a
    valid store of ``key`` is already there (written by another process meanwhile)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Host and pid in the name: ranks of several machines may share a cache folder (NFS).
    writer = f"{socket.gethostname()}-{os.getpid()}"
    tmp = folder.with_name(f"{folder.name}.tmp-{writer}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tensors = {}
        for name, t in graph.tensors().items():
            t = t.detach().cpu().contiguous()
            with open(tmp / f"{name}.bin", "wb") as f:
                # A uint8 view writes any dtype (numpy has no bfloat16).
                f.write(t.view(-1).view(torch.uint8).numpy().data if t.numel() else b"")
            tensors[name] = {"dtype": str(t.dtype).removeprefix("torch."),
                             "shape": list(t.shape), "bytes": t.numel() * t.element_size()}
        meta = {"format": FORMAT, "key": key, "name": graph.name,
                "num_classes": graph.num_classes, "tensors": tensors,
                "written": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / META).write_text(json.dumps(meta, indent=1))  # last: its presence means complete
        if _holds(folder, key):
            # Another writer (a rank of another node sharing the cache) finished the same
            # graph first; replacing its folder would pull the files from under its readers.
            shutil.rmtree(tmp, ignore_errors=True)
            return
        old = folder.with_name(f"{folder.name}.old-{writer}")
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


PLACEMENTS = ("mmap", "shm", "tensors")
"""Where a cached graph's tensors go: ``mmap``: the cache files, mapped (evictable pages, shared
through the page cache); ``shm``: a copy in ``/dev/shm`` files, made by the kernel and mapped
(0.7-2.6 s for a 1.4 GB graph here, against 2.0-2.9 s for a process faulting the same bytes
into torch shared memory); ``tensors``: torch
shared-memory tensors, which torch itself can pickle (for a PyG ``Data`` handed to
:func:`pyg_mgpu.spawn`)."""

SHM_PREFIX = "pyg_mgpu-graph-"
_WHERE = {"mmap": "mapped", "shm": "copied to /dev/shm", "tensors": "in shared memory"}


def open_store(folder: Path, key: str) -> ConvertedGraph:
    """The cached graph in ``folder``, its files mapped: its pointers, labels, splits and (some
    of) its source ids are read to check them, the rest only when touched.

    Raises:
        CacheInvalid: the folder is missing, stale (another key), or truncated or corrupt.
    """
    folder = Path(folder)
    try:
        meta = json.loads((folder / META).read_text())
    except FileNotFoundError:
        raise CacheInvalid("not built yet") from None
    except (OSError, ValueError) as err:
        raise CacheInvalid(f"its {META} is unreadable ({type(err).__name__})") from None
    if meta.get("format") != FORMAT or meta.get("key") != key:
        raise CacheInvalid("stale (the source files or conversion options changed)")
    files = {}
    try:
        for name, spec in meta["tensors"].items():
            path = folder / f"{name}.bin"
            size = path.stat().st_size if path.exists() else None
            if size != spec["bytes"]:
                raise CacheInvalid(f"corrupt ({path.name} holds {size} bytes, {META} says "
                                   f"{spec['bytes']})")
            shape = tuple(int(d) for d in spec["shape"])
            files[name] = MappedFile(str(path), spec["dtype"], shape)
        graph = _mapped_store(str(meta["name"]), int(meta["num_classes"]), files)
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CacheInvalid(f"corrupt ({META}: {type(err).__name__}: {err})") from None
    _check_structure(graph)
    return graph


def place(graph: ConvertedGraph, placement: str, shm_dir: str = "/dev/shm") -> ConvertedGraph:
    """A graph from :func:`open_store` moved to ``placement`` (one of :data:`PLACEMENTS`).

    Mapped files travel to spawned ranks as file names (``ConvertedGraph.mapped``); ``shm`` copies
    are deleted when the returned graph is garbage collected or the process exits (a killed
    process's copies are swept by the next ``shm`` placement).

    Raises:
        DatasetError: ``/dev/shm`` has no room for the graph (``shm``, ``tensors``).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if placement == "mmap":
        return graph
    check_shm_room(graph.name, graph.nbytes(), shm_dir)
    if placement == "tensors":
        return ConvertedGraph(name=graph.name, num_classes=graph.num_classes,
                          **{k: f.read_shared() for k, f in graph.mapped.items()})
    copies = _copy_to_shm(graph.mapped, shm_dir)
    placed = _mapped_store(graph.name, graph.num_classes, copies)
    weakref.finalize(placed, _unlink, [f.path for f in copies.values()])
    return placed


def _mapped_store(name: str, num_classes: int, files: dict[str, MappedFile]) -> ConvertedGraph:
    graph = ConvertedGraph(name=name, num_classes=num_classes,
                       **{k: f.map() for k, f in files.items()})
    graph.mapped = files
    return graph


def _copy_to_shm(files: dict[str, MappedFile], shm_dir: str) -> dict[str, MappedFile]:
    _sweep_orphans(shm_dir)
    stem = f"{SHM_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
    copies = {}
    try:
        for name, f in files.items():
            copy = os.path.join(shm_dir, f"{stem}-{name}.bin")
            copies[name] = MappedFile(copy, f.dtype, f.shape)
            # In the kernel (sendfile): no page faults in this process. Copying in parallel
            # pieces measured no faster on this VM (0.74-2.6 s for 1.4 GB either way).
            shutil.copyfile(f.path, copy)
    except BaseException:
        _unlink([c.path for c in copies.values()])
        raise
    return copies


def _unlink(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _sweep_orphans(shm_dir: str) -> None:
    """Deletes the ``shm`` copies of processes that no longer exist (killed before cleanup)."""
    for path in Path(shm_dir).glob(f"{SHM_PREFIX}*.bin"):
        try:
            pid = int(path.name[len(SHM_PREFIX):].split("-")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            _unlink([str(path)])
        except (ValueError, PermissionError):  # not ours, or another user's live process
            pass


# Source ids checked whole up to this many edges (0.5 GB as int32, ~0.1 s from memory); past
# it, as many of them evenly spaced, so that opening a graph of billions of edges, mapped from
# disk, does not read them all.
_ROWS_READ_WHOLE = 1 << 27


def _check_structure(graph: ConvertedGraph) -> None:
    """Cheap checks that catch a cache overwritten in place with the same sizes: one pass over
    the pointers, labels, splits and source ids (a sample of them on graphs past
    ``_ROWS_READ_WHOLE`` edges), which a sampler or loss would otherwise trip over mid-run;
    the features are not read."""
    colptr, num_nodes = graph.colptr, graph.num_nodes
    if colptr.numel() < 2 or int(colptr[0]) != 0 or int(colptr[-1]) != graph.num_edges:
        raise CacheInvalid(f"corrupt (its CSC pointers end at {int(colptr[-1])}, but it holds "
                           f"{graph.num_edges} edges)")
    if graph.x.size(0) != num_nodes or graph.y.numel() != num_nodes:
        raise CacheInvalid("corrupt (features, labels and pointers disagree on the node count)")
    if bool((colptr[1:] < colptr[:-1]).any()):
        raise CacheInvalid("corrupt (its CSC pointers decrease)")
    rows = graph.row
    if rows.numel() > _ROWS_READ_WHOLE:  # evenly spaced: no full read of a mapped edge list
        rows = rows[::-(-rows.numel() // _ROWS_READ_WHOLE)]
    ranges = {"source ids": (rows, 0, num_nodes),
              "labels": (graph.y, -1, graph.num_classes),  # -1: unlabelled
              **{split: (getattr(graph, split), 0, num_nodes) for split in SPLITS}}
    for what, (values, low, high) in ranges.items():
        if values.numel():
            least, most = (int(v) for v in torch.aminmax(values))
            if least < low or most >= high:
                raise CacheInvalid(f"corrupt (its {what} span [{least}, {most}], outside "
                                   f"[{low}, {high}))")


def _holds(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds a complete, valid store of ``key``."""
    try:
        open_store(folder, key)
    except CacheInvalid:
        return False
    return True


def load_cached(folder: Path, identity: dict, sources: Callable[[], Iterable[Path]],
                build: Callable[[], ConvertedGraph], placement: Optional[str] = "tensors",
                log: Optional[Callable[[str], None]] = None) -> ConvertedGraph:
    """The graph cached in ``folder``, or ``build()``'s, written there first.

    Args:
        identity: What the data is (name, root, seed, options), for the key.
        sources: The source files now (called again after ``build``, which may download them).
        placement: One of :data:`PLACEMENTS`, or None: ``shm`` when ``/dev/shm`` has room for
            the graph with a tenth to spare, else ``mmap``.
        log: Receives one line: the cache hit, or why the cache was (re)built.
    """
    log = log or (lambda message: None)
    try:
        graph = open_store(folder, source_key(identity, sources()))
        done = f"read {folder}"
    except CacheInvalid as err:
        start = time.perf_counter()
        converted = build()
        key = source_key(identity, sources())
        try:
            save_store(converted, folder, key)
        except OSError as error:  # a full or read-only disk costs the cache, not the run ...
            if placement == "mmap":  # ... unless the run was to map the cache's files
                raise OSError(f"could not write the graph cache {folder} ({error.strerror}), "
                              "whose files the mmap placement (--features-on mmap) maps: "
                              "give it a writable folder with free space (cache_dir, "
                              "--cache-dir).") from error
            log(f"graph cache: could not write {folder} ({error.strerror}); continuing "
                "without it")
            return converted
        took = time.perf_counter() - start
        done = (f"converted and wrote {folder} in {took:.1f}s" if str(err) == "not built yet"
                else f"{folder} was {err}; rebuilt it in {took:.1f}s")
        del converted  # the converted copy goes before the files that replace it are placed
        graph = open_store(folder, key)
    placement = _placement(placement, graph.nbytes())
    graph = place(graph, placement)
    log(f"graph cache: {done} ({_WHERE[placement]})")
    return graph


def _placement(placement: Optional[str], nbytes: int, shm_dir: str = "/dev/shm") -> str:
    """``placement``, or for None (auto): ``shm`` when ``shm_dir`` can hold the graph with a
    tenth to spare (shared memory is RAM the kernel cannot evict; mapped pages it can)."""
    if placement is not None:
        return placement
    if os.path.isdir(shm_dir) and shutil.disk_usage(shm_dir).free >= nbytes * 1.1:
        return "shm"
    return "mmap"

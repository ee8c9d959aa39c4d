"""Reading a dataset through PyG or OGB: a changed raw file is read again rather than the
library's earlier processed copy, and a failed read says whether anything was downloaded and
leaves no empty folders behind."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pyg_mgpu.data import DatasetError, downloads, load_graph

# The data tests' fixtures too: mirrors go to a temporary cache (autouse), and downloads fail.
from test_datasets import (cache, make_read_only, make_writable, offline,  # noqa: F401
                           write_ogbn_arxiv, write_reddit)


def relabel(root: Path, labels: np.ndarray, *folders: Path) -> None:
    """Rewrites Reddit's labels after everything under ``folders`` was last written."""
    for path in (p for folder in folders for p in folder.rglob("*") if p.is_file()):
        earlier = path.stat().st_mtime - 10
        os.utime(path, (earlier, earlier))
    path = root / "raw" / "reddit_data.npz"
    np.savez(path, **dict(np.load(path), label=labels))


@pytest.mark.slow
@pytest.mark.parametrize("read_only", [False, True], ids=["own folder", "mirrored"])
def test_a_changed_raw_file_is_processed_again(tmp_path, capsys, read_only):
    root = tmp_path / "reddit"
    write_reddit(root)
    if read_only:
        make_read_only(root)
    try:
        assert load_graph("reddit", root).y.tolist() == (np.arange(12) % 3).tolist()
        if read_only:
            make_writable(root)
        relabel(root, (np.arange(12) + 1) % 3, tmp_path)
        if read_only:
            make_read_only(root)
        capsys.readouterr()
        assert load_graph("reddit", root).y.tolist() == ((np.arange(12) + 1) % 3).tolist()
        assert "changed after" in capsys.readouterr().err
        load_graph("reddit", root)  # the new processed/ is newer: read, not processed again
        assert "changed after" not in capsys.readouterr().err
    finally:
        make_writable(root)


@pytest.mark.slow
def test_an_ogb_folder_missing_one_split_file_says_nothing_was_downloaded(tmp_path, offline):
    write_ogbn_arxiv(tmp_path, release=True)
    (tmp_path / "ogbn_arxiv" / "split" / "time" / "valid.csv.gz").unlink()
    with pytest.raises(DatasetError) as error:
        load_graph("ogbn-arxiv", tmp_path)
    message = str(error.value)
    assert "missing ogbn_arxiv/split/time/valid.csv.gz" in message
    assert "holds only some of them, so nothing was downloaded" in message
    assert "download from" not in message


@pytest.mark.slow
def test_a_raw_file_replaced_by_an_older_copy_is_processed_again(tmp_path, capsys):
    # cp -p, tar and unzip keep a file's own modification time, older than processed/.
    root = tmp_path / "reddit"
    write_reddit(root)
    assert load_graph("reddit", root).y.tolist() == (np.arange(12) % 3).tolist()
    path = root / "raw" / "reddit_data.npz"
    earlier = path.stat().st_mtime - 3600
    np.savez(path, **dict(np.load(path), label=(np.arange(12) + 1) % 3))
    os.utime(path, (earlier, earlier))
    capsys.readouterr()
    assert load_graph("reddit", root).y.tolist() == ((np.arange(12) + 1) % 3).tolist()
    assert "changed after" in capsys.readouterr().err
    load_graph("reddit", root)  # made from these files: read, not processed again
    assert "changed after" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_root_below_a_folder_named_processed_still_sees_its_raw_files_change(tmp_path):
    # The converted-graph cache keys on the dataset's source files, its processed/ left out:
    # not those of a root that lies below a folder of that name.
    root, graphs = tmp_path / "processed" / "data", tmp_path / "graphs"
    write_ogbn_arxiv(root, release=True)
    first = load_graph("ogbn-arxiv", root, cache_dir=graphs)
    assert first.y.tolist() == (np.arange(10) % 4).tolist()
    labels = root / "ogbn_arxiv" / "raw" / "node-label.csv.gz"
    np.savetxt(labels, (np.arange(10) + 1) % 4, fmt="%d")
    later = labels.stat().st_mtime + 10
    os.utime(labels, (later, later))
    again = load_graph("ogbn-arxiv", root, cache_dir=graphs)
    assert again.y.tolist() == ((np.arange(10) + 1) % 4).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["num-node-list.csv.gz", "node-label.csv.gz"])
def test_an_ogb_folder_missing_a_raw_file_names_it(tmp_path, offline, name):
    write_ogbn_arxiv(tmp_path, release=True)
    (tmp_path / "ogbn_arxiv" / "raw" / name).unlink()
    with pytest.raises(DatasetError) as error:
        load_graph("ogbn-arxiv", tmp_path)
    message = str(error.value)
    assert f"missing ogbn_arxiv/raw/{name})" in message
    assert "holds only some of them, so nothing was downloaded" in message
    assert "corrupt" not in message


def test_a_failed_download_into_an_existing_folder_leaves_it_as_it_was(tmp_path, offline):
    root = tmp_path / "reddit"
    (root / "notes").mkdir(parents=True)  # a folder of the user's, empty, stays
    with pytest.raises(DatasetError, match="the download from .* failed"):
        load_graph("reddit", root)
    assert sorted(p.name for p in root.iterdir()) == ["notes"]


def test_a_stale_processed_link_is_emptied_not_removed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "data.pt").write_text("old")
    (elsewhere / "sub" / "more.pt").write_text("old")
    folder = tmp_path / "ds"
    (folder / "raw").mkdir(parents=True)
    (folder / "processed").symlink_to(elsewhere)
    for path in [elsewhere / "data.pt", elsewhere / "sub" / "more.pt"]:
        os.utime(path, (1, 1))
    (folder / "raw" / "a.npz").write_text("new")
    downloads._drop_stale_processed("demo", folder)
    assert (folder / "processed").is_symlink() and list(elsewhere.iterdir()) == []


def test_processes_sharing_a_data_folder_take_turns(tmp_path, capsys):
    # Another process (a second machine of a torchrun job, on a shared filesystem) holds the
    # folder's lock: this one must not read or rewrite processed/ until it lets go.
    import subprocess
    import sys
    import threading
    import time

    root = tmp_path / "reddit"
    write_reddit(root)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | "
         "os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
         "sys.stdin.readline(); os.unlink(sys.argv[1])", str(root / ".pyg_mgpu-reddit.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        built = []

        def read() -> None:
            downloads.run_library("reddit", root, root, [], "nowhere",
                                  lambda library_root: built.append(library_root))

        reader = threading.Thread(target=read)
        reader.start()
        while "waiting for another process" not in capsys.readouterr().err:
            assert reader.is_alive() and holder.poll() is None
            time.sleep(0.01)
        assert built == []  # the lock is still held
        holder.stdin.write("\n")
        holder.stdin.flush()
        reader.join(timeout=60)
        assert built == [root] and not reader.is_alive()
    finally:
        holder.kill()
        holder.wait()
    assert not (root / ".pyg_mgpu-reddit.lock").exists()
    assert load_graph("reddit", root).y.tolist() == (np.arange(12) % 3).tolist()
    assert not (root / ".pyg_mgpu-reddit.lock").exists(), "the lock file is left behind"

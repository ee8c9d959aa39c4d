"""Your own training loop, stopped at a clean point and resumed where it stopped.

Inside ``stop.graceful()`` a stop signal (Ctrl-C, ``kill -TERM``, a scheduler's preemption) is
only recorded. After every step the ranks agree (``StopAgreement``) whether any of them got one,
so they all stop after the same step: rank 0 writes a checkpoint, and the job exits with 128 + the
signal's number (130 for Ctrl-C, 143 for SIGTERM). The same command again continues from the
checkpoint::

    python examples/stop_and_resume.py --out runs/stop_and_resume     # Ctrl-C after a few steps
    python examples/stop_and_resume.py --out runs/stop_and_resume     # continues from there

The resumed run trains on the rest of the stopped epoch's batches (``set_epoch(epoch,
start_step)``): every seed node of the epoch exactly once, as without the stop. Its neighbour
draws and dropout masks are new ones; the CLI's checkpoints also hold every rank's generator
states, to resume bit for bit (docs/faults.md).
"""
import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.nn import GraphSAGE

import pyg_mgpu
from pyg_mgpu.data import SyntheticSpec
from pyg_mgpu.distributed import stop


def save_atomically(state: dict, path: Path) -> None:
    """A reader (the next run) finds the previous checkpoint or this one, never half of one."""
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def train(ctx: pyg_mgpu.RankContext, data, args: argparse.Namespace) -> None:
    checkpoint = Path(args.out) / "checkpoint.pt"
    torch.manual_seed(0)
    model = GraphSAGE(data.num_features, args.hidden, num_layers=2,
                      out_channels=data.num_classes, dropout=0.5).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    epoch, step = 1, 0  # the next epoch, and the batches of it already trained
    if checkpoint.exists():  # every rank reads it
        state = torch.load(checkpoint, map_location=ctx.device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, step = state["epoch"], state["step"]
        if ctx.is_main:
            print(f"resuming epoch {epoch} after step {step}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda"
                                  else None)
    loader = pyg_mgpu.NeighborLoader(data, [10, 5], input_nodes=data.train_mask,
                                     batch_size=args.batch_size, shuffle=True, distributed=True)

    agreement = stop.StopAgreement()  # a collective: every rank creates it, in the same order
    with stop.graceful():
        while epoch <= args.epochs:
            loader.set_epoch(epoch, start_step=step)  # skips the batches already trained
            for batch in loader:
                batch = batch.to(ctx.device)
                optimizer.zero_grad()
                out = ddp(batch.x, batch.edge_index)[:batch.batch_size]
                loss = F.cross_entropy(out, batch.y[:batch.batch_size])
                loss.backward()
                optimizer.step()
                step += 1
                if ctx.is_main:
                    print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
                # The agreement on the previous step's flags: the same answer on every rank.
                decision = agreement.after_step()
                if decision.stop:
                    if ctx.is_main:
                        save_atomically({"model": model.state_dict(),
                                         "optimizer": optimizer.state_dict(),
                                         "epoch": epoch, "step": step}, checkpoint)
                        print(f"stopped: checkpoint at epoch {epoch} step {step}", flush=True)
                    dist.barrier()  # no rank ends before the checkpoint is written
                    agreement.close()
                    raise stop.StopSignal(decision.stop)  # spawn raises JobStopped
            epoch, step = epoch + 1, 0
    agreement.close()

    test = pyg_mgpu.NeighborLoader(data, [10, 5], input_nodes=data.test_mask,
                                   batch_size=args.batch_size, distributed=True)
    test_acc = pyg_mgpu.accuracy(model, test, device=ctx.device)  # every rank calls it
    if ctx.is_main:
        print(f"test acc {test_acc:.4f}", flush=True)
        checkpoint.unlink(missing_ok=True)  # finished: the next run starts afresh


def main() -> None:
    p = argparse.ArgumentParser(description="A training loop that stops at a clean point on "
                                            "Ctrl-C or SIGTERM and resumes when run again.")
    p.add_argument("--out", default="runs/stop_and_resume", help="folder of the checkpoint")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--devices", default="auto", help="auto, cpu, cuda or cuda:0,1,...")
    p.add_argument("--nprocs", type=int, default=None, help="CPU ranks (default 2)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--num-nodes", type=int, default=50_000, help="synthetic graph size")
    p.add_argument("--num-edges", type=int, default=1_000_000, help="synthetic graph size")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)

    data = pyg_mgpu.load_dataset("synthetic", synthetic=SyntheticSpec(
        num_nodes=args.num_nodes, num_edges=args.num_edges))
    try:
        pyg_mgpu.spawn(train, args=(data, args), devices=args.devices, nprocs=args.nprocs)
    except (pyg_mgpu.JobStopped, stop.StopSignal) as e:  # StopSignal: under torchrun
        print("stopped; the same command again continues from the checkpoint", file=sys.stderr)
        sys.exit(stop.stopped_exit_code(e.signum))


if __name__ == "__main__":
    main()

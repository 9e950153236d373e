"""Bytes per rank and step of the gradient exchanges, at several numbers of ranks.

    python scripts/benchmark_traffic.py --worlds 2 4 8 --sparsities 0.996 0.999

Starts W gloo processes on this machine (one thread each; 8 processes on 2 cores slow the
wall time, not the bytes) around a DDP model of `--entries` float32 parameters in DDP's
buckets, and runs a few steps of each exchange with random gradients, reading the DGC
hook's own count (`StepTraffic`) on every rank:

- `dgc_allgather`: the DGC hook (plain SGD, no warm-up) at each sparsity: every rank's
  (index, value) payload gathered by all ranks;
- `dense_ring`: DDP's all-reduce as a ring moves 2 (W - 1) / W of the buckets each way per
  rank (the reference; the hook at sparsity 0 counts it).

One JSON line per (exchange, sparsity, W): payload, sent and received bytes per rank and
step (equal on every rank, checked), the dense reference, received against the dense
reference, and received against the same exchange at the smallest W.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from asr.training.distributed.savers.dgc import dgc_hook
from asr.training.distributed.savers.dgc_state import DGCConfig, DGCState

STEPS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Layers(nn.Module):
    """Four linear layers of 1,000 inputs holding about `entries` float32 parameters;
    `forward(x)` sums their outputs' mean squares."""

    def __init__(self, entries: int) -> None:
        super().__init__()
        rows = max(entries // 4000, 1)
        self.layers = nn.ModuleList(nn.Linear(1000, rows) for _ in range(4))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return sum(layer(inputs).square().mean() for layer in self.layers)


def _traffic(entries: int, sparsity: float, rank: int) -> dict:
    """A few steps of the DGC hook at `sparsity` on this rank: its last step's traffic."""
    torch.manual_seed(0)
    model = DistributedDataParallel(_Layers(entries))
    total = sum(p.numel() for p in model.parameters())
    state = DGCState(DGCConfig(sparsity=sparsity, warmup_steps=0), total_entries=total)
    model.register_comm_hook(state, dgc_hook)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        inputs = torch.randn(8, 1000, generator=generator)
        model(inputs).backward()
    return {**vars(state.last_traffic), "entries_total": total}


def _worker(rank: int, world: int, port: int, entries: int, sparsities: list, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {str(s): _traffic(entries, s, rank) for s in [0.0, *sparsities]}
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def measure(world: int, entries: int, sparsities: list[float]) -> dict[str, dict]:
    """Each sparsity's traffic (0: the dense all-reduce), the same on every rank."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, (world, _free_port(), entries, sparsities, out), nprocs=world)
        ranks = [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]
    for rank in ranks[1:]:
        for key, traffic in rank.items():
            for name in ("sent_bytes", "received_bytes", "dense_bytes"):
                if traffic[name] != ranks[0][key][name]:
                    raise RuntimeError(f"ranks differ in {name} at sparsity {key}")
    return ranks[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.996, 0.999])
    parser.add_argument("--entries", type=int, default=1_000_000, help="float32 parameters")
    args = parser.parse_args()
    first: dict[str, float] = {}
    for world in args.worlds:
        for key, traffic in measure(world, args.entries, args.sparsities).items():
            sparsity = float(key)
            exchange = "dense_ring" if sparsity == 0.0 else "dgc_allgather"
            received = traffic["received_bytes"]
            first.setdefault(key, received)
            line = {
                "exchange": exchange,
                "sparsity": sparsity,
                "world": world,
                "entries": traffic["entries_total"],
                "payload_bytes": traffic["payload_bytes"],
                "sent_bytes": traffic["sent_bytes"],
                "received_bytes": received,
                "dense_ring_bytes": traffic["dense_bytes"],
                "dense_over_received": round(traffic["dense_bytes"] / max(received, 1), 2),
                f"received_vs_world_{args.worlds[0]}": round(received / first[key], 3),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

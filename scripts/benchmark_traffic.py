"""Bytes per rank and step of the gradient exchanges, at several numbers of ranks.

    python scripts/benchmark_traffic.py --worlds 2 4 8 --sparsities 0.996 0.999

Starts W gloo processes on this machine (one thread each; 8 processes on 2 cores slow the
wall time, not the bytes) around a DDP model of `--entries` float32 parameters in DDP's
buckets, and runs a few steps of each exchange with random gradients, reading the DGC
hook's own count (`StepTraffic`) on every rank:

- `dgc_allgather`: the DGC hook (plain SGD, no warm-up) at each sparsity: every rank's
  (index, value) payload gathered by all ranks;
- `dgc_reduce_scatter`: the same with `exchange: reduce_scatter`: each rank's pairs sent to
  the owners of their regions, summed there, and each region's largest sums all-gathered;
- `dense_ring`: DDP's all-reduce as a ring moves 2 (W - 1) / W of the buckets each way per
  rank (the reference; the hook at sparsity 0 counts it).

One JSON line per (exchange, sparsity, W): payload, sent and received bytes per rank and
step (the mean over ranks, and the most any rank received: the reduce-scatter's first round
depends on where each rank's pairs lie), the dense reference, received against the dense
reference, and received against the same exchange at the smallest W. Every byte a rank
counts as sent is counted as received by another (checked).
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

from asr.training.distributed.communication.dgc.hook import dgc_hook
from asr.training.distributed.communication.dgc.state import DGCConfig, DGCState

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


CASES = {  # name: (sparsity of the run or None for each --sparsities, exchange)
    "dense_ring": (0.0, "allgather"),
    "dgc_allgather": (None, "allgather"),
    "dgc_reduce_scatter": (None, "reduce_scatter"),
}


def _traffic(entries: int, sparsity: float, exchange: str, rank: int) -> dict:
    """A few steps of the DGC hook at `sparsity` on this rank: its last step's traffic."""
    torch.manual_seed(0)
    model = DistributedDataParallel(_Layers(entries))
    total = sum(p.numel() for p in model.parameters())
    config = DGCConfig(sparsity=sparsity, warmup_steps=0, exchange=exchange)
    state = DGCState(config, total_entries=total)
    model.register_comm_hook(state, dgc_hook)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        inputs = torch.randn(8, 1000, generator=generator)
        model(inputs).backward()
    return {**vars(state.last_traffic), "entries_total": total}


def _worker(rank: int, world: int, port: int, entries: int, cases: list, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {case: _traffic(entries, *case[1:], rank) for case in cases}
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def measure(world: int, entries: int, cases: list[tuple]) -> dict[tuple, dict]:
    """Each case's traffic, (name, sparsity, exchange): the first rank's counts with the
    mean and the most received over the ranks."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, (world, _free_port(), entries, cases, out), nprocs=world)
        ranks = [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]
    results = {}
    for case in cases:
        counts = [rank[case] for rank in ranks]
        sent = sum(c["sent_bytes"] for c in counts)
        received = [c["received_bytes"] for c in counts]
        if sent != sum(received):
            raise RuntimeError(f"{case}: {sent} bytes sent, {sum(received)} received")
        results[case] = {
            **counts[0],
            "sent_bytes": sent / world,
            "received_bytes": sum(received) / world,
            "most_received_bytes": max(received),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.996, 0.999])
    parser.add_argument("--entries", type=int, default=1_000_000, help="float32 parameters")
    args = parser.parse_args()
    cases = [
        (name, sparsity if fixed is None else fixed, exchange)
        for name, (fixed, exchange) in CASES.items()
        for sparsity in (args.sparsities if fixed is None else [fixed])
    ]
    first: dict[tuple, float] = {}
    for world in args.worlds:
        for case, traffic in measure(world, args.entries, cases).items():
            received = traffic["received_bytes"]
            first.setdefault(case, received)
            line = {
                "exchange": case[0],
                "sparsity": case[1],
                "world": world,
                "entries": traffic["entries_total"],
                "payload_bytes": traffic["payload_bytes"],
                "sent_bytes": round(traffic["sent_bytes"]),
                "received_bytes": round(received),
                "most_received_bytes": traffic["most_received_bytes"],
                "dense_ring_bytes": traffic["dense_bytes"],
                "dense_over_received": round(traffic["dense_bytes"] / max(received, 1), 2),
                f"received_vs_world_{args.worlds[0]}": round(received / first[case], 3),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

"""One rank of the gossip tests: replicas of a 16-entry weight vector, each rank starting
from its own random weights and pulled towards its own target by `lr` x (w - target) per
step, averaged with peers by `Gossip`. Writes what it saw to `out_dir/rank{R}.pt`.

Modes: `fixed`, `random` (the rings), `delay` (fixed ring, delay-by-one; the passive ranks
do not train, so the run is deterministic whatever the timing), `sync` (fixed ring,
synchronous: deterministic)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from asr.training.distributed.savers.gossip import Gossip, GossipConfig


def main(rank: int, world: int, init_file: str, out_dir: str, mode: str, steps: int, lr: float):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    group, average_group = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    weights = torch.randn(16, generator=torch.Generator().manual_seed(rank))
    target = torch.randn(16, generator=torch.Generator().manual_seed(100 + rank))
    config = GossipConfig(
        ring="random" if mode == "random" else "fixed",
        delay_by_one=mode == "delay",
        synchronous=mode == "sync",
    )
    gossip = Gossip([weights], config, list(range(world)), group, average_group)
    trains = lr > 0 and not (mode == "delay" and not gossip.active)
    record: dict[str, list] = {"start": [weights.clone()], "after_step": [], "spread": []}
    applied = torch.zeros_like(weights)  # the sum of this rank's own updates
    for step in range(steps):
        if trains:
            with gossip.lock:
                update = -lr * (weights - target)
                weights += update
                applied += update
        gossip.after_step()
        record["after_step"].append(weights.clone())
        if step % 10 == 9 and mode != "delay":
            record["spread"].append(gossip.average(write=False))
    gossip.close()
    record["exchanges"] = gossip.exchanges
    record["active"] = gossip.active
    record["target"] = target
    record["applied"] = applied
    record["spread_before_consensus"] = gossip.average(write=True)
    record["consensus"] = weights.clone()
    torch.save(record, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    rank, world, init_file, out_dir, mode, steps, lr = sys.argv[1:]
    main(int(rank), int(world), init_file, out_dir, mode, int(steps), float(lr))

"""One rank of the decentralized-strategy tests: a toy linear regression trained by
Lightning with `DecentralizedStrategy`, each rank on its own data (started like torchrun
would: RANK, LOCAL_RANK, WORLD_SIZE in the environment). Records the weights after every
optimizer step to `out_dir/rank{R}.pt`.

    strategy_worker.py RANK WORLD PORT OUT_DIR NODE_SIZE STEPS [RING] [delay|sync|ddp|straggle]

`sync`: synchronous gossip; `ddp`: Lightning's DDPStrategy instead (both with momentum SGD,
to compare the two step by step); `straggle`: rank 1 sleeps 0.1 s after each step. Each
step's end time is recorded too.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from asr.training.distributed.communication.adpsgd import DecentralizedConfig, DecentralizedStrategy


class Regression(L.LightningModule):
    def __init__(self, momentum: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.momentum = momentum

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=self.momentum)


class Record(L.Callback):
    def __init__(self, pause: float = 0.0) -> None:
        self.weights: list[torch.Tensor] = []
        self.times: list[float] = []
        self.pause = pause

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        self.weights.append(torch.cat([p.detach().reshape(-1) for p in pl_module.parameters()]))
        time.sleep(self.pause)
        self.times.append(time.monotonic())


def main(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    node_size: int,
    steps: int,
    ring: str,
    mode: str,
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        NODE_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    L.seed_everything(0)  # the same initial weights everywhere
    generator = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    x = torch.randn(steps * 4, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True) + rank + 0.1 * torch.randn(steps * 4, 1, generator=generator)
    config = DecentralizedConfig(
        ring=ring, delay_by_one=mode == "delay", synchronous=mode == "sync", node_size=node_size
    )
    strategy = (
        DDPStrategy(timeout=timedelta(seconds=60))
        if mode == "ddp"
        else DecentralizedStrategy(config, timeout=timedelta(seconds=60))
    )
    record = Record(0.1 if mode == "straggle" and rank == 1 else 0.0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_steps=steps,
        callbacks=[record],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    momentum = 0.9 if mode in ("sync", "ddp") else 0.0
    trainer.fit(Regression(momentum), DataLoader(TensorDataset(x, y), batch_size=4))
    final = torch.cat([p.detach().reshape(-1) for p in trainer.lightning_module.parameters()])
    result = {"weights": record.weights, "final": final, "times": record.times}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    rank, world, port, out_dir, node_size, steps = sys.argv[1:7]
    ring = sys.argv[7] if len(sys.argv) > 7 else "fixed"
    mode = sys.argv[8] if len(sys.argv) > 8 else ""
    main(int(rank), int(world), int(port), out_dir, int(node_size), int(steps), ring, mode)

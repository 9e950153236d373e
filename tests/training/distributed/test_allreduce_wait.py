"""Plain DDP's wait in the gradient all-reduce (`debug.step_times_dir`): the clock's
arithmetic, and 2 real processes over gloo where one rank sleeps before its backward, so
the other waits for it at every step."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from asr.training.distributed.communication.allreduce_wait import AllReduceClock

PAUSE = 0.3  # seconds the straggler sleeps before each backward


def straggler_step_times(rank: int, world: int, out_dir: Path, steps: int, pause: float) -> dict:
    """Scenario (run on every rank by `run_ranks`, in a gloo group that Lightning joins): a
    toy regression trained by Lightning with the strategy and callbacks `setup_distributed`
    builds for `debug.step_times_dir`, rank 1 sleeping `pause` s before each backward;
    returns this rank's step-times records."""
    import os
    import time

    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from asr.training.distributed.config import DistributedConfig
    from asr.training.distributed.setup import TrainingFacts, setup_distributed
    from asr.training.optimizer import optim_config
    from asr.training.run_config import DebugConfig, TrainerConfig

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(64, 1)

        def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            if self.global_rank == 1:
                time.sleep(pause)  # after the forward, before the backward
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    os.environ["LOCAL_RANK"] = str(rank)  # launched already: Lightning starts no process
    times = out_dir / "times"
    trainer_keys = TrainerConfig(accelerator="cpu", devices=world, strategy="ddp")
    facts = TrainingFacts(
        trainer=trainer_keys,
        optim=optim_config({"lr": 0.01}),
        debug=DebugConfig(step_times_dir=str(times)),
    )
    setup = setup_distributed(DistributedConfig(timeout=60.0), facts)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=setup.strategy,
        callbacks=setup.callbacks,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(steps * 4, 64, generator=generator)
    trainer.fit(Regression(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    lines = (times / f"rank{rank}.jsonl").read_text().splitlines()
    return {"steps": [json.loads(line) for line in lines], "strategy": setup.resolved["strategy"]}


@pytest.mark.slow  # real processes over gloo
def test_the_rank_that_waits_for_a_straggler_records_the_wait(run_ranks, tmp_path: Path) -> None:
    ranks = run_ranks(tmp_path, straggler_step_times, steps=6, pause=PAUSE)
    assert ranks[0]["strategy"] == "HookedDDPStrategy"  # the hook registered on a CPU
    waiting, straggler = ([s["allreduce_wait_s"] for s in r["steps"][1:]] for r in ranks)
    assert len(waiting) == len(straggler) == 5
    assert statistics.median(waiting) > 0.6 * PAUSE, waiting
    assert statistics.median(straggler) < statistics.median(waiting) / 4, (straggler, waiting)
    for rank in ranks:
        first, *later = rank["steps"]
        assert first["step_s"] is None  # nothing before the first step to count from
        assert all(s["step_s"] > PAUSE * 0.9 for s in later)  # both at the straggler's pace


def test_the_wait_runs_from_the_last_launch_to_the_last_completion() -> None:
    clock = AllReduceClock()
    assert clock.take_wait() is None  # no all-reduce yet
    for launch in (1.0, 1.5, 2.0):  # three buckets
        clock.launched(at=launch)
    for completion in (2.25, 4.0, 3.0):  # completions in any order, on other threads
        clock.completed(at=completion)
    assert clock.take_wait() == 2.0  # 4.0 - 2.0
    assert clock.take_wait() is None  # forgotten once read: a step without an exchange
    clock.launched(at=5.0)
    clock.completed(at=5.25)
    assert clock.take_wait() == 0.25

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

from asr.training.checkpointing import AtomicCheckpointIO, checkpoint_callbacks


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_save_writes_the_file_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "ckpts" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1, "w": torch.arange(3.0)}, path)
    AtomicCheckpointIO().save_checkpoint({"step": 2, "w": torch.arange(4.0)}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]
    loaded = AtomicCheckpointIO().load_checkpoint(path)
    assert loaded["step"] == 2 and torch.equal(loaded["w"], torch.arange(4.0))


def test_failed_save_keeps_previous_checkpoint_and_leaves_no_temp_file(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(1000)}, path)
    before = path.read_bytes()
    # pickling fails after the temporary file beside the target was opened
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(1000), "bad": Unpicklable()}, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert io.load_checkpoint(path)["step"] == 1


class _Model(BoringModel):
    """Lightning's 32-dim regression demo, logging the metric best.ckpt watches."""

    def validation_step(self, batch, batch_idx):
        self.log("val/wer", 100.0 / (1 + self.global_step))
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(RandomDataset(32, 8), batch_size=2)  # 4 steps/epoch

    def val_dataloader(self):
        return torch.utils.data.DataLoader(RandomDataset(32, 2), batch_size=2)


def _fit(ckpt_dir: Path, max_steps: int, every_n_train_steps: int | None) -> None:
    trainer = L.Trainer(
        max_steps=max_steps,
        callbacks=checkpoint_callbacks(ckpt_dir, every_n_train_steps),
        plugins=[AtomicCheckpointIO()],
        default_root_dir=ckpt_dir.parent,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Model())


def _steps(ckpt_dir: Path) -> dict[str, int]:
    return {
        p.name: torch.load(p, map_location="cpu", weights_only=False)["global_step"]
        for p in sorted(ckpt_dir.iterdir())
    }


def test_epoch_best_and_last_files(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "checkpoints"
    _fit(ckpt_dir, max_steps=8, every_n_train_steps=None)
    assert _steps(ckpt_dir) == {
        "best.ckpt": 8,  # val/wer falls with the step: the last epoch is the best
        "epoch=00.ckpt": 4,
        "epoch=01.ckpt": 8,
        "last.ckpt": 8,
    }


def test_last_checkpoint_is_the_newest_with_a_step_cadence(tmp_path: Path) -> None:
    # 4 steps per epoch, last.ckpt every 3 steps; the run stops at step 5 (mid-epoch).
    # last.ckpt is the newest state that resumes mid-epoch: step 3. (A checkpoint written
    # when training ends has Lightning's epoch marked complete: it would resume at the next
    # epoch and skip the rest of this one.)
    ckpt_dir = tmp_path / "checkpoints"
    _fit(ckpt_dir, max_steps=5, every_n_train_steps=3)
    steps = _steps(ckpt_dir)
    assert steps["last.ckpt"] == 3, steps
    assert not [name for name in steps if name.startswith("last-v")], steps

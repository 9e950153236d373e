"""`asr-train` reads its config through dataclasses only: the run-level keys into
`RunConfig`, the trainer group into `TrainerConfig` (plus the other `lightning.Trainer`
arguments a user adds), every other group by its part. A key that nothing declares is an
error that names it, and train.py itself reads no key outside the groups."""

from __future__ import annotations

import ast
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from asr.config_keys import ConfigError
from asr.training import train
from asr.training.command import CONFIG_DIR
from asr.training.run_config import (
    SECTION_KEYS,
    RunConfig,
    TrainerConfig,
    read_run_config,
    read_trainer_config,
    trainer_arguments,
)

PRESETS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))


def _compose(*overrides: str) -> dict:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return OmegaConf.to_container(hydra.compose("train", overrides=list(overrides)))


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_every_preset_reads_into_the_dataclasses(preset: str | None) -> None:
    cfg = _compose(*([f"experiment={preset}"] if preset else []))
    run = read_run_config(cfg)
    assert isinstance(run, RunConfig) and run.exp_dir == cfg["exp_dir"]
    assert run.debug.straggler_slowdown == cfg["debug"]["straggler_slowdown"]
    trainer, extra = read_trainer_config(cfg["trainer"])
    assert isinstance(trainer, TrainerConfig) and extra == {}
    assert trainer.max_epochs == cfg["trainer"]["max_epochs"]
    assert set(cfg) - {"trainer", "model", "data", "optim", "logger", "ema"} <= set(
        RunConfig.__dataclass_fields__
    )


def test_an_undeclared_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key seeds; valid top-level keys"):
        read_run_config(_compose("+seeds=3"))
    with pytest.raises(ConfigError, match=r"unknown config key debug.slowdown"):
        read_run_config(_compose("+debug.slowdown=3"))
    with pytest.raises(ConfigError, match=r"unknown config key trainer.max_epoch: neither"):
        read_trainer_config(_compose("+trainer.max_epoch=3")["trainer"])
    with pytest.raises(ConfigError, match=r"trainer.callbacks: .*it sets \['logger', 'callb"):
        read_trainer_config(_compose("+trainer.callbacks=[]")["trainer"])


def test_other_lightning_arguments_pass_through_and_the_resolved_ones_stay_out() -> None:
    trainer, extra = read_trainer_config(_compose("+trainer.val_check_interval=3")["trainer"])
    assert extra == {"val_check_interval": 3}
    arguments = trainer_arguments(trainer, extra)
    assert arguments["val_check_interval"] == 3 and arguments["max_epochs"] == trainer.max_epochs
    assert "precision" not in arguments and "strategy" not in arguments  # resolved first


def test_train_py_reads_no_key_outside_the_groups() -> None:
    """Every key train.py reads from a config mapping itself (a subscript or get/pop) is
    one of the groups, each handed whole to the reader of its dataclass; the run-level keys
    are read through `read_run_config` alone."""
    tree = ast.parse(Path(train.__file__).read_text())
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            reads = node.func.attr in ("get", "pop", "select") and node.args
            if reads and owner != "os.environ":
                keys.add(ast.literal_eval(node.args[0]))
        elif isinstance(node, ast.Attribute) and ast.unparse(node.value) == "cfg":
            keys.add(node.attr)
    # `model.loss` goes whole to the objective, which reads it into its loss's dataclass
    assert keys <= {*SECTION_KEYS, "loss"}, sorted(keys - {*SECTION_KEYS, "loss"})
    assert {"trainer", "model", "data", "optim", "logger", "ema"} <= keys

"""`asr-train`'s command line: Hydra composes the config from `asr/configs` and the
overrides, then `asr.training.train.run` trains. Torch and Lightning are imported only
once a run starts, so that `--cfg job`, `--help` and a bad override answer in a second
(the recipes resolve their config this way before every stage).

The configs ship inside the package (asr/configs), so any install finds them;
ASR_CONFIG_DIR points elsewhere, and Hydra's --config-dir adds a directory."""

from __future__ import annotations

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from asr.cli import command

CONFIG_DIR = os.environ.get("ASR_CONFIG_DIR", str(Path(__file__).resolve().parents[1] / "configs"))


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
@command
def main(cfg: DictConfig) -> None:
    from asr.training.cuda_allocator import use_expandable_segments

    use_expandable_segments()  # before anything touches CUDA
    from asr.training.train import run

    run(cfg)


if __name__ == "__main__":
    main()

"""The Hydra group files of `asr/configs`, written from the config dataclasses.

Every default lives in a config dataclass and every key is documented there, one line
`- `key`: text` per key in the class docstring (continued on indented lines). The YAML
files that hold defaults are generated from them, so a default is written once:

    python -m asr.training.config_files            # rewrite asr/configs
    python -m asr.training.config_files --check    # exit 1 if a file is not as generated

`FILES` says what each generated file holds. Its keys are those of one or more `Part`s: a
config class (a dataclass, or a class whose keyword-only constructor arguments are the
keys), with the class defaults unless the part overrides them; each key's docstring line
becomes the comment above it. The rules:

- A group that selects between alternatives with different values (`optim=adamw_noam`,
  `adamw_cosine`, `sgd_cosine`; `logger=wandb_csv`, `csv`) has one generated file per
  alternative: a named variant, the class defaults plus the few overrides its `Part`
  declares below. A key without a default (`optim.lr`) is given by every variant.
- `links` are Hydra interpolations that tie a key to another group's value
  (`model.encoder.input_dim: ${data.features.num_mel_bins}`): composition, not defaults.
- `omit` leaves out keys that do not apply to a variant (SGD's momentum in an AdamW file);
  the class defaults then apply, and the dataclass rejects a value given for them.
- A file that only adjusts a generated one is written by hand and lists that one first in
  its defaults list (`trainer/gpu.yaml`, `trainer/cpu_ddp.yaml`, `data/demo.yaml`), as the
  presets (`experiment/*.yaml`) are. They hold overrides only: none may restate the value
  of the config it adjusts (tests/training/test_config_files.py checks both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from asr.data.augment import AugmentConfig, NoiseConfig, ReverbConfig, SpeedConfig, VolumeConfig
from asr.data.buckets import SamplerConfig
from asr.data.datamodule import AsrDataModule
from asr.data.dataset import SpecAugmentConfig
from asr.data.features import FeatureConfig
from asr.models.build import AedConfig, TransducerConfig
from asr.models.ssl import SslConfig
from asr.training.callbacks import EmaConfig
from asr.training.config_render import ConfigFile, Part, render
from asr.training.distributed.communication.adascale import AdaScaleConfig
from asr.training.distributed.communication.dgc.state import DGCConfig
from asr.training.loggers import LoggerConfig
from asr.training.objective import AedLossConfig, TransducerLossConfig
from asr.training.optimizer import ADAMW_ONLY, SGD_ONLY, OptimConfig
from asr.training.run_config import RunConfig, TrainerConfig
from asr.training.ssl_objective import SslLossConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

OBJECTIVE = "the training objective (asr/training/objective.py)."
MODEL_INPUT = {"encoder.input_dim": "${data.features.num_mel_bins}"}
WARMUP_COSINE = {"kind": "warmup_cosine", "warmup_steps": 500}
COSINE_ONLY = ("scheduler.hold_fraction", "scheduler.min_ratio")
LIBRISPEECH = "${data_dir}/manifests/librispeech_cuts_"

FILES = (
    ConfigFile(
        "train.yaml",
        "asr-train entry config: a defaults list and the run-level keys.\n"
        "Override anything from the command line, e.g.\n"
        "  asr-train experiment=demo trainer.max_epochs=2 model.encoder.num_layers=4",
        (Part(RunConfig),),
        head="""defaults:
  - _self_                      # first, so that experiment presets can override the keys below
  - model: conformer_transducer
  - data: librispeech
  - data/augment: null          # demo or librispeech: speed, noise, reverberation on the fly
  - batches: null               # shipped buckets and batch sizes (data.sampler keys), e.g. demo
  - trainer: default
  - optim: adamw_noam
  - logger: wandb_csv
  - distributed/compression: null  # dgc: Deep Gradient Compression (multi-process runs)
  - distributed/adascale: null  # enabled: AdaScale's learning-rate gain (momentum SGD)
  - ema: null                   # scaled (or demo): EMA of the weights following the batch size
  - experiment: null
""",
        tail="""
hydra:
  run:
    dir: ${exp_dir}/hydra
  job:
    name: train  # the log is hydra/train.log whichever module starts the run
    chdir: false
""",
    ),
    ConfigFile(
        "model/conformer_transducer.yaml",
        "Conformer-Transducer (asr/models/transducer.py; built by asr/models/build.py) and its\n"
        "loss (asr/training/objective.py).",
        (
            Part(TransducerConfig),
            Part(TransducerLossConfig, key="loss", doc=OBJECTIVE),
        ),
        links=MODEL_INPUT,
    ),
    ConfigFile(
        "model/aed.yaml",
        "Attention encoder-decoder: Conformer encoder, pre-norm Transformer decoder with a KV\n"
        "cache (asr/models/aed.py; built by asr/models/build.py), and its loss.",
        (
            Part(AedConfig),
            Part(AedLossConfig, key="loss", doc=OBJECTIVE),
        ),
        links=MODEL_INPUT,
    ),
    ConfigFile(
        "model/ssl.yaml",
        "Self-supervised pre-training of the Conformer encoder, w2v-BERT or BEST-RQ\n"
        "(asr/models/ssl.py; docs/ssl.md), and its loss (asr/training/ssl_objective.py).",
        (
            Part(SslConfig),
            Part(SslLossConfig, key="loss", doc=OBJECTIVE),
        ),
        links=MODEL_INPUT,
    ),
    ConfigFile(
        "data/librispeech.yaml",
        "LibriSpeech 960 h (manifests from recipes/librispeech/run.sh).",
        (
            Part(
                AsrDataModule,
                {
                    "train_cuts": [
                        f"{LIBRISPEECH}{part}.jsonl.gz"
                        for part in ("train-clean-100", "train-clean-360", "train-other-500")
                    ],
                    "valid_cuts": [
                        f"{LIBRISPEECH}{part}.jsonl.gz" for part in ("dev-clean", "dev-other")
                    ],
                    "test_cuts": [f"{LIBRISPEECH}test-clean.jsonl.gz"],
                    "tokenizer": "${data_dir}/tokenizer/bpe1024.model",
                    "features": FeatureConfig(),
                    "spec_augment": SpecAugmentConfig(),
                    "sampler": SamplerConfig(),
                },
            ),
        ),
        links={
            "sampler.seed": "${seed}",
            "subsampling_factor": "${model.encoder.subsampling_factor}",
        },
    ),
    ConfigFile("trainer/default.yaml", "lightning.Trainer's arguments.", (Part(TrainerConfig),)),
    ConfigFile(
        "optim/adamw_noam.yaml",
        "AdamW with the Transformer's schedule: linear warm-up, then 1/sqrt(step).",
        (Part(OptimConfig, {"lr": 2.0e-3, "scheduler": {"kind": "noam", "warmup_steps": 10000}}),),
        omit=SGD_ONLY + COSINE_ONLY,
    ),
    ConfigFile(
        "optim/adamw_cosine.yaml",
        "AdamW with a linear warm-up, a hold at the peak and a cosine decay.",
        (Part(OptimConfig, {"lr": 1.5e-3, "scheduler": WARMUP_COSINE}),),
        omit=SGD_ONLY,
    ),
    ConfigFile(
        "optim/sgd_cosine.yaml",
        "Momentum SGD with a linear warm-up, a hold at the peak and a cosine decay (for\n"
        "AdaScale: distributed/adascale=enabled).",
        (
            Part(
                OptimConfig,
                {
                    "kind": "sgd",
                    "lr": 0.05,
                    "momentum": 0.9,
                    "nesterov": False,
                    "scheduler": WARMUP_COSINE,
                },
            ),
        ),
        omit=ADAMW_ONLY,
    ),
    ConfigFile("logger/wandb_csv.yaml", "Weights & Biases and a CSV file.", (Part(LoggerConfig),)),
    ConfigFile(
        "logger/csv.yaml", "A CSV file only (no W&B).", (Part(LoggerConfig, {"wandb": None}),)
    ),
    ConfigFile(
        "data/augment/librispeech.yaml",
        "On-the-fly augmentation of LibriSpeech's training audio (asr/data/augment.py;\n"
        "docs/data.md): icefall's recipe, speed 0.9/1.0/1.1 and MUSAN noise at 10-20 dB on\n"
        "half the cuts (MUSAN=1 recipes/librispeech/run.sh writes its manifest), plus\n"
        "reverberation in generated rooms on a fifth. Needs data.features.source=on_the_fly.\n"
        "Select with: asr-train ... data/augment=librispeech",
        (
            Part(
                AugmentConfig,
                {
                    "speed": SpeedConfig(),
                    "reverb": ReverbConfig(p=0.2),
                    "noise": NoiseConfig(cuts=("${data_dir}/manifests/musan_cuts.jsonl.gz",)),
                },
            ),
        ),
        package="data.augment",
    ),
    ConfigFile(
        "data/augment/demo.yaml",
        "On-the-fly augmentation of the demo's training audio (experiment=demo_augment;\n"
        "recipes/demo/augment.sh): speed, volume, reverberation in generated rooms, and the\n"
        "training types of the demo's noise corpus (asr-make-demo-noise). Its held-out types\n"
        "build the noisy test sets. Select with: asr-train ... data/augment=demo",
        (
            Part(
                AugmentConfig,
                {
                    "speed": SpeedConfig(),
                    "volume": VolumeConfig(),
                    "reverb": ReverbConfig(p=0.2),
                    "noise": NoiseConfig(
                        cuts=("${data_dir}/manifests/noise_cuts_train.jsonl.gz",),
                        snr=(5.0, 20.0),
                    ),
                },
            ),
        ),
        package="data.augment",
    ),
    ConfigFile(
        "distributed/compression/dgc.yaml",
        "Deep Gradient Compression (asr/training/distributed/communication/dgc/): each rank\n"
        "sends the top 0.4 % of its accumulated gradient (or AdamW update) per bucket; what is\n"
        "not sent waits in a residual. The defaults are the setting that recipes/demo/RESULTS.md\n"
        "(Deep Gradient Compression) compares with dense DDP, but for the sparsity warm-up:\n"
        "those runs added the paper's four stages of 75 steps each\n"
        "(distributed.compression.warmup_steps=75). The paper's final sparsity is 0.999.\n"
        "Select with: asr-train ... trainer=cpu_ddp distributed/compression=dgc",
        (Part(DGCConfig),),
        package="distributed.compression",
    ),
    ConfigFile(
        "distributed/adascale/enabled.yaml",
        "AdaScale (asr/training/distributed/communication/adascale.py): the learning rate is\n"
        "scaled by the gain r_t in [1, number of ranks] measured from the ranks' gradients, and\n"
        "the schedule advances r_t steps per step. For momentum SGD:\n"
        "  asr-train ... optim=sgd_cosine distributed/adascale=enabled",
        (Part(AdaScaleConfig),),
        package="distributed.adascale",
    ),
    ConfigFile(
        "ema/scaled.yaml",
        "EMA of the weights whose momentum follows the batch size (asr/training/callbacks.py):\n"
        "rho_t = decay ^ (B_t / reference_batch_seconds), B_t the step's seconds of audio over\n"
        "all ranks and accumulated micro-batches. Select with: asr-train ... ema=scaled",
        (Part(EmaConfig),),
    ),
    ConfigFile(
        "ema/demo.yaml",
        "ema/scaled with the demo's momentum (experiment=demo): an average over about 100\n"
        "steps of 20-35 s of audio, for a run of 7 epochs. Without it: asr-train ... '~ema'",
        (Part(EmaConfig, {"decay": 0.99, "reference_batch_seconds": 30.0}),),
    ),
)


def generate(out_dir: Path) -> list[Path]:
    """Write every file of `FILES` under `out_dir`; returns their paths."""
    written = []
    for file in FILES:
        path = out_dir / file.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(file))
        written.append(path)
    return written


def stale_files(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The generated files that `config_dir` lacks or holds in another version."""
    return [
        file.path
        for file in FILES
        if not (config_dir / file.path).is_file()
        or (config_dir / file.path).read_text() != render(file)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CONFIG_DIR, help="default: asr/configs")
    parser.add_argument("--check", action="store_true", help="only report files not as generated")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        for path in stale:
            print(f"{args.out / path} is not as generated: python -m asr.training.config_files")
        return 1 if stale else 0
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pre-training and fine-tuning with 2 real processes over gloo: w2v-BERT (and BEST-RQ) on
audio alone (half the cuts without a transcript) with duration buckets from
`asr-estimate-bins` and no tokenizer, killed with -9 and resumed; then a transducer
fine-tuned from its encoder with `freeze_encoder_steps`, whose encoder stays bitwise
unchanged on both ranks over those steps.
Each run goes through `ddp_worker.py` (as `asr-train` fits), which records every step."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from ddp_worker import weights_digest
from lhotse import CutSet
from processes import kill_when_checkpointed, records, run, worker

from asr.data.bins import main as estimate_bins_main
from asr.inference.bundle import CHECKPOINT_DIR, LAST_CHECKPOINT, export_encoder
from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.training.encoder_init import load_encoder

EPOCHS = 1
FROZEN_STEPS = 3
KILL_AT_STEP = 4


def unlabelled_half(manifest: Path, out: Path) -> Path:
    """A copy of `manifest` whose every other cut has an empty transcript."""
    cuts = CutSet.from_file(manifest).to_eager()
    silent = [
        c.map_supervisions(lambda s: s.transform_text(lambda _: "")) if i % 2 else c
        for i, c in enumerate(cuts)
    ]
    path = out / "train-half-unlabelled.jsonl.gz"
    CutSet.from_cuts(silent).to_file(path)
    return path


@pytest.fixture(scope="module")
def ssl_setup(train_overrides, feature_manifests, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ssl_ranks")
    train_cuts = unlabelled_half(feature_manifests["train-clean-100"], root)
    bins = root / "bins.yaml"
    estimate_bins_main([str(train_cuts), "--num-buckets", "3", "-o", str(bins)])

    def overrides(exp_dir: Path, objective: str = "w2v_bert") -> list[str]:
        return [
            *train_overrides(exp_dir, kind="ssl"),
            f"experiment=demo_ssl_{objective}",
            "data.tokenizer=null",
            "trainer=cpu_ddp",
            "trainer.devices=2",
            f"trainer.max_epochs={EPOCHS}",
            "checkpoint.every_n_train_steps=2",
            f"data.train_cuts=[{train_cuts}]",
            f"data.sampler.bins_file={bins}",
            "data.valid_max_duration=1000",
            "run_test=false",
        ]

    return {"root": root, "overrides": overrides, "train_cuts": train_cuts}


@pytest.fixture(scope="module")
def ssl_run(ssl_setup) -> dict:
    root = ssl_setup["root"]
    overrides = ssl_setup["overrides"](root / "exp")
    run(worker(root / "record", overrides, "--validate"), root / "ssl.log")
    return {"records": records(root / "record"), "exp_dir": root / "exp", "overrides": overrides}


@pytest.mark.slow
def test_w2v_bert_pre_trains_on_two_ranks_with_duration_buckets(ssl_run, ssl_setup) -> None:
    ranks = ssl_run["records"]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    steps = list(zip(ranks[0]["steps"], ranks[1]["steps"], strict=True))
    assert all(a["bucket"] == b["bucket"] for a, b in steps)  # buckets synchronized
    assert all(a["digest"] == b["digest"] for a, b in steps)  # DDP kept them equal
    assert len({a["digest"] for a, _ in steps}) == len(steps)  # every step changed them
    # the cuts without a transcript were trained on, none skipped as unusable
    trained = {re.sub(r"_dup\d+$", "", c) for r in ranks for s in r["steps"] for c in s["cut_ids"]}
    assert all(not s["skipped"] for r in ranks for s in r["steps"])
    texts = {c.id: c.supervisions[0].text for c in CutSet.from_file(ssl_setup["train_cuts"])}
    assert {c for c in trained if not texts[c]} and {c for c in trained if texts[c]}
    validation = ranks[0]["validation"]
    assert "val/wer" not in validation and math.isfinite(validation["val/loss"])
    assert all(r["finite"] for r in ranks)


@pytest.mark.slow
def test_best_rq_pre_trains_on_two_ranks(ssl_setup) -> None:
    root = ssl_setup["root"]
    overrides = ssl_setup["overrides"](root / "best_rq", "best_rq")
    run(worker(root / "best_rq_record", overrides, "--validate"), root / "best_rq.log")
    ranks = records(root / "best_rq_record")
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert a["bucket"] == b["bucket"] and a["digest"] == b["digest"]
    assert all(r["finite"] for r in ranks)
    assert math.isfinite(ranks[0]["validation"]["val/mlm_accuracy"])


@pytest.fixture(scope="module")
def killed_ssl_run(ssl_run, ssl_setup) -> dict:
    root = ssl_setup["root"]
    overrides = ssl_setup["overrides"](root / "killed")
    command = worker(root / "killed_record", overrides, "--validate")
    last = root / "killed" / CHECKPOINT_DIR / LAST_CHECKPOINT
    kill_when_checkpointed(command, last, KILL_AT_STEP, root / "killed.log")
    stopped = torch.load(last, map_location="cpu", weights_only=False)
    run(command, root / "resumed.log")
    return {"stopped": stopped, "records": records(root / "killed_record")}


@pytest.mark.slow
@pytest.mark.long
def test_pre_training_killed_with_minus_9_resumes_to_the_same_weights(
    ssl_run, killed_ssl_run
) -> None:
    stopped = killed_ssl_run["stopped"]
    assert stopped["AsrDataModule"]["batches_done"] > 0  # killed inside an epoch
    resumed = killed_ssl_run["records"]
    assert resumed[0]["start"]["global_step"] == stopped["global_step"] >= KILL_AT_STEP
    assert [r["global_step"] for r in resumed] == [r["global_step"] for r in ssl_run["records"]]
    # masks, distractors and Gumbel noise come from (seed, step, cut ids): the same run
    assert resumed[0]["digest"] == resumed[1]["digest"] == ssl_run["records"][0]["digest"]


@pytest.mark.slow
def test_a_frozen_encoder_is_bitwise_unchanged_on_both_ranks(
    ssl_run, train_overrides, feature_manifests
) -> None:
    root = ssl_run["exp_dir"].parent
    encoder = export_encoder(
        [ssl_run["exp_dir"] / CHECKPOINT_DIR / LAST_CHECKPOINT], root / "encoder.pt"
    )
    overrides = [
        *train_overrides(root / "finetune"),
        "experiment=demo",
        "trainer=cpu_ddp",
        "trainer.devices=2",
        "trainer.max_steps=6",
        "model.loss.transducer_start_step=0",
        f"init_encoder_from={encoder}",
        f"freeze_encoder_steps={FROZEN_STEPS}",
        "run_test=false",
    ]
    run(worker(root / "finetune_record", overrides), root / "finetune.log")
    ranks = records(root / "finetune_record")
    loaded = torch.load(encoder, weights_only=False)
    start = ranks[0]["start"]["encoder_digest"]
    assert all(r["start"]["encoder_digest"] == start for r in ranks)
    for rank in ranks:
        encoders = [s["encoder_digest"] for s in rank["steps"]]
        models = [s["digest"] for s in rank["steps"]]
        assert encoders[:FROZEN_STEPS] == [start] * FROZEN_STEPS  # held, bit for bit
        assert encoders[FROZEN_STEPS] != start  # then trained
        assert len(set(models[:FROZEN_STEPS])) == FROZEN_STEPS  # the rest trained meanwhile
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert a["digest"] == b["digest"]
    # what it held is the pre-trained encoder, loaded exactly
    exported = ConformerEncoder(ConformerConfig(**loaded["encoder_config"]))
    load_encoder(exported, encoder)
    assert weights_digest(exported) == start

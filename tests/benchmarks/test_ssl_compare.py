"""The SSL comparison's own figures: each start's run chosen by dev WER alone, and BEST-RQ's
code prior entropy computed from the checkpoint's frozen quantizer on real features."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import torch
from lhotse import load_manifest

from asr.benchmarks.ssl_compare import code_prior_entropy, compare
from asr.data.features import normalize_features
from asr.models.conformer import ConformerConfig
from asr.models.ssl import BestRqConfig, SslConfig, build_ssl_model


def test_code_prior_entropy_is_that_of_the_quantizer_codes(feature_manifests, tmp_path) -> None:
    encoder = ConformerConfig(input_dim=80, d_model=32, num_layers=1, num_heads=2)
    model = build_ssl_model(
        SslConfig(objective="best_rq", encoder=encoder, best_rq=BestRqConfig(num_codes=64, seed=5))
    )
    path = tmp_path / "best.ckpt"
    bundle = {
        "model": {"encoder": vars(encoder), "best_rq": vars(model.config)},
        "features": {"normalize": "per_utterance"},
    }
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "asr_bundle": bundle}, path)
    dev = feature_manifests["dev-clean"]
    prior = code_prior_entropy(path, dev)
    counts: Counter[int] = Counter()
    for cut in load_manifest(dev):
        features = normalize_features(cut.load_features(), "per_utterance")
        counts.update(model.quantizer(torch.from_numpy(features)[None]).flatten().tolist())
    total = sum(counts.values())
    expected = -sum(n / total * math.log(n / total) for n in counts.values())
    assert prior == {"nats": round(expected, 4), "codes_seen": len(counts), "frames": total}
    assert 1 < len(counts) <= 64 and 0 < prior["nats"] <= math.log(64)


def _finetune_run(exp: Path, name: str, dev_wers: list[float], test_wer: float) -> None:
    run = exp / f"finetune_{name}"
    (run / "csv" / "version_0").mkdir(parents=True)
    lines = ["step,val/wer"] + [f"{i * 10 + 9},{w}" for i, w in enumerate(dev_wers)]
    (run / "csv" / "version_0" / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run / "decode-test-clean").mkdir()
    (run / "decode-test-clean" / "wer.json").write_text(json.dumps({"wer": test_wer}))


def test_each_start_is_chosen_by_dev_wer_never_by_test_wer(tmp_path) -> None:
    runs = {  # name: (dev WERs over the run, test WER)
        "scratch_lr0.001-seed1": ([90.0, 80.0], 82.0),
        "scratch_lr0.002-seed1": ([85.0, 79.0], 84.0),  # better dev, worse test: chosen
        "best_rq_lr0.001-seed1": ([70.0, 61.0], 60.0),
        "best_rq_lr0.002-seed1": ([65.0, 62.0], 50.0),  # better test only: not chosen
    }
    for name, (dev, test) in runs.items():
        _finetune_run(tmp_path, name, dev, test)
    table = compare(tmp_path, list(runs), {"steps": 20})
    assert table["chosen"] == {
        "scratch": "scratch_lr0.002-seed1",
        "best_rq": "best_rq_lr0.001-seed1",
    }
    assert table["baseline"] == "scratch_lr0.002-seed1"
    records = {r["run"]: r for r in table["finetuning"]}
    assert records["best_rq_lr0.001-seed1"]["relative_cut"] == round(1 - 60.0 / 84.0, 4)
    assert "relative_cut" not in records["best_rq_lr0.002-seed1"]
    assert records["scratch_lr0.001-seed1"]["lr"] == 0.001
    assert records["best_rq_lr0.002-seed1"]["best_dev_wer"] == 62.0

"""recipes/librispeech/run.sh end to end, but for the downloads, on a synthetic stand-in with
LibriSpeech's seven part names and a tiny model on the CPU: every stage runs, and the model
decoded is the model exported. The lm stage's LM text is a small file put where the
download would write it (the downloader keeps a file that is there)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
import yaml

from asr.data.corpus import load_cuts
from asr.decoding.lm import read_arpa
from asr.demo.lm_text import make_lm_text
from asr.demo.synth import make_demo_corpus

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = [
    "trainer=default",
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "logger=csv",
    "model.encoder.d_model=64",
    "model.encoder.num_layers=2",
    "model.encoder.num_heads=2",
    "model.predictor.embed_dim=64",
    "model.predictor.hidden_dim=64",
    "model.joiner.joint_dim=64",
    "data.num_workers=0",
    "optim.scheduler.warmup_steps=5",
]


def _recipe(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "recipes" / "librispeech" / "run.sh"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env},
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.long
def test_every_stage_but_the_download_runs_on_a_stand_in(tmp_path: Path) -> None:
    data, exp = tmp_path / "data", tmp_path / "exp"
    sizes = {"train_hours": 0.02, "dev_minutes": 0.3, "test_minutes": 0.3, "seed": 1}
    make_demo_corpus(data, **sizes, num_jobs=2, librispeech_parts=True)
    # the LM text in place of openslr.org/11's download: 400 sentences of the grammar, none a
    # dev or test one, of which the lm stage reads LM_MAX_LINES
    lm_text = data / "lm" / "librispeech-lm-norm.txt.gz"
    make_lm_text(lm_text, data, sentences=400)
    lm_text_bytes = lm_text.read_bytes()
    env = {
        "DATA": str(data),
        "EXP": str(exp),
        "VOCAB_SIZE": "64",
        "NUM_BUCKETS": "1",  # 2D: 1 duration x 2 token bins (each bucket costs probes)
        "BATCH_MEMORY": "300MiB",
        "BATCH_TOLERANCE": "0.5",  # 2-3 probes a bucket instead of 6-7
        "DEVICE": "cpu",
        "AVG": "2",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "LM_ORDER": "3",  # the lm stage at toy sizes
        "LM_MAX_LINES": "300",
        "LM_BEAM": "2",  # not the decode stage's beam: it decodes without the LM too
    }
    # SHAR=1: stage 5 also writes each training part (its speed copies too) as Shar shards
    printed = _recipe(
        env | {"SHAR": "1"}, "--stage", "manifests", "--", *TINY_MODEL, "trainer.max_epochs=2"
    )
    for stage in ("manifests", "perturb", "tokenizer", "features", "bins", "batch-sizes", "lm"):
        assert f": {stage} (" in printed
    manifests = data / "manifests"
    for part in ("train-clean-100", "train-clean-360", "train-other-500"):
        original = load_cuts(manifests / f"librispeech_cuts_{part}.jsonl.gz")
        perturbed = load_cuts(manifests / f"librispeech_cuts_{part}-sp.jsonl.gz")
        assert len(perturbed) == 3 * len(original)
        index = json.loads((data / "shar" / f"{part}-sp" / "shar_index.json").read_text())
        assert index["cuts_written"] == len(perturbed) and list(index["fields"]) == [
            "cuts", "recording"
        ]  # fmt: skip
    assert (exp / "batch_sizes.yaml").is_file()
    # decoded and exported: the average of the last two epochs, greedy and beam 4
    bundle = torch.load(exp / "model.bundle.pt", weights_only=True)
    checkpoints = exp / "checkpoints"
    assert bundle["averaged"] == [str(checkpoints / f"epoch={e:02d}.ckpt") for e in (0, 1)]
    results = (exp / "results.md").read_text()
    assert "`--epoch 1 --avg 2`" in results
    for part in ("test-clean", "test-other"):
        for beam in (1, 4):
            wer = json.loads((exp / f"decode-{part}-beam{beam}" / "wer.json").read_text())
            search = "greedy" if beam == 1 else "beam 4"
            assert f"| {part} | {search} | {wer['wer']:.2f} |" in results
    # the lm stage: the LM text kept (not downloaded), a 3-gram of its first 300 lines and the
    # LODR bigram of the training transcripts, beam 2 without and with them, one line each
    assert lm_text.read_bytes() == lm_text_bytes
    for arpa, order in (("bpe64_3gram_300lines", 3), ("bpe64_lodr_2gram", 2)):
        assert read_arpa(data / "lm" / f"{arpa}.arpa.gz").order == order
    assert "300 sentences" in printed  # LM_MAX_LINES of the 400
    for part in ("test-clean", "test-other"):
        without = json.loads((exp / f"decode-{part}-beam2" / "wer.json").read_text())
        fused = json.loads((exp / f"decode-{part}-beam2-lm" / "wer.json").read_text())
        assert fused["language_model"]["lm"] == str(data / "lm" / "bpe64_3gram_300lines.arpa.gz")
        assert fused["language_model"]["lodr"] == str(data / "lm" / "bpe64_lodr_2gram.arpa.gz")
        assert f"{part}, beam 2: {without['wer']:.2f}% without LM\n" in printed
        assert f"{part}, beam 2: {fused['wer']:.2f}% with LM + LODR (LM " in printed
        assert f"| {part} | beam 2, LM + LODR | {fused['wer']:.2f} |" in results
    assert "![training curves](training.png)" in results
    assert (exp / "training.png").stat().st_size > 10_000 and (exp / "bins.png").is_file()
    # self-supervised pre-training (BEST-RQ, duration bins, its own batch sizes), then the
    # transducer fine-tuned on train-clean-100 from its encoder and decoded
    ssl_exp, finetuned = tmp_path / "exp_ssl", Path(f"{exp}-ft-best_rq")
    pretrain = [*TINY_MODEL[:4], *TINY_MODEL[-2:], "model.encoder.d_model=64",
                "model.encoder.num_layers=2", "model.encoder.num_heads=2",
                "model.best_rq.num_codes=64", "trainer.max_epochs=1"]  # fmt: skip
    printed = _recipe(
        env | {"SSL_EXP": str(ssl_exp), "PRETRAIN_ARGS": " ".join(pretrain)},
        "--stage", "pretrain", "--stop-stage", "finetune", "--", *TINY_MODEL,
        "trainer.max_epochs=1",
    )  # fmt: skip
    assert ": pretrain (" in printed and ": finetune (" in printed
    bins = yaml.safe_load(
        (data / "bins-train-clean-100,train-clean-360,train-other-500-sp-audio.yaml").read_text()
    )
    assert set(bins) == {"bucket_duration_bins"}  # by duration alone
    assert "bucket_batch_size" in yaml.safe_load((ssl_exp / "batch_sizes.yaml").read_text())
    encoder = torch.load(ssl_exp / "encoder.pt", weights_only=True)
    assert encoder["encoder_config"]["d_model"] == 64
    assert "init_encoder_from=" in (finetuned / "hydra" / ".hydra" / "overrides.yaml").read_text()
    for part in ("test-clean", "test-other"):
        assert json.loads((finetuned / f"decode-{part}-beam1" / "wer.json").read_text())[
            "utterances"
        ]
    # stored features instead of on-the-fly ones, without speed perturbation: the stages
    # that differ (training on stored features is the demo recipe's way, tested there)
    env |= {"FEATURES": "precomputed", "SPEED_PERTURB": "0", "EXP": str(tmp_path / "exp_feats")}
    _recipe(env | {"SHAR": "1"}, "--stage", "features", "--stop-stage", "bins", "--", *TINY_MODEL)
    assert (manifests / "librispeech_cuts_train-other-500-feats.jsonl.gz").is_file()
    index = json.loads((data / "shar" / "train-other-500-feats" / "shar_index.json").read_text())
    assert list(index["fields"]) == ["cuts", "recording", "features"]  # audio and features
    assert (manifests / "librispeech_cuts_dev-other-feats.jsonl.gz").is_file()
    assert (data / "bins-train-clean-100,train-clean-360,train-other-500.yaml").is_file()
    # the streaming preset: its feature statistics (stage 5), then initialized from the
    # full-context model above, trained from stored librosa features (its batch sizes those
    # of the run above) and exported for sherpa-onnx's online recognizer (stage 10)
    streaming = tmp_path / "exp_streaming"
    streaming.mkdir()
    (streaming / "batch_sizes.yaml").write_text((exp / "batch_sizes.yaml").read_text())
    env |= {"EXPERIMENT": "librispeech_streaming", "EXP": str(streaming), "AVG": "1"}
    printed = _recipe(
        env, "--stage", "features", "--stop-stage", "export", "--", *TINY_MODEL,
        "trainer.max_epochs=1", f"init_from={exp / 'model.bundle.pt'}",
    )  # fmt: skip
    assert "is missing: training" not in printed  # the full-context model was there
    log = (streaming / "hydra" / "train.log").read_text()
    assert f"tensors from {exp / 'model.bundle.pt'}" in log
    assert (manifests / "librispeech_cuts_train-other-500-librosa-feats.jsonl.gz").is_file()
    stats = json.loads((data / "feature_stats_librosa.json").read_text())
    assert stats["frontend"] == "librosa" and len(stats["mean"]) == 80
    encoder = onnx.load(streaming / "onnx" / "encoder.onnx")
    meta = {p.key: p.value for p in encoder.metadata_props}
    assert meta["window_size"] == "64" and meta["cache_last_channel_dim2"] == "128"  # 640 ms
    assert [i.name for i in encoder.graph.input][2:] == [
        "cache_last_channel", "cache_last_time", "cache_last_channel_len"
    ]  # fmt: skip
    assert json.loads((streaming / "decode-test-clean-beam1" / "wer.json").read_text())[
        "utterances"
    ]

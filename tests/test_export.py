"""Export, inference and decoding from the checkpoints of the shared training run, and an
attention encoder-decoder through the same tool chain."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

import asr
from asr.data.corpus import load_cuts
from asr.decoding.transducer import BeamOptions
from asr.export import (
    BUNDLE_FORMAT,
    checkpoints_to_average,
    export_bundle,
    load_bundle,
    select_checkpoints,
)
from asr.models.aed import EncoderDecoder
from asr.transcribe import read_audio

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]
BIN = Path(sys.executable).parent
TEST = "test-clean"
# one intra-op thread in the subprocesses too (see the single_thread fixture)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(name: str, *args: str | Path) -> str:
    """Run a console script of the package; its stdout."""
    done = subprocess.run(
        [str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=300, env=ENV
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _model_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


@pytest.fixture(scope="module")
def bundle(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`asr-export epoch=02.ckpt --average 2`: the mean of the last two epochs."""
    path = tmp_path_factory.mktemp("export") / "model.bundle.pt"
    last_epoch = trained_run.checkpoints / f"epoch={trained_run.epochs - 1:02d}.ckpt"
    out = _cli("asr-export", last_epoch, "--average", "2", "-o", path)
    assert f"wrote {path}" in out and "weights averaged over 2 checkpoint(s)" in out
    return path


@pytest.fixture(scope="module")
def test_flacs(tiny_corpus) -> list[Path]:
    return sorted((tiny_corpus.librispeech / TEST).rglob("*.flac"))


def test_averaged_weights_are_the_mean_of_two_epochs(trained_run, bundle: Path) -> None:
    n = trained_run.epochs
    older, newer = (trained_run.checkpoints / f"epoch={e:02d}.ckpt" for e in (n - 2, n - 1))
    content = torch.load(bundle, weights_only=True)  # a bundle needs no pickled classes
    assert content["format"] == BUNDLE_FORMAT
    assert content["averaged"] == [str(older), str(newer)]
    a, b = _model_weights(older), _model_weights(newer)
    averaged = content["state_dict"]
    assert averaged.keys() == a.keys() == b.keys()
    moved = 0
    for key, value in averaged.items():
        if value.is_floating_point():
            assert torch.allclose(value, (a[key] + b[key]) / 2, rtol=0, atol=1e-7), key
            moved += int(not torch.equal(a[key], b[key]))
        else:
            assert torch.equal(value, b[key]), key
    assert moved > 10, "the two epochs' weights differ, so the mean is a real test"


def test_average_from_last_checkpoint_uses_its_epoch(trained_run, tmp_path: Path) -> None:
    n = trained_run.epochs
    assert checkpoints_to_average(trained_run.checkpoints / "last.ckpt", 2) == [
        trained_run.checkpoints / f"epoch={e:02d}.ckpt" for e in (n - 2, n - 1)
    ]
    with pytest.raises(FileNotFoundError, match=rf"--average {n + 1} needs .* missing \[-1\]"):
        export_bundle(trained_run.checkpoints / "last.ckpt", tmp_path / "b.pt", average=n + 1)
    assert not (tmp_path / "b.pt").exists()


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "none.pt")):
        load_bundle(tmp_path / "none.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="neither an asr bundle nor an asr-train checkpoint"):
        load_bundle(tmp_path / "other.pt")
    truncated = tmp_path / "truncated.bundle.pt"
    truncated.write_bytes((tmp_path / "other.pt").read_bytes()[:300])
    with pytest.raises(ValueError, match=f"cannot read {truncated}: truncated or not a torch"):
        load_bundle(truncated)


def test_command_line_errors_are_one_line_naming_the_file(bundle: Path, tmp_path: Path) -> None:
    """Bad input ends a console script with one line on stderr, exit 1, no traceback;
    ASR_DEBUG=1 shows the traceback."""
    truncated = tmp_path / "model.bundle.pt"
    truncated.write_bytes(bundle.read_bytes()[:100_000])
    bad_flac = tmp_path / "bad.flac"
    bad_flac.write_text("not audio")
    cases = [
        (["asr-transcribe", truncated, bad_flac], f"cannot read {truncated}: truncated"),
        (["asr-transcribe", bundle, tmp_path / "none.flac"], "audio file not found"),
        (["asr-transcribe", bundle, bad_flac], f"cannot read audio {bad_flac}: Error opening"),
        (["asr-decode", bundle, tmp_path / "none.jsonl.gz"], "manifest not found"),
        (["asr-export", tmp_path / "none.ckpt"], "checkpoint not found"),
    ]
    debug = [["asr-transcribe", truncated, bad_flac], "ASR_DEBUG"]
    # all at once: each spends ~2 s importing torch
    running = [
        subprocess.Popen(
            [str(BIN / name), *map(str, args)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=ENV if message != "ASR_DEBUG" else {**ENV, "ASR_DEBUG": "1"},
        )
        for (name, *args), message in [*cases, debug]
    ]
    for process, ((name, *_), message) in zip(running, [*cases, debug], strict=True):
        stderr = process.communicate(timeout=120)[1]
        assert process.returncode == 1, stderr
        if message == "ASR_DEBUG":  # ASR_DEBUG=1 shows the traceback
            assert "Traceback" in stderr
            continue
        assert stderr.startswith(f"{name}: error: ") and message in stderr
        assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_transcribe_path_or_array_gives_the_same_text(bundle: Path, test_flacs) -> None:
    recognizer = asr.load_model(bundle)
    samples, rate = sf.read(test_flacs[0], dtype="float32")
    assert rate == 16_000
    # the path branch reads exactly these samples ...
    assert np.array_equal(read_audio(test_flacs[0]), samples)
    texts = recognizer.transcribe([test_flacs[0], samples, str(test_flacs[1])])
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    # ... and both give the same text
    assert texts[0] == texts[1]
    assert recognizer.transcribe(samples) == [texts[0]]  # a single input is fine too


def test_transcribe_cli_prints_one_line_per_file(bundle: Path, test_flacs) -> None:
    files = test_flacs[:3]
    lines = _cli("asr-transcribe", bundle, *files, "--device", "cpu").splitlines()
    expected = asr.load_model(bundle).transcribe(files)
    assert lines == [f"{path}\t{text}" for path, text in zip(files, expected, strict=True)]


def test_beam_search_through_the_cli_and_load_model(bundle: Path, test_flacs) -> None:
    files = test_flacs[:3]
    recognizer = asr.load_model(bundle, beam_size=4)
    assert recognizer.options == BeamOptions(beam_size=4)  # a transducer: modified beam search
    expected = recognizer.transcribe(files)
    lines = _cli("asr-transcribe", bundle, *files, "--device", "cpu", "--beam-size", "4")
    assert lines.splitlines() == [f"{p}\t{t}" for p, t in zip(files, expected, strict=True)]


@pytest.fixture(scope="module")
def decoded(bundle: Path, tiny_corpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("decode")
    printed = _cli("asr-decode", bundle, tiny_corpus.cuts(TEST), "-o", out, "--device", "cpu")
    summary = next(line for line in printed.splitlines() if line.startswith("{"))
    assert json.loads(summary) == json.loads((out / "wer.json").read_text())
    assert f"on {json.loads(summary)['ref_words']} words" in printed
    return out


def _hyps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "hyps.jsonl").read_text().splitlines()]


def test_decode_lists_the_n_best(bundle: Path, tiny_corpus, tmp_path: Path) -> None:
    out = tmp_path / "nbest"
    args = ("--beam-size", "4", "--nbest", "3", "-o", out, "--device", "cpu")
    _cli("asr-decode", bundle, tiny_corpus.cuts(TEST), *args)
    lines = _hyps(out)
    assert lines and all(1 <= len(line["nbest"]) <= 3 for line in lines)
    for line in lines:
        assert line["nbest"][0]["hyp"] == line["hyp"]
        scores = [entry["score"] for entry in line["nbest"]]
        assert scores == sorted(scores, reverse=True)
    done = subprocess.run(
        [str(BIN / "asr-decode"), str(bundle), str(tiny_corpus.cuts(TEST)), "--nbest", "2"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert done.returncode == 2 and "--nbest 2 needs --beam-size of at least 2" in done.stderr


def test_decode_and_export_pick_the_same_averaged_model(
    trained_run, bundle: Path, decoded: Path, tiny_corpus, tmp_path: Path
) -> None:
    # `--epoch E --avg N` on the run's checkpoints/ makes the bundle fixture's model (the
    # last two epochs) in asr-export and in asr-decode alike
    last = str(trained_run.epochs - 1)
    exported = tmp_path / "e.bundle.pt"
    _cli("asr-export", trained_run.checkpoints, "--epoch", last, "--avg", "2", "-o", exported)
    again, first = torch.load(exported), torch.load(bundle)
    assert again["averaged"] == first["averaged"]
    assert all(torch.equal(again["state_dict"][k], v) for k, v in first["state_dict"].items())
    out = tmp_path / "decode"
    args = ("--epoch", last, "--avg", "2", "-o", out, "--device", "cpu")
    _cli("asr-decode", trained_run.checkpoints.parent, tiny_corpus.cuts(TEST), *args)
    assert _hyps(out) == _hyps(decoded)
    assert select_checkpoints(trained_run.checkpoints, best=True) == [
        trained_run.checkpoints / "best.ckpt"
    ]
    with pytest.raises(ValueError, match="is a directory: say which checkpoint"):
        select_checkpoints(trained_run.checkpoints)
    with pytest.raises(ValueError, match="cannot be averaged"):
        select_checkpoints(trained_run.checkpoints, best=True, avg=2)


def test_decode_totals_are_the_sums_of_the_lines(decoded: Path, tiny_corpus) -> None:
    summary, hyps = json.loads((decoded / "wer.json").read_text()), _hyps(decoded)
    refs = {c.id: c.supervisions[0].text for c in load_cuts(tiny_corpus.cuts(TEST))}
    assert hyps and all(h["ref"] == refs[h["id"]] for h in hyps)
    for key in ("substitutions", "deletions", "insertions", "ref_words"):
        assert summary[key] == sum(h[key] for h in hyps), key
    assert summary["ref_words"] == sum(len(h["ref"].split()) for h in hyps)
    errors = summary["substitutions"] + summary["deletions"] + summary["insertions"]
    assert summary["wer"] == round(100 * errors / summary["ref_words"], 3)


def test_decode_covers_every_cut(decoded: Path, tiny_corpus) -> None:
    summary, hyps = json.loads((decoded / "wer.json").read_text()), _hyps(decoded)
    cut_ids = [c.id for c in load_cuts(tiny_corpus.cuts(TEST))]
    assert summary["utterances_skipped"] == 0
    assert sorted(h["id"] for h in hyps) == sorted(cut_ids)


def test_decode_counts_unreadable_audio_as_all_deletions(
    bundle: Path, decoded: Path, tiny_corpus, tmp_path
):
    from dataclasses import replace

    from lhotse import CutSet
    from lhotse.audio import AudioSource

    cuts = list(load_cuts(tiny_corpus.cuts(TEST)))
    gone = AudioSource(type="file", channels=[0], source=str(tmp_path / "gone.flac"))
    lost = replace(cuts[0], recording=replace(cuts[0].recording, sources=[gone]))
    CutSet.from_cuts([lost, *cuts[1:]]).to_file(tmp_path / "damaged.jsonl.gz")
    printed = _cli("asr-decode", bundle, tmp_path / "damaged.jsonl.gz", "-o", tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "wer.json").read_text())
    full = json.loads((decoded / "wer.json").read_text())
    words = len(cuts[0].supervisions[0].text.split())
    assert summary["utterances"] == len(cuts) and summary["utterances_skipped"] == 1
    assert summary["ref_words"] == full["ref_words"]  # the WER is over every utterance asked for
    line = next(h for h in _hyps(tmp_path / "out") if h["id"] == lost.id)
    assert line["hyp"] == "" and line["deletions"] == words and "unreadable" in line
    assert "1 utterance(s) had unreadable audio and count as all deletions" in printed


def test_decode_a_manifest_smaller_than_the_bucket_count(bundle: Path, tiny_corpus, tmp_path):
    few = load_cuts(tiny_corpus.cuts(TEST)).subset(first=4)
    few.to_file(tmp_path / "few.jsonl.gz")
    _cli("asr-decode", bundle, tmp_path / "few.jsonl.gz", "-o", tmp_path / "out")
    assert len(_hyps(tmp_path / "out")) == 4


BLOCKED = """
import sys
for name in ("lightning", "pytorch_lightning", "hydra", "omegaconf"):
    sys.modules[name] = None  # any import of these now raises ImportError
import asr
texts = asr.load_model(sys.argv[1]).transcribe([sys.argv[2]])
assert all(sys.modules[name] is None for name in ("lightning", "hydra", "omegaconf"))
print(repr(texts))
"""


def test_load_model_needs_neither_lightning_nor_hydra(bundle: Path, test_flacs) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(bundle), str(test_flacs[0])],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == repr(asr.load_model(bundle).transcribe([test_flacs[0]]))


# --- attention encoder-decoder: asr-train, export, load_model, asr-decode, asr-transcribe ---


@pytest.fixture(scope="module")
def aed_run(compose_train, feature_manifests, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 epochs of experiment=demo_aed_flash, shrunk to the tiny model; its exp_dir."""
    from asr.training.train import run

    exp_dir = tmp_path_factory.mktemp("aed") / "exp"
    cfg = compose_train(
        exp_dir,
        "experiment=demo_aed_flash",
        "trainer.max_epochs=2",
        "optim.lr=3e-3",
        kind="aed",
    )
    metrics = run(cfg)
    assert {"val/wer", "val/ctc_wer", "train/cross_entropy", "train/ctc"} <= set(metrics)
    return exp_dir


def test_the_checkpoint_exports_to_a_bundle_that_rebuilds_the_same_network(aed_run, tmp_path):
    ckpt = aed_run / "checkpoints" / "last.ckpt"
    bundle = export_bundle(ckpt, tmp_path / "aed.bundle.pt")
    model, tokenizer, features = load_bundle(bundle)
    assert isinstance(model, EncoderDecoder) and len(model.decoder.layers) == 1
    assert tokenizer.vocab_size == model.vocab_size
    weights = _model_weights(ckpt)
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def test_load_model_decode_and_transcribe_work_for_the_aed(aed_run, tiny_corpus, tmp_path):
    bundle = export_bundle(aed_run / "checkpoints" / "last.ckpt", tmp_path / "aed.bundle.pt")
    flacs = sorted((tiny_corpus.librispeech / TEST).rglob("*.flac"))[:3]
    greedy = asr.load_model(bundle).transcribe(flacs)
    assert len(greedy) == 3 and all(isinstance(t, str) for t in greedy)
    lines = _cli("asr-transcribe", bundle, *flacs, "--device", "cpu").splitlines()
    assert lines == [f"{p}\t{t}" for p, t in zip(flacs, greedy, strict=True)]
    for beam in (1, 3):
        out = tmp_path / f"beam{beam}"
        _cli("asr-decode", bundle, tiny_corpus.cuts(TEST), "-o", out, "--beam-size", str(beam))
        summary = json.loads((out / "wer.json").read_text())
        assert summary["utterances_skipped"] == 0 and summary["ref_words"] > 0
        hyps = {h["id"]: h["hyp"] for h in _hyps(out)}
        assert len(hyps) == len(list((tiny_corpus.librispeech / TEST).rglob("*.flac")))
    beam3 = asr.load_model(bundle, beam_size=3).transcribe(flacs)
    assert len(beam3) == 3

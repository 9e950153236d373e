"""ONNX export (`asr-export --format onnx`) decoded by sherpa-onnx, by this package over
onnxruntime (`--onnx DIR`) and compared with PyTorch; and the errors of bad exports."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

import asr
from asr.benchmarks.longform import sherpa_word_times
from asr.inference.cli import transcribe_main
from asr.inference.onnx_export import export_onnx
from asr.inference.onnx_runtime import load_onnx_recognizer
from asr.inference.recognizer import load_recognizer, read_audio
from asr.metrics import corpus_errors

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stateless_run(compose_train, train_tiny, feature_manifests, tmp_path_factory) -> Path:
    """A tiny transducer with the stateless predictor (sherpa-onnx's contract) trained for
    6 steps (within the demo's CTC warm-up: a joiner near its initialization emits many
    tokens, so hypotheses differ from utterance to utterance); its last checkpoint."""
    exp_dir = tmp_path_factory.mktemp("stateless") / "exp"
    cfg = compose_train(
        exp_dir,
        "experiment=demo_stateless",
        "trainer.max_epochs=1",
        "trainer.max_steps=6",
        "optim.lr=3e-3",
    )
    train_tiny(cfg)
    return exp_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def stateless_export(stateless_run: Path, cli, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "onnx"
    printed = cli("asr-export", stateless_run, "--format", "onnx", "-o", out)
    assert f"wrote 7 files to {out}" in printed
    assert "sherpa-onnx cannot" not in printed
    return out


def _sherpa_texts(directory: Path, flacs: list[Path], int8: bool = False) -> list[str]:
    import sherpa_onnx

    name = "{}.int8.onnx" if int8 else "{}.onnx"
    parts = [str(directory / name.format(p)) for p in ("encoder", "decoder", "joiner")]
    recognizer = sherpa_onnx.OfflineRecognizer.from_transducer(
        *parts, str(directory / "tokens.txt"), num_threads=1, decoding_method="greedy_search"
    )
    texts = []
    for flac in flacs:
        stream = recognizer.create_stream()
        stream.accept_waveform(16000, read_audio(flac))
        recognizer.decode_stream(stream)
        texts.append(" ".join(stream.result.text.split()))
    return texts


@pytest.mark.long  # sherpa-onnx and onnxruntime against PyTorch: an export each (make test-long)
def test_sherpa_onnx_decodes_the_export_as_pytorch_does(
    stateless_run, stateless_export, test_flacs, cli
):
    flacs = test_flacs[:8]
    meta = {p.key: p.value for p in onnx.load(stateless_export / "decoder.onnx").metadata_props}
    assert meta["context_size"] == "2" and meta["predictor_kind"] == "stateless"
    pytorch = load_recognizer(stateless_run, "cpu", max_symbols_per_frame=1).transcribe(flacs)
    assert sum(len(t.split()) for t in pytorch) >= 8, pytorch  # the model emits words
    assert _sherpa_texts(stateless_export, flacs) == pytorch
    lines = cli(
        "asr-transcribe", "--onnx", stateless_export, *flacs, "--max-symbols-per-frame", "1"
    )
    assert lines.splitlines() == [f"{p}\t{t}" for p, t in zip(flacs, pytorch, strict=True)]
    # int8: the same files for both decoders; the features differ in their last digits
    # (lhotse's Fbank here, kaldi-native-fbank in sherpa-onnx), which the int8 weights turn
    # into a few flipped near-ties of this barely trained model
    ours_int8 = load_onnx_recognizer(stateless_export, max_symbols_per_frame=1, int8=True)
    ours, theirs = ours_int8.transcribe(flacs), _sherpa_texts(stateless_export, flacs, int8=True)
    assert corpus_errors(theirs, ours).wer < 0.1, (ours, theirs)  # 5.3 % when written


@pytest.mark.long  # sherpa-onnx and onnxruntime against PyTorch: an export each (make test-long)
def test_onnx_beam_search_and_default_symbols_match_pytorch(
    stateless_run, stateless_export, test_flacs, test_cuts, cli, tmp_path
):
    flacs = test_flacs[:6]
    for beam in (1, 3):
        pytorch = asr.load_model(stateless_run, beam_size=beam).transcribe(flacs)
        ours = asr.load_model(stateless_export, beam_size=beam).transcribe(flacs)
        assert ours == pytorch
    for model in (["--onnx", stateless_export], [stateless_run]):
        out = tmp_path / ("onnx" if len(model) == 2 else "pytorch")
        cli("asr-decode", *model, test_cuts, "-o", out, "--max-symbols-per-frame", "1")
    onnx_hyps, pytorch_hyps = (
        [json.loads(line)["hyp"] for line in (tmp_path / d / "hyps.jsonl").read_text().splitlines()]
        for d in ("onnx", "pytorch")
    )
    assert onnx_hyps == pytorch_hyps and len(onnx_hyps) == len(test_flacs)


@pytest.mark.long  # sherpa-onnx and onnxruntime against PyTorch: an export each (make test-long)
def test_word_times_of_the_export_match_pytorch_and_sherpa_onnx(
    stateless_run, stateless_export, test_flacs
):
    flacs = test_flacs[:6]
    pytorch = load_recognizer(stateless_run, max_symbols_per_frame=1)
    ours = load_onnx_recognizer(stateless_export, max_symbols_per_frame=1)
    expected = pytorch.transcribe(flacs, timestamps=True)
    assert ours.transcribe(flacs, timestamps=True) == expected
    assert sum(len(t.words) for t in expected) > 10
    # sherpa-onnx's token timestamps, each utterance decoded whole as sherpa-onnx does
    audio = [read_audio(flac) for flac in flacs]
    whole = [pytorch.transcripts_of_features([pytorch.features_of(a)])[0] for a in audio]
    sherpa = sherpa_word_times(stateless_export, audio)
    assert [[(w.word, w.start) for w in s] for s in sherpa] == [
        [(w.word, w.start) for w in t.words] for t in whole
    ]


@pytest.mark.long  # 130 s: two more models trained and exported (make test-long)
def test_lstm_and_aed_models_export_for_our_onnxruntime_decoder(
    trained_run, aed_run, test_flacs, tmp_path, capsys
):
    flacs = test_flacs[:4]
    lstm = export_onnx([trained_run.checkpoints / "last.ckpt"], tmp_path / "lstm", int8=False)
    assert lstm.sherpa_onnx  # NeMo's contract, on the librosa front end (experiment=demo)
    aed = export_onnx([aed_run / "checkpoints" / "last.ckpt"], tmp_path / "aed", int8=False)
    assert sorted(f.name for f in aed.files) == ["decoder.onnx", "encoder.onnx", "tokens.txt"]
    for export, ckpt in ((lstm, trained_run.checkpoints / "last.ckpt"),
                         (aed, aed_run / "checkpoints" / "last.ckpt")):  # fmt: skip
        for beam in (1, 2):
            pytorch = asr.load_model(ckpt, beam_size=beam).transcribe(flacs)
            assert any(pytorch), pytorch
            ours = load_onnx_recognizer(export.directory, beam_size=beam).transcribe(flacs)
            assert ours == pytorch, (export.kind, beam)


@pytest.mark.long  # sherpa-onnx and onnxruntime against PyTorch: an export each (make test-long)
def test_sherpa_onnx_offline_decodes_the_lstm_export_in_nemos_contract(
    trained_run, test_flacs, tmp_path
):
    """`make demo`'s kind of model (LSTM predictor, trained on the librosa_povey front end,
    which sherpa-onnx's offline NeMo recognizer computes): sherpa-onnx gives PyTorch's texts."""
    import sherpa_onnx

    checkpoint = trained_run.checkpoints / "last.ckpt"
    export = export_onnx([checkpoint], tmp_path / "nemo", int8=False)
    assert export.sherpa_onnx
    lines = (export.directory / "tokens.txt").read_text().splitlines()
    assert lines[-1] == f"<blk> {len(lines) - 1}"
    d = export.directory
    recognizer = sherpa_onnx.OfflineRecognizer.from_transducer(
        str(d / "encoder.onnx"), str(d / "decoder.onnx"), str(d / "joiner.onnx"),
        str(d / "tokens.txt"), num_threads=1, model_type="nemo_transducer",
    )  # fmt: skip
    pytorch = load_recognizer(checkpoint, max_symbols_per_frame=10)  # sherpa-onnx's NeMo greedy
    flacs = test_flacs[:6]
    audio = [read_audio(f) for f in flacs]
    assert pytorch.features.frontend == "librosa_povey"
    expected = [" ".join(t.split()) for t in pytorch.transcribe(audio)]
    assert any(expected), expected
    got = []
    for samples in audio:
        stream = recognizer.create_stream()
        stream.accept_waveform(16000, samples)
        recognizer.decode_stream(stream)
        got.append(" ".join(stream.result.text.split()))
    assert got == expected


def _error_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        transcribe_main(argv)
    assert stop.value.code == 1
    return capsys.readouterr().err.strip()


@pytest.mark.long  # sherpa-onnx and onnxruntime against PyTorch: an export each (make test-long)
def test_bad_exports_and_truncated_models_fail_in_one_line_naming_the_file(
    stateless_export, trained_run, bundle, test_flacs, tmp_path, capsys
):
    flac = str(test_flacs[0])
    missing = tmp_path / "nothing"
    err = _error_of(["--onnx", str(missing), flac], capsys)
    assert err.endswith(f": error: ONNX export directory not found: {missing}")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in stateless_export.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "joiner.onnx").write_text("not a model\n")
    err = _error_of(["--onnx", str(broken), flac], capsys)
    assert f"{broken / 'joiner.onnx'} is not a readable ONNX model" in err
    assert len(err.splitlines()) == 1
    (broken / "decoder.onnx").unlink()
    err = _error_of(["--onnx", str(broken), flac], capsys)
    missing_decoder = f"{broken / 'decoder.onnx'}: not found (asr-export --format onnx writes it)"
    assert err.endswith(missing_decoder)
    for model in (bundle, trained_run.checkpoints / "last.ckpt"):
        data = model.read_bytes()
        for length in (0, 1, 100, 5000, len(data) // 2, len(data) - 1):
            cut = tmp_path / f"cut{length}{model.suffix}"
            cut.write_bytes(data[:length])
            err = _error_of([str(cut), flac], capsys)
            assert len(err.splitlines()) == 1 and str(cut) in err, (length, err)


def test_a_pretraining_checkpoint_is_refused_by_the_onnx_export(trained_run, tmp_path):
    checkpoint = torch.load(trained_run.checkpoints / "last.ckpt", weights_only=False)
    checkpoint["asr_bundle"]["model"]["kind"] = "ssl"
    ssl = tmp_path / "ssl.ckpt"
    torch.save(checkpoint, ssl)
    with pytest.raises(ValueError, match=f"{ssl} is a pre-training checkpoint"):
        export_onnx([ssl], tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists() or not any((tmp_path / "onnx").iterdir())

"""The streaming export (`asr-export --format onnx` of a streaming model) in sherpa-onnx's
online NeMo transducer contract: sherpa-onnx's OnlineRecognizer, fed 0.1 s pieces, decodes
it as our streaming recognizer decodes the checkpoint; and `asr-transcribe --streaming`
on files and on raw PCM from standard input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import onnx
import pytest

from asr.data.corpus import load_cuts
from asr.data.features import FeatureConfig, online_fbank_options
from asr.inference.audio import read_audio
from asr.inference.cli import transcribe_main
from asr.inference.streaming import load_streaming_recognizer

pytestmark = pytest.mark.slow
PIECE = 1600  # 0.1 s


@pytest.fixture(scope="module")
def streaming_export(streaming_run: Path, cli, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("online") / "onnx"
    printed = cli(
        "asr-export", streaming_run, "--format", "onnx", "--no-int8", "--chunk-ms", "80", "-o", out
    )
    assert f"wrote 4 files to {out}" in printed and "sherpa-onnx cannot" not in printed
    return out


def _padded(samples: np.ndarray, span: int) -> np.ndarray:
    """`samples` and 0.5 s or more of silence, so that the feature frames ready before the
    end of input are not a multiple of `span` (sherpa-onnx then decodes the same whole
    chunks as we do)."""
    pad = 8000
    while True:
        audio = np.concatenate([samples, np.zeros(pad, dtype=np.float32)])
        fbank = knf.OnlineFbank(online_fbank_options(FeatureConfig(frontend="librosa")))
        fbank.accept_waveform(16000, audio)
        if fbank.num_frames_ready % span:
            return audio
        pad += 160


def _sherpa(directory: Path, audio: list[np.ndarray], finished: bool = False) -> list[str]:
    """sherpa-onnx's texts of `audio` fed in 0.1 s pieces (then, if `finished`, its
    `input_finished()`: the last feature frames become ready)."""
    import sherpa_onnx

    recognizer = sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=str(directory / "tokens.txt"),
        encoder=str(directory / "encoder.onnx"),
        decoder=str(directory / "decoder.onnx"),
        joiner=str(directory / "joiner.onnx"),
        num_threads=1,
        decoding_method="greedy_search",
    )
    texts = []
    for samples in audio:
        stream = recognizer.create_stream()
        for start in range(0, len(samples), PIECE):
            stream.accept_waveform(16000, samples[start : start + PIECE])
            while recognizer.is_ready(stream):
                recognizer.decode_stream(stream)
        if finished:
            stream.input_finished()
            while recognizer.is_ready(stream):
                recognizer.decode_stream(stream)
        texts.append(" ".join(recognizer.get_result(stream).split()))
    return texts


@pytest.mark.long  # the streaming export in sherpa-onnx's online recognizer (make test-long)
def test_sherpa_onnx_online_decodes_the_streaming_export_as_we_do(
    streaming_run, streaming_export, test_flacs
):
    meta = {p.key: p.value for p in onnx.load(streaming_export / "encoder.onnx").metadata_props}
    recognizer = load_streaming_recognizer(streaming_run, 80, max_symbols_per_frame=10)  # sherpa's
    span = recognizer.span
    assert meta["window_size"] == meta["chunk_shift"] == str(span) == "8"  # 80 ms
    assert meta["cache_last_channel_dim2"] == "8" and meta["normalize_type"] == ""
    lines = (streaming_export / "tokens.txt").read_text().splitlines()
    assert lines[-1] == f"<blk> {len(lines) - 1}"  # NeMo's order: the blank last
    audio = [_padded(read_audio(f), span) for f in test_flacs[:6]]
    ours = []
    for samples in audio:
        stream = recognizer.create_stream()
        for start in range(0, len(samples), PIECE):
            stream.accept_waveform(samples[start : start + PIECE])
            recognizer.decode([stream])
        ours.append(" ".join(stream.text.split()))
    assert any(ours), ours
    assert _sherpa(streaming_export, audio) == ours


@pytest.mark.long  # the streaming export in sherpa-onnx's online recognizer (make test-long)
def test_sherpa_onnx_and_we_end_a_stream_with_the_same_last_words(
    streaming_run, streaming_export, test_flacs
):
    """Our stream ends with the silence the export's metadata tells sherpa-onnx's clients
    to send after the audio, before `input_finished()`: the same final texts, last words
    included."""
    meta = {p.key: p.value for p in onnx.load(streaming_export / "encoder.onnx").metadata_props}
    recognizer = load_streaming_recognizer(streaming_run, 80, max_symbols_per_frame=10)
    tail = float(meta["tail_padding_seconds"])
    assert tail == recognizer.tail_seconds == 0.08  # a chunk
    audio = [read_audio(f) for f in test_flacs[:6]]
    ours = [" ".join(recognizer.feed([a], PIECE)[0].text.split()) for a in audio]  # one by one,
    # as sherpa-onnx decodes them: a batch rounds otherwise, and random weights have ties
    assert any(ours), ours
    silence = np.zeros(int(tail * 16000), dtype=np.float32)
    tailed = [np.concatenate([a, silence]) for a in audio]
    assert _sherpa(streaming_export, tailed, finished=True) == ours


def test_asr_transcribe_streaming_reads_files_and_raw_pcm_on_stdin(streaming_run, test_flacs, cli):
    flac = test_flacs[0]
    expected = load_streaming_recognizer(streaming_run, 160).transcribe([flac])[0].text
    pcm = (np.clip(read_audio(flac), -1, 1) * 32767).astype("<i2").tobytes()
    done = subprocess.run(  # a file, then the same audio as raw PCM on stdin
        cli.command("asr-transcribe", "--streaming", "--chunk-ms", "160", streaming_run, flac, "-"),
        input=pcm + b"\x00",  # an odd byte at the end: half a sample, dropped
        capture_output=True,
        timeout=120,
        env=cli.env,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = [line.partition("\t") for line in done.stdout.decode().strip().splitlines()]
    assert [(name, text) for name, _, text in lines] == [
        (str(flac), expected),
        ("<stdin>", expected),  # 16-bit rounding changes nothing here
    ]


def test_streaming_errors_are_one_line(streaming_run, trained_run, test_flacs, capsys, monkeypatch):
    """In this process (test_cli.py runs the console scripts' error convention itself)."""
    monkeypatch.setattr("sys.argv", ["asr-transcribe"])

    def error(*args) -> str:
        with pytest.raises(SystemExit) as exited:
            transcribe_main([str(a) for a in args])
        assert exited.value.code != 0
        return capsys.readouterr().err.strip()

    flac = str(test_flacs[0])
    offline = trained_run.checkpoints / "last.ckpt"
    assert error("--streaming", offline, flac) == (
        "asr-transcribe: error: this model was trained with full context "
        "(model.encoder.streaming is null): it cannot stream"
    )
    assert error("--streaming", "--chunk-ms", "200", streaming_run, flac) == (
        "asr-transcribe: error: --chunk-ms 200 was not trained; trained chunks: 80, 160 ms"
    )


def test_asr_decode_at_a_chunk_size_equals_streaming(streaming_run, test_cuts, tmp_path, cli):
    """`asr-decode --chunk-ms` decodes whole utterances through the chunked masks: the
    hypotheses streaming gives."""
    out = tmp_path / "decode"
    printed = cli("asr-decode", streaming_run, test_cuts, "--chunk-ms", "80", "-o", out)
    assert printed.splitlines()[-1].startswith("WER ")
    hyps = [json.loads(line) for line in (out / "hyps.jsonl").read_text().splitlines()]
    recognizer = load_streaming_recognizer(streaming_run, 80)
    cuts = {c.id: c for c in load_cuts(test_cuts)}
    for hyp in hyps[:4]:
        audio = cuts[hyp["id"]].load_audio()[0]
        assert recognizer.transcribe([audio])[0].text == hyp["hyp"]

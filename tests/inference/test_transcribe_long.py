"""Recordings of any length and word timestamps through `Recognizer.transcribe` and
`asr-transcribe`, on the models of the shared training runs, and bad audio."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional

import asr
from asr.benchmarks.longform import JoinedRecording, join_cuts
from asr.data.corpus import load_cuts
from asr.decoding.search import NO_TOKEN_TIMES
from asr.inference.audio import open_audio, read_audio
from asr.inference.cli import transcribe_main
from asr.inference.longform import WindowConfig, segments_of
from asr.inference.recognizer import load_recognizer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


@pytest.fixture(scope="module")
def joined(test_cuts, tmp_path_factory: pytest.TempPathFactory) -> JoinedRecording:
    """About a minute of the tiny corpus's test utterances, joined with 0.5-1.5 s gaps."""
    path = tmp_path_factory.mktemp("long") / "joined.flac"
    return join_cuts(list(load_cuts(test_cuts)), path, seconds=60.0, seed=2)


def test_a_long_file_is_its_segments_decoded_one_by_one(bundle: Path, joined) -> None:
    recognizer = asr.load_model(bundle)
    (whole,) = recognizer.transcribe(joined.path, batch_size=1, timestamps=True)
    source = open_audio(joined.path)
    segments = segments_of(source, recognizer.windows)
    assert len(segments) == joined.utterances  # cut at every gap
    one_by_one = []
    for segment in segments:
        feats = recognizer.features_of(source.read(segment.start, segment.end))
        one_by_one += recognizer.transcripts_of_features([feats], [segment.start], [segment.end])[
            0
        ].words
    assert whole.words == one_by_one and whole.text == " ".join(w.word for w in one_by_one)
    assert len(whole.words) > 20
    starts = [w.start for w in whole.words]
    assert starts == sorted(starts) and starts[0] >= 0 and whole.words[-1].end <= joined.duration
    # read whole from an array, batched: the same words and times; the confidences to
    # rounding (a batch's padding moves their sums in the 7th digit, and they print 4)
    (from_array,) = recognizer.transcribe(read_audio(joined.path), timestamps=True)
    assert [(w.word, w.start, w.end) for w in from_array.words] == [
        (w.word, w.start, w.end) for w in whole.words
    ]
    assert [w.confidence for w in from_array.words] == pytest.approx(
        [w.confidence for w in whole.words], abs=2e-4
    )
    assert recognizer.transcribe(joined.path) == [whole.text]


def test_a_stretch_without_pauses_is_decoded_in_overlapping_windows(bundle, joined) -> None:
    windows = WindowConfig(window=8.0, overlap=2.0, max_pause=0.0)
    recognizer = load_recognizer(bundle, windows=windows)
    (long,) = recognizer.transcribe(joined.path, timestamps=True)
    starts = [w.start for w in long.words]
    assert starts == sorted(starts) and long.words[-1].end <= joined.duration
    assert len(long.words) > 10
    assert len(segments_of(open_audio(joined.path), windows)) >= 8


BAD = {
    "silence.wav": np.zeros(3 * 16000, np.float32),
    "noise_floor.wav": np.random.default_rng(0).standard_normal(30 * 16000) * 10 ** (-65 / 20),
    "header_only.wav": np.zeros(0, np.float32),
    "300_samples.wav": 0.1 * np.random.default_rng(1).standard_normal(300),  # < 1 frame
}
SHORT = 0.1 * np.random.default_rng(2).standard_normal(700)  # 44 ms of loud noise


def _run(argv: list, capsys: pytest.CaptureFixture) -> tuple[str, str, object]:
    """asr-transcribe in this process: (stdout, stderr, its exit code or None)."""
    code = None
    try:
        transcribe_main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return out.out, out.err, code


def test_bad_audio_gives_one_line_or_an_empty_result(bundle, test_flacs, tmp_path, capsys):
    for name, samples in {**BAD, "short.wav": SHORT}.items():
        sf.write(tmp_path / name, samples, 16000)
    (tmp_path / "empty.flac").write_bytes(b"")
    samples = torch.from_numpy(read_audio(test_flacs[0]))
    sf.write(tmp_path / "44k.wav", torchaudio.functional.resample(samples, 16000, 44100), 44100)
    names = (*BAD, "short.wav", "empty.flac", "44k.wav", "missing.wav")
    argv = [bundle, test_flacs[0], *(tmp_path / n for n in names), "--output-format", "json"]
    out, err, code = _run(argv, capsys)
    assert code == "asr-transcribe: 2 of 9 file(s) could not be read"
    texts = {Path(line["audio"]).name: line["text"] for line in map(json.loads, out.splitlines())}
    assert all(texts[name] == "" for name in BAD)  # nothing said, nothing written
    assert isinstance(texts["short.wav"], str)  # decoded: what the model makes of a click
    assert texts["44k.wav"] == texts[test_flacs[0].name] != ""  # resampled
    assert err.splitlines() == [
        f"asr-transcribe: error: cannot read audio {tmp_path / 'empty.flac'}: "
        f"Error opening '{tmp_path / 'empty.flac'}': Format not recognised.",
        f"asr-transcribe: error: audio file not found: {tmp_path / 'missing.wav'}",
    ]
    _, err, code = _run([bundle, tmp_path / "missing.wav"], capsys)  # one file: one line
    assert code == 1 and err.splitlines() == [
        f"asr-transcribe: error: audio file not found: {tmp_path / 'missing.wav'}"
    ]


def test_timestamps_formats_from_the_command_line(bundle, joined, tmp_path, capsys) -> None:
    ctm, _, code = _run([bundle, joined.path, "--output-format", "ctm"], capsys)
    rows = [line.split() for line in ctm.splitlines()]
    assert code is None and rows and all(r[0] == str(joined.path) and r[1] == "1" for r in rows)
    (transcript,) = asr.load_model(bundle).transcribe(joined.path, timestamps=True)
    assert [r[4] for r in rows] == [w.word for w in transcript.words]
    assert [float(r[2]) for r in rows] == pytest.approx([w.start for w in transcript.words])
    _run([bundle, joined.path, "--output-format", "srt", "-o", tmp_path], capsys)
    srt = (tmp_path / "joined.srt").read_text()
    assert srt.startswith("1\n00:00:0") and " --> " in srt
    text, _, _ = _run([bundle, joined.path, "--timestamps"], capsys)
    assert text.startswith(f"{joined.path}\t{transcript.words[0].word}[")
    _, err, code = _run([bundle, joined.path, joined.path, "-o", tmp_path], capsys)
    assert code == 2 and "several inputs are named joined (one file each)" in err


def test_attention_decoders_transcribe_long_audio_but_give_no_times(aed_run, joined, capsys):
    checkpoint = aed_run / "checkpoints" / "last.ckpt"
    windows = WindowConfig(window=8.0, overlap=2.0, max_pause=0.0)  # merged without times
    recognizer = load_recognizer(checkpoint, windows=windows)
    (text,) = recognizer.transcribe(joined.path)
    assert isinstance(text, str)
    with pytest.raises(ValueError, match="an attention decoder gives no token times"):
        recognizer.transcribe(joined.path, timestamps=True)
    out, err, code = _run([checkpoint, joined.path, "--timestamps"], capsys)
    assert code == 1 and out == ""
    assert err.strip().endswith(f": error: {NO_TOKEN_TIMES}")  # the program's name first

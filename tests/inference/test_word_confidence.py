"""Word confidence and context phrases where users meet them: every word of
`transcribe(timestamps=True)` (greedy, beam, long recordings in windows), of a stream's
transcript (greedy and beam) and of asr-transcribe's JSON and CTM has a confidence in
[0, 1], one per word; context phrases from a file or a list go through load_model,
asr-transcribe and asr-decode, and an empty list changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asr.inference.audio import read_audio
from asr.inference.cli import decode_main, transcribe_main
from asr.inference.longform import WindowConfig
from asr.inference.recognizer import load_recognizer
from asr.inference.streaming import load_streaming_recognizer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def _check_words(transcripts) -> None:
    """Each transcript's words all have a confidence in [0, 1], and spell its text."""
    confidences = []
    for transcript in transcripts:
        assert " ".join(w.word for w in transcript.words) == transcript.text
        for word in transcript.words:
            assert word.confidence is not None and 0.0 <= word.confidence <= 1.0
            confidences.append(word.confidence)
    assert confidences  # (the tiny test model is barely trained: its confidences are low)


@pytest.mark.parametrize("beam", [1, 4])
def test_every_word_has_a_confidence_offline_and_in_long_recordings(bundle, test_flacs, beam):
    recognizer = load_recognizer(bundle, beam_size=beam)
    _check_words(recognizer.transcribe(test_flacs[:3], timestamps=True))
    # one long recording decoded in overlapping windows, stitched
    long = np.concatenate([read_audio(f) for f in test_flacs[:4]])
    windowed = load_recognizer(
        bundle, beam_size=beam, windows=WindowConfig(window=3.0, overlap=1.0, max_pause=0.0)
    )
    assert len(long) / 16000 > 6.0
    _check_words(windowed.transcribe(long, timestamps=True))


@pytest.mark.parametrize("beam", [1, 4])
def test_every_word_of_a_stream_has_a_confidence(streaming_run, test_flacs, beam):
    recognizer = load_streaming_recognizer(streaming_run, 160, beam_size=beam)
    audio = [read_audio(f) for f in test_flacs[:3]]
    _check_words(recognizer.transcribe(audio))
    # a stream with an empty phrase list gives what one without gives
    plain = recognizer.feed(audio[:1])[0]
    empty = recognizer.create_stream(biasing=[])
    for start in range(0, len(audio[0]), 1600):
        empty.accept_waveform(audio[0][start : start + 1600])
        recognizer.decode([empty, recognizer.create_stream()])
    empty.finish()
    recognizer.decode([empty])
    assert empty.best() == plain.best()


def test_context_phrases_through_load_model_and_the_command_lines(
    bundle, test_flacs, test_cuts, tmp_path, capsys
):
    recognizer = load_recognizer(bundle)
    files = test_flacs[:2]
    plain = recognizer.transcribe(files, timestamps=True)
    assert recognizer.transcribe(files, timestamps=True, biasing=[]) == plain
    # the first file's second word, boosted: still there; the transcript keeps its shape
    word = plain[0].words[1].word
    boosted = recognizer.transcribe(files, biasing=[(word, 2.0)])
    assert word in boosted[0].split()
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(f"{word} :2\nZORVAK\n")
    transcribe_main(
        [str(bundle), *map(str, files), "--biasing-phrases", str(phrases), "--output-format", "ctm"]
    )
    ctm = capsys.readouterr().out.splitlines()
    assert ctm and all(len(line.split()) == 6 for line in ctm)  # ... word confidence
    assert all(0.0 <= float(line.split()[5]) <= 1.0 for line in ctm)
    transcribe_main([str(bundle), str(files[0]), "--output-format", "json"])
    (line,) = capsys.readouterr().out.splitlines()
    assert "confidence" not in line  # no --timestamps: text only
    transcribe_main([str(bundle), str(files[0]), "--output-format", "json", "--timestamps"])
    words = json.loads(capsys.readouterr().out)["words"]
    assert [w["word"] for w in words] == [w.word for w in plain[0].words]
    # one file alone against two in a batch: the same confidences to their rounding
    assert [w["confidence"] for w in words] == pytest.approx(
        [w.confidence for w in plain[0].words], abs=2e-4
    )
    out = tmp_path / "decoded"
    decode_main([str(bundle), str(test_cuts), "--biasing-phrases", str(phrases), "-o", str(out)])
    assert "WER" in capsys.readouterr().out and (out / "hyps.jsonl").is_file()
    phrases.write_text("ZORVAK :-1\n")
    with pytest.raises(SystemExit):
        transcribe_main([str(bundle), str(files[0]), "--biasing-phrases", str(phrases)])
    assert "phrases.txt line 1: biasing score of 'ZORVAK' must be >= 0" in capsys.readouterr().err


def test_json_keeps_words_without_a_confidence_out_of_it(tmp_path: Path) -> None:
    from asr.inference.timestamps import Transcript, Word, to_ctm, to_json

    transcript = Transcript("A B", [Word("A", 0.0, 0.1, 0.5), Word("B", 0.1, 0.2)])
    words = json.loads(to_json(transcript, "x"))["words"]
    assert words == [
        {"word": "A", "start": 0.0, "end": 0.1, "confidence": 0.5},
        {"word": "B", "start": 0.1, "end": 0.2},
    ]
    assert to_ctm(transcript, "x").splitlines() == ["x 1 0.000 0.100 A 0.500", "x 1 0.100 0.100 B"]

"""Long recordings with known word times, for `scripts/benchmark_longform.py` and the
tests: demo test utterances joined with gaps into one file, and word start errors of
a transcript against the synthesizer's word times.

The truth is each supervision's `alignment["word"]` (the demo corpus writes it from
espeak-ng's word events; `asr.demo.espeak`), moved by the utterance's place in the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np
import soundfile as sf
from lhotse.cut import Cut

from asr.frames import SAMPLE_RATE
from asr.inference.onnx_runtime import DECODER, ENCODER, JOINER, TOKENS, onnx_file
from asr.inference.timestamps import Word, words_from_tokens
from asr.tokens import WORD_START

NOISE_DBFS = -65.0  # the demo corpus's noise floor, also in the gaps


def cut_words(cut: Cut, offset: float = 0.0) -> list[Word]:
    """The words of a cut's supervisions with their times (seconds, plus `offset`)."""
    words = []
    for supervision in cut.supervisions:
        alignment = (supervision.alignment or {}).get("word")
        if alignment is None:
            raise ValueError(
                f"cut {cut.id} has no word alignment: make the demo corpus again "
                "(asr-make-demo-corpus writes word times since 2026-11-26; docs/transcribe.md)"
            )
        start = offset + supervision.start
        words += [
            Word(item.symbol, round(start + item.start, 3), round(start + item.end, 3))
            for item in alignment
            if item.symbol
        ]
    return words


@dataclass(frozen=True)
class JoinedRecording:
    """A file of joined utterances: where it is, how long, and its words with their times."""

    path: Path
    duration: float
    words: list[Word]
    utterances: int

    @property
    def text(self) -> str:
        return " ".join(w.word for w in self.words)


def join_cuts(
    cuts: Sequence[Cut],
    path: Path,
    seconds: float,
    gaps: tuple[float, float] = (0.5, 1.5),
    seed: int = 0,
) -> JoinedRecording:
    """Write the cuts' audio one after another, with a gap of noise floor of a random
    length in `gaps` between two, until the file lasts `seconds` (repeating the cuts if
    need be; at least one cut); a FLAC written a cut at a time."""
    if not cuts:
        raise ValueError("no cuts to join")
    rng = np.random.default_rng(seed)
    words: list[Word] = []
    samples = count = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with sf.SoundFile(path, "w", SAMPLE_RATE, 1, "PCM_16", format="FLAC") as out:
        while samples < seconds * SAMPLE_RATE or count == 0:
            cut = cuts[count % len(cuts)]
            if count:
                gap = round(rng.uniform(*gaps) * SAMPLE_RATE)
                out.write(rng.standard_normal(gap) * 10 ** (NOISE_DBFS / 20))
                samples += gap
            audio = cut.load_audio()[0]
            words += cut_words(cut, samples / SAMPLE_RATE)
            out.write(audio)
            samples += len(audio)
            count += 1
    return JoinedRecording(path, samples / SAMPLE_RATE, words, count)


def matched_starts(hypothesis: Sequence[Word], reference: Sequence[Word]) -> list[float]:
    """Start time errors (hypothesis - reference, seconds) of the words the two share in
    their word alignment (the edit-distance one the WER counts: the correct words)."""
    if not hypothesis or not reference:
        return []
    alignment = jiwer.process_words(
        " ".join(w.word for w in reference), " ".join(w.word for w in hypothesis)
    ).alignments[0]
    errors = []
    for chunk in alignment:
        if chunk.type != "equal":
            continue
        for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
            hyp, ref = hypothesis[chunk.hyp_start_idx + k], reference[chunk.ref_start_idx + k]
            if hyp.start is None or ref.start is None:
                raise ValueError("words without times")
            errors.append(hyp.start - ref.start)
    return errors


def error_summary(errors: Iterable[float]) -> dict:
    """Mean and 95th percentile of absolute start errors, the mean signed error (a
    constant delay shows there), and how many words they cover."""
    values = np.asarray(list(errors), dtype=np.float64)
    if values.size == 0:
        return {"words": 0}
    absolute = np.abs(values)
    return {
        "words": int(values.size),
        "mean_abs_s": round(float(absolute.mean()), 4),
        "p95_abs_s": round(float(np.percentile(absolute, 95)), 4),
        "mean_signed_s": round(float(values.mean()), 4),
    }


def sherpa_word_times(directory: Path, audio: list[np.ndarray]) -> list[list[Word]]:
    """sherpa-onnx's greedy search of an export (`asr-export --format onnx`) on each
    utterance, its token timestamps grouped into words (a word starts at its first token;
    sherpa-onnx gives no end: it is set to the last token's time)."""
    import sherpa_onnx

    parts = [str(directory / onnx_file(name, False)) for name in (ENCODER, DECODER, JOINER)]
    recognizer = sherpa_onnx.OfflineRecognizer.from_transducer(
        *parts, str(directory / TOKENS), num_threads=1, decoding_method="greedy_search"
    )
    out = []
    for samples in audio:
        stream = recognizer.create_stream()
        stream.accept_waveform(SAMPLE_RATE, samples)
        recognizer.decode_stream(stream)
        pieces = [token.replace(" ", WORD_START) for token in stream.result.tokens]  # "▁" as " "
        starts = [round(float(time), 3) for time in stream.result.timestamps]
        out.append(words_from_tokens(pieces, starts, token_seconds=0.0))
    return out

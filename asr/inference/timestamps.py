"""Word timestamps: tokens and their encoder frames -> words with start and end times,
and the output formats of `asr-transcribe --timestamps` (text, json, srt, ctm).

A word begins at a SentencePiece piece that starts with "▁". It starts when its first
token was emitted (the start of that encoder frame) and ends when its last token ends, but
never after the next word starts: a token lasts the frames the search gives it
(`TimedTokens.durations`: one frame for a plain transducer's token; a token-and-duration
transducer's predicted duration, 0 when the next comes in the same frame). Times are in
seconds from the start of the audio. Its confidence is its least confident token's
(`asr.decoding.confidence`): it is a field of the word, so words and confidences never
differ in number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from asr.decoding.confidence import word_confidence
from asr.decoding.hypotheses import TimedTokens
from asr.tokens import WORD_START, starts_word

OUTPUT_FORMATS = ("text", "json", "srt", "ctm")
SRT_MAX_WORDS, SRT_MAX_SECONDS = 12, 5.0  # one subtitle cue at most
SRT_PAUSE_SECONDS = 0.8  # a pause this long starts a new cue


@dataclass(frozen=True)
class Word:
    """A word, when it was said, in seconds, and the search's confidence in it, in [0, 1]
    (None: the model gives no times)."""

    word: str
    start: float | None = None
    end: float | None = None
    confidence: float | None = None


@dataclass(frozen=True)
class Transcript:
    """A recording's text and its words (with times where the model gives them)."""

    text: str
    words: list[Word]

    @classmethod
    def of_words(cls, words: list[Word]) -> Transcript:
        return cls(" ".join(w.word for w in words), words)


def words_from_tokens(
    pieces: Sequence[str],
    starts: Sequence[float],
    token_seconds: float,
    audio_end: float = math.inf,
    confidences: Sequence[float] | None = None,
    ends: Sequence[float] | None = None,
) -> list[Word]:
    """Words of a hypothesis's `pieces` (SentencePiece pieces, one per token) emitted at
    `starts` seconds, each token lasting `token_seconds` (an encoder frame) or ending at
    its time in `ends`, in audio that ends at `audio_end` seconds (no word ends later);
    with the tokens' `confidences`, each word's (its least confident token's)."""
    if len(pieces) != len(starts):
        raise ValueError(f"{len(pieces)} pieces but {len(starts)} times")
    if confidences is not None and len(confidences) != len(pieces):
        raise ValueError(f"{len(pieces)} pieces but {len(confidences)} confidences")
    if ends is not None and len(ends) != len(pieces):
        raise ValueError(f"{len(pieces)} pieces but {len(ends)} end times")
    sure = confidences if confidences is not None else [None] * len(pieces)
    ends = ends if ends is not None else [start + token_seconds for start in starts]
    groups: list[tuple[str, float, float, list]] = []  # (text, first start, last end, confidences)
    for piece, start, stop, confidence in zip(pieces, starts, ends, sure, strict=True):
        if starts_word(piece) or not groups:
            groups.append((piece.lstrip(WORD_START), start, stop, [confidence]))
        else:
            text, first, _, tokens = groups[-1]
            groups[-1] = (text + piece, first, stop, [*tokens, confidence])
    groups = [g for g in groups if g[0]]  # a lone "▁" that nothing followed
    words = []
    for i, (text, first, last, tokens) in enumerate(groups):
        end = min(last, audio_end)
        if i + 1 < len(groups):
            end = min(end, groups[i + 1][1])
        confidence = None if confidences is None else round(word_confidence(tokens), 4)
        words.append(Word(text, round(first, 3), round(max(end, first), 3), confidence))
    return words


class PieceTable(Protocol):
    """What turns token ids into text: a SentencePiece `Tokenizer`, or an ONNX export's
    token table."""

    def id_to_piece(self, idx: int) -> str: ...

    def decode(self, ids: list[int]) -> str: ...


def words_of_hypothesis(
    hyp: TimedTokens,
    tokenizer: PieceTable,
    frame_seconds: float,
    offset: float = 0.0,
    audio_end: float = math.inf,
) -> list[Word]:
    """The words of a search's hypothesis, with times in seconds from `offset` (where its
    frame 0 is in the audio) and confidences; a token ends its duration after its frame
    (`TimedTokens.durations`); no word ends after `audio_end`."""
    pieces = [tokenizer.id_to_piece(i) for i in hyp.tokens]
    starts = [offset + frame * frame_seconds for frame in hyp.frames]
    lasting = hyp.durations or []
    ends = [start + d * frame_seconds for start, d in zip(starts, lasting, strict=True)]
    return words_from_tokens(pieces, starts, frame_seconds, audio_end, hyp.confidences, ends)


def transcript_of_hypothesis(
    hyp: TimedTokens,
    tokenizer: PieceTable,
    frame_seconds: float,
    offset: float = 0.0,
    audio_end: float = math.inf,
) -> Transcript:
    """A hypothesis's text and its words (`words_of_hypothesis`)."""
    words = words_of_hypothesis(hyp, tokenizer, frame_seconds, offset, audio_end)
    return Transcript(tokenizer.decode(hyp.tokens), words)


def words_of_text(text: str) -> list[Word]:
    """Words without times (a model that gives none)."""
    return [Word(word) for word in text.split()]


def _clock(seconds: float, separator: str = ",") -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _timed(transcript: Transcript, name: str) -> list[Word]:
    if any(w.start is None for w in transcript.words):
        raise ValueError(f"{name}: this model gives no word times (srt and ctm need them)")
    return transcript.words


def to_srt(transcript: Transcript, name: str = "audio") -> str:
    """SubRip subtitles: cues of at most SRT_MAX_WORDS words and SRT_MAX_SECONDS seconds,
    a new one after a pause of SRT_PAUSE_SECONDS."""
    cues: list[list[Word]] = []
    for word in _timed(transcript, name):
        last = cues[-1] if cues else None
        if (
            last
            and len(last) < SRT_MAX_WORDS
            and word.end - last[0].start <= SRT_MAX_SECONDS
            and word.start - last[-1].end < SRT_PAUSE_SECONDS
        ):
            last.append(word)
        else:
            cues.append([word])
    blocks = [
        f"{n}\n{_clock(cue[0].start)} --> {_clock(cue[-1].end)}\n"
        + " ".join(w.word for w in cue)
        + "\n"
        for n, cue in enumerate(cues, 1)
    ]
    return "\n".join(blocks)


def to_ctm(transcript: Transcript, name: str) -> str:
    """NIST CTM: `name channel start duration word confidence` per word (channel 1; the
    confidence column where the search gave one)."""
    lines = []
    for w in _timed(transcript, name):
        confidence = "" if w.confidence is None else f" {w.confidence:.3f}"
        lines.append(f"{name} 1 {w.start:.3f} {w.end - w.start:.3f} {w.word}{confidence}\n")
    return "".join(lines)


def to_json(transcript: Transcript, name: str) -> str:
    """One JSON object: audio, text and (where known) words with start, end and
    confidence."""
    words = [
        {key: value for key, value in asdict(w).items() if value is not None}
        for w in transcript.words
        if w.start is not None
    ]
    out: dict = {"audio": name, "text": transcript.text}
    if words:
        out["words"] = words
    return json.dumps(out)


def to_text(transcript: Transcript, name: str, timestamps: bool) -> str:
    """`name<TAB>text`; with `timestamps`, each word followed by its start and end."""
    if not timestamps:
        return f"{name}\t{transcript.text}\n"
    words = _timed(transcript, name)
    return f"{name}\t" + " ".join(f"{w.word}[{w.start:.2f}-{w.end:.2f}]" for w in words) + "\n"


def render(transcript: Transcript, name: str, output_format: str, timestamps: bool) -> str:
    """`transcript` of the audio `name` in one of OUTPUT_FORMATS."""
    if output_format == "srt":
        return to_srt(transcript, name)
    if output_format == "ctm":
        return to_ctm(transcript, name)
    if output_format == "json":
        return to_json(transcript, name) + "\n"
    if output_format == "text":
        return to_text(transcript, name, timestamps)
    raise ValueError(f"output format must be one of {OUTPUT_FORMATS}, got {output_format!r}")

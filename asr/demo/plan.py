"""The demo corpus's plan: every utterance's text, speaker, rate and pitch, before any
audio exists (`asr.demo.synth` synthesizes it).

A seeded template grammar (statements, questions, commands, compound and reported
sentences) fills its slots from the word lists in `asr.demo.lexicon`. Each word category is
drawn by cycling through a shuffled copy of its list, not by independent draws, so a few
thousand sentences use the whole lexicon (1,600+ words). Dev and test draw only words seen
in training and reject any sentence that occurs in training. Durations are estimated from
length and speaking rate to meet the size targets. Speakers are espeak voice + variant +
rate + pitch combinations; one speaker appears only in test-clean.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from asr.demo import lexicon as lex
from asr.demo.espeak import SILENCE_PAD

PARTS = ("train-clean-100", "dev-clean", "test-clean")
# The rest of LibriSpeech's part names (`librispeech_parts`): a stand-in with its layout.
EXTRA_PARTS = ("train-clean-360", "train-other-500", "dev-other", "test-other")
# Audio without transcripts for self-supervised pre-training (`unlabelled_hours`): new
# sentences read by new voice settings, in the same layout (LibriSpeech has no such part).
UNLABELLED_PART = "train-unlabelled"
# The context-biasing test sets (`asr.demo.context_sets`): sentences holding names and rare
# words never seen in training, and their twins with ordinary words in their place; and
# their dev sets, other phrases in other sentences, to choose scores and weights on.
CONTEXT_PART, PLAIN_PART = "test-context", "test-plain"
DEV_CONTEXT_PART, DEV_PLAIN_PART = "dev-context", "dev-plain"
# A part's position seeds its audio and ids: new parts go at the end.
ALL_PARTS = PARTS + EXTRA_PARTS + (UNLABELLED_PART, CONTEXT_PART, PLAIN_PART)
ALL_PARTS += (DEV_CONTEXT_PART, DEV_PLAIN_PART)
MIN_WORDS, MAX_WORDS = 3, 20
SPOKEN_TEXT = re.compile(r"[a-z']+( [a-z']+)*")  # what espeak reads is what the transcript says


@dataclass(frozen=True)
class Speaker:
    """A synthetic speaker: espeak-ng voice+variant, rate (words/min), pitch and range (0-100).

    Voices are file names under espeak-ng-data/lang ("en" is British English: there is no
    "en-gb"), variants file names under espeak-ng-data/voices/!v."""

    id: int
    voice: str
    rate: int
    pitch: int
    range: int


TRAIN_SPEAKERS = (
    Speaker(1001, "en-us+m1", 165, 45, 50),
    Speaker(1002, "en-us+f3", 175, 60, 60),
    Speaker(1003, "en+m3", 155, 40, 45),
    Speaker(1004, "en+f2", 185, 55, 55),
    Speaker(1005, "en-gb-scotland+m2", 160, 50, 40),
    Speaker(1006, "en-029+f1", 170, 65, 70),
    Speaker(1007, "en-gb-x-rp+m5", 180, 35, 50),
    Speaker(1008, "en-us-nyc+f4", 165, 55, 45),
    Speaker(1009, "en-gb-x-gbclan+m4", 150, 45, 60),
    Speaker(1010, "en-gb-x-gbcwmd+f5", 175, 50, 50),
)
TEST_ONLY_SPEAKER = Speaker(1011, "en-us+m6", 170, 55, 55)
# The unlabelled part's speakers: the training accents with other variants, rates and
# pitches (none of them reads a labelled utterance).
UNLABELLED_SPEAKERS = (
    Speaker(2001, "en-us+m3", 160, 40, 55),
    Speaker(2002, "en-us+f1", 180, 65, 50),
    Speaker(2003, "en+m7", 150, 45, 40),
    Speaker(2004, "en+f5", 170, 60, 65),
    Speaker(2005, "en-gb-scotland+f2", 165, 55, 50),
    Speaker(2006, "en-029+m4", 175, 45, 60),
    Speaker(2007, "en-gb-x-rp+f3", 160, 60, 45),
    Speaker(2008, "en-us-nyc+m8", 185, 40, 50),
    Speaker(2009, "en-gb-x-gbclan+f4", 155, 55, 55),
    Speaker(2010, "en-gb-x-gbcwmd+m1", 170, 50, 65),
)


@dataclass(frozen=True)
class Utterance:
    """One planned utterance. `index` is its position in the part; `text` is lower case."""

    part: str
    index: int
    speaker: Speaker
    number: int  # within the chapter
    text: str
    rate: int
    pitch: int

    @property
    def chapter(self) -> int:
        return 10_000 * (ALL_PARTS.index(self.part) + 1) + self.speaker.id

    @property
    def id(self) -> str:
        return f"{self.speaker.id}-{self.chapter}-{self.number:04d}"

    @property
    def transcript(self) -> str:
        return self.text.upper()


# Seconds of speech = (base + per_char * characters) * 175 / rate: a least-squares fit over
# 276 utterances of all training speakers (each speaker within 8% of the fit).
_EST_BASE, _EST_PER_CHAR = 0.093, 0.0507


def estimate_seconds(text: str, rate: int) -> float:
    """Estimated duration of the synthesized, trimmed utterance at `rate` words per minute."""
    return 2 * SILENCE_PAD + (_EST_BASE + _EST_PER_CHAR * len(text)) * 175 / rate


def plan_part(
    part: str,
    seconds: float,
    *,
    seed: int,
    speakers: Sequence[Speaker],
    known: set[str] | None = None,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[Utterance]:
    """Texts and voices for one part, until the estimated duration reaches `seconds`.

    With `known`, sentences use only those words; sentences in `exclude` are never produced.
    Speakers take turns; rate and pitch are jittered per utterance around the speaker's.
    """
    rng = random.Random(f"{seed}:{part}")
    grammar = lex.Grammar(rng, known)
    seen = set(exclude)
    numbers: dict[int, int] = defaultdict(int)
    utterances: list[Utterance] = []
    total, rejected = 0.0, 0
    while total < seconds:
        words = grammar.sentence()
        text = " ".join(words)
        if not SPOKEN_TEXT.fullmatch(text):
            raise ValueError(f"the grammar produced {text!r}: only a-z, ' and single spaces")
        fits = MIN_WORDS <= len(words) <= MAX_WORDS and (known is None or known.issuperset(words))
        if not fits or text in seen:
            rejected += 1
            if rejected > 1000 + 20 * len(utterances):
                raise RuntimeError(
                    f"{part}: cannot find new sentences from the training words; raise train_hours"
                )
            continue
        seen.add(text)
        speaker = speakers[len(utterances) % len(speakers)]
        rate = round(speaker.rate * rng.uniform(0.94, 1.06))
        pitch = min(99, max(1, speaker.pitch + rng.randint(-5, 5)))
        utterances.append(
            Utterance(part, len(utterances), speaker, numbers[speaker.id], text, rate, pitch)
        )
        numbers[speaker.id] += 1
        total += estimate_seconds(text, rate)
    return utterances


def plan_corpus(
    *,
    train_hours: float,
    dev_minutes: float,
    test_minutes: float,
    seed: int,
    librispeech_parts: bool = False,
    unlabelled_hours: float = 0.0,
) -> dict[str, list[Utterance]]:
    """All three parts (with `librispeech_parts`, all seven: train-clean-360 and
    train-other-500 of `train_hours` / 2 each, dev-other and test-other as large as dev and
    test). Dev and test use training words only and no training sentence. With
    `unlabelled_hours`, also `UNLABELLED_PART`: that much audio of sentences found in no
    other part, by `UNLABELLED_SPEAKERS`; the other parts are the same with or without it."""
    train = plan_part(PARTS[0], train_hours * 3600, seed=seed, speakers=TRAIN_SPEAKERS)
    known = {word for utt in train for word in utt.text.split()}
    taken = {utt.text for utt in train}
    dev = plan_part(
        PARTS[1], dev_minutes * 60, seed=seed, speakers=TRAIN_SPEAKERS, known=known, exclude=taken
    )
    taken |= {utt.text for utt in dev}
    test_speakers = (TEST_ONLY_SPEAKER, *TRAIN_SPEAKERS)
    test = plan_part(
        PARTS[2], test_minutes * 60, seed=seed, speakers=test_speakers, known=known, exclude=taken
    )
    plan = dict(zip(PARTS, (train, dev, test), strict=True))
    taken |= {utt.text for utt in test}
    if librispeech_parts:
        plan |= _extra_parts(train_hours, dev_minutes, test_minutes, seed, known, taken)
        taken |= {utt.text for part in EXTRA_PARTS for utt in plan[part]}
    if unlabelled_hours > 0:
        plan[UNLABELLED_PART] = plan_part(
            UNLABELLED_PART, unlabelled_hours * 3600, seed=seed, speakers=UNLABELLED_SPEAKERS,
            exclude=taken,
        )  # fmt: skip
    return plan


def _extra_parts(
    train_hours: float,
    dev_minutes: float,
    test_minutes: float,
    seed: int,
    known: set[str],
    taken: set[str],
) -> dict[str, list[Utterance]]:
    """`EXTRA_PARTS` (see `plan_corpus`), their sentences new to `taken`."""
    taken = set(taken)
    test_speakers = (TEST_ONLY_SPEAKER, *TRAIN_SPEAKERS)
    plan: dict[str, list[Utterance]] = {}
    sizes = dict(
        zip(
            EXTRA_PARTS,
            (1800 * train_hours, 1800 * train_hours, 60 * dev_minutes, 60 * test_minutes),
            strict=True,
        )
    )
    for part in EXTRA_PARTS:
        speakers = test_speakers if part.startswith("test") else TRAIN_SPEAKERS
        training = part.startswith("train")
        plan[part] = plan_part(
            part,
            sizes[part],
            seed=seed,
            speakers=speakers,
            known=None if training else known,
            exclude=taken,
        )
        taken |= {utt.text for utt in plan[part]}
    return plan

"""Test sets for context biasing, synthesized beside the demo corpus.

Demo speech holding names and rare words that training never heard, the same sentences
with ordinary words in their place, and the phrase lists to boost.

Made beside a complete demo corpus (`asr.demo.synth`), from its training transcripts:

- Phrases (`context_phrases`), seeded: real but rare English nouns and names that espeak-ng
  reads well, invented names built from syllables ("zorvak", "quelindra") and two-word
  names (a title such as "doctor" or an invented first name, then an invented surname).
  No word of a phrase is in the lexicon or the training text, except a title; no word is
  in two phrases, so a phrase that is never spoken is not heard inside another.
- Sentences (`plan_context_sets`): each of the "occurring" phrases is spoken in two or
  three sentences, as the subject (the phrase, then a grammar predicate in the past tense)
  or as the object (a subject, a past transitive verb, the phrase); the rest of each
  sentence is training words. Each sentence has a twin, the phrase replaced by a name or
  "the" + a noun of the lexicon, read by the same speaker at the same rate and pitch.
  Speakers take turns as in test-clean (the test-only speaker, then the training ones).
  The "distractor" phrases are never spoken; "extra" phrases fill the longer lists.

It writes, under OUT (the demo corpus root, e.g. data/demo):

- ``LibriSpeech/test-context`` and ``LibriSpeech/test-plain``: two parts in the corpus's
  layout, each with a ``context_sets.json`` marker holding the parameters, so a re-run
  with the same ones skips (a corpus rebuilt with other parameters removes both parts);
- ``manifests/librispeech_cuts_test-{context,plain}.jsonl.gz`` (`prepare_manifests`);
- ``manifests/context_phrases.json``: the phrases (upper case, as the transcripts) and,
  per test-context utterance, its phrase, role and plain twin;
- ``manifests/context_phrases_{10,100,1000}.txt``: lists for ``--biasing-phrases``, one
  phrase a line: half of each (up to all of them) spoken, the rest distractors, then extra.

Command line: ``asr-make-context-sets OUT [--seed S] [--num-jobs J]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from asr.cli import command
from asr.data.corpus import cuts_path, prepare_manifests
from asr.demo import lexicon as lex
from asr.demo.plan import (
    ALL_PARTS,
    CONTEXT_PART,
    MAX_WORDS,
    MIN_WORDS,
    PLAIN_PART,
    SPOKEN_TEXT,
    TEST_ONLY_SPEAKER,
    TRAIN_SPEAKERS,
    UNLABELLED_PART,
    Utterance,
)
from asr.demo.synth import MARKER as CORPUS_MARKER
from asr.demo.synth import check_voices, synthesize_all, write_json, write_transcripts

MARKER = "context_sets.json"
PHRASES_JSON = "context_phrases.json"
LIST_SIZES = (10, 100, 1000)
_VERSION = 1  # bump when the sets change, so old ones are rebuilt
SPEAKERS = (TEST_ONLY_SPEAKER, *TRAIN_SPEAKERS)  # test-clean's turns

# Real words that espeak-ng reads well and the demo lexicon lacks. Nouns take "the".
RARE_NOUNS = lex._w("""
xylophone zeppelin marmalade kaleidoscope porcupine trombone avalanche saxophone
harpsichord accordion armadillo flamingo pelican walrus chameleon platypus mandolin
tambourine harmonica gondola igloo volcano hurricane submarine trampoline chandelier
thermometer microscope octopus caterpillar
""")
RARE_NAMES = lex._w("""
istanbul melbourne beethoven picasso mozart shakespeare napoleon cleopatra einstein
copenhagen budapest madagascar nairobi amsterdam barcelona stockholm honolulu galileo
vivaldi magellan
""")
# First words of two-word names: lexicon words (they may be training words).
TITLES = lex._w("doctor captain uncle aunt king queen prince princess judge mayor")
_ONSETS = lex._w("b d f g k l m n p r s t v z br dr gr kr tr st sh th qu")
_VOWELS = lex._w("a e i o u")
_CODAS = ("", "", "", "n", "r", "l", "s")  # inside a name
_ENDINGS = ("n", "r", "l", "k", "x", "s", "th", "")  # its last syllable; "": ends in a or o
# Letter runs that could read as rude words: names holding one are drawn again.
_AVOID = lex._w("shit fuk fuc cunt nig cok dick tit piss slut rape fag puss sex cum kik")
_LEXICON = frozenset(
    {word for words in lex.CATEGORIES.values() for word in words}
    | set(lex.IRREGULAR_PLURALS.values())
)


def invented_name(rng: random.Random) -> str:
    """A pronounceable made-up name of two or three syllables, letters a-z."""

    def syllable(codas: Sequence[str], last: bool = False) -> str:
        onset = rng.choice(_ONSETS)
        vowel = rng.choice(_VOWELS[:-1] if onset == "qu" else _VOWELS)  # no "quu"
        coda = rng.choice(codas)
        if last and not coda:
            vowel = rng.choice("aao")  # no final e, i or u
        return onset + vowel + coda

    middle = [syllable(_CODAS)] if rng.random() < 0.3 else []
    return "".join([syllable(_CODAS), *middle, syllable(_ENDINGS, last=True)])


def context_phrases(n: int, *, seed: int = 0, vocabulary: Iterable[str] = frozenset()) -> list[str]:
    """`n` distinct phrases, lower case: rare real words (`RARE_NOUNS`, `RARE_NAMES`),
    invented names and two-word names, mixed in turns (2 : 2 : 1 while the real words
    last). No word of a phrase is in the lexicon or `vocabulary` (the training words)
    except a title, and no word other than a title is in two phrases."""
    rng = random.Random(f"{seed}:phrases")
    taken = set(_LEXICON) | set(vocabulary)
    rare = [word for word in RARE_NOUNS + RARE_NAMES if word not in taken]
    rng.shuffle(rare)
    taken |= set(RARE_NOUNS + RARE_NAMES)

    def new_name() -> str:
        for _ in range(10_000):
            name = invented_name(rng)
            if 4 <= len(name) <= 10 and name not in taken and not any(x in name for x in _AVOID):
                taken.add(name)
                return name
        raise RuntimeError("cannot invent new names: every draw is taken")

    phrases: list[str] = []
    while len(phrases) < n:
        kinds = ("rare", "invented", "two", "rare", "invented") if rare else ("invented", "two")
        for kind in kinds:
            if kind == "rare" and rare:
                phrases.append(rare.pop())
            elif kind == "two":
                first = rng.choice(TITLES) if rng.random() < 0.6 else new_name()
                phrases.append(f"{first} {new_name()}")
            else:
                phrases.append(new_name())
    return phrases[:n]


@dataclass(frozen=True)
class ContextSets:
    """The phrases, and the utterances of both parts: `plain[i]` is `context[i]`'s twin,
    `phrases[i]` the phrase `context[i]` holds (as subject or object, `roles[i]`) and
    `fillers[i]` the word(s) in its place in `plain[i]`."""

    occurring: list[str]
    distractors: list[str]
    extra: list[str]
    context: list[Utterance]
    plain: list[Utterance]
    phrases: list[str]
    roles: list[str]
    fillers: list[str]


def plan_context_sets(
    training_texts: Iterable[str],
    *,
    seed: int = 0,
    occurring: int = 50,
    distractors: int = 50,
    total: int = max(LIST_SIZES),
) -> ContextSets:
    """Phrases and sentences from the training transcripts (any case): `occurring`
    phrases spoken in 2 or 3 sentences each (3 for 60 % of them), `distractors` never
    spoken, and extra phrases up to `total`. Pure and cheap; the same for a seed."""
    texts = {" ".join(text.lower().split()) for text in training_texts}
    known = {word for text in texts for word in text.split()}
    if not known:
        raise ValueError("no training text: the phrases must be new to it")
    phrases = context_phrases(max(total, occurring + distractors), seed=seed, vocabulary=known)
    spoken = phrases[:occurring]
    rng = random.Random(f"{seed}:{CONTEXT_PART}")
    grammar = lex.Grammar(rng, known)
    thrice = set(rng.sample(range(occurring), k=round(0.6 * occurring)))
    seen = set(texts)
    sets = ContextSets(
        spoken, phrases[occurring : occurring + distractors], phrases[occurring + distractors :],
        [], [], [], [], [],
    )  # fmt: skip
    numbers = {speaker.id: 0 for speaker in SPEAKERS}
    for round_ in range(3):
        for i, phrase in enumerate(spoken):
            if round_ == 2 and i not in thrice:
                continue
            role = ("subject", "object")[(i + round_) % 2]
            words, twin, filler = _sentence(grammar, phrase, role, known, seen)
            index = len(sets.context)
            speaker = SPEAKERS[index % len(SPEAKERS)]
            rate = round(speaker.rate * rng.uniform(0.94, 1.06))
            pitch = min(99, max(1, speaker.pitch + rng.randint(-5, 5)))
            number = numbers[speaker.id]
            numbers[speaker.id] += 1
            for part, text, out in (
                (CONTEXT_PART, words, sets.context),
                (PLAIN_PART, twin, sets.plain),
            ):
                out.append(Utterance(part, index, speaker, number, " ".join(text), rate, pitch))
            sets.phrases.append(phrase)
            sets.roles.append(role)
            sets.fillers.append(" ".join(filler))
    return sets


def _sentence(
    grammar: lex.Grammar, phrase: str, role: str, known: set[str], seen: set[str]
) -> tuple[list[str], list[str], list[str]]:
    """(sentence, twin, filler): `phrase` as subject or object of a sentence of training
    words, and the twin with `filler` in its place; both new to `seen` (added to it)."""
    noun = phrase in RARE_NOUNS
    said = ["the", phrase] if noun else phrase.split()
    for _ in range(2000):
        if role == "subject":
            before: list[str] = []
            after = grammar.predicate("_past")
            filler = ["the", grammar.w("agent")] if noun else [grammar.w("name")]
        else:
            before = [*grammar.subject()[0], grammar.w("vt_past")]
            after = grammar.extras(0.45, 0.2, 0.2)
            filler = ["the", grammar.w("object")] if noun else [grammar.w("name")]
        words, twin = [*before, *said, *after], [*before, *filler, *after]
        text, twin_text = " ".join(words), " ".join(twin)
        fits = all(MIN_WORDS <= len(w) <= MAX_WORDS for w in (words, twin))
        if fits and known.issuperset(twin) and not {text, twin_text} & seen:
            if not (SPOKEN_TEXT.fullmatch(text) and SPOKEN_TEXT.fullmatch(twin_text)):
                raise ValueError(f"not a-z, ' and single spaces: {text!r} / {twin_text!r}")
            seen |= {text, twin_text}
            return words, twin, filler[-1:] if noun else filler
    raise RuntimeError(f"cannot place {phrase!r} in a sentence of training words")


def phrase_list(sets: ContextSets, n: int, *, seed: int = 0) -> list[str]:
    """`n` phrases to boost, shuffled: half spoken ones (as many as there are), then
    distractors, then extra phrases."""
    spoken = sets.occurring[: n // 2]
    distract = sets.distractors[: n - len(spoken)]
    chosen = spoken + distract + sets.extra[: n - len(spoken) - len(distract)]
    if len(chosen) < n:
        raise ValueError(f"only {len(chosen)} phrases planned, {n} asked for")
    random.Random(f"{seed}:list{n}").shuffle(chosen)
    return chosen


# ---------------------------------------------------------------------------------------
# Files


def _corpus_params(root: Path) -> dict:
    """The parameters of the complete demo corpus under `root` (its LibriSpeech folder)."""
    try:
        made = json.loads((root / CORPUS_MARKER).read_text())
        params, _ = made["params"], made["summary"]  # no summary: an unfinished corpus
        return params
    except (OSError, ValueError, KeyError) as err:
        raise FileNotFoundError(
            f"{root}: no complete demo corpus to make the context sets from ({err}); make one "
            "first (asr-make-demo-corpus OUT)"
        ) from err


def training_texts(root: Path) -> list[str]:
    """The transcripts of the corpus's training parts (every part with transcripts named
    train-*), lower case."""
    parts = [p for p in ALL_PARTS if p.startswith("train") and p != UNLABELLED_PART]
    return [
        line.partition(" ")[2].lower()
        for part in parts
        for path in sorted((root / part).glob("*/*/*.trans.txt"))
        for line in path.read_text().splitlines()
    ]


def _reused(root: Path, params: dict) -> dict | None:
    """The summary in both parts' markers if they hold `params`, else None."""
    try:
        made = [
            json.loads((root / part / MARKER).read_text()) for part in (CONTEXT_PART, PLAIN_PART)
        ]
    except (OSError, ValueError):
        return None
    if all(m.get("params") == params and "summary" in m for m in made):
        return made[0]["summary"]
    return None


def _write_phrases(manifest_dir: Path, sets: ContextSets, seed: int) -> list[Path]:
    """`PHRASES_JSON` and the phrase lists (upper case); returns the lists' paths."""
    utterances = {
        utt.id: {"phrase": phrase.upper(), "role": role, "plain": twin.id, "filler": filler.upper()}
        for utt, twin, phrase, role, filler in zip(
            sets.context, sets.plain, sets.phrases, sets.roles, sets.fillers, strict=True
        )
    }
    lists = [manifest_dir / f"context_phrases_{n}.txt" for n in LIST_SIZES]
    content = {
        "seed": seed,
        "occurring": [p.upper() for p in sets.occurring],
        "distractors": [p.upper() for p in sets.distractors],
        "extra": [p.upper() for p in sets.extra],
        "lists": {str(n): path.name for n, path in zip(LIST_SIZES, lists, strict=True)},
        "utterances": utterances,
    }
    manifest_dir.mkdir(parents=True, exist_ok=True)
    write_json(manifest_dir / PHRASES_JSON, content)
    for n, path in zip(LIST_SIZES, lists, strict=True):
        path.write_text("".join(f"{p.upper()}\n" for p in phrase_list(sets, n, seed=seed)))
    return lists


def make_context_sets(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_jobs: int | None = None,
    occurring: int = 50,
    distractors: int = 50,
) -> dict:
    """Synthesize test-context and test-plain beside the complete demo corpus in OUT (with
    its noise floor), write their manifests and the phrase files; return a summary:
    utterances and hours per part, phrase counts, the files. Skips the synthesis if both
    parts exist with these parameters ("reused": True). Raises FileNotFoundError naming
    OUT when it holds no complete demo corpus."""
    root, manifest_dir = Path(out_dir) / "LibriSpeech", Path(out_dir) / "manifests"
    corpus = _corpus_params(root)
    if occurring < 1 or distractors < 0 or seed < 0:
        raise ValueError("occurring must be >= 1, distractors and seed >= 0")
    num_jobs = num_jobs or os.cpu_count() or 1
    params = {
        "version": _VERSION, "seed": seed, "occurring": occurring, "distractors": distractors,
        "corpus": corpus,
    }  # fmt: skip
    sets = plan_context_sets(
        training_texts(root), seed=seed, occurring=occurring, distractors=distractors
    )
    summary = _reused(root, params)
    reused = summary is not None
    if summary is not None:
        Console(stderr=True).print(f"{root}: context sets with these parameters exist; skipping")
    else:
        check_voices(SPEAKERS)
        for part in (CONTEXT_PART, PLAIN_PART):
            if (root / part).exists():
                shutil.rmtree(root / part)
            (root / part).mkdir(parents=True)
        plan = {CONTEXT_PART: sets.context, PLAIN_PART: sets.plain}
        durations, words = synthesize_all(root, plan, seed, corpus["noise_dbfs"], num_jobs)
        for utterances in plan.values():
            write_transcripts(root, utterances, durations, words)
        summary = {
            part: {
                "utterances": len(utts),
                "hours": round(sum(durations[u.id] for u in utts) / 3600, 4),
            }
            for part, utts in plan.items()
        }
        for part in plan:
            write_json(root / part / MARKER, {"params": params, "summary": summary})
    prepare_manifests(root, manifest_dir, parts=[CONTEXT_PART, PLAIN_PART])
    lists = _write_phrases(manifest_dir, sets, seed)
    return {
        "parts": summary,
        "phrases": {
            "occurring": len(sets.occurring),
            "distractors": len(sets.distractors),
            "extra": len(sets.extra),
        },
        "files": [
            *(str(cuts_path(manifest_dir, part)) for part in (CONTEXT_PART, PLAIN_PART)),
            str(manifest_dir / PHRASES_JSON),
            *map(str, lists),
        ],
        "reused": reused,
    }


@command
def main(argv: Sequence[str] | None = None) -> None:
    """Console script `asr-make-context-sets OUT [--seed S] [--num-jobs J]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, help="the demo corpus root (OUT/LibriSpeech, OUT/manifests)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-jobs", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args(argv)
    summary = make_context_sets(args.out, seed=args.seed, num_jobs=args.num_jobs)
    for part, figures in summary["parts"].items():
        print(f"{part:16s} {figures['utterances']:6d} utterances {figures['hours']:8.4f} h")
    print(", ".join(f"{count} {kind}" for kind, count in summary["phrases"].items()), "phrases")
    for path in summary["files"]:
        print(path)


if __name__ == "__main__":
    main()

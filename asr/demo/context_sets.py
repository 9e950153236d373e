"""Test and dev sets for context biasing, synthesized beside the demo corpus.

Demo speech holding names and rare words that training never heard, the same sentences
with ordinary words in their place, and the phrase lists to boost: a test part to report
on, and a dev part (other phrases, other sentences) to choose the biasing score and the
LM weights on.

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
- The dev part (`plan_dev_sets`) is made the same way after the test part, from seeded
  streams of its own, so the test part is what it was before the dev part existed (same
  phrases, sentences and audio: its figures are published; version 1 of its marker is
  kept). Its phrases share no word with any of test's 1,000 (its real words come from
  `DEV_RARE_NOUNS` and `DEV_RARE_NAMES`, its titles from `DEV_TITLES`, and its invented
  names are new), its sentences are none of test-context's and test-plain's, nor of the
  corpus's dev and test parts; its turns start with a voice of its own,
  `DEV_ONLY_SPEAKER`, read by no other part, as test's start with the test-only one.

It writes, under OUT (the demo corpus root, e.g. data/demo):

- ``LibriSpeech/{test,dev}-context`` and ``LibriSpeech/{test,dev}-plain``: parts in the
  corpus's layout, each with a ``context_sets.json`` marker holding the parameters, so a
  re-run with the same ones skips (a corpus rebuilt with other parameters removes them);
- ``manifests/librispeech_cuts_{test,dev}-{context,plain}.jsonl.gz`` (`prepare_manifests`);
- ``manifests/context_phrases.json``: test's phrases (upper case, as the transcripts) and,
  per test-context utterance, its phrase, role and plain twin; the same for the dev part
  under its key "dev";
- ``manifests/context_phrases_{10,100,1000}.txt`` (test) and
  ``manifests/context_phrases_dev_{10,100,1000}.txt`` (dev): lists for
  ``--biasing-phrases``, one phrase a line: half of each (up to all of them) spoken, the
  rest distractors, then extra.

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
    DEV_CONTEXT_PART,
    DEV_PLAIN_PART,
    EXTRA_PARTS,
    MAX_WORDS,
    MIN_WORDS,
    PARTS,
    PLAIN_PART,
    SPOKEN_TEXT,
    TEST_ONLY_SPEAKER,
    TRAIN_SPEAKERS,
    UNLABELLED_PART,
    Speaker,
    Utterance,
)
from asr.demo.synth import MARKER as CORPUS_MARKER
from asr.demo.synth import check_voices, synthesize_all, write_json, write_transcripts

MARKER = "context_sets.json"
PHRASES_JSON = "context_phrases.json"
LIST_SIZES = (10, 100, 1000)
# Bump when the sets change, so old ones are rebuilt (2: the dev part). The test part's
# marker keeps a version of its own, unchanged since 1 because its phrases, sentences and
# audio are: sets made before the dev part keep their test audio, and get a dev part. Bump
# _TEST_VERSION (and with it the dev part, whose marker holds it) when test changes.
_VERSION = 2
_TEST_VERSION = 1
SPEAKERS = (TEST_ONLY_SPEAKER, *TRAIN_SPEAKERS)  # test-clean's turns
# The dev part's own voice (the rp accent of training with a variant no labelled part uses),
# first in its turns as the test-only speaker is in test's.
DEV_ONLY_SPEAKER = Speaker(1012, "en-gb-x-rp+m7", 170, 50, 55)
DEV_SPEAKERS = (DEV_ONLY_SPEAKER, *TRAIN_SPEAKERS)

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
# The dev part's real words: others of the same kinds, none in the lists above.
DEV_RARE_NOUNS = lex._w("""
alligator crocodile gorilla penguin iguana tarantula jellyfish lobster scorpion
hippopotamus rhinoceros chimpanzee pineapple avocado broccoli spaghetti helicopter
parachute escalator stethoscope periscope barometer glacier tornado asteroid catapult
cauldron banjo clarinet
""")
DEV_RARE_NAMES = lex._w("""
tokyo vienna lisbon helsinki dublin cairo santiago jakarta manila chicago rembrandt chopin
darwin newton columbus aristotle archimedes michelangelo edison vancouver
""")
# First words of two-word names: lexicon words (they may be training words); the dev
# part's are others.
TITLES = lex._w("doctor captain uncle aunt king queen prince princess judge mayor")
DEV_TITLES = lex._w("lady master officer sister brother father mother nurse cousin farmer")
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


def context_phrases(
    n: int,
    *,
    seed: int = 0,
    vocabulary: Iterable[str] = frozenset(),
    exclude: Iterable[str] = frozenset(),
    rare: Sequence[str] | None = None,
    titles: Sequence[str] = TITLES,
    stream: str = "phrases",
) -> list[str]:
    """`n` distinct phrases, lower case: rare real words (`rare`, default `RARE_NOUNS` and
    `RARE_NAMES`), invented names and two-word names (a title of `titles` or an invented
    name first), mixed in turns (2 : 2 : 1 while the real words last). No word of a phrase
    is in the lexicon, `vocabulary` (the training words) or `exclude` except a title, and
    no word other than a title is in two phrases. `stream` names the seeded draws (the
    dev part's are not the test part's)."""
    rng = random.Random(f"{seed}:{stream}")
    taken = set(_LEXICON) | set(vocabulary) | set(exclude)
    real = RARE_NOUNS + RARE_NAMES if rare is None else list(rare)
    rare = [word for word in real if word not in taken]
    rng.shuffle(rare)
    taken |= set(RARE_NOUNS + RARE_NAMES + real)

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
                first = rng.choice(titles) if rng.random() < 0.6 else new_name()
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
    """The test part: phrases and sentences from the training transcripts (any case):
    `occurring` phrases spoken in 2 or 3 sentences each (3 for 60 % of them),
    `distractors` never spoken, and extra phrases up to `total`. Pure and cheap; the same
    for a seed."""
    texts, known = _training(training_texts)
    phrases = context_phrases(max(total, occurring + distractors), seed=seed, vocabulary=known)
    rng = random.Random(f"{seed}:{CONTEXT_PART}")
    return _plan_sets(
        phrases, occurring, distractors, rng, known, set(texts), set(RARE_NOUNS), SPEAKERS,
        (CONTEXT_PART, PLAIN_PART),
    )  # fmt: skip


def plan_dev_sets(
    training_texts: Iterable[str],
    test: ContextSets,
    *,
    seed: int = 0,
    occurring: int = 50,
    distractors: int = 50,
    total: int = max(LIST_SIZES),
    held_out: Iterable[str] = (),
) -> ContextSets:
    """The dev part, as `plan_context_sets` makes the test part `test` (call it with the
    same arguments) but from seeded streams of its own: phrases sharing no word with any
    of test's (its titles `DEV_TITLES`, its real words `DEV_RARE_NOUNS` and
    `DEV_RARE_NAMES`), sentences that are none of test's, of the training text or of
    `held_out` (the corpus's dev and test transcripts, any case), read in turns starting
    with `DEV_ONLY_SPEAKER`. Pure and cheap; the same for a seed."""
    texts, known = _training(training_texts)
    tested = test.occurring + test.distractors + test.extra
    phrases = context_phrases(
        max(total, occurring + distractors),
        seed=seed,
        vocabulary=known,
        exclude={word for phrase in tested for word in phrase.split()},
        rare=DEV_RARE_NOUNS + DEV_RARE_NAMES,
        titles=DEV_TITLES,
        stream=f"{DEV_CONTEXT_PART}:phrases",
    )
    rng = random.Random(f"{seed}:{DEV_CONTEXT_PART}")
    seen = set(texts) | {utt.text for utt in test.context + test.plain}
    seen |= {" ".join(text.lower().split()) for text in held_out}
    return _plan_sets(
        phrases, occurring, distractors, rng, known, seen, set(DEV_RARE_NOUNS), DEV_SPEAKERS,
        (DEV_CONTEXT_PART, DEV_PLAIN_PART),
    )  # fmt: skip


def _training(training_texts: Iterable[str]) -> tuple[set[str], set[str]]:
    """The training sentences (lower case, single spaces) and their words."""
    texts = {" ".join(text.lower().split()) for text in training_texts}
    known = {word for text in texts for word in text.split()}
    if not known:
        raise ValueError("no training text: the phrases must be new to it")
    return texts, known


def _plan_sets(
    phrases: list[str],
    occurring: int,
    distractors: int,
    rng: random.Random,
    known: set[str],
    seen: set[str],
    nouns: set[str],
    speakers: Sequence[Speaker],
    parts: tuple[str, str],
) -> ContextSets:
    """The sentences of one part's pair (`parts`: context, plain): the first `occurring`
    of `phrases` spoken (`nouns` with "the"), in sentences new to `seen` (added to it)."""
    spoken = phrases[:occurring]
    grammar = lex.Grammar(rng, known)
    thrice = set(rng.sample(range(occurring), k=round(0.6 * occurring)))
    sets = ContextSets(
        spoken, phrases[occurring : occurring + distractors], phrases[occurring + distractors :],
        [], [], [], [], [],
    )  # fmt: skip
    numbers = {speaker.id: 0 for speaker in speakers}
    for round_ in range(3):
        for i, phrase in enumerate(spoken):
            if round_ == 2 and i not in thrice:
                continue
            role = ("subject", "object")[(i + round_) % 2]
            words, twin, filler = _sentence(grammar, phrase, phrase in nouns, role, known, seen)
            index = len(sets.context)
            speaker = speakers[index % len(speakers)]
            rate = round(speaker.rate * rng.uniform(0.94, 1.06))
            pitch = min(99, max(1, speaker.pitch + rng.randint(-5, 5)))
            number = numbers[speaker.id]
            numbers[speaker.id] += 1
            for part, text, out in zip(
                parts, (words, twin), (sets.context, sets.plain), strict=True
            ):
                out.append(Utterance(part, index, speaker, number, " ".join(text), rate, pitch))
            sets.phrases.append(phrase)
            sets.roles.append(role)
            sets.fillers.append(" ".join(filler))
    return sets


def _sentence(
    grammar: lex.Grammar, phrase: str, noun: bool, role: str, known: set[str], seen: set[str]
) -> tuple[list[str], list[str], list[str]]:
    """(sentence, twin, filler): `phrase` (a `noun`: "the" before it, a noun of the lexicon
    in its twin; else a name) as subject or object of a sentence of training words, and
    the twin with `filler` in its place; both new to `seen` (added to it)."""
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


def phrase_list(sets: ContextSets, n: int, *, seed: int = 0, stream: str = "list") -> list[str]:
    """`n` phrases to boost, shuffled (the seeded draws `stream`: the dev part has its own):
    half spoken ones (as many as there are), then distractors, then extra phrases."""
    spoken = sets.occurring[: n // 2]
    distract = sets.distractors[: n - len(spoken)]
    chosen = spoken + distract + sets.extra[: n - len(spoken) - len(distract)]
    if len(chosen) < n:
        raise ValueError(f"only {len(chosen)} phrases planned, {n} asked for")
    random.Random(f"{seed}:{stream}{n}").shuffle(chosen)
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


def transcripts(root: Path, parts: Iterable[str]) -> list[str]:
    """The transcripts of `parts` under `root` (the corpus's LibriSpeech folder), lower
    case; a part that is not there has none."""
    return [
        line.partition(" ")[2].lower()
        for part in parts
        for path in sorted((root / part).glob("*/*/*.trans.txt"))
        for line in path.read_text().splitlines()
    ]


def training_texts(root: Path) -> list[str]:
    """The transcripts of the corpus's training parts (every part with transcripts named
    train-*), lower case."""
    return transcripts(
        root, [p for p in ALL_PARTS if p.startswith("train") and p != UNLABELLED_PART]
    )


# The corpus's own dev and test parts (LibriSpeech's names), whose sentences the dev part
# of the context sets does not take.
HELD_OUT_PARTS = tuple(p for p in PARTS + EXTRA_PARTS if not p.startswith("train"))


def _reused(root: Path, parts: tuple[str, str], params: dict) -> dict | None:
    """The summary in both `parts`' markers if they hold `params`, else None."""
    try:
        made = [json.loads((root / part / MARKER).read_text()) for part in parts]
    except (OSError, ValueError):
        return None
    if all(m.get("params") == params and "summary" in m for m in made):
        return made[0]["summary"]
    return None


def _phrases_content(sets: ContextSets, lists: dict[int, Path]) -> dict:
    """What `PHRASES_JSON` says of one part: its phrases (upper case), its lists' file
    names and, per context utterance, its phrase, role, plain twin and filler."""
    utterances = {
        utt.id: {"phrase": phrase.upper(), "role": role, "plain": twin.id, "filler": filler.upper()}
        for utt, twin, phrase, role, filler in zip(
            sets.context, sets.plain, sets.phrases, sets.roles, sets.fillers, strict=True
        )
    }
    return {
        "occurring": [p.upper() for p in sets.occurring],
        "distractors": [p.upper() for p in sets.distractors],
        "extra": [p.upper() for p in sets.extra],
        "lists": {str(n): path.name for n, path in lists.items()},
        "utterances": utterances,
    }


def _write_phrases(
    manifest_dir: Path, sets: ContextSets, dev: ContextSets, seed: int
) -> list[Path]:
    """`PHRASES_JSON` (the test part's keys at the top, as before the dev part, and the dev
    part's under "dev") and the phrase lists (upper case); returns the lists' paths."""
    lists = {n: manifest_dir / f"context_phrases_{n}.txt" for n in LIST_SIZES}
    dev_lists = {n: manifest_dir / f"context_phrases_dev_{n}.txt" for n in LIST_SIZES}
    content = {
        "seed": seed,
        **_phrases_content(sets, lists),
        "dev": _phrases_content(dev, dev_lists),
    }
    manifest_dir.mkdir(parents=True, exist_ok=True)
    write_json(manifest_dir / PHRASES_JSON, content)
    for n, path in lists.items():
        path.write_text("".join(f"{p.upper()}\n" for p in phrase_list(sets, n, seed=seed)))
    for n, path in dev_lists.items():
        chosen = phrase_list(dev, n, seed=seed, stream=f"{DEV_CONTEXT_PART}:list")
        path.write_text("".join(f"{p.upper()}\n" for p in chosen))
    return [*lists.values(), *dev_lists.values()]


def make_context_sets(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_jobs: int | None = None,
    occurring: int = 50,
    distractors: int = 50,
) -> dict:
    """Synthesize test-context, test-plain, dev-context and dev-plain beside the complete
    demo corpus in OUT (with its noise floor), write their manifests and the phrase files;
    return a summary: utterances and hours per part, phrase counts per part ("phrases":
    test's, "dev_phrases"), the files. Skips the synthesis of a part's pair (test, dev)
    that exists with these parameters ("reused": True when both do). Raises
    FileNotFoundError naming OUT when it holds no complete demo corpus."""
    root, manifest_dir = Path(out_dir) / "LibriSpeech", Path(out_dir) / "manifests"
    corpus = _corpus_params(root)
    if occurring < 1 or distractors < 0 or seed < 0:
        raise ValueError("occurring must be >= 1, distractors and seed >= 0")
    num_jobs = num_jobs or os.cpu_count() or 1
    params = {
        "version": _TEST_VERSION, "seed": seed, "occurring": occurring, "distractors": distractors,
        "corpus": corpus,
    }  # fmt: skip
    dev_params = {**params, "version": _VERSION, "test_version": _TEST_VERSION}
    training = training_texts(root)
    sizes = {"seed": seed, "occurring": occurring, "distractors": distractors}
    sets = plan_context_sets(training, **sizes)
    dev = plan_dev_sets(training, sets, **sizes, held_out=transcripts(root, HELD_OUT_PARTS))
    pairs = {
        (CONTEXT_PART, PLAIN_PART): (sets, params),
        (DEV_CONTEXT_PART, DEV_PLAIN_PART): (dev, dev_params),
    }
    summary: dict[str, dict] = {}
    plan: dict[str, list[Utterance]] = {}
    for parts, (planned, made_with) in pairs.items():
        reused = _reused(root, parts, made_with)
        if reused is not None:
            Console(stderr=True).print(
                f"{root}: {' and '.join(parts)} with these parameters exist; skipping"
            )
            summary |= reused
        else:
            plan |= dict(zip(parts, (planned.context, planned.plain), strict=True))
    if plan:
        check_voices({utt.speaker for utts in plan.values() for utt in utts})
        for part in plan:
            if (root / part).exists():
                shutil.rmtree(root / part)
            (root / part).mkdir(parents=True)
        durations, words = synthesize_all(root, plan, seed, corpus["noise_dbfs"], num_jobs)
        for utterances in plan.values():
            write_transcripts(root, utterances, durations, words)
        made = {
            part: {
                "utterances": len(utts),
                "hours": round(sum(durations[u.id] for u in utts) / 3600, 4),
            }
            for part, utts in plan.items()
        }
        for parts, (_, made_with) in pairs.items():
            if parts[0] in plan:
                pair = {part: made[part] for part in parts}
                for part in parts:
                    write_json(root / part / MARKER, {"params": made_with, "summary": pair})
        summary |= made
    every = [part for parts in pairs for part in parts]
    prepare_manifests(root, manifest_dir, parts=every)
    lists = _write_phrases(manifest_dir, sets, dev, seed)

    def counts(planned: ContextSets) -> dict[str, int]:
        return {
            "occurring": len(planned.occurring),
            "distractors": len(planned.distractors),
            "extra": len(planned.extra),
        }

    return {
        "parts": {part: summary[part] for part in every},
        "phrases": counts(sets),
        "dev_phrases": counts(dev),
        "files": [
            *(str(cuts_path(manifest_dir, part)) for part in every),
            str(manifest_dir / PHRASES_JSON),
            *map(str, lists),
        ],
        "reused": not plan,
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
    for name, key in (("test", "phrases"), ("dev", "dev_phrases")):
        counts = ", ".join(f"{count} {kind}" for kind, count in summary[key].items())
        print(f"{name} phrases: {counts}")
    for path in summary["files"]:
        print(path)


if __name__ == "__main__":
    main()

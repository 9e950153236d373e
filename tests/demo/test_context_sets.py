import json
import re
from collections import Counter
from pathlib import Path

import pytest

from asr.demo import lexicon as lex
from asr.demo.context_sets import (
    LIST_SIZES,
    MARKER,
    PHRASES_JSON,
    RARE_NAMES,
    RARE_NOUNS,
    SPEAKERS,
    TITLES,
    ContextSets,
    context_phrases,
    main,
    make_context_sets,
    phrase_list,
    plan_context_sets,
)
from asr.demo.plan import CONTEXT_PART, PLAIN_PART, TEST_ONLY_SPEAKER, plan_corpus

PHRASE = re.compile(r"[a-z]+( [a-z]+)?")
TINY = {"train_hours": 0.012, "dev_minutes": 0.25, "test_minutes": 0.3, "seed": 3}


@pytest.fixture(scope="module")
def training() -> list[str]:
    """The demo corpus's training text (`make demo`'s sizes)."""
    plan = plan_corpus(train_hours=2.0, dev_minutes=6, test_minutes=10, seed=0)
    return [utt.text for utt in plan["train-clean-100"]]


@pytest.fixture(scope="module")
def sets(training: list[str]) -> ContextSets:
    return plan_context_sets(training, seed=0)


def spoken_in(phrase: str, text: str) -> bool:
    return f" {phrase} " in f" {text} "


def test_sizes_and_every_occurring_phrase_spoken(sets: ContextSets) -> None:
    assert len(sets.context) == len(sets.plain) == len(sets.phrases) >= 100
    assert len(set(sets.occurring)) == len(sets.occurring) == 50
    assert len(set(sets.distractors)) == 50
    counts = Counter(sets.phrases)
    assert set(counts) == set(sets.occurring) and set(counts.values()) == {2, 3}
    for utt, phrase in zip(sets.context, sets.phrases, strict=True):
        assert spoken_in(phrase, utt.text)
        assert sum(spoken_in(p, utt.text) for p in sets.occurring) == 1
    for utts in (sets.context, sets.plain):
        assert all(3 <= len(utt.text.split()) <= 20 for utt in utts)
        assert len({utt.id for utt in utts}) == len({utt.text for utt in utts}) == len(utts)
    roles = Counter(sets.roles)
    assert set(roles) == {"subject", "object"} and min(roles.values()) > 0.4 * len(sets.roles)


def test_phrase_words_are_new_to_training(sets: ContextSets, training: list[str]) -> None:
    vocabulary = {word for text in training for word in text.split()}
    lexicon = {word for words in lex.CATEGORIES.values() for word in words}
    assert not (set(RARE_NOUNS) | set(RARE_NAMES)) & (vocabulary | lexicon)
    phrases = sets.occurring + sets.distractors + sets.extra
    assert len(set(phrases)) == len(phrases) == max(LIST_SIZES)
    seen: set[str] = set()
    for phrase in phrases:
        assert PHRASE.fullmatch(phrase), phrase
        words = phrase.split()
        if len(words) == 2 and words[0] in TITLES:
            words = words[1:]
        assert not set(words) & (vocabulary | lexicon), phrase
        assert not set(words) & seen, phrase  # no word in two phrases
        seen |= set(words)
    assert {word for text in training for word in text.split()}.isdisjoint(seen)
    kinds = Counter(
        "rare" if p in RARE_NOUNS + RARE_NAMES else "two" if " " in p else "invented"
        for p in sets.occurring
    )
    assert kinds == {"rare": 20, "invented": 20, "two": 10}


def test_plain_twins_differ_only_in_the_phrase(sets: ContextSets, training: list[str]) -> None:
    vocabulary = {word for text in training for word in text.split()}
    nouns = set(lex.CATEGORIES["agent"]) | set(lex.CATEGORIES["object"])
    for utt, twin, phrase, filler in zip(
        sets.context, sets.plain, sets.phrases, sets.fillers, strict=True
    ):
        assert (twin.part, utt.part) == (PLAIN_PART, CONTEXT_PART)
        assert (twin.index, twin.speaker, twin.number) == (utt.index, utt.speaker, utt.number)
        assert (twin.rate, twin.pitch) == (utt.rate, utt.pitch)
        assert f" {twin.text} " == f" {utt.text} ".replace(f" {phrase} ", f" {filler} ", 1)
        assert filler in (nouns if phrase in RARE_NOUNS else set(lex.NAMES))
        assert set(twin.text.split()) <= vocabulary
        assert set(utt.text.split()) - set(phrase.split()) <= vocabulary
    assert not {twin.text for twin in sets.plain} & set(training)


def test_distractors_and_extra_phrases_are_never_spoken(sets: ContextSets) -> None:
    texts = [utt.text for utt in sets.context + sets.plain]
    for phrase in sets.distractors + sets.extra:
        assert not any(spoken_in(phrase, text) for text in texts), phrase
    for phrase in sets.occurring:
        assert not any(spoken_in(phrase, twin.text) for twin in sets.plain)


def test_speakers_take_turns_as_in_test_clean(sets: ContextSets) -> None:
    assert sets.context[0].speaker == TEST_ONLY_SPEAKER
    assert [utt.speaker for utt in sets.context[: len(SPEAKERS)]] == list(SPEAKERS)


def test_phrase_lists(sets: ContextSets) -> None:
    for n in LIST_SIZES:
        phrases = phrase_list(sets, n)
        assert len(set(phrases)) == len(phrases) == n
        assert len(set(phrases) & set(sets.occurring)) == min(n // 2, 50)
    assert set(phrase_list(sets, 100)) == set(sets.occurring + sets.distractors)
    assert phrase_list(sets, 100) != sets.occurring + sets.distractors  # shuffled
    with pytest.raises(ValueError, match="only 1000 phrases"):
        phrase_list(sets, 1001)


def test_same_seed_same_sets(sets: ContextSets, training: list[str]) -> None:
    assert plan_context_sets(training, seed=0) == sets
    other = plan_context_sets(training, seed=1)
    assert other.occurring != sets.occurring
    assert [u.text for u in other.context] != [u.text for u in sets.context]
    many = context_phrases(1100, seed=5)
    assert len(set(many)) == 1100 and many == context_phrases(1100, seed=5)
    assert context_phrases(100, seed=5) == many[:100]


def test_synthesized_sets_beside_a_tiny_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from asr.data.corpus import cuts_path, load_cuts
    from asr.demo.synth import make_demo_corpus

    with pytest.raises(SystemExit):  # the command: one line naming the folder
        main([str(tmp_path)])
    assert f"{tmp_path}/LibriSpeech: no complete demo corpus" in capsys.readouterr().err
    make_demo_corpus(tmp_path, **TINY, num_jobs=2)
    summary = make_context_sets(tmp_path, seed=2, occurring=3, distractors=2, num_jobs=2)
    root, manifests = tmp_path / "LibriSpeech", tmp_path / "manifests"
    assert not summary["reused"]
    assert summary["phrases"] == {"occurring": 3, "distractors": 2, "extra": 995}
    phrases = json.loads((manifests / PHRASES_JSON).read_text())
    for part in (CONTEXT_PART, PLAIN_PART):
        cuts = list(load_cuts(cuts_path(manifests, part)))
        assert len(cuts) == summary["parts"][part]["utterances"] == len(phrases["utterances"])
        assert sum(c.duration for c in cuts) / 3600 == pytest.approx(
            summary["parts"][part]["hours"], abs=1e-4
        )
        texts = {c.id: c.supervisions[0].text for c in cuts}
        if part == CONTEXT_PART:
            assert texts.keys() == phrases["utterances"].keys()
            for utt_id, held in phrases["utterances"].items():
                assert f" {held['phrase']} " in f" {texts[utt_id]} "
                assert held["phrase"] in phrases["occurring"]
        else:
            assert set(texts) == {held["plain"] for held in phrases["utterances"].values()}
    for n in LIST_SIZES:
        lines = (manifests / f"context_phrases_{n}.txt").read_text().splitlines()
        assert len(set(lines)) == n and all(line == line.upper() for line in lines)
    # a re-run reuses both parts; so does the corpus's own re-run, which keeps them
    marker = (root / CONTEXT_PART / MARKER).stat().st_mtime_ns
    assert make_context_sets(tmp_path, seed=2, occurring=3, distractors=2)["reused"]
    assert make_demo_corpus(tmp_path, **TINY, num_jobs=2)["reused"]
    assert (root / CONTEXT_PART / MARKER).stat().st_mtime_ns == marker
    # a corpus made with other parameters removes the sets made from its training text
    make_demo_corpus(tmp_path, **{**TINY, "seed": 4}, num_jobs=2)
    assert not (root / CONTEXT_PART).exists() and not (root / PLAIN_PART).exists()

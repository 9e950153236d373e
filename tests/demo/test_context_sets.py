import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from asr.demo import lexicon as lex
from asr.demo.context_sets import (
    DEV_ONLY_SPEAKER,
    DEV_RARE_NAMES,
    DEV_RARE_NOUNS,
    DEV_SPEAKERS,
    DEV_TITLES,
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
    plan_dev_sets,
)
from asr.demo.plan import (
    ALL_PARTS,
    CONTEXT_PART,
    DEV_CONTEXT_PART,
    DEV_PLAIN_PART,
    PLAIN_PART,
    TEST_ONLY_SPEAKER,
    TRAIN_SPEAKERS,
    UNLABELLED_SPEAKERS,
    plan_corpus,
)

PHRASE = re.compile(r"[a-z]+( [a-z]+)?")
TINY = {"train_hours": 0.012, "dev_minutes": 0.25, "test_minutes": 0.3, "seed": 3}


@pytest.fixture(scope="module")
def corpus() -> dict:
    """The demo corpus's plan (`make demo`'s sizes)."""
    return plan_corpus(train_hours=2.0, dev_minutes=6, test_minutes=10, seed=0)


@pytest.fixture(scope="module")
def training(corpus: dict) -> list[str]:
    """The demo corpus's training text."""
    return [utt.text for utt in corpus["train-clean-100"]]


@pytest.fixture(scope="module")
def held_out(corpus: dict) -> list[str]:
    """The demo corpus's dev-clean and test-clean text."""
    return [utt.text for part in ("dev-clean", "test-clean") for utt in corpus[part]]


@pytest.fixture(scope="module")
def sets(training: list[str]) -> ContextSets:
    return plan_context_sets(training, seed=0)


@pytest.fixture(scope="module")
def dev(training: list[str], sets: ContextSets, held_out: list[str]) -> ContextSets:
    return plan_dev_sets(training, sets, seed=0, held_out=held_out)


def test_the_test_part_is_the_one_published(sets: ContextSets) -> None:
    """The sets that recipes/demo/RESULTS.md reports on: the same ids, voices, texts and
    phrases as before the dev part existed (a change here changes published figures)."""
    lines = [f"{u.id} {u.rate} {u.pitch} {u.text}" for u in sets.context + sets.plain]
    text = "\n".join(lines) + "\n" + "\n".join(sets.occurring + sets.distractors + sets.extra)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == "e4a5b951de9315352127c0aa689e92e841f5deb7c7b68d64c4cef6fe9186074b"
    assert sets.occurring[:3] == ["porcupine", "brasfol", "quarukix quebros"]


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


def _kinds(sets: ContextSets, rare: list[str]) -> Counter:
    return Counter(
        "rare" if p in rare else "two" if " " in p else "invented" for p in sets.occurring
    )


def test_the_dev_part_is_made_as_the_test_part(dev: ContextSets, training: list[str]) -> None:
    assert len(dev.context) == len(dev.plain) == len(dev.phrases) >= 100
    assert len(set(dev.occurring)) == 50 and len(set(dev.distractors)) == 50
    phrases = dev.occurring + dev.distractors + dev.extra
    assert len(set(phrases)) == len(phrases) == max(LIST_SIZES)
    assert set(Counter(dev.phrases).values()) == {2, 3} and set(dev.phrases) == set(dev.occurring)
    assert _kinds(dev, DEV_RARE_NOUNS + DEV_RARE_NAMES) == {"rare": 20, "invented": 20, "two": 10}
    vocabulary = {word for text in training for word in text.split()}
    lexicon = {word for words in lex.CATEGORIES.values() for word in words}
    assert not (set(DEV_RARE_NOUNS) | set(DEV_RARE_NAMES)) & (vocabulary | lexicon)
    assert set(DEV_TITLES) <= lexicon and not set(DEV_TITLES) & set(TITLES)
    seen: set[str] = set()
    for phrase in phrases:
        assert PHRASE.fullmatch(phrase), phrase
        words = phrase.split()
        if len(words) == 2 and words[0] in DEV_TITLES:
            words = words[1:]
        assert not set(words) & (vocabulary | lexicon | seen), phrase
        seen |= set(words)
    nouns = set(lex.CATEGORIES["agent"]) | set(lex.CATEGORIES["object"])
    for utt, twin, phrase, filler in zip(
        dev.context, dev.plain, dev.phrases, dev.fillers, strict=True
    ):
        assert (utt.part, twin.part) == (DEV_CONTEXT_PART, DEV_PLAIN_PART)
        assert sum(spoken_in(p, utt.text) for p in phrases) == 1 and spoken_in(phrase, utt.text)
        assert f" {twin.text} " == f" {utt.text} ".replace(f" {phrase} ", f" {filler} ", 1)
        assert filler in (nouns if phrase in DEV_RARE_NOUNS else set(lex.NAMES))
        assert (twin.id.split("-")[0], twin.rate, twin.pitch) == (
            utt.id.split("-")[0],
            utt.rate,
            utt.pitch,
        )
        assert set(twin.text.split()) <= vocabulary
    texts = [utt.text for utt in dev.context + dev.plain]
    for phrase in dev.distractors + dev.extra:
        assert not any(spoken_in(phrase, text) for text in texts), phrase


def test_the_dev_part_shares_no_phrase_word_and_no_sentence_with_test(
    sets: ContextSets, dev: ContextSets, training: list[str], held_out: list[str]
) -> None:
    def words(sets: ContextSets) -> set[str]:
        return {w for p in sets.occurring + sets.distractors + sets.extra for w in p.split()}

    assert not words(dev) & words(sets)
    texts = [utt.text for utt in dev.context + dev.plain]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & {utt.text for utt in sets.context + sets.plain}
    assert not set(texts) & (set(training) | set(held_out))
    # held-out sentences are avoided: with one of them as dev's first twin, it is drawn anew
    taken = plan_dev_sets(training, sets, seed=0, held_out=[dev.plain[0].text.upper()])
    assert dev.plain[0].text not in {utt.text for utt in taken.plain}


def test_the_dev_part_has_a_voice_of_its_own_and_its_own_draws(
    sets: ContextSets, dev: ContextSets, training: list[str], held_out: list[str]
) -> None:
    assert [utt.speaker for utt in dev.context[: len(DEV_SPEAKERS)]] == list(DEV_SPEAKERS)
    others = (TEST_ONLY_SPEAKER, *TRAIN_SPEAKERS, *UNLABELLED_SPEAKERS)
    assert DEV_ONLY_SPEAKER.id not in {s.id for s in others}
    assert DEV_ONLY_SPEAKER.voice not in {s.voice for s in others}
    assert ALL_PARTS[-2:] == (DEV_CONTEXT_PART, DEV_PLAIN_PART)  # test's chapters and noise kept
    assert not {utt.id for utt in dev.context} & {utt.id for utt in sets.context}
    assert plan_dev_sets(training, sets, seed=0, held_out=held_out) == dev
    assert plan_dev_sets(training, sets, seed=1, held_out=held_out).occurring != dev.occurring
    for n in LIST_SIZES:
        chosen = phrase_list(dev, n, stream="dev-context:list")
        assert len(set(chosen)) == n and len(set(chosen) & set(dev.occurring)) == min(n // 2, 50)


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
    assert summary["dev_phrases"] == summary["phrases"]
    made = json.loads((manifests / PHRASES_JSON).read_text())
    for phrases, (context, plain), prefix in (
        (made, (CONTEXT_PART, PLAIN_PART), "context_phrases_"),
        (made["dev"], (DEV_CONTEXT_PART, DEV_PLAIN_PART), "context_phrases_dev_"),
    ):
        for part in (context, plain):
            cuts = list(load_cuts(cuts_path(manifests, part)))
            assert len(cuts) == summary["parts"][part]["utterances"] == len(phrases["utterances"])
            assert sum(c.duration for c in cuts) / 3600 == pytest.approx(
                summary["parts"][part]["hours"], abs=1e-4
            )
            texts = {c.id: c.supervisions[0].text for c in cuts}
            if part == context:
                assert texts.keys() == phrases["utterances"].keys()
                for utt_id, held in phrases["utterances"].items():
                    assert f" {held['phrase']} " in f" {texts[utt_id]} "
                    assert held["phrase"] in phrases["occurring"]
            else:
                assert set(texts) == {held["plain"] for held in phrases["utterances"].values()}
        for n in LIST_SIZES:
            assert phrases["lists"][str(n)] == f"{prefix}{n}.txt"
            lines = (manifests / f"{prefix}{n}.txt").read_text().splitlines()
            assert len(set(lines)) == n and all(line == line.upper() for line in lines)
    test_words = {
        w for key in ("occurring", "distractors", "extra") for p in made[key] for w in p.split()
    }
    dev_words = {
        w
        for key in ("occurring", "distractors", "extra")
        for p in made["dev"][key]
        for w in p.split()
    }
    assert not test_words & dev_words
    # a re-run reuses the four parts; so does the corpus's own re-run, which keeps them
    marker = (root / CONTEXT_PART / MARKER).stat().st_mtime_ns
    assert make_context_sets(tmp_path, seed=2, occurring=3, distractors=2)["reused"]
    assert make_demo_corpus(tmp_path, **TINY, num_jobs=2)["reused"]
    assert (root / CONTEXT_PART / MARKER).stat().st_mtime_ns == marker
    # sets made before the dev part (their test markers at version 1): test is kept as it
    # is, the dev part made beside it
    for part in (DEV_CONTEXT_PART, DEV_PLAIN_PART):
        shutil.rmtree(root / part)
    assert json.loads((root / CONTEXT_PART / MARKER).read_text())["params"]["version"] == 1
    again = make_context_sets(tmp_path, seed=2, occurring=3, distractors=2, num_jobs=2)
    assert not again["reused"] and again["parts"] == summary["parts"]
    assert (root / CONTEXT_PART / MARKER).stat().st_mtime_ns == marker
    assert (root / DEV_CONTEXT_PART / MARKER).is_file()
    # a corpus made with other parameters removes the sets made from its training text
    make_demo_corpus(tmp_path, **{**TINY, "seed": 4}, num_jobs=2)
    for part in (CONTEXT_PART, PLAIN_PART, DEV_CONTEXT_PART, DEV_PLAIN_PART):
        assert not (root / part).exists()

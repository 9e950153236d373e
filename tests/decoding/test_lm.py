"""The token n-gram estimator (interpolated modified Kneser-Ney), ARPA out and in, and
asr-train-lm. Expected probabilities come from the formulas, worked by hand or by a
direct, independent evaluation over the sentences below, or from the first estimator (plain
Python dictionaries, tests/decoding/kneser_ney_reference.py), never from the estimator
itself."""

import gzip
import itertools
import math
import random

import numpy as np
import pytest

from asr.data.tokenizer import train_tokenizer
from asr.decoding.kneser_ney import (
    FALLBACK_DISCOUNTS,
    KneserNeyCounter,
    _decimals,
    main,
    train_kneser_ney,
)
from asr.decoding.lm import BOS, EOS, UNK, NgramLM, read_arpa, write_arpa
from tests.decoding.kneser_ney_reference import reference_kneser_ney


def test_bigram_worked_by_hand(tmp_path) -> None:
    # <s> a b </s> and <s> a </s>. Bigram raw counts: <s>a 2, ab 1, a</s> 1, b</s> 1;
    # unigram continuation counts: a 1 (<s>), b 1 (a), </s> 2 (a, b), <unk> 0.
    # Both orders' count-of-counts have n3 = 0: KenLM's fallback discounts 0.5, 1, 1.5.
    # Unigrams: S = 4, gamma = (0.5 + 0.5 + 1) / 4 = 0.5, uniform over 4 tokens:
    #   p(a) = p(b) = 0.5/4 + 0.5/4 = 0.25, p(</s>) = 1/4 + 0.125 = 0.375, p(<unk>) = 0.125.
    # After <s>: S = 2, gamma = 1/2: p(a|<s>) = 1/2 + 0.5 * 0.25 = 0.625.
    # After a: S = 2, gamma = 0.5: p(b|a) = 0.25 + 0.5 * 0.25 = 0.375,
    #   p(</s>|a) = 0.25 + 0.5 * 0.375 = 0.4375, p(<unk>|a) = 0.5 * 0.125.
    # After b: S = 1, gamma = 0.5: p(</s>|b) = 0.5 + 0.5 * 0.375 = 0.6875.
    lm = train_kneser_ney([["a", "b"], ["a"]], order=2)
    expected = {
        ((), "a"): 0.25,
        ((), "b"): 0.25,
        ((), EOS): 0.375,
        ((), UNK): 0.125,
        ((BOS,), "a"): 0.625,
        ((BOS,), "b"): 0.5 * 0.25,
        (("a",), "b"): 0.375,
        (("a",), EOS): 0.4375,
        (("a",), UNK): 0.0625,
        (("b",), EOS): 0.6875,
        (("b",), "a"): 0.5 * 0.25,
    }
    for (context, token), p in expected.items():
        assert lm.log10_prob(context, token) == pytest.approx(math.log10(p), abs=1e-12)
    assert lm.logprobs[0][(BOS,)] == -99
    assert lm.backoffs[0][("a",)] == pytest.approx(math.log10(0.5))
    write_arpa(lm, tmp_path / "lm.arpa")
    text = (tmp_path / "lm.arpa").read_text()
    assert "ngram 1=5\nngram 2=4\n" in text and "-99\t<s>\t" in text and text.endswith("\\end\\\n")


def _sentences(seed: int = 9) -> list[list[str]]:
    rng = random.Random(seed)
    tokens = "abcdefghijkl"
    return [
        [rng.choice(tokens[: rng.randint(2, 12)]) for _ in range(rng.randint(1, 6))]
        for _ in range(25)
    ]


def _reference(sentences: list[list[str]], order: int):
    """p(w | h) of interpolated modified Kneser-Ney, straight from the definitions:
    every count is found by scanning the padded sentences."""
    padded = [(BOS, *s, EOS) for s in sentences]

    def occurrences(gram):
        k = len(gram)
        return [(p, i) for p in padded for i in range(len(p) - k + 1) if p[i : i + k] == gram]

    def adjusted(gram):
        found = occurrences(gram)
        if len(gram) == order or gram[0] == BOS:
            return len(found)
        return len({p[i - 1] for p, i in found if i > 0})

    vocab = sorted({t for s in sentences for t in s} | {EOS, UNK})
    grams = {
        k: {p[i : i + k] for p in padded for i in range(len(p) - k + 1)} - {(BOS,)}
        for k in range(1, order + 1)
    }
    discounts = {}
    for k in range(1, order + 1):
        n = [sum(adjusted(g) == r for g in grams[k]) for r in range(5)]
        y = n[1] / (n[1] + 2 * n[2])
        discounts[k] = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
        assert all(0 < d <= r for r, d in enumerate(discounts[k], 1)), "fallback: pick a seed"

    def prob(history, word):
        k = len(history) + 1
        lower = 1 / len(vocab) if k == 1 else prob(history[1:], word)
        counts = {v: adjusted((*history, v)) for v in vocab}
        total = sum(counts.values())
        if total == 0:
            return lower
        d = discounts[k]
        gamma = sum(d[min(c, 3) - 1] for c in counts.values() if c) / total
        a = counts[word]
        return (a - d[min(a, 3) - 1] if a else 0) / total + gamma * lower

    return vocab, grams, prob


@pytest.mark.parametrize("order", [2, 3])
def test_matches_the_formulas_and_sums_to_one(order: int) -> None:
    sentences = _sentences()
    lm = train_kneser_ney(sentences, order)
    vocab, grams, prob = _reference(sentences, order)
    contexts = {()} | {g[: order - 1] for g in grams[order]} | {("l", "a")[: order - 1]}
    contexts |= {(BOS,)} | {tuple(c) for c in itertools.product("ab", repeat=order - 1)}
    for context in contexts:
        ps = [10 ** lm.log10_prob(context, w) for w in vocab]
        assert sum(ps) == pytest.approx(1.0, abs=1e-6), context
        for w, p in zip(vocab, ps, strict=True):
            assert p == pytest.approx(prob(context, w), rel=1e-9), (context, w)


@pytest.mark.parametrize("name", ["lm.arpa", "lm.arpa.gz"])
def test_arpa_round_trip(tmp_path, name: str) -> None:
    lm = train_kneser_ney(_sentences(), 3)
    write_arpa(lm, tmp_path / name)
    back = read_arpa(tmp_path / name)
    assert back.order == 3 and back.counts() == lm.counts()
    for k in range(3):
        assert back.logprobs[k].keys() == lm.logprobs[k].keys()
        for gram, logp in lm.logprobs[k].items():
            assert back.logprobs[k][gram] == pytest.approx(logp, abs=1e-5)
        for gram, bow in lm.backoffs[k].items():
            assert back.backoffs[k][gram] == pytest.approx(bow, abs=1e-5)


def _zipf_text(tokens: int = 4000, vocabulary: int = 30, seed: int = 1) -> list[list[int]]:
    """Sentences of 1-15 ids drawn with p(rank r) ~ 1 / r**2.5: rare ids for the low orders'
    count-of-counts, repeats for the high orders'."""
    rng = random.Random(seed)
    weights = [1 / (r + 1) ** 2.5 for r in range(vocabulary)]
    sentences: list[list[int]] = []
    while sum(map(len, sentences)) < tokens:
        sentences.append(rng.choices(range(vocabulary), weights, k=rng.randint(1, 15)))
    return sentences


def _assert_same_model(lm: NgramLM, reference: NgramLM) -> None:
    assert lm.order == reference.order and lm.counts() == reference.counts()
    for k in range(lm.order):
        assert lm.logprobs[k].keys() == reference.logprobs[k].keys()
        assert lm.backoffs[k].keys() == reference.backoffs[k].keys()
        for gram, logp in reference.logprobs[k].items():
            assert abs(lm.logprobs[k][gram] - logp) <= 1e-9, gram
        for gram, bow in reference.backoffs[k].items():
            assert abs(lm.backoffs[k][gram] - bow) <= 1e-9, gram
    for mine, theirs in zip(lm.discounts, reference.discounts, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-12)


def _name(i: int) -> str:
    return f"w{i}"


@pytest.mark.parametrize("order", [2, 3, 4, 5, 6])
def test_equals_the_dictionary_estimator_on_a_tiny_text(order: int) -> None:
    for sentences in ([["a", "b"], ["a"]], _sentences(), [[], ["a"], ["a", "a", "a"]]):
        _assert_same_model(
            train_kneser_ney(sentences, order), reference_kneser_ney(sentences, order)
        )


@pytest.mark.parametrize("order", [2, 3, 4, 5, 6])
def test_equals_the_dictionary_estimator_on_a_random_text(order: int) -> None:
    sentences = _zipf_text()
    reference = reference_kneser_ney(sentences, order, _name)
    assert FALLBACK_DISCOUNTS not in reference.discounts  # discounts from count-of-counts
    _assert_same_model(train_kneser_ney(sentences, order, _name), reference)
    # Counted in chunks of about 300 tokens, whose tables are merged.
    counter = KneserNeyCounter(order, _name, chunk_tokens=300)
    for sentence in sentences:
        counter.add(sentence)
    _assert_same_model(counter.estimate(), reference)


def test_equals_the_dictionary_estimator_with_wide_ids() -> None:
    # 2000 ids take 11 bits: a 6-gram spans two 64-bit words. The ids arrive over the chunks,
    # so the tables are repacked as the bits grow (8, 9, 10, 11).
    rng = random.Random(4)
    sentences = [
        [rng.randrange(100 * (1 + i // 40)) for _ in range(rng.randint(0, 12))] for i in range(800)
    ]
    counter = KneserNeyCounter(6, _name, chunk_tokens=500)
    for sentence in sentences:
        counter.add(sentence)
    tables = counter.estimate_tables()
    assert tables.bits == 11 and tables.keys[5].shape[1] == 2
    _assert_same_model(tables.to_ngram_lm(), reference_kneser_ney(sentences, 6, _name))


@pytest.mark.parametrize("chunk_tokens", [3, 1000])
def test_equals_the_dictionary_estimator_whatever_the_tokens(chunk_tokens: int) -> None:
    # Ids (a table lookup below 2**24, np.unique above), negative ints and strings (a
    # dictionary); the same name is the same token whichever way it came.
    sentences = [[1, 2, 3], ["1", "x"], [2**40, 5, 1], [-3, 1], [], [np.int64(7), 1, 2]] * 3
    for order in (2, 3, 4):
        counter = KneserNeyCounter(order, chunk_tokens=chunk_tokens)
        for sentence in sentences:
            counter.add(sentence)
        _assert_same_model(counter.estimate(), reference_kneser_ney(sentences, order))


@pytest.mark.parametrize("name", ["lm.arpa", "lm.arpa.gz"])
def test_tables_write_the_same_arpa(tmp_path, name: str) -> None:
    counter = KneserNeyCounter(4, _name)
    for sentence in _zipf_text(tokens=1500):
        counter.add(sentence)
    tables = counter.estimate_tables()
    lm = tables.to_ngram_lm()
    written = []
    tables.write_arpa(tmp_path / name, written.append)
    assert sum(written) == sum(tables.counts())
    back = read_arpa(tmp_path / name)
    assert back.order == 4 and back.counts() == lm.counts()
    for k in range(4):
        assert back.logprobs[k].keys() == lm.logprobs[k].keys()
        assert back.backoffs[k].keys() == lm.backoffs[k].keys()
        for gram, logp in lm.logprobs[k].items():
            assert back.logprobs[k][gram] == pytest.approx(logp, abs=5.1e-7)
        for gram, bow in lm.backoffs[k].items():
            assert back.backoffs[k][gram] == pytest.approx(bow, abs=5.1e-7)
    if name == "lm.arpa":
        text = (tmp_path / name).read_text()
        assert text.startswith("\\data\\\nngram 1=") and text.endswith("\n\\end\\\n")
        assert "\n-99\t<s>\t-" in text


def test_arpa_numbers() -> None:
    values = np.array([-0.30103, -12.5, -1e-7, 0.0, -99.0, -0.0000016, 0.25, -100.000001])
    written = [item.tobytes().replace(b"\0", b"").decode() for item in _decimals(values)]
    assert written == ["-0.30103", "-12.5", "0", "0", "-99", "-0.000002", "0.25", "-100.000001"]


@pytest.mark.parametrize("token", ["<s>", "</s>", "a b", ""])
def test_refuses_token_names_an_arpa_file_cannot_hold(token: str) -> None:
    counter = KneserNeyCounter(3)
    with pytest.raises(ValueError, match="is named"):
        counter.add(["a", token])
    assert counter.sentences == 0


KENLM_STYLE = """\\data\\
ngram 1=4
ngram 2=2

\\1-grams:
-1.0\t<unk>\t0
0\t<s>\t-0.30103
-0.30103\t▁A
-0.5\t</s>

\\2-grams:
-0.1\t<s> ▁A
-0.2\t▁A </s>

\\end\\
"""


def test_reads_a_kenlm_style_file(tmp_path) -> None:
    path = tmp_path / "kenlm.arpa.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(KENLM_STYLE)
    lm = read_arpa(path)
    assert isinstance(lm, NgramLM) and lm.counts() == [4, 2]
    assert lm.log10_prob([BOS], "▁A") == -0.1
    assert lm.log10_prob([BOS], EOS) == pytest.approx(-0.30103 - 0.5)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("\\end\\\n", ""), "missing \\end\\"),
        (lambda t: t.replace("-0.1\t", "x\t"), ":12: bad number"),
        (lambda t: t.replace("ngram 2=2", "ngram 2=3"), "declares 3 2-grams, the file has 2"),
    ],
)
def test_malformed_arpa_names_file_and_line(tmp_path, edit, message: str) -> None:
    path = tmp_path / "bad.arpa"
    path.write_text(edit(KENLM_STYLE))
    with pytest.raises(ValueError, match=str(path)) as err:
        read_arpa(path)
    assert message in str(err.value)


def test_train_lm_command(tmp_path, capsys) -> None:
    text = tmp_path / "text.txt.gz"
    lines = ["THE CAT SAT ON THE MAT", "A DOG SAT", "", "THE DOG RAN TO THE CAT"] * 5
    with gzip.open(text, "wt") as f:
        f.write("\n".join(lines) + "\n")
    model = tmp_path / "tok.model"
    tokenizer = train_tokenizer([line for line in lines if line], model, vocab_size=30)
    out = tmp_path / "lm.arpa"
    main([str(text), "--tokenizer", str(model), "--order", "3", "-o", str(out)])
    printed = capsys.readouterr().out
    lm = read_arpa(out)
    assert lm.order == 3
    for k, count in enumerate(lm.counts(), start=1):
        assert f"{k}-grams: {count}" in printed
    pieces = {tokenizer.id_to_piece(i) for line in lines for i in tokenizer.encode(line)}
    assert pieces | {BOS, EOS, UNK} == set(lm.vocabulary())
    assert "15 sentences" in printed


def test_train_lm_command_bad_input(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.txt"), "--tokenizer", "x.model", "-o", str(tmp_path / "o")])
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.txt"), "--tokenizer", "x", "--order", "7", "-o", "o"])


def test_train_lm_reads_manifests_and_the_first_lines(tmp_path, capsys) -> None:
    """Lhotse supervision and cut manifests give their supervisions' text (the LODR bigram of
    a model's training transcripts), the same model as the text itself; --max-lines reads
    the first N sentences of the inputs in order; the ARPA file appears whole or not at all;
    a recordings manifest (no text) is one line naming the file and line."""
    import json

    from lhotse import MonoCut, SupervisionSegment

    lines = ["THE CAT SAT ON THE MAT", "A DOG SAT", "THE DOG RAN TO THE CAT", "A CAT RAN"] * 3
    text = tmp_path / "text.txt"
    text.write_text("\n".join(lines) + "\n")
    model = tmp_path / "tok.model"
    train_tokenizer(lines, model, vocab_size=30)
    sups = [
        SupervisionSegment(id=f"u{i}", recording_id=f"u{i}", start=0, duration=1, text=line)
        for i, line in enumerate(lines)
    ]
    supervisions = tmp_path / "librispeech_supervisions_train.jsonl.gz"
    with gzip.open(supervisions, "wt") as f:
        f.writelines(json.dumps(s.to_dict()) + "\n" for s in sups)
    cuts = tmp_path / "cuts.jsonl"  # two supervisions in one cut: joined by a space
    halves = [(s, lines[i].split(" ", 1)) for i, s in enumerate(sups)]
    with open(cuts, "w") as f:
        for s, words in halves:
            parts = [
                SupervisionSegment(f"{s.id}-{j}", s.id, j, 1, text=w) for j, w in enumerate(words)
            ]
            f.write(json.dumps(MonoCut(s.id, 0, 2, 0, supervisions=parts).to_dict()) + "\n")

    def train(*inputs, extra=()):
        out = tmp_path / "lm.arpa.gz"
        main([*map(str, inputs), "--tokenizer", str(model), "--order", "3", "-o", str(out), *extra])
        assert sorted(p.name for p in tmp_path.glob("*lm*")) == ["lm.arpa.gz"]  # no partial
        return read_arpa(out).logprobs, capsys.readouterr().out

    expected, _ = train(text)
    assert train(supervisions)[0] == expected
    assert train(cuts)[0] == expected
    first, printed = train(supervisions, text, extra=["--max-lines", "5"])
    assert "5 sentences" in printed
    with open(tmp_path / "first.txt", "w") as f:
        f.write("\n".join(lines[:5]) + "\n")
    assert first == train(tmp_path / "first.txt")[0]
    recordings = tmp_path / "recordings.jsonl"
    recordings.write_text('{"id": "u0", "sources": [], "sampling_rate": 16000}\n')
    with pytest.raises(SystemExit):
        train(recordings)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{recordings}:1: neither a supervision nor a cut" in err
    with pytest.raises(SystemExit):
        train(text, extra=["--max-lines", "0"])
    assert "--max-lines must be at least 1" in capsys.readouterr().err

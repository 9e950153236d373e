import jiwer
import pytest

from asr.metrics import ErrorCounts, cer, corpus_errors, word_errors

# (reference, hypothesis, (substitutions, deletions, insertions, reference words))
PAIRS = [
    ("THE CAT SAT", "THE CAT SAT", (0, 0, 0, 3)),
    ("A B C D", "A X C", (1, 1, 0, 4)),
    ("THE CAT SAT", "THE CAT SAT ON IT", (0, 0, 2, 3)),
    ("A B C", "C B A", (2, 0, 0, 3)),
    ("A B", "", (0, 2, 0, 2)),
    ("ONE TWO THREE FOUR", "ONE TOO THREE", (1, 1, 0, 4)),
    ("X Y Z", "W X Y Z", (0, 0, 1, 3)),
    ("X Y Z", "  X   Y  Z ", (0, 0, 0, 3)),  # whitespace is not a word
    ("the cat", "THE CAT", (2, 0, 0, 2)),  # case-sensitive
]


@pytest.mark.parametrize(("ref", "hyp", "expected"), PAIRS)
def test_word_errors_exact_counts(ref: str, hyp: str, expected: tuple) -> None:
    counts = word_errors(ref, hyp)
    assert (counts.substitutions, counts.deletions, counts.insertions, counts.ref_words) == (
        expected
    )
    assert counts.errors == sum(expected[:3])


def test_empty_reference_counts_insertions_only() -> None:
    assert word_errors("", "X Y") == ErrorCounts(insertions=2)
    assert word_errors("  ", "") == ErrorCounts()
    assert ErrorCounts(insertions=2).wer == 0.0  # no reference words: defined as 0


def test_corpus_wer_equals_jiwer() -> None:
    refs = [ref for ref, _, _ in PAIRS]
    hyps = [hyp for _, hyp, _ in PAIRS]
    total = corpus_errors(refs, hyps)
    assert total == ErrorCounts(*(sum(expected[k] for _, _, expected in PAIRS) for k in range(4)))
    assert total.wer == pytest.approx(jiwer.wer(refs, [" ".join(h.split()) for h in hyps]))
    assert total.wer == pytest.approx(13 / 27)


def test_counts_add_up() -> None:
    a, b = ErrorCounts(1, 2, 3, 10), ErrorCounts(4, 0, 1, 5)
    assert a + b == ErrorCounts(5, 2, 4, 15)
    assert (a + b).wer == pytest.approx(11 / 15)


def test_corpus_errors_needs_pairs() -> None:
    with pytest.raises(ValueError, match="2 references but 1 hypotheses"):
        corpus_errors(["A", "B"], ["A"])


def test_cer_equals_jiwer() -> None:
    refs, hyps = ["ABC DE", "HELLO"], ["ABD DE", "HELO"]
    assert cer(refs, hyps) == pytest.approx(jiwer.cer(refs, hyps))
    assert cer(refs, hyps) == pytest.approx(2 / 11)

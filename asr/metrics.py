"""Word and character error rates through jiwer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jiwer


@dataclass
class ErrorCounts:
    """Substitutions, deletions, insertions and reference words, summable across batches."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_words: int = 0

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """Word error rate as a fraction (0.05 = 5 %); 0 for an empty reference."""
        return self.errors / self.ref_words if self.ref_words else 0.0

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.ref_words + other.ref_words,
        )


def word_errors(reference: str, hypothesis: str) -> ErrorCounts:
    """Errors of one utterance (whitespace-tokenized words, case-sensitive)."""
    ref = reference.split()
    if not ref:
        return ErrorCounts(insertions=len(hypothesis.split()))
    out = jiwer.process_words(" ".join(ref), " ".join(hypothesis.split()) or "")
    return ErrorCounts(out.substitutions, out.deletions, out.insertions, len(ref))


def corpus_errors(references: Sequence[str], hypotheses: Sequence[str]) -> ErrorCounts:
    """Summed errors over utterance pairs."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    total = ErrorCounts()
    for ref, hyp in zip(references, hypotheses, strict=True):
        total = total + word_errors(ref, hyp)
    return total


def cer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Character error rate over the corpus."""
    return float(jiwer.cer(list(references), list(hypotheses)))

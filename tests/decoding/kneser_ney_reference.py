"""The first estimator of `asr.decoding.kneser_ney` (then in `asr.decoding.lm`, commit
b057e74), plain Python dictionaries like icefall's ``shared/make_kn_lm.py``: kept only as
the reference that the numpy estimator must equal (tests/decoding/test_lm.py). Unchanged
but for its imports and names."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from asr.decoding.kneser_ney import FALLBACK_DISCOUNTS
from asr.decoding.lm import BOS, EOS, NO_PROB, UNK, Ngram, NgramLM


def reference_discounts(adjusted: Iterable[int]) -> tuple[float, float, float]:
    n = [0, 0, 0, 0, 0]
    for a in adjusted:
        if a <= 4:
            n[a] += 1
    try:
        y = n[1] / (n[1] + 2 * n[2])
        d = (1 - 2 * y * n[2] / n[1], 2 - 3 * y * n[3] / n[2], 3 - 4 * y * n[4] / n[3])
    except ZeroDivisionError:
        d = None
    if d is None or not all(0 < di <= r for r, di in enumerate(d, start=1)):
        return FALLBACK_DISCOUNTS
    return d  # type: ignore[return-value]


class ReferenceCounter:
    """Counts a text's n-grams one sentence at a time; `estimate` builds the model."""

    def __init__(self, order: int, token_name: Callable[[int], str] = str) -> None:
        self.order = order
        self.token_name = token_name
        self.top: dict[Ngram, int] = defaultdict(int)  # raw counts of N-grams
        self.starts: dict[Ngram, int] = defaultdict(int)  # raw counts of shorter <s> n-grams
        self.sentences = 0
        self.tokens = 0

    def add(self, sentence: Sequence[int] | Sequence[str]) -> None:
        words = (BOS, *(self.token_name(t) for t in sentence), EOS)
        n = self.order
        for k in range(1, min(n, len(words) + 1)):
            self.starts[words[:k]] += 1
        for i in range(len(words) - n + 1):
            self.top[words[i : i + n]] += 1
        self.sentences += 1
        self.tokens += len(sentence) + 1

    def estimate(self) -> NgramLM:
        n = self.order
        adjusted: list[dict[Ngram, int]] = [{} for _ in range(n)]
        adjusted[n - 1] = dict(self.top)
        for gram, count in self.starts.items():
            adjusted[len(gram) - 1][gram] = count
        for k in range(n - 1, 0, -1):  # k-grams from the (k+1)-grams they end
            lower = adjusted[k - 1]
            for gram in adjusted[k]:
                suffix = gram[1:]
                if suffix[0] != BOS:
                    lower[suffix] = lower.get(suffix, 0) + 1
        unigrams = adjusted[0]
        unigrams.pop((BOS,), None)  # never predicted
        unigrams.setdefault((UNK,), 0)

        logprobs: list[dict[Ngram, float]] = []
        backoffs: list[dict[Ngram, float]] = [{} for _ in range(n)]
        discounts = []
        probs_below: dict[Ngram, float] = {}
        for k in range(1, n + 1):
            table = adjusted[k - 1]
            d = reference_discounts(table.values())
            discounts.append(d)
            total: dict[Ngram, int] = defaultdict(int)
            taken: dict[Ngram, float] = defaultdict(float)
            for gram, a in table.items():
                total[gram[:-1]] += a
                if a:
                    taken[gram[:-1]] += d[min(a, 3) - 1]
            gamma = {h: taken[h] / s for h, s in total.items()}
            probs: dict[Ngram, float] = {}
            for gram, a in table.items():
                h = gram[:-1]
                lower = probs_below[gram[1:]] if k > 1 else 1.0 / len(table)
                discounted = (a - d[min(a, 3) - 1]) / total[h] if a else 0.0
                probs[gram] = discounted + gamma[h] * lower
            if k > 1:
                backoffs[k - 2] = {h: math.log10(g) for h, g in gamma.items()}
            logprobs.append({g: math.log10(p) for g, p in probs.items()})
            probs_below = probs
        logprobs[0][(BOS,)] = NO_PROB
        return NgramLM(order=n, logprobs=logprobs, backoffs=backoffs, discounts=discounts)


def reference_kneser_ney(
    sentences: Iterable[Sequence[int] | Sequence[str]],
    order: int,
    token_name: Callable[[int], str] = str,
) -> NgramLM:
    counter = ReferenceCounter(order, token_name)
    for sentence in sentences:
        counter.add(sentence)
    return counter.estimate()

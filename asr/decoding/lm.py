"""Token n-gram language models in ARPA, KenLM's format: the model (`NgramLM`, a back-off
n-gram over token pieces) and ARPA out and in (plain or gzipped), so that a KenLM ``lmplz``
model over the same pieces loads too. `asr.decoding.kneser_ney` estimates one from text
(``asr-train-lm``); `asr.decoding.fusion` turns one into the tensors the searches step.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
NO_PROB = -99.0  # log10 probability written for <s>, which is never predicted

Ngram = tuple[str, ...]


@dataclass
class NgramLM:
    """A back-off n-gram model: ``logprobs[k - 1][g]`` is the log10 probability of the last
    token of the k-gram ``g`` after its first k - 1; ``backoffs[k - 1][g]`` is the log10
    back-off weight of ``g`` as a context (absent: 0). Tokens are pieces (strings)."""

    order: int
    logprobs: list[dict[Ngram, float]]
    backoffs: list[dict[Ngram, float]]
    discounts: list[tuple[float, float, float]] = field(default_factory=list)

    def counts(self) -> list[int]:
        """The number of n-grams of each order, 1..order."""
        return [len(table) for table in self.logprobs]

    def vocabulary(self) -> list[str]:
        """Every token with a unigram (``<s>`` included)."""
        return [g[0] for g in self.logprobs[0]]

    def log10_prob(self, context: Sequence[str], token: str) -> float:
        """log10 p(token | context) by the back-off rule; only the last order - 1 tokens of
        the context count."""
        keep = max(len(context) - (self.order - 1), 0)  # the last order - 1 tokens
        context = tuple(context)[keep:] if self.order > 1 else ()
        total = 0.0
        while True:
            gram = context + (token,)
            found = self.logprobs[len(gram) - 1].get(gram)
            if found is not None:
                return total + found
            if not context:
                unk = self.logprobs[0].get((UNK,))
                if unk is None:
                    raise KeyError(f"token {token!r} is not in the LM and it has no {UNK}")
                return total + unk
            total += self.backoffs[len(context) - 1].get(context, 0.0)
            context = context[1:]


def _open_text(path: Path, mode: str):
    if mode == "r":
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
    else:
        gzipped = path.suffix == ".gz"
    return (
        gzip.open(path, mode + "t", encoding="utf-8")
        if gzipped
        else open(path, mode, encoding="utf-8")
    )


def _number(value: float) -> str:
    return f"{value:.6g}"


def write_arpa(lm: NgramLM, path: str | Path) -> None:
    """Write `lm` as an ARPA file (gzipped when `path` ends in ``.gz``)."""
    path = Path(path)
    with _open_text(path, "w") as f:
        f.write("\\data\\\n")
        for k, count in enumerate(lm.counts(), start=1):
            f.write(f"ngram {k}={count}\n")
        for k in range(1, lm.order + 1):
            f.write(f"\n\\{k}-grams:\n")
            bows = lm.backoffs[k - 1]
            for gram, logp in lm.logprobs[k - 1].items():
                line = f"{_number(logp)}\t{' '.join(gram)}"
                if gram in bows:
                    line += f"\t{_number(bows[gram])}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")


def read_arpa(path: str | Path) -> NgramLM:
    """Read an ARPA file (plain or gzipped), such as `write_arpa`'s or KenLM ``lmplz``'s.
    A malformed file raises ValueError naming the file and line."""
    path = Path(path)
    declared: list[int] = []
    logprobs: list[dict[Ngram, float]] = []
    backoffs: list[dict[Ngram, float]] = []
    section = None  # None: before \data\; 0: in \data\; k: in \k-grams:
    ended = False
    lineno = 0

    def fault(message: str) -> ValueError:
        return ValueError(f"{path}:{lineno}: {message}")

    with _open_text(path, "r") as f:
        for lineno, raw in enumerate(f, start=1):  # noqa: B007 (fault reads it)
            line = raw.strip()
            if not line or ended:
                continue
            if line == "\\data\\":
                section = 0
                continue
            if line == "\\end\\":
                ended = True
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                try:
                    k = int(line[1 : -len("-grams:")])
                except ValueError:
                    raise fault(f"bad section header {line!r}") from None
                if k != len(logprobs) + 1 or k > len(declared):
                    raise fault(f"unexpected section {line!r}")
                section = k
                logprobs.append({})
                backoffs.append({})
                continue
            if section is None:
                continue  # text before \data\ is allowed (lmplz writes none)
            if section == 0:
                key, _, value = line.partition("=")
                if not key.startswith("ngram ") or not value.strip().isdigit():
                    raise fault(f"expected 'ngram K=COUNT', found {line!r}")
                declared.append(int(value))
                continue
            fields = line.split()
            k = section
            if len(fields) not in (k + 1, k + 2):
                raise fault(f"expected a log10 probability, {k} tokens and a back-off")
            try:
                logp = float(fields[0])
                bow = float(fields[k + 1]) if len(fields) == k + 2 else None
            except ValueError:
                raise fault(f"bad number in {line!r}") from None
            if not math.isfinite(logp) or (bow is not None and not math.isfinite(bow)):
                raise fault(f"non-finite number in {line!r}")
            gram = tuple(fields[1 : k + 1])
            logprobs[k - 1][gram] = logp
            if bow is not None:
                backoffs[k - 1][gram] = bow
    if not declared:
        raise ValueError(f"{path}: no \\data\\ section: not an ARPA file")
    if not ended:
        raise ValueError(f"{path}:{lineno}: missing \\end\\ (a truncated file?)")
    for k, count in enumerate(declared, start=1):
        found = len(logprobs[k - 1]) if k <= len(logprobs) else 0
        if found != count:
            raise ValueError(f"{path}: \\data\\ declares {count} {k}-grams, the file has {found}")
    return NgramLM(order=len(declared), logprobs=logprobs, backoffs=backoffs)

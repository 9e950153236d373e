"""Token n-gram language models: an interpolated modified Kneser-Ney estimator over a
tokenizer's ids, and ARPA out and in (plain or gzipped), so that a KenLM ``lmplz`` model
over the same pieces loads too.

Why written here: no well-kept package estimates modified Kneser-Ney into ARPA and installs
from PyPI. PyPI's ``kenlm`` (0.3.0) is KenLM's query module only; its estimator ``lmplz``
is a C++ program built with CMake and Boost. NLTK's ``KneserNeyInterpolated`` (3.10) has a
single discount and writes no ARPA. SRILM is not on PyPI, and Debian packages IRSTLM, not
KenLM. The estimator below is plain Python dictionaries, like icefall's
``shared/make_kn_lm.py``.

The model (Chen & Goodman 1998, as KenLM's ``lmplz`` and SRILM's ``-interpolate
-kndiscount`` build it), for an order-N model over sentences ``<s> w1 .. wn </s>``:

- adjusted counts ``a(g)``: the raw count for an N-gram and for an n-gram that starts with
  ``<s>`` (nothing can precede it); otherwise the continuation count, the number of distinct
  tokens ``v`` with ``v g`` seen.
- three discounts per order k from its count-of-counts n1..n4 of adjusted counts:
  ``Y = n1 / (n1 + 2 n2)``, ``D1 = 1 - 2Y n2/n1``, ``D2 = 2 - 3Y n3/n2``,
  ``D3+ = 3 - 4Y n4/n3``. Where a count-of-counts is 0 or a discount leaves ``(0, r]``
  (tiny texts), the order takes KenLM's ``--discount_fallback`` values 0.5, 1, 1.5.
- ``p(w | h) = (a(hw) - D(a(hw))) / S(h) + gamma(h) p(w | h')``, with ``S(h)`` the sum of
  ``a(hv)`` over v, ``gamma(h) = (D1 N1(h) + D2 N2(h) + D3+ N3+(h)) / S(h)`` (``Nr(h)`` the
  number of v with ``a(hv) = r``, or ``>= 3``) and ``h'`` is ``h`` without its first token.
  The unigrams interpolate with the uniform distribution over the vocabulary: every token
  seen, ``</s>`` and ``<unk>`` (which gets only that share), as ``lmplz`` does.

The ARPA file holds these interpolated probabilities with ``gamma(h)`` as ``h``'s back-off
weight, so the usual back-off query ``p(w | h) = bow(h) p(w | h')`` for an unseen ``h w``
gives the interpolated model exactly. ``<s>`` has no probability of its own (-99, as
KenLM writes). Tokens are written as the tokenizer's pieces (``▁THE``, ``S``), as a KenLM
user who ran ``lmplz`` over ``spm_encode --output_format=piece`` text would have them;
without a tokenizer, as decimal ids.

Memory: the text is read one sentence at a time; what grows is one dictionary entry per
distinct n-gram (a tuple key and a count, then a probability and a back-off weight). The
peak is about 400 bytes per distinct n-gram in CPython (tracemalloc, a random 4-gram text
of 750 k n-grams, December 2026): about 2.5 million distinct n-grams per GiB. A 6-gram of
10 M tokens of varied text can hold about 40 M distinct n-grams (about 16 GiB); counting
in numpy arrays is the way past that bound.
"""

from __future__ import annotations

import gzip
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asr.cli import command

log = logging.getLogger(__name__)

BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"
NO_PROB = -99.0  # log10 probability written for <s>, which is never predicted
MIN_ORDER, MAX_ORDER = 2, 6
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM lmplz --discount_fallback

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
        context = tuple(context)[len(context) - (self.order - 1) :] if self.order > 1 else ()
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


def _discounts(adjusted: Iterable[int], order: int) -> tuple[float, float, float]:
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
        log.warning(
            "order %d: count-of-counts %s give no valid modified Kneser-Ney discounts "
            "(a small text); using %s",
            order,
            n[1:],
            FALLBACK_DISCOUNTS,
        )
        return FALLBACK_DISCOUNTS
    return d  # type: ignore[return-value]


class KneserNeyCounter:
    """Counts a text's n-grams one sentence at a time; `estimate` builds the model.

    Sentences are sequences of tokens (ids or pieces); `token_name` turns one into the
    string the model (and its ARPA file) holds.
    """

    def __init__(self, order: int, token_name: Callable[[int], str] = str) -> None:
        if not MIN_ORDER <= order <= MAX_ORDER:
            raise ValueError(f"n-gram order {order}: expected {MIN_ORDER} to {MAX_ORDER}")
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
        """The interpolated modified Kneser-Ney model of what was added (module docstring)."""
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
            d = _discounts(table.values(), k)
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


def train_kneser_ney(
    sentences: Iterable[Sequence[int] | Sequence[str]],
    order: int,
    token_name: Callable[[int], str] = str,
) -> NgramLM:
    """An interpolated modified Kneser-Ney model of `sentences` (see the module docstring)."""
    counter = KneserNeyCounter(order, token_name)
    for sentence in sentences:
        counter.add(sentence)
    return counter.estimate()


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


def _sentences_of(paths: Sequence[Path], advance: Callable[[int], None]):
    """Lines of plain or gzipped text files, stripped, empty ones skipped; `advance` gets
    the bytes of the files read so far (compressed bytes for gzip)."""
    for path in paths:
        raw = open(path, "rb")  # noqa: SIM115 (closed below, position read for progress)
        try:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
            done = 0
            for i, line in enumerate(stream):
                text = line.decode("utf-8").strip()
                if text:
                    yield text
                if i % 1000 == 0:
                    advance(raw.tell() - done)
                    done = raw.tell()
            advance(raw.tell() - done)
        finally:
            raw.close()


@command
def main(argv: list[str] | None = None) -> None:
    """`asr-train-lm TEXT... --tokenizer bpe.model --order N -o lm.arpa`: an interpolated
    modified Kneser-Ney n-gram over the tokenizer's pieces, one sentence per line."""
    import argparse

    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from asr.data.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "text", type=Path, nargs="+", help="text files, one sentence a line (plain or gzipped)"
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="the SentencePiece model")
    parser.add_argument("--order", type=int, default=3, help=f"{MIN_ORDER} to {MAX_ORDER}")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the ARPA file to write (gzipped if it ends in .gz)",
    )
    args = parser.parse_args(argv)
    for path in args.text:
        if not path.is_file():
            raise FileNotFoundError(f"text file not found: {path}")
    tokenizer = Tokenizer.load(args.tokenizer)
    counter = KneserNeyCounter(args.order, tokenizer.id_to_piece)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("counting", total=sum(p.stat().st_size for p in args.text))
        for text in _sentences_of(args.text, lambda n: progress.advance(task, n)):
            counter.add(tokenizer.encode(text))
    if counter.sentences == 0:
        raise ValueError(f"no sentences in {', '.join(map(str, args.text))}")
    lm = counter.estimate()
    write_arpa(lm, args.output)
    print(
        f"wrote {args.output}: order {lm.order}, {counter.sentences} sentences, "
        f"{counter.tokens} tokens (with </s>)"
    )
    for k, count in enumerate(lm.counts(), start=1):
        print(f"  {k}-grams: {count}")

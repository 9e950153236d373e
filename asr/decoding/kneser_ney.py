"""Token n-gram language models from text: an interpolated modified Kneser-Ney estimator
over a tokenizer's ids (`KneserNeyCounter`, `train_kneser_ney`) that writes ARPA
(`asr.decoding.lm`), and its command line, ``asr-train-lm``.

Why written here: no well-kept package estimates modified Kneser-Ney into ARPA and installs
from PyPI. PyPI's ``kenlm`` (0.3.0) is KenLM's query module only; its estimator ``lmplz``
is a C++ program built with CMake and Boost. NLTK's ``KneserNeyInterpolated`` (3.10) has a
single discount and writes no ARPA. SRILM is not on PyPI, and Debian packages IRSTLM, not
KenLM. Why numpy: the first estimator here was plain Python dictionaries, like icefall's
``shared/make_kn_lm.py``, at about 400 bytes per distinct n-gram; on 10 M tokens at order 6
(the benchmark below) it took 123 s and a 4.9 GB peak, this one 9-17 s and 0.37 GB. It
stays as the tests' reference (tests/decoding/kneser_ney_reference.py), which this one
equals to 1e-9 in every log10 probability and back-off weight.

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

How it counts: each token becomes a dense int id (``<s>`` 0, ``</s>`` 1, ``<unk>`` 2, then
the others as first seen), and a k-gram a row of uint64 words, ``64 // bits`` ids to a word
(one word for a 6-gram of up to 1024 ids, two or three for larger vocabularies), first id
highest, so that sorting the rows sorts the k-grams and puts each context's k-grams
together. Every ``CHUNK_TOKENS`` (2**20) tokens the buffered sentences' N-grams, and the
k-grams that start with ``<s>``, are sorted and counted (np.unique-like); the chunk tables
are merged into the running N-gram table (a stable sort of sorted runs: a linear merge)
once they hold a quarter of its rows, so the merging costs n log n. Estimation: the
(k-1)-grams are the distinct last k - 1 tokens of the k-grams (one sort, whose run lengths
are the continuation counts and whose ranks index each k-gram's suffix), plus the ``<s>``
ones, which sort first; the sums S(h), N1/N2/N3+(h) and gamma(h) are np.add.reduceat over
each context's adjacent rows; a k-gram's lower-order probability is read through its suffix
index; and the contexts of the k-grams are the (k-1)-grams not ending in ``</s>``, in the
same order, which carry gamma(h) as their back-off. The ARPA lines are formatted a block at
a time in numpy records of fixed-size fields (numbers to six decimals, from digit tables),
padded with NUL bytes that are dropped.

Memory (``scripts/benchmark_train_lm.py``: the peak resident set of ``asr-train-lm`` above
that of a one-sentence run, 43 MB; the demo's 128-piece tokenizer; a 2-core machine shared
with other work, December 2026): about 38 bytes per distinct n-gram for a 6-gram (10 M
tokens of synthetic text, 9.0 M distinct n-grams of orders 1-6: 369 MB peak, about 31 M
tokens per GiB), the model itself being 24 (a packed key, a log10 probability and a
back-off weight of 8 bytes each). The peak comes in estimation; counting holds 12 bytes per
distinct N-gram plus about 40 MB of working arrays for a chunk, which is what a 3-gram of the
same text, with only 0.44 M distinct n-grams, mostly spends (84 MB peak, 5 s). How many
tokens a GiB holds depends on how many distinct n-grams a token brings: 0.9 at order 6 on
that text, fewer at lower orders. Of the 6-gram's 9-17 s, reading and tokenizing take about
half; estimating about 2 s and writing the 320 MB ARPA file about 3 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import json
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asr.cli import command
from asr.decoding.lm import BOS, EOS, NO_PROB, UNK, Ngram, NgramLM

log = logging.getLogger(__name__)

MIN_ORDER, MAX_ORDER = 2, 6
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM lmplz --discount_fallback


# Packed n-grams. Tokens are the counter's own ids (0 <s>, 1 </s>, 2 <unk>, then each new
# token name in the order first seen), below 2**bits; a k-gram is a row of uint64 words
# holding 64 // bits tokens each, its first token in the highest bits of the first word, so
# that the rows' lexicographic order is the k-grams' (and a context's k-grams are adjacent).
BOS_ID, EOS_ID, UNK_ID = 0, 1, 2
CHUNK_TOKENS = 1 << 20  # tokens counted at once (sorted and reduced to a table)
_ARPA_BLOCK_BYTES = 1 << 24  # bytes of ARPA lines formatted at once
_CONTEXTS_AT_ONCE = 1 << 18  # contexts whose n-grams' probabilities are computed at once


def _bits_for(vocabulary: int) -> int:
    return max(1, (vocabulary - 1).bit_length())


def _place(bits: int, i: int) -> tuple[int, int]:
    """(word, shift) of token `i` of a packed row."""
    per_word = 64 // bits
    word, slot = divmod(i, per_word)
    return word, bits * (per_word - 1 - slot)


def _pack(column: Callable[[int], np.ndarray], k: int, rows: int, bits: int) -> np.ndarray:
    """(rows, words) uint64 keys of k-grams whose token i is `column(i)`."""
    keys = np.zeros((rows, -(-k // (64 // bits))), np.uint64)
    for i in range(k):
        word, shift = _place(bits, i)
        token = column(i).astype(np.uint64)
        token <<= np.uint64(shift)
        keys[:, word] |= token
    return keys


def _token(keys: np.ndarray, bits: int, i: int) -> np.ndarray:
    """Token `i` of each packed row (int32)."""
    word, shift = _place(bits, i)
    mask = np.uint64((1 << bits) - 1)
    return ((keys[:, word] >> np.uint64(shift)) & mask).astype(np.int32)


def _repack(keys: np.ndarray, bits: int, first: int, last: int, to_bits: int = 0) -> np.ndarray:
    """Keys of tokens first..last - 1 of each row (a suffix or a context), packed with
    `to_bits` (default: `bits`)."""
    return _pack(lambda i: _token(keys, bits, first + i), last - first, len(keys), to_bits or bits)


def _sort_order(keys: np.ndarray, merging: bool = False) -> np.ndarray:
    """The permutation that sorts the rows. `merging`: the rows are a few sorted runs, which
    a stable sort (timsort) merges in linear time."""
    if keys.shape[1] == 1:
        return np.argsort(keys[:, 0], kind="stable" if merging else None)
    return np.lexsort(keys.T[::-1])


def _changes(keys: np.ndarray) -> np.ndarray:
    """For sorted rows: True where a row differs from the one before (and at row 0)."""
    out = np.ones(len(keys), bool)
    if keys.ndim == 1:
        np.not_equal(keys[1:], keys[:-1], out=out[1:])
    elif keys.shape[1] == 1:
        np.not_equal(keys[1:, 0], keys[:-1, 0], out=out[1:])
    else:
        np.any(keys[1:] != keys[:-1], axis=1, out=out[1:])
    return out


Table = tuple[np.ndarray, np.ndarray]  # sorted distinct packed keys, their counts


def _count(keys: np.ndarray) -> Table:
    """The distinct rows of `keys` and how often each occurs."""
    keys = np.sort(keys[:, 0])[:, None] if keys.shape[1] == 1 else keys[_sort_order(keys)]
    first = np.flatnonzero(_changes(keys))
    return keys[first], np.diff(first, append=len(keys)).astype(np.int32)


def _merge(tables: list[Table]) -> Table:
    """One table of the sorted tables' keys, the counts of a key summed."""
    if len(tables) == 1:
        return tables[0]
    keys = np.concatenate([t[0] for t in tables])
    counts = np.concatenate([t[1] for t in tables])
    tables.clear()
    order = _sort_order(keys, merging=True)
    keys = keys[order]
    counts = counts[order]
    del order
    first = np.flatnonzero(_changes(keys))
    counts = np.add.reduceat(counts, first)
    return keys[first], counts


def _index_dtype(rows: int) -> type:
    return np.int32 if rows < 2**31 else np.int64


def _discounts(count_of_counts: np.ndarray, order: int) -> tuple[float, float, float]:
    """D1, D2, D3+ from n1..n4 (`count_of_counts[r]` = nr), or the fallback."""
    n = [int(x) for x in count_of_counts[:5]]
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


def _count_of_counts(adjusted: np.ndarray) -> np.ndarray:
    return np.bincount(np.minimum(adjusted, 5), minlength=6)


@dataclass
class NgramTables:
    """An estimated model as arrays, as `KneserNeyCounter.estimate_tables` builds it:
    ``keys[k - 1]`` the sorted packed k-grams (``names`` spells their tokens),
    ``logprobs[k - 1]`` their log10 probabilities, ``backoffs[k - 1]`` their log10 back-off
    weights (NaN: not a context; None for the highest order). `to_ngram_lm` gives the
    dictionary form; `write_arpa` writes the ARPA file without it."""

    order: int
    names: list[str]
    bits: int
    keys: list[np.ndarray]
    logprobs: list[np.ndarray]
    backoffs: list[np.ndarray | None]
    discounts: list[tuple[float, float, float]]

    def counts(self) -> list[int]:
        """The number of n-grams of each order, 1..order."""
        return [len(keys) for keys in self.keys]

    def tokens(self, k: int, rows: slice = slice(None)) -> list[np.ndarray]:
        """The ids of the k-grams' tokens (of `rows`), one array per position."""
        keys = self.keys[k - 1][rows]
        return [_token(keys, self.bits, i) for i in range(k)]

    def to_ngram_lm(self) -> NgramLM:
        """The model as `NgramLM`: Python dictionaries, for small models and tests."""
        names = np.array(self.names, dtype=object)
        logprobs: list[dict[Ngram, float]] = []
        backoffs: list[dict[Ngram, float]] = []
        for k in range(1, self.order + 1):
            grams = list(zip(*(names[col].tolist() for col in self.tokens(k)), strict=True))
            logprobs.append(dict(zip(grams, self.logprobs[k - 1].tolist(), strict=True)))
            bows = self.backoffs[k - 1]
            held = [] if bows is None else np.flatnonzero(~np.isnan(bows)).tolist()
            backoffs.append({grams[i]: float(bows[i]) for i in held})  # type: ignore[index]
        return NgramLM(self.order, logprobs, backoffs, list(self.discounts))

    def write_arpa(self, path: str | Path, advance: Callable[[int], None] | None = None) -> None:
        """Write the model as an ARPA file (gzipped when `path` ends in ``.gz``), lines
        formatted a block at a time in numpy; `advance` gets the n-grams written so far.
        Numbers have at most six decimals (``-0.30103``, ``-99``)."""
        path = Path(path)
        spellings = _spellings(self.names)
        gzipped = path.suffix == ".gz"
        with gzip.open(path, "wb", compresslevel=6) if gzipped else open(path, "wb") as f:
            f.write(b"\\data\\\n")
            for k, count in enumerate(self.counts(), start=1):
                f.write(f"ngram {k}={count}\n".encode())
            for k in range(1, self.order + 1):
                f.write(f"\n\\{k}-grams:\n".encode())
                rows = max(1, _ARPA_BLOCK_BYTES // (k * spellings[0].dtype.itemsize + 40))
                bows = self.backoffs[k - 1]
                for lo in range(0, len(self.keys[k - 1]), rows):
                    block = slice(lo, lo + rows)
                    f.write(
                        _arpa_lines(
                            self.logprobs[k - 1][block],
                            self.tokens(k, block),
                            spellings,
                            None if bows is None else bows[block],
                        )
                    )
                    if advance is not None:
                        advance(len(self.logprobs[k - 1][block]))
            f.write(b"\n\\end\\\n")


_NUMBER = 12  # bytes of a number's field: sign, 3 digits, point, 6 decimals, NUL
_NUMBER_WORDS: list[np.ndarray] = []  # the tables of `_number_words`, made at first use


def _number_words() -> list[np.ndarray]:
    """Little-endian uint32 tables over 0..999: a NUL then the digits without leading
    zeros (NULs instead); the point and 3 digits; the same with trailing zeros as NULs (a
    lone point too); 3 digits with trailing zeros as NULs, then a NUL."""
    if not _NUMBER_WORDS:
        digits = np.array([list(f"{i:03d}".encode()) for i in range(1000)], np.uint8)
        zeros = np.array([3] + [len(str(i)) - len(str(i).rstrip("0")) for i in range(1, 1000)])
        trailing = np.arange(3) >= 3 - zeros[:, None]
        words = np.zeros((4, 1000, 4), np.uint8)
        words[0, :, 1:] = np.where(np.arange(1000)[:, None] >= [100, 10, 0], digits, 0)
        words[1:3, :, 0] = ord(".")
        words[1:3, :, 1:] = digits
        words[2, :, 1:][trailing] = 0
        words[2, 0, 0] = 0
        words[3, :, :3] = np.where(trailing, 0, digits)
        _NUMBER_WORDS.extend(words.view("<u4")[..., 0])
    return _NUMBER_WORDS


def _decimals(values: np.ndarray) -> np.ndarray:
    """`values` as ASCII rounded to six decimals, trailing zeros dropped, each in 12 bytes
    padded with NUL bytes (which `_arpa_lines` drops): a (rows,) array of 12-byte items.
    |values| < 1000: log10 probabilities of float64 are above -324."""
    whole_words, high_words, high_trimmed, low_words = _number_words()
    rounded = np.rint(np.abs(values) * 1e6).astype(np.int64)
    whole, frac = np.divmod(rounded, 10**6)
    if len(values) and whole.max() >= 1000:
        raise ValueError(f"no ARPA number for {values[whole.argmax()]}: beyond -1000..1000")
    high, low = np.divmod(frac, 1000)
    words = np.empty((len(values), 3), "<u4")
    words[:, 0] = whole_words[whole]
    words[:, 0] |= np.where((values < 0) & (rounded > 0), ord("-"), 0).astype("<u4")
    words[:, 1] = np.where(low == 0, high_trimmed[high], high_words[high])
    words[:, 2] = low_words[low]
    return words.view(f"V{_NUMBER}")[:, 0]


def _spellings(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each name after a tab, and after a space, as items of one size padded with NULs."""
    pieces = [name.encode() for name in names]
    width = 1 + max(map(len, pieces))
    spellings = np.zeros((2, len(pieces), width), np.uint8)
    spellings[0, :, 0], spellings[1, :, 0] = ord("\t"), ord(" ")
    for i, piece in enumerate(pieces):
        spellings[:, i, 1 : 1 + len(piece)] = np.frombuffer(piece, np.uint8)
    after_tab, after_space = spellings.view(f"V{width}")[..., 0]
    return after_tab, after_space


def _arpa_lines(
    logprobs: np.ndarray,
    tokens: list[np.ndarray],
    spellings: tuple[np.ndarray, np.ndarray],
    bows: np.ndarray | None,
) -> bytes:
    """The ARPA lines of a block of n-grams: each line is built in a record of fixed-size
    fields padded with NULs, and the NULs are dropped."""
    width = spellings[0].dtype.itemsize
    fields = [("p", f"V{_NUMBER}")] + [(f"w{i}", f"V{width}") for i in range(len(tokens))]
    if bows is not None:
        fields += [("tab", "u1"), ("bow", f"V{_NUMBER}")]
    lines = np.zeros(len(logprobs), [*fields, ("newline", "u1")])
    lines["p"] = _decimals(logprobs)
    for i, token in enumerate(tokens):
        lines[f"w{i}"] = spellings[i > 0][token]
    if bows is not None:
        held = ~np.isnan(bows)
        lines["tab"][held] = ord("\t")
        lines["bow"][held] = _decimals(bows[held])
    lines["newline"] = ord("\n")
    return lines.tobytes().translate(None, b"\0")


class KneserNeyCounter:
    """Counts a text's n-grams one sentence at a time; `estimate` builds the model.

    Sentences are sequences of tokens (ids or pieces); `token_name` turns one into the
    string the model (and its ARPA file) holds. Every `chunk_tokens` tokens the buffered
    sentences' N-grams are sorted and counted in numpy (see the module docstring).
    """

    def __init__(
        self,
        order: int,
        token_name: Callable[[int], str] = str,
        *,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> None:
        if not MIN_ORDER <= order <= MAX_ORDER:
            raise ValueError(f"n-gram order {order}: expected {MIN_ORDER} to {MAX_ORDER}")
        self.order = order
        self.token_name = token_name
        self.chunk_tokens = chunk_tokens
        self.sentences = 0
        self.tokens = 0
        self._names = [BOS, EOS, UNK]  # the counter's ids' names
        self._name_ids = {name: i for i, name in enumerate(self._names)}
        self._ids: dict = {}  # token (as added) -> id
        self._table = np.full(0, -1, np.int32)  # id of each int token below its size, or -1
        # Sentences not yet counted: the tokens of those of non-negative ints as they are
        # (mapped to ids in numpy), the ids of the others; each one's length and kind.
        self._raw = array("Q")
        self._interned = array("i")
        self._lengths = array("i")
        self._is_interned = array("b")
        self._buffered = 0
        self._bits = 0
        self._top: Table | None = None  # N-grams
        # Tables of k-grams that start with <s>, 1 < k < N: merged ones first, then the
        # chunks' ones not yet merged, as the N-grams' _top and _pending.
        self._pending: list[Table] = []  # N-gram tables of chunks, not yet merged into _top
        self._starts: dict[int, list[Table]] = {k: [] for k in range(2, order)}

    def _intern(self, tokens: Iterable) -> list[int]:
        """The ids of `tokens`, new ones named by `token_name` (all checked first)."""
        tokens = list(tokens)
        new = [t for t in dict.fromkeys(tokens) if t not in self._ids]
        names = [self.token_name(t) for t in new]
        for token, name in zip(new, names, strict=True):
            if name in (BOS, EOS) or not name or name.split() != [name] or "\0" in name:
                raise ValueError(
                    f"token {token!r} is named {name!r}: a sentence's tokens need names "
                    f"without white space, other than {BOS} and {EOS}"
                )
        for token, name in zip(new, names, strict=True):
            if name not in self._name_ids:
                self._name_ids[name] = len(self._names)
                self._names.append(name)
            self._ids[token] = self._name_ids[name]
        return [self._ids[t] for t in tokens]

    def add(self, sentence: Sequence[int] | Sequence[str]) -> None:
        size = len(self._raw)
        try:
            self._raw.extend(sentence)  # ints >= 0 (a tokenizer's ids): the fast way
            interned = False
        except (TypeError, OverflowError):
            del self._raw[size:]
            try:
                ids = list(map(self._ids.__getitem__, sentence))
            except KeyError:
                ids = self._intern(sentence)
            self._interned.extend(ids)
            interned = True
        self._lengths.append(len(sentence))
        self._is_interned.append(interned)
        self.sentences += 1
        self.tokens += len(sentence) + 1
        self._buffered += len(sentence)
        if self._buffered >= self.chunk_tokens:
            self._flush()

    def _ids_of(self, raw: np.ndarray) -> np.ndarray:
        """The ids of int tokens: through a table while they are below 2**24."""
        if not len(raw):
            return np.zeros(0, np.int32)
        top = int(raw.max())
        if top >= 1 << 24:
            values, inverse = np.unique(raw, return_inverse=True)
            return np.array(self._intern(values.tolist()), np.int32)[inverse]
        if top >= len(self._table):
            grown = np.full(top + 1, -1, np.int32)
            grown[: len(self._table)] = self._table
            self._table = grown
        ids = self._table[raw]
        if (ids < 0).any():
            new = np.unique(raw[ids < 0])
            self._table[new] = self._intern(new.tolist())
            ids = self._table[raw]
        return ids

    def _widen(self, bits: int) -> None:
        """Repack the tables for ids below 2**bits."""
        n = self.order
        if self._top is not None:
            self._top = (_repack(self._top[0], self._bits, 0, n, bits), self._top[1])
        self._pending = [(_repack(keys, self._bits, 0, n, bits), c) for keys, c in self._pending]
        for k, tables in self._starts.items():
            self._starts[k] = [(_repack(keys, self._bits, 0, k, bits), c) for keys, c in tables]
        self._bits = bits

    def _flush(self) -> None:
        """Count the buffered sentences' N-grams and <s> k-grams into tables."""
        if not self._lengths:
            return
        spans = np.frombuffer(self._lengths, np.int32).astype(np.int64)
        raw = self._ids_of(np.frombuffer(self._raw, np.uint64)) if self._raw else None
        interned = np.frombuffer(self._interned, np.int32).copy() if self._interned else None
        if raw is None or interned is None:
            ids = next((a for a in (raw, interned) if a is not None), np.zeros(0, np.int32))
        else:
            which = np.repeat(np.frombuffer(self._is_interned, np.int8).astype(bool), spans)
            ids = np.empty(len(which), np.int32)
            ids[~which] = raw
            ids[which] = interned
            del which
        del raw, interned
        spans += 2
        self._raw, self._interned = array("Q"), array("i")
        self._lengths, self._is_interned = array("i"), array("b")
        self._buffered = 0
        bits = _bits_for(len(self._names))
        if bits > self._bits:
            self._widen(bits)
        n, bits = self.order, self._bits
        ends = np.cumsum(spans)
        starts = ends - spans
        stream = np.empty(int(ends[-1]), np.int32)  # <s> w1 .. wn </s> <s> ...
        inside = np.ones(len(stream), bool)
        inside[starts] = inside[ends - 1] = False
        stream[inside] = ids
        del ids, inside
        stream[starts] = BOS_ID
        stream[ends - 1] = EOS_ID
        windows = np.maximum(spans - n + 1, 0)  # N-grams of each sentence
        first = starts - np.cumsum(windows) + windows  # where each sentence's N-grams start
        at = np.arange(int(windows.sum())) + np.repeat(first, windows)
        self._pending.append(_count(_pack(lambda i: stream[at + i], n, len(at), bits)))
        del at, first
        for k in range(2, n):
            at = starts[spans >= k]
            self._starts[k].append(_count(_pack(lambda i, at=at: stream[at + i], k, len(at), bits)))
        if self._top is None or sum(len(t[1]) for t in self._pending) >= len(self._top[1]) // 4:
            self._merge_pending()  # so that the merges' work grows as n log n

    def _merge_pending(self) -> None:
        wide = self.tokens >= 2**31  # a count could pass int32

        def merged(tables: list[Table]) -> Table:
            if wide:
                tables = [(keys, counts.astype(np.int64)) for keys, counts in tables]
            return _merge(tables)

        tables = ([] if self._top is None else [self._top]) + self._pending
        self._top, self._pending = None, []
        self._top = merged(tables)
        for k, tables in self._starts.items():
            self._starts[k] = [merged(tables)]

    def estimate_tables(self, advance: Callable[[], None] | None = None) -> NgramTables:
        """The interpolated modified Kneser-Ney model of what was added (module docstring)
        as arrays; `advance` is called once an order is done."""
        self._flush()
        if self.sentences == 0:
            raise ValueError("no sentences: nothing to estimate a model from")
        self._merge_pending()
        assert self._top is not None
        n, bits, vocabulary = self.order, self._bits, len(self._names)
        keys: list = [None] * (n + 1)  # by order
        adjusted: list = [None] * (n + 1)
        suffix: list = [None] * (n + 1)  # row of each k-gram's last k - 1 tokens in order k - 1
        keys[n], adjusted[n] = self._top
        for k in range(n, 2, -1):  # the (k-1)-grams from the k-grams they end, and <s> ones
            [(start_keys, start_counts)] = self._starts[k - 1]
            ends = _repack(keys[k], bits, 1, k)
            order = _sort_order(ends)
            ends = ends[order]
            change = _changes(ends)
            first = np.flatnonzero(change)
            keys[k - 1] = np.concatenate([start_keys, ends[first]])  # <s> (id 0) sorts first
            del ends
            continued = np.diff(first, append=len(order)).astype(np.int32)
            adjusted[k - 1] = np.concatenate([start_counts, continued])
            del first, continued
            index = _index_dtype(len(keys[k - 1]))
            run = np.cumsum(change, dtype=index)
            run += len(start_keys) - 1
            suffix[k] = np.empty(len(order), index)
            suffix[k][order] = run
            del order, run, change
        suffix[2] = _token(keys[2], bits, 1)
        adjusted[1] = np.bincount(suffix[2], minlength=vocabulary)
        adjusted[1][BOS_ID] = 0  # not a token to predict: left out of S and the discounts
        keys[1] = _pack(lambda i: np.arange(vocabulary), 1, vocabulary, bits)

        discounts = []
        d = _discounts(_count_of_counts(adjusted[1][1:]), 1)
        discounts.append(d)
        taken = np.array([0.0, *d])[np.minimum(adjusted[1], 3)]
        total = adjusted[1].sum()
        probs = (adjusted[1] - taken) / total + (taken.sum() / total) * (1.0 / (vocabulary - 1))
        probs[BOS_ID] = np.nan
        logprobs: list = [None] * (n + 1)
        backoffs: list = [None] * (n + 1)
        logprobs[1] = probs
        if advance is not None:
            advance()
        for k in range(2, n + 1):
            counts = adjusted[k]
            context = _token(keys[2], bits, 0) if k == 2 else _repack(keys[k], bits, 0, k - 1)
            heads = np.flatnonzero(_changes(context))  # where each context's k-grams start
            # gamma(h) is the back-off weight of h, a (k-1)-gram: for k > 2, those (k-1)-grams
            # that do not end in </s> (each has a k-gram after it), in the same order.
            if k == 2:
                holders = context[heads]
            else:
                holders = _token(keys[k - 1], bits, k - 2) != EOS_ID
                if holders.sum() != len(heads) or not np.array_equal(
                    context[heads], keys[k - 1][holders]
                ):
                    raise RuntimeError(f"the contexts of the {k}-grams are not the {k - 1}-grams")
            del context
            d = _discounts(_count_of_counts(counts), k)
            discounts.append(d)
            taken = np.array([0.0, *d])[np.minimum(counts, 3)]
            total = np.add.reduceat(counts, heads, dtype=np.int64)
            gamma = np.add.reduceat(taken, heads) / total
            sizes = np.diff(heads, append=len(counts)).astype(np.int32)
            backoffs[k - 1] = np.full(len(keys[k - 1]), np.nan)
            backoffs[k - 1][holders] = np.log10(gamma)
            del holders
            probs = np.subtract(counts, taken, out=taken)
            del taken, counts
            for first in range(0, len(heads), _CONTEXTS_AT_ONCE):  # to bound the temporaries
                part = slice(first, first + _CONTEXTS_AT_ONCE)
                rows = slice(heads[first], heads[first] + int(sizes[part].sum()))
                probs[rows] /= np.repeat(total[part], sizes[part])
                lower = logprobs[k - 1][suffix[k][rows]]
                lower *= np.repeat(gamma[part], sizes[part])
                probs[rows] += lower
            del total, gamma, sizes, heads
            adjusted[k] = suffix[k] = None
            np.log10(logprobs[k - 1], out=logprobs[k - 1])
            logprobs[k] = probs
            if advance is not None:
                advance()
        np.log10(logprobs[n], out=logprobs[n])
        logprobs[1][BOS_ID] = NO_PROB
        return NgramTables(
            order=n,
            names=list(self._names),
            bits=bits,
            keys=keys[1:],
            logprobs=logprobs[1:],
            backoffs=backoffs[1:],
            discounts=discounts,
        )

    def estimate(self) -> NgramLM:
        """The interpolated modified Kneser-Ney model of what was added (module docstring)."""
        return self.estimate_tables().to_ngram_lm()


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


def _is_manifest(path: Path) -> bool:
    """Whether `path` is a lhotse manifest (JSON lines, plain or gzipped), by its name."""
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def _manifest_text(line: bytes, path: Path, lineno: int) -> str:
    """The text of one line of a lhotse manifest: a supervision's, or a cut's supervisions'
    joined by spaces (as `asr.data.corpus.cut_text`); a line with neither (a recording) is
    an error naming the file and line."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{lineno}: not a manifest's JSON line ({err})") from None
    if not isinstance(item, dict):
        item = {}
    if "supervisions" in item:  # a cut
        return " ".join((s.get("text") or "").strip() for s in item["supervisions"])
    if "text" in item:  # a supervision
        return item["text"] or ""
    raise ValueError(
        f"{path}:{lineno}: neither a supervision nor a cut (no text): give text files, or "
        "supervision or cut manifests"
    )


def _sentences_of(paths: Sequence[Path], advance: Callable[[int], None]):
    """Lines of plain or gzipped text files, or the texts of lhotse supervision or cut
    manifests (``*.jsonl`` or ``*.jsonl.gz``: the supervisions' text), stripped, empty ones
    skipped; `advance` gets the bytes of the files read so far (compressed bytes for gzip)."""
    for path in paths:
        raw = open(path, "rb")  # noqa: SIM115 (closed below, position read for progress)
        manifest = _is_manifest(path)
        try:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
            done = 0
            for i, line in enumerate(stream):
                if manifest and line.strip():
                    text = _manifest_text(line, path, i + 1).strip()
                else:
                    text = line.decode("utf-8").strip()
                if text:
                    yield text
                if i % 1000 == 0:
                    advance(raw.tell() - done)
                    done = raw.tell()
            advance(raw.tell() - done)
        finally:
            raw.close()


def _return_freed_arrays() -> None:
    """Fix glibc's mmap threshold at 1 MiB. By default glibc raises it to the size of each
    large block freed (up to 32 MiB), so the estimator's freed temporary arrays stay in the
    heap, fragmented, instead of going back: the peak resident set of a 6-gram of 10 M
    tokens was about 60 MB (15 %) higher without this, at the same speed. No-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


@command
def main(argv: list[str] | None = None) -> None:
    """`asr-train-lm TEXT... --tokenizer bpe.model --order N -o lm.arpa`: an interpolated
    modified Kneser-Ney n-gram over the tokenizer's pieces, one sentence per line, or the
    transcripts of lhotse supervision or cut manifests."""
    import argparse

    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TimeRemainingColumn,
    )

    from asr.data.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "text",
        type=Path,
        nargs="+",
        help="text files, one sentence a line (plain or gzipped), or lhotse supervision or cut "
        "manifests (*.jsonl, *.jsonl.gz: their supervisions' text, e.g. a model's training "
        "transcripts for a LODR bigram)",
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="the SentencePiece model")
    parser.add_argument("--order", type=int, default=3, help=f"{MIN_ORDER} to {MAX_ORDER}")
    parser.add_argument(
        "--max-lines",
        type=int,
        metavar="N",
        help="read only the first N sentences (non-empty lines) of the text, files in the "
        "order given: a bound on the memory for a text too large (default: all)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the ARPA file to write (gzipped if it ends in .gz)",
    )
    args = parser.parse_args(argv)
    if args.max_lines is not None and args.max_lines < 1:
        parser.error(f"--max-lines must be at least 1, not {args.max_lines}")
    for path in args.text:
        if not path.is_file():
            raise FileNotFoundError(f"text file not found: {path}")
    tokenizer = Tokenizer.load(args.tokenizer)
    _return_freed_arrays()
    counter = KneserNeyCounter(args.order, tokenizer.id_to_piece)
    started = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("counting", total=sum(p.stat().st_size for p in args.text))
        for text in _sentences_of(args.text, lambda n: progress.advance(task, n)):
            counter.add(tokenizer.encode(text))
            if counter.sentences == args.max_lines:
                break
    if counter.sentences == 0:
        raise ValueError(f"no sentences in {', '.join(map(str, args.text))}")
    counted = time.perf_counter()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("estimating (orders)", total=args.order)
        tables = counter.estimate_tables(lambda: progress.advance(task))
        estimated = time.perf_counter()
        task = progress.add_task("writing (n-grams)", total=sum(tables.counts()))
        # written whole or not at all: a file at --output is a complete model (the recipes
        # skip training when it is there)
        partial = args.output.with_name(f".{args.output.stem}.partial{args.output.suffix}")
        tables.write_arpa(partial, lambda n: progress.advance(task, n))
        partial.replace(args.output)
    written = time.perf_counter()
    print(
        f"wrote {args.output}: order {tables.order}, {counter.sentences} sentences, "
        f"{counter.tokens} tokens (with </s>)"
    )
    for k, count in enumerate(tables.counts(), start=1):
        print(f"  {k}-grams: {count}")
    print(
        f"  seconds: counting {counted - started:.1f}, estimating {estimated - counted:.1f}, "
        f"writing {written - estimated:.1f}"
    )

"""Context biasing: phrases a search should prefer (names, product words, jargon), as an
automaton over token ids that every search consults.

The phrases are tokenized with the model's SentencePiece model (`BiasingGraph.from_phrases`)
into a trie, and the trie into an Aho-Corasick automaton: each state is a partial match
(a trie node), and every token moves a state to the longest partial match that still
holds after it. A hypothesis carries its state and earns `score` for every token that
advances a match, from a phrase's second token on (the first is a piece that starts many
ordinary words); when a match fails, the bonus of the part no longer matched is given
back (icefall's rule), and when the utterance ends inside a partial match, that is given
back too. So a near-miss ends with no net gain. A completed phrase banks its bonus once a
new word starts after it (or the utterance ends): a phrase heard as the start of a longer
word ("QUEBROS" in "QUEBROSS") gives it back, and a longer phrase that continues it
("NEW YORK CITY" after "NEW YORK") goes on earning.

In numbers, per state n: `held[n]`, what a hypothesis in n gives back if the utterance
ends (the bonus since the last banked phrase; 0 at a phrase's end), and for every token t
the next state `next[n, t]` and the gain `gain[n, t]`: what the token earns, or gives
back (negative), with what a completed phrase banks. Both tables are dense (states x
vocabulary), built once, so that a batched search reads its rows with one gather
(`gain.index_select(0, nodes)`) and a CUDA graph can replay it.

Beam searches add `gain` to every non-blank extension and give back `held` when a
hypothesis ends; they keep half their beam for the best hypotheses as if every partial
match ended there (`keep_half`, the rule both beams call), so that the plain hypotheses
are still there when a match fails. Greedy searches, which cannot take a decision back, add
only what a token earns (`advance`: gains below zero count as zero), so that leaving a
partial match costs nothing against blank. Scores are per token: a phrase of k tokens
earns (k - 1) x its score. docs/decoding.md, "Context biasing", says how to choose it.
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from asr.data.tokenizer import Tokenizer
from asr.tokens import BLANK_ID, BOS_ID, EOS_ID, UNK_ID, WORD_START, starts_word

# The bonus per token of a phrase without its own score, for a beam of 8, chosen on the
# demo's dev sets (`asr-sweep`, recipes/demo/RESULTS.md "Language models"): the largest
# score whose dev-plain WER stays within 0.3 points of no list (4: +0.23; 4.5: +0.59),
# dev-context recall 3.1 -> 64.6 %. (It was 4.5, chosen on test-context before dev existed.)
DEFAULT_BIASING_SCORE = 4.0
# The largest bonus per token: past it a phrase outweighs any acoustic evidence, so a
# larger score says nothing more and is refused (with inf, nan and 1e308, which overflows
# the float32 tables into inf and nan). Measured on the demo's models (make demo's, its
# TDT and streaming ones; 80 utterances of test-clean and test-context, 9,096 frames of
# 40 ms each, on the greedy path): a frame's best token beats its worst text token by
# 17-36 (natural log; median 27, 99.9 % under 35) and its worst token of all (unk, BOS,
# EOS too) by at most 46; blank, where it wins, lies 18-46 above the worst non-blank
# token. At 50 per token a phrase's token would win every frame whatever was said. The
# useful scores are 1-6 (recipes/demo/RESULTS.md, "Context biasing"): 50 is 11 times the
# default.
MAX_BIASING_SCORE = 50.0
MAX_TABLE_ENTRIES = 1 << 27  # states x vocabulary: at most 2 GiB of tables (16 bytes an
# entry: int64 `next`, float32 `gain` and `advance`)
_SCORED = re.compile(r"^(?P<text>.*?)\s+:(?P<score>\S+)\s*$")  # "PHRASE :2.5"

Place = TypeVar("Place", bound=Hashable)
Phrases = Iterable["str | tuple[str, float] | BiasingPhrase"]


@dataclass(frozen=True)
class BiasingPhrase:
    """A phrase to boost and its bonus per token (None: the list's score)."""

    text: str
    score: float | None = None


def parse_phrase(item: str | tuple[str, float] | BiasingPhrase, where: str = "") -> BiasingPhrase:
    """A phrase from a string (`"TEXT"`, or `"TEXT :SCORE"`: sherpa-onnx's hotwords
    format), a (text, score) pair or a `BiasingPhrase`; a one-line ValueError names an
    empty phrase or a bad or negative score (`where`: e.g. "phrases.txt line 3")."""
    at = f"{where}: " if where else ""
    if isinstance(item, BiasingPhrase):
        text, score = item.text, item.score
    elif isinstance(item, tuple):
        text, score = item
    else:
        text, score = item, None
        if match := _SCORED.match(item):
            try:
                text, score = match["text"], float(match["score"])
            except ValueError:
                raise ValueError(f"{at}bad score {match['score']!r} in {item.strip()!r}") from None
    text = " ".join(str(text).split())
    if not text:
        raise ValueError(f"{at}an empty biasing phrase")
    if score is not None:
        score = check_biasing_score(score, f"{at}biasing score of {text!r}")
    return BiasingPhrase(text, score)


def check_biasing_score(score: float, name: str = "biasing score") -> float:
    """`score` as a float, or a one-line ValueError naming it (`name`) and its value unless
    0 <= score <= MAX_BIASING_SCORE (which refuses nan and inf too)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {score!r}") from None
    if not 0 <= value <= MAX_BIASING_SCORE:
        raise ValueError(
            f"{name} must be >= 0 and at most {MAX_BIASING_SCORE:g} per token (more outweighs "
            f"any acoustic evidence), got {value!r}"
        )
    return value


def read_biasing_phrases(path: str | Path) -> list[BiasingPhrase]:
    """The phrases of a file: one per line, optionally followed by ` :SCORE`; blank lines
    and lines starting with # are skipped. Errors name the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read biasing phrases from {path}: {err}") from None
    return [
        parse_phrase(line, f"{path} line {number}")
        for number, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def tokenize_phrase(text: str, tokenizer: Tokenizer) -> list[list[int]]:
    """The token sequences a model may emit for `text`: SentencePiece's segmentation, and
    the variants where a word starts with a lone "▁" piece followed by the rest of its
    first piece (what a model emits when it starts a word it rarely saw). The text is
    taken as written, else upper- or lower-cased when only that has every character in
    the vocabulary (a LibriSpeech model knows upper case only); a ValueError names a
    phrase that cannot be tokenized."""
    for form in (text, text.upper(), text.lower()):
        ids = tokenizer.encode(form)
        if ids and UNK_ID not in ids:
            break
    else:
        unknown = sorted(
            c
            for c in set(text.replace(" ", ""))
            if all(UNK_ID in tokenizer.encode(form) for form in (c, c.upper(), c.lower()))
        )
        raise ValueError(
            f"biasing phrase {text!r} cannot be tokenized: the model's vocabulary lacks "
            f"{' '.join(map(repr, unknown)) or 'its characters'}"
        )
    space = tokenizer.piece_to_id(WORD_START)
    words = _split_words(ids, tokenizer)
    variants = [[]]
    for word in words:
        forms = [word]
        first = tokenizer.id_to_piece(word[0])
        if space is not None and starts_word(first) and len(first) > 1:
            rest = tokenizer.piece_to_id(first[1:])
            if rest is not None:
                forms.append([space, rest, *word[1:]])
        variants = [v + f for v in variants for f in forms][:8]
    return variants


def _split_words(ids: list[int], tokenizer: Tokenizer) -> list[list[int]]:
    """`ids` cut before every piece that starts a word."""
    words: list[list[int]] = []
    for i in ids:
        if starts_word(tokenizer.id_to_piece(i)) or not words:
            words.append([i])
        else:
            words[-1].append(i)
    return words


class BiasingGraph:
    """The automaton of a phrase list (see the module's docstring): `next` and `gain`
    (states x vocabulary), `held` (states,), state 0 the root (no partial match).

    Build it with `from_phrases` (text, with the model's tokenizer) or `from_tokens`
    (token-id sequences). An empty list gives one state and zero gains: searching with it
    gives what searching without biasing gives.
    """

    def __init__(self, next_: Tensor, gain: Tensor, held: Tensor, phrases: int) -> None:
        self.next, self.gain, self.held = next_, gain, held
        self.advance = gain.clamp(min=0)
        self.num_phrases = phrases
        self._on: dict[torch.device, BiasingGraph] = {next_.device: self}

    @property
    def num_states(self) -> int:
        return self.next.size(0)

    @property
    def vocab_size(self) -> int:
        return self.next.size(1)

    def to(self, device: torch.device | str) -> BiasingGraph:
        """The same graph with its tables on `device` (kept, so moving twice is free)."""
        device = torch.device(device)
        if device not in self._on:
            moved = BiasingGraph(
                self.next.to(device), self.gain.to(device), self.held.to(device), self.num_phrases
            )
            moved._on = self._on
            self._on[device] = moved
        return self._on[device]

    @classmethod
    def from_phrases(
        cls,
        phrases: Iterable[str | tuple[str, float] | BiasingPhrase],
        tokenizer: Tokenizer,
        score: float = DEFAULT_BIASING_SCORE,
    ) -> BiasingGraph:
        """The graph of `phrases` (see `parse_phrase`), each earning its own score per
        token or else `score`, tokenized with `tokenizer` (`tokenize_phrase`)."""
        score = check_biasing_score(score)
        if not isinstance(tokenizer, Tokenizer):  # e.g. an ONNX export's tokens.txt
            raise ValueError(
                "biasing phrases are tokenized with the model's SentencePiece model, which an "
                "ONNX export does not hold: decode the bundle (sherpa-onnx takes "
                "--hotwords-file)"
            )
        sequences = []
        parsed = [parse_phrase(p) for p in phrases]
        for phrase in parsed:
            bonus = score if phrase.score is None else phrase.score
            sequences += [(ids, bonus) for ids in tokenize_phrase(phrase.text, tokenizer)]
        starts = [starts_word(tokenizer.id_to_piece(i)) for i in range(tokenizer.vocab_size)]
        return cls.from_tokens(sequences, tokenizer.vocab_size, len(parsed), starts)

    @classmethod
    def from_tokens(
        cls,
        sequences: Sequence[tuple[Sequence[int], float]],
        vocab_size: int,
        num_phrases: int | None = None,
        word_starts: Sequence[bool] | None = None,
    ) -> BiasingGraph:
        """The graph of token-id sequences, each with its bonus per token. `word_starts`:
        per token id, whether it starts a word (SentencePiece's "▁" pieces); a completed
        phrase keeps its bonus only when a word starts after it (or the utterance ends),
        so that a phrase heard as the start of a longer word earns nothing. None: every
        token starts a word."""
        children: list[dict[int, int]] = [{}]
        step_score: list[float] = [0.0]  # the bonus of the token that enters each state
        is_end: list[bool] = [False]
        for tokens, bonus in sequences:
            if not tokens:
                raise ValueError("an empty biasing phrase (no tokens)")
            bonus = check_biasing_score(bonus, f"biasing score of tokens {list(tokens)}")
            node = 0
            for depth, token in enumerate(tokens):
                if not 0 <= token < vocab_size or token in (BLANK_ID, UNK_ID, BOS_ID, EOS_ID):
                    raise ValueError(f"biasing token {token} is not a text token of the model")
                if token not in children[node]:
                    children[node][token] = len(children)
                    children.append({})
                    step_score.append(0.0)
                    is_end.append(False)
                node = children[node][token]
                # The first token starts many ordinary words: it earns nothing (unless it
                # is the whole phrase).
                earns = bonus if depth or len(tokens) == 1 else 0.0
                step_score[node] = max(step_score[node], earns)
            is_end[node] = True
        states = len(children)
        if states * vocab_size > MAX_TABLE_ENTRIES:
            raise ValueError(
                f"{states} biasing states x {vocab_size} tokens is over the limit of "
                f"{MAX_TABLE_ENTRIES} table entries: use fewer or shorter phrases"
            )
        starts = torch.ones(vocab_size, dtype=torch.bool)
        if word_starts is not None:
            starts = torch.as_tensor(list(word_starts), dtype=torch.bool)
            starts[[BLANK_ID, UNK_ID, BOS_ID, EOS_ID]] = True  # none continues a word
        # Breadth-first: a state's failure state (and its row of `next`) is ready before
        # its children need it. `at_risk[n]`: what a hypothesis in n would give back on a
        # failed match, the bonus since the last phrase it completed and followed by a
        # new word (banked).
        next_ = torch.zeros(states, vocab_size, dtype=torch.long)
        at_risk = [0.0] * states
        fail = [0] * states
        order = [0]
        for node in order:
            if node:
                next_[node] = next_[fail[node]]
            for token, child in children[node].items():  # (fail[node] is another row)
                fail[child] = int(next_[fail[node], token]) if node else 0
                banked = is_end[node] and bool(starts[token])
                at_risk[child] = (0.0 if banked else at_risk[node]) + step_score[child]
                next_[node, token] = child
                order.append(child)
        risk = torch.tensor(at_risk)
        ends = torch.tensor(is_end)
        held = torch.where(ends, 0.0, risk)  # what ending the utterance here gives back
        # A completed phrase followed by a word start banks what it holds.
        banks = torch.where(ends[:, None] & starts[None, :], risk[:, None], 0.0)
        gain = banks + risk[next_] - risk[:, None]
        count = len(sequences) if num_phrases is None else num_phrases
        return cls(next_, gain, held, count)


def keep_half(by_score: Sequence[Place], by_plain: Iterable[Place], k: int) -> list[Place]:
    """The K candidates a beam keeps, given best first by score (`by_score`) and by score
    less what their partial matches would give back if the hypothesis ended there
    (`by_plain`, `BiasingGraph.held`): the best half by score, then the best plain ones,
    then the rest by score, without repeats. A hypothesis that earns a phrase's bonus token
    by token would otherwise crowd out the plain hypotheses, which must still be there when
    its match fails. Without a graph both orders are the same: the K best."""
    half = (k + 1) // 2
    kept = list(by_score[:half])
    seen = set(kept)
    for place in itertools.chain(by_plain, by_score[half:]):
        if len(kept) == k:
            break
        if place not in seen:
            kept.append(place)
            seen.add(place)
    return kept


class SharedBiasingGraphs:
    """The graphs of phrase lists, each built once per (phrases, score) and shared while
    anything holds it: searches whose graphs are the same object share one search step,
    and one set of tables in memory. `get` may be called from several threads: a list that
    one thread is building is waited for by the others, not built again. `builds` counts
    the graphs built."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.builds = 0
        self._lock = threading.Lock()
        self._graphs: weakref.WeakValueDictionary[Hashable, BiasingGraph] = (
            weakref.WeakValueDictionary()
        )
        self._building: dict[Hashable, Future[BiasingGraph]] = {}

    def get(self, phrases: Phrases, score: float = DEFAULT_BIASING_SCORE) -> BiasingGraph:
        """The graph of `phrases` (see `BiasingGraph.from_phrases`), built or shared."""
        key = (tuple(parse_phrase(p) for p in phrases), float(score))
        with self._lock:
            graph = self._graphs.get(key)
            if graph is not None:
                return graph
            pending = self._building.get(key)
            building = pending is None
            if building:
                pending = self._building[key] = Future()
        if not building:
            return pending.result()
        try:
            graph = BiasingGraph.from_phrases(key[0], self.tokenizer, score)
        except BaseException as err:
            with self._lock:
                del self._building[key]
            pending.set_exception(err)
            raise
        with self._lock:
            self._graphs[key] = graph
            del self._building[key]
            self.builds += 1
        pending.set_result(graph)
        return graph

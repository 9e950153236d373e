"""Language-model fusion: token n-grams in tensor form, shallow fusion and LODR, for every search.

A search that fuses an LM scores each token extension with

    log P_model(token) + lm_weight * log P_lm(token | h) - lodr_weight * log P_lodr(token | h)

(natural logs, h the hypothesis's tokens), blanks with the model's score alone, and a
finished hypothesis once more with the same weights applied to log P(</s> | h). Shallow
fusion is the first LM; LODR (low-order density ratio, icefall) subtracts a low-order n-gram
of the training transcripts, which stands in for the internal LM the transducer learned
from them, so that the external LM is not counted on top of it.

`TokenLm` is one n-gram (`asr.decoding.lm.NgramLM`, read from ARPA) over a model's token ids,
as tensors a search steps on the CPU or a GPU with static shapes (a CUDA graph replays it):

- states: the root (the empty history, state 0) and every n-gram of order 1..N-1 (the
  histories the model conditions on), each with its back-off state (the history without
  its first token) and back-off weight;
- arcs: every n-gram of order 2..N, as a sorted key `state * V + token` (V: the model's
  vocabulary), with its log-probability and the state after it (the longest suffix of the
  n-gram that is a state);
- dense rows: for the states of the lowest orders (the root's row is the unigrams; more
  orders as memory allows, `densified`: a row is its back-off state's plus the back-off
  weight, its own arcs written over it), the score and next state of every token.

The scores of all V tokens for R states walk each state's back-off chain until it reaches
a dense state (at most N - 1 steps; none when every state is dense), looking every (state,
token) key up with one `searchsorted` per step, then read that state's row: no per-state
loop, no data-dependent shape. It is the layout of NeMo's NGPU-LM (a trie of next-state and
back-off tables, arXiv 2505.22857), looked up by binary search and gathers instead of a
custom kernel.

Tokens are matched by piece: the LM's ``<unk>``, ``<s>`` and ``</s>`` are the model's pieces
of the same names (`asr.tokens.SPECIAL_PIECES`), so the end of a sentence is the score of
the model's ``</s>`` column (an attention decoder's EOS takes it as it is). A model token the
LM never saw gets the LM's ``<unk>`` probability. `LmFusion` holds one or two `TokenLm` and
their weights: a hypothesis's LM state is one row of a (R, P) tensor (P LMs), carried in
`asr.decoding.hypotheses.HypothesisState` with the fused scores of its next token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from asr.decoding.lm import BOS, EOS, UNK, NgramLM, read_arpa

log = logging.getLogger(__name__)

LN10 = math.log(10.0)
# The largest LM or LODR weight accepted. Weights that help lie between 0.1 and 0.7 (icefall's
# LODR recipes use 0.1-0.6 for the LM and 0.1-0.2 for LODR; NGPU-LM's sweeps 0.1-0.6): at 5,
# one token's LM log-probability (typically -2 to -10) outweighs the acoustic model's choice
# between its best tokens many times over, so the output is the LM's sentence, not the audio's.
MAX_LM_WEIGHT = 5.0
# The most bytes an LM's dense rows (states x vocabulary: a score and a next state each) may
# take where `load_fusion` adds them by itself, order by order: the demo grammar's 6-gram
# (1.5 M histories) gets them up to order 3 (78 k histories, 80 MB), and a lookup walks the
# back-off chain of the longer histories only (2 steps instead of 5).
DENSE_MAX_BYTES = 1 << 31
_TABLES_VERSION = 2  # bump when the saved tensor form changes


def check_lm_weight(name: str, value: float) -> float:
    """`value` as a float when it is a usable LM weight (0 to `MAX_LM_WEIGHT`); else a
    one-line ValueError naming `name`."""
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(weight) or not 0.0 <= weight <= MAX_LM_WEIGHT:
        raise ValueError(
            f"{name} must be between 0 and {MAX_LM_WEIGHT} (useful weights: 0.1-0.7), got {value}"
        )
    return weight


def check_lodr_below_lm(lm_weight: float, lodr_weight: float) -> None:
    """A one-line ValueError when the LODR weight is above the LM's: the fused score of every
    token, and of ending at once, then rises the more the training transcripts expect it,
    and a beam search ends on nothing (the demo's dev-clean at LM 0.1, LODR 0.3: 100 %
    deletions, recipes/demo/RESULTS.md)."""
    if lodr_weight > lm_weight:
        raise ValueError(
            f"lodr_weight {lodr_weight} is above lm_weight {lm_weight}: LODR subtracts a "
            "low-order LM and must weigh less than the LM it corrects (useful: about half)"
        )


@dataclass(frozen=True)
class TokenLm:
    """One back-off n-gram over a model's token ids, as tensors (see the module's docstring).

    States are numbered by order: the root (0), then the histories of one token, of two,
    and so on; `order_ends[k]` counts the states of order at most k. The first D states are
    dense: `dense_scores` (D, V) holds ln p(token | state) of every token and `dense_next`
    (D, V) the state after it (D = 1 as built: the root's row, the unigrams; `densified`
    adds orders). Every other state's arcs are `keys` (A,) sorted `state * V + token`, with
    `arc_logp` (A,) ln p and `arc_next` (A,) the state after it; each state backs off to
    `backoff_state` (S,) with `backoff_weight` (S,) ln. `start_state`: the state after
    ``<s>``; `end_id`: the token id of ``</s>``; `pieces_hash`: which vocabulary the ids
    are of."""

    order: int
    vocab_size: int
    start_state: int
    end_id: int
    dense_scores: Tensor
    dense_next: Tensor
    keys: Tensor
    arc_logp: Tensor
    arc_next: Tensor
    backoff_state: Tensor
    backoff_weight: Tensor
    order_ends: tuple[int, ...]
    pieces_hash: str = ""

    @property
    def num_states(self) -> int:
        return self.backoff_state.numel()

    @property
    def num_arcs(self) -> int:
        return self.keys.numel() + self.vocab_size

    @property
    def num_dense(self) -> int:
        return self.dense_scores.size(0)

    @property
    def dense_order(self) -> int:
        """The highest order whose states are all dense (0: the root's only)."""
        return max(k for k, end in enumerate(self.order_ends) if end <= self.num_dense)

    @property
    def sparse_levels(self) -> int:
        """The back-off steps a lookup walks before every history is a dense state."""
        return self.order - 1 - self.dense_order

    def _tensors(self) -> dict[str, Tensor]:
        fields = (f.name for f in dataclasses.fields(self))
        return {n: t for n in fields if isinstance(t := getattr(self, n), Tensor)}

    def nbytes(self) -> int:
        """Bytes of its tensors."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def to(self, device: torch.device | str) -> TokenLm:
        device = torch.device(device)
        if device == self.device:
            return self
        return dataclasses.replace(self, **{n: t.to(device) for n, t in self._tensors().items()})

    def dense_nbytes(self, order: int | None = None) -> int:
        """Bytes the dense rows of every state up to `order` take (None: every state's)."""
        states = self.order_ends[self.order - 1 if order is None else order]
        return states * self.vocab_size * (4 + 4)  # float32 score, int32 next state

    def densified(self, max_bytes: float = math.inf) -> TokenLm:
        """This LM with dense rows for the states of every order whose rows (with the lower
        orders') take at most `max_bytes`: a lookup then walks fewer back-off steps (none
        when every state is dense: one gather). A state's row is its back-off state's
        (a lower order's, so already dense) plus its back-off weight, with its own arcs
        written over it: one gather and one scatter per order."""
        order = max(k for k in range(self.order) if self.dense_nbytes(k) <= max_bytes or k == 0)
        if order <= self.dense_order:
            return self
        vocab = self.vocab_size
        scores = torch.empty(self.order_ends[order], vocab, device=self.device)
        nexts = torch.empty(self.order_ends[order], vocab, dtype=torch.int32, device=self.device)
        scores[: self.num_dense] = self.dense_scores
        nexts[: self.num_dense] = self.dense_next
        for k in range(self.dense_order + 1, order + 1):
            first, last = self.order_ends[k - 1], self.order_ends[k]
            backoff = self.backoff_state[first:last]
            scores[first:last] = scores[backoff] + self.backoff_weight[first:last, None]
            nexts[first:last] = nexts[backoff]
            bounds = torch.tensor([first * vocab, last * vocab], device=self.device)
            lo, hi = torch.searchsorted(self.keys, bounds).tolist()
            rows, tokens = self.keys[lo:hi] // vocab, self.keys[lo:hi] % vocab
            scores[rows, tokens] = self.arc_logp[lo:hi]
            nexts[rows, tokens] = self.arc_next[lo:hi].to(torch.int32)
        return dataclasses.replace(self, dense_scores=scores, dense_next=nexts)

    @classmethod
    def from_ngram(cls, lm: NgramLM, pieces: Sequence[str], source: str = "the LM") -> TokenLm:
        """The tensor form of `lm` over the vocabulary `pieces` (piece i is token id i). An LM
        token that is not a piece (a word-level LM given to a BPE model) is a one-line
        ValueError naming the first and how many there are (`source`: the file, for it)."""
        ids = {piece: i for i, piece in enumerate(pieces)}
        unknown = [g[0] for g in lm.logprobs[0] if g[0] not in ids and g[0] not in (BOS, EOS, UNK)]
        if unknown:
            raise ValueError(
                f"{source}: {len(unknown)} of its {lm.counts()[0]} tokens are not the model's "
                f"pieces, the first {unknown[0]!r} (an LM over words or another tokenizer? "
                f"train one over the model's pieces: asr-train-lm --tokenizer)"
            )
        for special in (BOS, EOS):
            if special not in ids:
                raise ValueError(
                    f"the model's vocabulary has no {special} piece to map the LM's to"
                )
            if (special,) not in lm.logprobs[0]:
                raise ValueError(f"{source}: no {special} unigram: not a sentence-level LM")
        vocab = len(pieces)

        def mapped(gram: tuple[str, ...]) -> tuple[int, ...]:
            return tuple(ids.get(p, -1) for p in gram)  # -1: a token the model lacks

        # states: the root, then every n-gram of order 1..N-1 (a history), by order
        state_of: dict[tuple[int, ...], int] = {(): 0}
        order_ends = [1]
        for k in range(1, lm.order):
            for gram in lm.logprobs[k - 1]:
                state_of.setdefault(mapped(gram), len(state_of))
            order_ends.append(len(state_of))

        def longest_state(history: tuple[int, ...]) -> int:
            while history not in state_of:
                history = history[1:]
            return state_of[history]

        num_states = len(state_of)
        backoff_state = [0] * num_states
        backoff_weight = [0.0] * num_states
        for k in range(1, lm.order):
            bows = lm.backoffs[k - 1]
            for gram in lm.logprobs[k - 1]:
                s = state_of[mapped(gram)]
                backoff_state[s] = longest_state(mapped(gram)[1:])
                backoff_weight[s] = bows.get(gram, 0.0) * LN10
        unk = lm.logprobs[0].get((UNK,))
        floor = (unk if unk is not None else -99.0) * LN10
        unigram = [floor] * vocab
        unk_state = state_of.get((ids[UNK],), 0) if UNK in ids else 0
        unigram_next = [unk_state] * vocab
        for (piece,), logp in lm.logprobs[0].items():
            if piece in ids:
                unigram[ids[piece]] = logp * LN10
                unigram_next[ids[piece]] = longest_state((ids[piece],))
        keys: list[int] = []
        logps: list[float] = []
        nexts: list[int] = []
        for k in range(2, lm.order + 1):
            for gram, logp in lm.logprobs[k - 1].items():
                tokens = mapped(gram)
                if tokens[-1] < 0:
                    continue  # a token the model cannot emit (<unk> without a piece)
                context = state_of.get(tokens[:-1])
                if context is None:  # a history missing from a malformed file
                    continue
                keys.append(context * vocab + tokens[-1])
                logps.append(logp * LN10)
                nexts.append(longest_state(tokens if k < lm.order else tokens[1:]))
        if not keys:  # no n-gram above the unigrams: one key no query equals
            keys, logps, nexts = [-1], [0.0], [0]
        keys_t = torch.tensor(keys, dtype=torch.long)
        by_key = torch.argsort(keys_t)
        return cls(
            order=lm.order,
            vocab_size=vocab,
            start_state=state_of[(ids[BOS],)],
            end_id=ids[EOS],
            dense_scores=torch.tensor([unigram], dtype=torch.float32),
            dense_next=torch.tensor([unigram_next], dtype=torch.int32),
            keys=keys_t[by_key],
            arc_logp=torch.tensor(logps, dtype=torch.float32)[by_key],
            arc_next=torch.tensor(nexts, dtype=torch.long)[by_key],
            backoff_state=torch.tensor(backoff_state, dtype=torch.long),
            backoff_weight=torch.tensor(backoff_weight, dtype=torch.float32),
            order_ends=tuple(order_ends),
            pieces_hash=vocabulary_hash(pieces),
        )

    def lookup(
        self, states: Tensor, tokens: Tensor | None = None, with_next: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """ln p(token | state) and (`with_next`) the state after it, for states (R,) and
        tokens (R, C) (or (C,), the same for every row; None: every token in id order):
        (R, C) tensors. The history backs off until it is a dense state (at most
        `sparse_levels` steps, an arc of a longer history winning), whose row is read."""
        levels = []  # per back-off step: the arc found, its score (with the back-offs), next
        state, backoff = states, None
        last = self.keys.numel() - 1
        if self.sparse_levels:
            backoff = torch.zeros(states.shape, dtype=self.dense_scores.dtype, device=states.device)
        if self.sparse_levels and tokens is None:
            tokens = torch.arange(self.vocab_size, device=states.device)
        if tokens is not None and tokens.dim() == 1:
            tokens = tokens.expand(states.size(0), -1)
        for _ in range(self.sparse_levels):
            sparse = state >= self.num_dense
            query = state[:, None] * self.vocab_size + tokens
            at = torch.searchsorted(self.keys, query).clamp_(max=last)
            found = (self.keys[at] == query) & sparse[:, None]
            nxt = self.arc_next[at] if with_next else None
            levels.append((found, backoff[:, None] + self.arc_logp[at], nxt))
            backoff = backoff + torch.where(sparse, self.backoff_weight[state], 0.0)
            state = torch.where(sparse, self.backoff_state[state], state)
        if tokens is None:  # every token of a dense state: its rows
            score = self.dense_scores.index_select(0, state)
            after = self.dense_next.index_select(0, state).long() if with_next else None
        else:
            score = self.dense_scores[state[:, None], tokens]
            after = self.dense_next[state[:, None], tokens].long() if with_next else None
        if levels:
            score = backoff[:, None] + score
        for found, logp, nxt in reversed(levels):  # the longest history that has the arc wins
            score = torch.where(found, logp, score)
            if with_next:
                after = torch.where(found, nxt, after)
        return score, after

    def all_scores(self, states: Tensor) -> Tensor:
        """ln p(token | state) of every token (R, V) for states (R,)."""
        return self.lookup(states, None, with_next=False)[0]

    def step(self, states: Tensor, tokens: Tensor) -> Tensor:
        """The states (R,) after `tokens` (R,)."""
        if not self.sparse_levels:  # every state dense: one gather
            return self.dense_next[states, tokens].long()
        return self.lookup(states, tokens[:, None])[1][:, 0]

    def end_scores(self, states: Tensor) -> Tensor:
        """ln p(</s> | state) (R,) for states (R,)."""
        end = torch.full((1,), self.end_id, device=states.device)
        return self.lookup(states, end, with_next=False)[0][:, 0]

    def log_prob(self, tokens: Sequence[int], end: bool = True) -> float:
        """ln p of a token sequence from ``<s>`` (and ``</s>`` when `end`), for checks."""
        state = torch.tensor([self.start_state], device=self.device)
        total = 0.0
        for token in [*tokens, *([self.end_id] if end else [])]:
            score, after = self.lookup(state, torch.tensor([[token]], device=self.device))
            total += float(score[0, 0])
            state = after[:, 0]
        return total

    def save(self, path: str | Path, stamp: str = "") -> None:
        """Write the tensor form (torch.save) atomically, with `stamp`: what it was made
        from (`load_token_lm`: the ARPA file's size and time)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields["dense_scores"] = self.dense_scores[:1]  # the root's row; the rest is rebuilt
        fields["dense_next"] = self.dense_next[:1]
        torch.save({"version": _TABLES_VERSION, "stamp": stamp, **fields}, tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> tuple[TokenLm, str]:
        """A tensor form `save` wrote, and its stamp."""
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved.pop("version", None) != _TABLES_VERSION:
            raise ValueError(f"{path}: not a token LM of this version (write it again)")
        stamp = saved.pop("stamp", "")
        return cls(**saved), stamp


def vocabulary_hash(pieces: Sequence[str]) -> str:
    """A short hash of a vocabulary's pieces in order."""
    return hashlib.sha256("\n".join(pieces).encode("utf-8")).hexdigest()[:16]


def load_token_lm(path: str | Path, pieces: Sequence[str]) -> TokenLm:
    """The LM at `path` over the vocabulary `pieces`: an ARPA file (plain or gzipped: read,
    and its tensor form cached beside it as ``<path>.<vocabulary>.pt``, reused while the
    ARPA file is unchanged) or such a cache itself. Errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"language model not found: {path}")
    digest = vocabulary_hash(pieces)
    if path.suffix == ".pt":
        lm = TokenLm.load(path)[0]
        if lm.pieces_hash != digest:
            raise ValueError(f"{path}: made for another vocabulary than this model's")
        return lm
    stat = path.stat()
    cache = path.with_name(f"{path.name}.{digest}.pt")
    stamp = f"{stat.st_size}:{stat.st_mtime_ns}"
    if cache.is_file():
        try:
            lm, made_from = TokenLm.load(cache)
            if made_from == stamp:
                return lm
        except Exception as err:  # noqa: BLE001 (a broken cache is rebuilt)
            log.warning("%s: cannot read the cached tensor form (%s); rebuilding it", cache, err)
    lm = TokenLm.from_ngram(read_arpa(path), pieces, source=str(path))
    try:
        lm.save(cache, stamp)
    except OSError as err:  # a read-only directory: no cache, no harm
        log.info("not caching %s's tensor form: %s", path, err)
    return lm


def free_bytes(device: torch.device) -> int:
    """Memory free for new tensors on `device` (CUDA: the device's; else available RAM)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class LmFusion:
    """Shallow fusion of `lm` with `weight` and, optionally, LODR: `lodr` subtracted with
    `lodr_weight` (see the module's docstring). `blank_id`: the token no LM scores (None:
    every token is scored, an attention decoder's vocabulary)."""

    lm: TokenLm
    weight: float
    lodr: TokenLm | None = None
    lodr_weight: float = 0.0
    blank_id: int | None = None
    _variants: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_lm_weight("lm_weight", self.weight)
        check_lm_weight("lodr_weight", self.lodr_weight)
        check_lodr_below_lm(self.weight, self.lodr_weight)
        if self.lodr is not None and self.lodr.vocab_size != self.lm.vocab_size:
            raise ValueError(
                f"the LM has {self.lm.vocab_size} tokens and the LODR LM {self.lodr.vocab_size}"
            )

    @property
    def parts(self) -> list[tuple[TokenLm, float]]:
        """Each LM with its signed weight."""
        parts = [(self.lm, self.weight)]
        if self.lodr is not None:
            parts.append((self.lodr, -self.lodr_weight))
        return parts

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def device(self) -> torch.device:
        return self.lm.device

    def nbytes(self) -> int:
        return sum(lm.nbytes() for lm, _ in self.parts)

    def to(self, device: torch.device | str) -> LmFusion:
        lodr = None if self.lodr is None else self.lodr.to(device)
        if self.lm.device == torch.device(device) and lodr is self.lodr:
            return self
        return LmFusion(self.lm.to(device), self.weight, lodr, self.lodr_weight, self.blank_id)

    def for_model(
        self, vocab_size: int, blank_id: int | None, device: torch.device | str
    ) -> LmFusion:
        """This fusion on `device` for a model of `vocab_size` tokens whose blank (None:
        none) is not scored; a ValueError when the LM is over another vocabulary."""
        if vocab_size != self.vocab_size:
            raise ValueError(
                f"the LM is over {self.vocab_size} tokens, the model has {vocab_size}: "
                "an LM trained with another tokenizer"
            )
        key = (blank_id, str(torch.device(device)))
        fusion = self._variants.get(key)  # one object per use, so that progresses stack
        if fusion is None:
            fusion = self
            if blank_id != self.blank_id:
                fusion = LmFusion(self.lm, self.weight, self.lodr, self.lodr_weight, blank_id)
            fusion = self._variants[key] = fusion.to(device)
        return fusion

    def start(self, rows: int, device: torch.device | str) -> Tensor:
        """The LM states (R, P) of `rows` hypotheses before their first token."""
        starts = [lm.start_state for lm, _ in self.parts]
        return torch.tensor(starts, device=device).expand(rows, -1).contiguous()

    def scores(self, states: Tensor) -> Tensor:
        """The fused LM score of every next token (R, V) for states (R, P), 0 for blank."""
        total = None
        for p, (lm, weight) in enumerate(self.parts):
            part = lm.all_scores(states[:, p]) * weight  # (no fused multiply-add: LODR with
            total = part if total is None else total + part  # the LM itself cancels exactly)
        if self.blank_id is not None:
            total[:, self.blank_id] = 0.0
        return total

    def step(self, states: Tensor, tokens: Tensor) -> Tensor:
        """The states (R, P) after `tokens` (R,)."""
        return torch.stack(
            [lm.step(states[:, p], tokens) for p, (lm, _) in enumerate(self.parts)], 1
        )

    def end_scores(self, states: Tensor) -> Tensor:
        """The fused score of ending the sentence (R,) in states (R, P)."""
        total = torch.zeros(states.size(0), device=states.device)
        for p, (lm, weight) in enumerate(self.parts):
            total = total + weight * lm.end_scores(states[:, p])
        return total

    def check_fits(self, device: torch.device | str, free: int | None = None) -> None:
        """A one-line MemoryError, before decoding starts, when the LMs' tensors take more
        than half the memory free on `device` (`free` bytes; None: as measured now)."""
        device = torch.device(device)
        need = self.nbytes()
        free = free_bytes(device) if free is None else free
        if need > free // 2:
            raise MemoryError(
                f"the language model's tables take {need / 1e9:.2f} GB, more than half the "
                f"{free / 1e9:.2f} GB free on {device}: prune it (fewer n-grams or a lower "
                "order) or decode on a device with more memory"
            )


def ready_for(lm: TokenLm, device: torch.device | str, dense: bool | None = None) -> TokenLm:
    """`lm` on `device`, checked to fit there first (`LmFusion.check_fits`), with dense
    rows (`TokenLm.densified`) order by order as far as they take at most
    `DENSE_MAX_BYTES` and half the memory left free (`dense` True: every state's; False:
    none)."""
    device = torch.device(device)
    LmFusion(lm, 0.0).check_fits(device)
    if dense is not False:
        budget = math.inf if dense else min(DENSE_MAX_BYTES, free_bytes(device) // 2)
        lm = lm.densified(budget)
    return lm.to(device)


def load_fusion(
    pieces: Sequence[str],
    lm: str | Path,
    lm_weight: float,
    lodr: str | Path | None = None,
    lodr_weight: float = 0.0,
    device: torch.device | str = "cpu",
    dense: bool | None = None,
) -> LmFusion:
    """Shallow fusion of the LM file `lm` (ARPA or its cached tensor form) with `lm_weight`,
    minus the LODR LM `lodr` (None: none) with `lodr_weight`, over the vocabulary `pieces`,
    on `device` (checked to fit before anything moves there). `dense`: expand each LM to
    dense tables (`TokenLm.densified`; None: where they take at most `DENSE_MAX_BYTES` and
    fit, False: never)."""
    lm_weight = check_lm_weight("lm_weight", lm_weight)
    lodr_weight = check_lm_weight("lodr_weight", lodr_weight)
    if lodr is None and lodr_weight:
        raise ValueError("a LODR weight needs a LODR LM (--lodr)")
    fusion = LmFusion(
        load_token_lm(lm, pieces),
        lm_weight,
        None if lodr is None else load_token_lm(lodr, pieces),
        lodr_weight,
    )
    fusion.check_fits(device)
    lm_, lodr_ = (
        None if t is None else ready_for(t, device, dense) for t in (fusion.lm, fusion.lodr)
    )
    return LmFusion(lm_, lm_weight, lodr_, lodr_weight)

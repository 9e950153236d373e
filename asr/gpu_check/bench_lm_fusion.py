"""GPU bench, section `lm-fusion`: what fusing a token n-gram language model costs the
transducer's searches on a GPU (issue 67: shallow fusion and LODR in every search).

Targets (issue 67): with an LM, greedy search keeps at least 0.8 of its speed (RTFx)
without one, and a beam at least 0.75 of the same beam's; `ratio` = search seconds without
the LM / with it. `scripts/benchmark_lm.py` measures the same on a CPU (one thread, the
demo's trained model and LMs); here greedy search is the label-looping search replayed from
a CUDA graph, the LM's states and scores in the graph's static buffers.

Model and inputs, as the `decode` section's: `librispeech_transducer` (102 M, BPE 1,024)
with seeded random weights, float32, and `utterances` random feature sequences evenly
spread over 2-14 s (LibriSpeech's test sets average 7.4 s), encoded once before anything is
timed: what is timed is the search alone, on the encoder output.

Language models: token n-grams of orders 3 and 6 (shallow fusion, weight `LM_WEIGHT`) and
a LODR bigram (subtracted, `LODR_WEIGHT`), `scripts/benchmark_lm.py`'s default weights,
estimated by `asr.decoding.kneser_ney.KneserNeyCounter` (modified Kneser-Ney) from about
`lm_tokens` tokens of seeded text over the model's vocabulary (`lm_text`): sentences of 2-7
phrases drawn by a Zipf law from `phrases` phrases of 1-5 tokens, themselves drawn by a
Zipf law over the text tokens, so that n-grams repeat as in text (at the GPU's sizes the
6-gram has about 320 k histories; the demo grammar's, 1.5 M). Each is in the tensor form
the searches use (`TokenLm`), on the device, with the dense rows `load_fusion` gives it (as
far as `DENSE_MAX_BYTES` holds them): the 6-gram's longest histories still walk their
back-off (`sparse_levels` in its `lm` record), as a large LM's do. The searches use
`lm3`, `lm6` and `lm6+lodr2` (LODR's bigram is all dense: its cost hardly depends on the
order beside it).

Random weights emit at a random rate, and an LM's scores make tokens dearer: at the plain
search's blank bias a random model emits hardly a token with an LM (a search cheaper than a
trained model's), and a beam, summing over alignments, emits fewer than greedy search at
the same bias (with random weights, whose tokens are never sure, none at all). So every
search and LM gets its own blank shift (bisection, `calibrate_blank`) at which it emits
LibriSpeech's 3.8 tokens a second (`calibration` records; each `cost` record counts the
tokens).

Measured, each search without an LM and with each LM, alternating: in a round every batch
is searched by every variant before the next batch, the variants' order reversed from round
to round, so that drift in the machine's speed hits them alike; the device is synchronized
before and after each search. One `cost` record per search, batch size and LM: median
seconds per round with and without the LM, their ratio against the target, search RTFx,
tokens, and how many utterances the LM changed; `targets` lists every ratio.

- greedy (`LabelLoopingGreedy(loops="fused")`: on CUDA the fused step replayed from a CUDA
  graph, on a CPU the same step run eagerly) at each of `greedy_batch_sizes`, the smallest
  first (kept buffers only grow). Checked: the kept search of each LM replayed a captured
  graph (`graph` records; a failure if it ran eagerly: its capture failed), and at the
  first batch size its tokens and frames with each of `CHECKED` equal frame-looping greedy
  search's with the same LM (`agreement`; a failure if not).
- beam (`BeamSearch`, beam `beam_size`) on `beam_batch` utterances (every few of the set,
  their durations spread alike) in one batch, its shifts calibrated on the shortest of
  them (`beam_plan`).

Time: the section's 50 s hold the imports (`STARTUP_S`), the model, the LMs (counting and
conversion: about 5 s of a CPU), the calibrations and the searches. The rounds stop after
the first when the time left would not hold another (`rounds` in each `cost` record), and
the beam's calibration takes as many bisection steps as the time left holds once a round
of the beam is kept for.

A rehearsal runs `experiment=demo`'s shapes and tiny LMs on the CPU: its figures say
nothing of a GPU, so its ratios and calibrations give no warning.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate
from typing import Any

import numpy as np
import torch
from torch import Tensor

from asr.decoding.cuda_graphs import _KEPT
from asr.decoding.fusion import DENSE_MAX_BYTES, LmFusion, TokenLm, ready_for
from asr.decoding.hypotheses import TimedTokens
from asr.decoding.kneser_ney import KneserNeyCounter
from asr.decoding.label_looping import LabelLoopingGreedy, _LabelLoops
from asr.decoding.search import TransducerSearch, decode_with
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from asr.frames import FRAMES_PER_SECOND
from asr.gpu_check.facts import device_facts, project_commit
from asr.gpu_check.random_models import (
    RATE_TOLERANCE,
    TOKENS_PER_SECOND,
    Search,
    blank_shift,
    calibrate_blank,
    random_features,
)
from asr.gpu_check.random_models import build as build_model_of
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import clock
from asr.models.build import count_parameters
from asr.models.transducer import Transducer
from asr.tokens import SPECIAL_PIECES
from asr.training.oomptimizer import compose_config

STARTUP_S = 10.0  # of the section's limit: the imports before `run`
LM_WEIGHT = 0.3  # scripts/benchmark_lm.py's defaults
LODR_WEIGHT = 0.1
TARGETS = {"greedy": 0.8, "beam": 0.75}  # issue 67: RTFx with an LM / RTFx without
PLAIN = "none"  # the variant without an LM
CHECKED = ("lm3", "lm6+lodr2")  # greedy with these must equal frame looping's output
FIRST_TEXT_ID = len(SPECIAL_PIECES)  # ids below are blank, <unk>, <s>, </s>
GREEDY = GreedyOptions()
NEAR_SPAN = 4.0  # of the blank shift around a guess (the plain search's or greedy search's)
LM_SLOWDOWN = 1.3  # a search with an LM against one without, as a beam's time is planned
CALIBRATION_S = 8.0  # of audio, at least, on which a beam's blank shift is calibrated


@dataclass(frozen=True)
class FusionCase:
    """The model (`preset`, `vocab_size`), the utterances, the searches' batch sizes and
    beam, the LMs' text (about `lm_tokens` tokens from `phrases` phrases), at most
    `rounds` timed rounds per search and batch size, and at most `calibration_steps`
    bisection steps per blank shift (`calibrate_blank`)."""

    preset: str
    vocab_size: int
    utterances: int
    shortest_s: float
    longest_s: float
    greedy_batch_sizes: tuple[int, ...]
    beam_size: int
    beam_batch: int
    lm_tokens: int
    phrases: int
    rounds: int
    calibration_steps: int  # of each blank shift's bisection, at most


GPU_CASE = FusionCase(
    "librispeech_transducer", 1024, utterances=64, shortest_s=2.0, longest_s=14.0,
    greedy_batch_sizes=(16, 64), beam_size=8, beam_batch=16, lm_tokens=500_000,
    phrases=3000, rounds=3, calibration_steps=14,
)  # fmt: skip
REHEARSAL_CASE = FusionCase(
    "demo", 64, utterances=8, shortest_s=1.0, longest_s=2.0, greedy_batch_sizes=(4, 8),
    beam_size=8, beam_batch=4, lm_tokens=4000, phrases=60, rounds=2, calibration_steps=10,
)  # fmt: skip


# -- the language models --------------------------------------------------------------------


def _zipf(n: int, exponent: float = 1.1) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


def lm_text(vocab_size: int, tokens: int, phrases: int, seed: int = 0) -> list[list[int]]:
    """Seeded sentences of text token ids (`FIRST_TEXT_ID` and above), about `tokens` in
    all: each 2-7 phrases drawn by a Zipf law from `phrases` phrases of 1-5 tokens, whose
    tokens are drawn by a Zipf law over the text tokens (in a seeded order)."""
    rng = np.random.default_rng(seed)
    text_ids = rng.permutation(np.arange(FIRST_TEXT_ID, vocab_size))
    lengths = rng.integers(1, 6, size=phrases)
    drawn = rng.choice(text_ids.size, size=int(lengths.sum()), p=_zipf(text_ids.size))
    inventory = [p.tolist() for p in np.split(text_ids[drawn], np.cumsum(lengths)[:-1])]
    per_sentence = rng.integers(2, 8, size=max(1, tokens // 9))  # 4.5 phrases x ~2 tokens
    picks = rng.choice(phrases, size=int(per_sentence.sum()), p=_zipf(phrases)).tolist()
    sentences, at, total = [], 0, 0
    for count in per_sentence.tolist():
        sentence = [t for i in picks[at : at + count] for t in inventory[i]]
        sentences.append(sentence)
        at, total = at + count, total + len(sentence)
        if total >= tokens:
            break
    return sentences


def model_pieces(vocab_size: int) -> list[str]:
    """Piece names of a random model's ids: the special pieces, then t4, t5, ..."""
    specials = [SPECIAL_PIECES[i] for i in range(FIRST_TEXT_ID)]
    return specials + [f"t{i}" for i in range(FIRST_TEXT_ID, vocab_size)]


def build_fusions(
    report: Report, case: FusionCase, device: torch.device
) -> dict[str, LmFusion | None]:
    """The LMs searched with, by name (`PLAIN`: none): n-grams of orders 3 and 6 and the
    LODR bigram estimated from `lm_text`, in tensor form on `device` with dense rows as
    `load_fusion` gives them; an `lm` record each."""
    pieces = model_pieces(case.vocab_size)
    sentences = lm_text(case.vocab_size, case.lm_tokens, case.phrases)
    lms: dict[int, TokenLm] = {}
    built: dict[int, dict[str, Any]] = {}
    for order in (3, 6, 2):
        began = time.perf_counter()
        counter = KneserNeyCounter(order, pieces.__getitem__)
        for sentence in sentences:
            counter.add(sentence)
        ngram = counter.estimate()
        lms[order] = TokenLm.from_ngram(ngram, pieces, source=f"the {order}-gram")
        built[order] = {"ngrams": ngram.counts(), "build_s": time.perf_counter() - began}
    on_device = {}
    for order, lm in lms.items():  # as load_fusion does, on the device (faster) here
        on_device[order] = densified(lm, device)
        report.record(
            "lm", order=order, **built[order], states=lm.num_states, arcs=lm.num_arcs,
            dense_states=on_device[order].num_dense, dense_order=on_device[order].dense_order,
            sparse_levels=on_device[order].sparse_levels, bytes=on_device[order].nbytes(),
            text_sentences=len(sentences), text_tokens=sum(map(len, sentences)),
        )  # fmt: skip
    return {
        PLAIN: None,
        "lm3": LmFusion(on_device[3], LM_WEIGHT),
        "lm6": LmFusion(on_device[6], LM_WEIGHT),
        "lm6+lodr2": LmFusion(on_device[6], LM_WEIGHT, on_device[2], LODR_WEIGHT),
    }


def densified(lm: TokenLm, device: torch.device) -> TokenLm:
    """`lm` on `device` with the dense rows `load_fusion` gives it (as far as they take at
    most `DENSE_MAX_BYTES` and fit the device), checked to fit first."""
    return ready_for(lm, device)


# -- the searches, alternating --------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """An LM (None: none) and the blank bias shift at which a search emits about
    `TOKENS_PER_SECOND` with it (`calibrated`)."""

    fusion: LmFusion | None
    shift: float


@dataclass
class Rounds:
    """Per variant: each round's seconds (all batches), and the first round's hypotheses
    in utterance order."""

    seconds: dict[str, list[float]]
    hyps: dict[str, list[TimedTokens]]


def tokens_of(model: Transducer, search: TransducerSearch, fusion: LmFusion | None) -> Search:
    return lambda enc, lens: [h.tokens for h in decode_with(search, model, enc, lens, None, fusion)]


def calibrated(
    report: Report,
    model: Transducer,
    search: TransducerSearch,
    batches: Sequence[tuple[Tensor, Tensor]],
    audio_s: float,
    fusions: dict[str, LmFusion | None],
    judge: bool,
    steps: int,
    near: dict[str, Variant] | None = None,
) -> dict[str, Variant]:
    """Each LM's variant with its own blank shift, at which `search` emits about
    `TOKENS_PER_SECOND` on `batches`: an LM's scores make tokens dearer (at the plain
    search's shift a random model emits hardly any: a search cheaper than a trained
    model's), and a beam, summing over alignments, emits fewer than greedy search at the
    same shift (with random weights, whose tokens are never sure, none at all). The plain
    search's shift is searched from 0 (or from its shift in `near`, another search's
    variants), each LM's from the plain one's moved by the LM's offset in `near`, within
    `NEAR_SPAN`; a `calibration` record each."""
    variants: dict[str, Variant] = {}
    for name, fusion in fusions.items():
        if name == PLAIN:
            around = 0.0 if near is None else near[PLAIN].shift
            span = 30.0 if near is None else NEAR_SPAN
        else:
            offset = 0.0 if near is None else near[name].shift - near[PLAIN].shift
            around, span = variants[PLAIN].shift + offset, NEAR_SPAN
        shift, rate = calibrate_blank(
            model, batches, audio_s, tokens_of(model, search, fusion), around, span, steps
        )
        variants[name] = Variant(fusion, shift)
        report.record(
            "calibration", search=search_name(search), lm=name, blank_bias_shift=shift,
            tokens_per_second=rate, target_tokens_per_second=TOKENS_PER_SECOND,
        )  # fmt: skip
        if judge and abs(rate / TOKENS_PER_SECOND - 1) > RATE_TOLERANCE:
            report.warn(
                f"{search_name(search)} search with {name} emits {rate:.2f} tokens/s, not ~3.8"
            )
    return variants


def search_name(search: TransducerSearch) -> str:
    return "beam" if isinstance(search, BeamSearch) else "greedy"


@torch.inference_mode()
def alternating(
    model: Transducer,
    search: TransducerSearch,
    batches: Sequence[tuple[Tensor, Tensor]],
    variants: dict[str, Variant],
    max_rounds: int,
    deadline: float,
) -> Rounds:
    """Every batch searched with every variant before the next batch, the order of the
    variants reversed each round, the device synchronized before and after each search;
    rounds until `max_rounds`, or until the time left (`deadline`, `time.monotonic()`)
    would not hold another as long as the last."""
    device = batches[0][0].device.type
    names = list(variants)
    out = Rounds({n: [] for n in names}, {n: [] for n in names})
    for r in range(max_rounds):
        began = time.monotonic()
        order = names if r % 2 == 0 else names[::-1]
        totals = dict.fromkeys(names, 0.0)
        for enc, lens in batches:
            for name in order:
                variant = variants[name]
                with blank_shift(model, variant.shift):
                    start = clock(device)
                    found = decode_with(search, model, enc, lens, None, variant.fusion)
                    totals[name] += clock(device) - start
                if r == 0:
                    out.hyps[name] += found
        for name in names:
            out.seconds[name].append(totals[name])
        now = time.monotonic()
        if now + (now - began) > deadline:
            break
    return out


def unshifted(fusions: dict[str, LmFusion | None]) -> dict[str, Variant]:
    return {name: Variant(fusion, 0.0) for name, fusion in fusions.items()}


@torch.inference_mode()
def warm_up(
    model: Transducer,
    search: TransducerSearch,
    batch: tuple[Tensor, Tensor],
    variants: dict[str, Variant],
) -> None:
    """One search of `batch` with each variant: kernels, and a label-looping search's
    buffers and graph (kept per LM), captured for the batch it is given."""
    for variant in variants.values():
        with blank_shift(model, variant.shift):
            decode_with(search, model, *batch, None, variant.fusion)


def cost_records(
    report: Report,
    kind: str,
    batch_size: int,
    rounds: Rounds,
    audio_s: float,
    judge: bool,
    **fields: Any,
) -> list[dict[str, Any]]:
    """A `cost` record per LM: its median seconds per round against the plain search's
    (the same rounds), their ratio against `TARGETS[kind]`; a warning (`judge`: on a GPU)
    where it is missed."""
    plain = statistics.median(rounds.seconds[PLAIN])
    plain_tokens = [h.tokens for h in rounds.hyps[PLAIN]]
    target, lines = TARGETS[kind], []
    for name, seconds in rounds.seconds.items():
        if name == PLAIN:
            continue
        with_lm = statistics.median(seconds)
        ratio = plain / with_lm
        tokens = [h.tokens for h in rounds.hyps[name]]
        line = {
            "search": kind, **fields, "batch_size": batch_size, "lm": name,
            "utterances": len(tokens), "audio_seconds": audio_s, "rounds": len(seconds),
            "search_seconds": with_lm, "search_seconds_plain": plain, "ratio": ratio,
            "target": target, "meets_target": ratio >= target,
            "search_rtfx": audio_s / with_lm, "search_rtfx_plain": audio_s / plain,
            "tokens": sum(map(len, tokens)), "tokens_plain": sum(map(len, plain_tokens)),
            "utterances_changed": sum(a != b for a, b in zip(tokens, plain_tokens, strict=True)),
        }  # fmt: skip
        report.record("cost", **line)
        lines.append(line)
        if judge and ratio < target:
            report.warn(
                f"{kind} at batch {batch_size} with {name}: {ratio:.3f} of the speed without "
                f"an LM, below the {target} target"
            )
    return lines


def kept_key(
    model: Transducer, fusion: LmFusion | None, device: torch.device, graphs: bool = True
) -> tuple:
    """The key under which `LabelLoopingGreedy.advance` keeps the label-looping search of
    `model` with `fusion` (None: none) on `device` (`asr.decoding.cuda_graphs.kept_with`):
    one per LM variant (`LmFusion.for_model`), by its id, as
    tests/decoding/test_fusion_label_looping.py reads it."""
    key: tuple = (_LabelLoops, GREEDY, False, graphs)
    if fusion is not None:
        key += (id(fusion.for_model(model.vocab_size, model.blank_id, device)),)
    return key


def graph_captured(model: Transducer, fusion: LmFusion | None, device: torch.device) -> bool | None:
    """Whether the label-looping search kept for `model` with `fusion` on `device` replays
    a captured CUDA graph (False: its capture failed, it ran eagerly); None where no search
    with graphs is kept (not on CUDA)."""
    kept = _KEPT.get(model, {}).get(kept_key(model, fusion, device))
    graphed = None if kept is None else kept.kept.graphed
    return None if graphed is None else graphed.captured


@torch.inference_mode()
def check_agreement(
    report: Report,
    model: Transducer,
    batches: Sequence[tuple[Tensor, Tensor]],
    found: Rounds,
    variants: dict[str, Variant],
    batch_size: int,
) -> None:
    """Label looping's tokens and frames with each of `CHECKED` (the first round's) must
    be frame-looping greedy search's with the same LM (and blank shift)."""
    frame = FrameLoopingGreedy(GREEDY)
    for name in CHECKED:
        variant = variants[name]
        with blank_shift(model, variant.shift):
            expected = [
                h
                for enc, lens in batches
                for h in decode_with(frame, model, enc, lens, None, variant.fusion)
            ]
        differ = sum(
            (a.tokens, a.frames) != (b.tokens, b.frames)
            for a, b in zip(found.hyps[name], expected, strict=True)
        )
        report.record(
            "agreement", lm=name, batch_size=batch_size, utterances=len(expected),
            tokens=sum(len(h.tokens) for h in expected), label_looping_differs=differ,
        )  # fmt: skip
        if differ:
            report.fail(
                f"with {name}, label-looping greedy search differs from frame-looping greedy "
                f"search on {differ} of {len(expected)} utterances (batch {batch_size})"
            )


# -- the section ----------------------------------------------------------------------------


def groups(
    enc: Tensor, lens: Tensor, rows: Sequence[int], size: int
) -> list[tuple[Tensor, Tensor]]:
    """The utterances `rows` of the encoder output (N, T, D) in batches of `size`, each cut
    to its longest."""
    out = []
    for start in range(0, len(rows), size):
        at = torch.tensor(rows[start : start + size], device=enc.device)
        group_lens = lens[at]
        out.append((enc[at, : int(group_lens.max())], group_lens))
    return out


@torch.inference_mode()
def encoded(
    model: Transducer, features: list[Tensor], size: int, device: str
) -> tuple[Tensor, Tensor]:
    """Every utterance's encoder output, padded into one (N, T, D) tensor, and lengths."""
    outs, lens = [], []
    for start in range(0, len(features), size):
        group = features[start : start + size]
        n = torch.tensor([f.size(0) for f in group], device=device)
        padded = torch.nn.utils.rnn.pad_sequence(list(group), batch_first=True).to(device)
        out, out_lens = model.encode(padded, n)
        outs += list(out.unbind(0))
        lens.append(out_lens)
    return torch.nn.utils.rnn.pad_sequence(outs, batch_first=True), torch.cat(lens)


@dataclass(frozen=True)
class Inputs:
    """The encoder output of every utterance (N, T, D), its lengths (N,) and each
    utterance's audio seconds."""

    enc: Tensor
    lens: Tensor
    seconds: list[float]

    def groups(self, rows: Sequence[int], size: int) -> list[tuple[Tensor, Tensor]]:
        return groups(self.enc, self.lens, rows, size)


def bench_greedy(
    report: Report,
    case: FusionCase,
    model: Transducer,
    inputs: Inputs,
    fusions: dict[str, LmFusion | None],
    deadline: float,
    judge: bool,
) -> tuple[list[dict[str, Any]], dict[str, Variant]]:
    """Label looping at each batch size, the smallest first (kept buffers only grow: a
    larger batch first would leave its rows in every later graph); each LM's blank shift
    calibrated at the first."""
    search = LabelLoopingGreedy(GREEDY, loops="fused")
    device = inputs.enc.device
    rows, lines = list(range(inputs.enc.size(0))), []
    variants: dict[str, Variant] = {}
    for i, size in enumerate(sorted(case.greedy_batch_sizes)):
        batches = inputs.groups(rows, size)
        # the longest batch first: its buffers and graph (one per LM) serve every batch
        warm_up(model, search, batches[-1], variants or unshifted(fusions))
        if i == 0:
            audio_s = sum(inputs.seconds)
            variants = calibrated(
                report, model, search, batches, audio_s, fusions, judge, case.calibration_steps
            )
        found = alternating(model, search, batches, variants, case.rounds, deadline)
        lines += cost_records(report, "greedy", size, found, sum(inputs.seconds), judge,
                              loops="fused", cuda_graphs=device.type == "cuda")  # fmt: skip
        for name, fusion in fusions.items():
            captured = graph_captured(model, fusion, device)
            report.record("graph", batch_size=size, lm=name, captured=captured)
            if device.type == "cuda" and not captured:
                report.fail(f"label looping with {name} at batch {size} ran without its CUDA "
                            "graph (its capture failed: see the log)")  # fmt: skip
        if i == 0:
            check_agreement(report, model, batches, found, variants, size)
    return lines, variants


def bench_beam(
    report: Report,
    case: FusionCase,
    model: Transducer,
    inputs: Inputs,
    greedy: dict[str, Variant],
    deadline: float,
    judge: bool,
) -> list[dict[str, Any]]:
    """Beam search of `case.beam_batch` utterances spread over the durations, one batch.
    Its blank shifts are calibrated on the shortest of them (`CALIBRATION_S` of audio: a
    beam's bisection is dear), starting from greedy search's (`greedy`), in as many steps
    as the time left holds once a round is kept for (`beam_plan`: both timed first, one
    plain search each)."""
    fusions = {name: variant.fusion for name, variant in greedy.items()}
    search = BeamSearch(BeamOptions(beam_size=case.beam_size))
    count = inputs.enc.size(0)
    rows = list(range(0, count, max(1, count // case.beam_batch)))[: case.beam_batch]
    seconds = [inputs.seconds[r] for r in rows]
    shortest = min(bisect.bisect_left(list(accumulate(seconds)), CALIBRATION_S) + 1, len(rows))
    (calibration,) = inputs.groups(rows[:shortest], shortest)
    (batch,) = inputs.groups(rows, len(rows))
    plain = {PLAIN: Variant(None, greedy[PLAIN].shift)}
    warm_up(model, search, calibration, plain)  # kernels; then each timed once
    calibration_s, pass_s = (timed_once(model, search, b, plain) for b in (calibration, batch))
    round_s = pass_s * len(fusions) * LM_SLOWDOWN
    share = (deadline - time.monotonic() - round_s) / len(fusions)
    fits = share / (calibration_s * LM_SLOWDOWN) - 1  # passes after the first
    steps = int(max(0, min(case.calibration_steps, fits)))
    report.record(
        "beam_plan", calibration_utterances=shortest, calibration_seconds=sum(seconds[:shortest]),
        calibration_pass_s=calibration_s, pass_s=pass_s, round_estimate_s=round_s,
        calibration_steps=steps,
    )  # fmt: skip
    audio_s = sum(seconds[:shortest])
    variants = calibrated(
        report, model, search, [calibration], audio_s, fusions, judge, steps, greedy
    )
    found = alternating(model, search, [batch], variants, case.rounds, deadline)
    return cost_records(report, "beam", len(rows), found, sum(seconds), judge,
                        beam_size=case.beam_size)  # fmt: skip


@torch.inference_mode()
def timed_once(
    model: Transducer,
    search: TransducerSearch,
    batch: tuple[Tensor, Tensor],
    variants: dict[str, Variant],
) -> float:
    """Seconds of one search of `batch` with each of `variants`, in all."""
    start = clock(batch[0].device.type)
    warm_up(model, search, batch, variants)
    return clock(batch[0].device.type) - start


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    deadline = began + options.limit_s - STARTUP_S
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    threads = torch.get_num_threads()
    if options.rehearsal:
        torch.set_num_threads(1)  # toy models: one thread is steadiest
    try:
        _run(report, case, options, deadline)
    finally:
        torch.set_num_threads(threads)


def _run(report: Report, case: FusionCase, options: SectionOptions, deadline: float) -> None:
    device = options.device
    input_dim = compose_config([f"experiment={case.preset}"]).model.encoder.input_dim
    features = random_features(case.utterances, case.shortest_s, case.longest_s, input_dim)
    seconds = [f.size(0) / FRAMES_PER_SECOND for f in features]
    report.record(
        "setup", **asdict(case), audio_seconds=sum(seconds), lm_weight=LM_WEIGHT,
        lodr_weight=LODR_WEIGHT, targets=TARGETS, dense_max_bytes=DENSE_MAX_BYTES,
        precision="float32", commit=project_commit(), **device_facts(device),
    )  # fmt: skip
    model = build_model_of(case.preset, case.vocab_size, device, Transducer)
    report.record("model", preset=case.preset, parameters=count_parameters(model))
    enc, lens = encoded(model, features, max(case.greedy_batch_sizes), device)
    inputs = Inputs(enc, lens, seconds)
    fusions = build_fusions(report, case, enc.device)
    judge = not options.rehearsal
    lines, greedy = bench_greedy(report, case, model, inputs, fusions, deadline, judge)
    lines += bench_beam(report, case, model, inputs, greedy, deadline, judge)
    report.record("targets", cases=[
        {k: line[k] for k in ("search", "batch_size", "lm", "ratio", "target", "meets_target")}
        for line in lines
    ])  # fmt: skip

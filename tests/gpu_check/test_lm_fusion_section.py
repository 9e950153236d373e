"""The GPU bench's `lm-fusion` section rehearsed in this process at toy sizes on the CPU
(`experiment=demo`'s shapes, tiny LMs): its records and their fields; then its parts
alone: the LM text, the alternation, the judged ratios, the kept search's key (what the
CUDA-graph check reads) and the agreement check's failure (the whole bench through its
runner: test_gpu_bench.py)."""

import dataclasses
import io
import math
import time
from types import SimpleNamespace

import pytest
import torch

from asr.decoding.cuda_graphs import _KEPT
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.search import decode_with
from asr.decoding.transducer import FrameLoopingGreedy
from asr.gpu_check import bench_lm_fusion
from asr.gpu_check.bench_lm_fusion import (
    CHECKED,
    FIRST_TEXT_ID,
    GREEDY,
    PLAIN,
    REHEARSAL_CASE,
    TARGETS,
    Rounds,
    Variant,
    alternating,
    check_agreement,
    cost_records,
    graph_captured,
    kept_key,
    lm_text,
)
from asr.gpu_check.report import Report
from tests.decoding.test_fusion_label_looping import VOCAB, _batch, _fusion
from tests.decoding.test_transducer_beam import _random_model
from tests.gpu_check.section_reports import rehearse

VARIANTS = ["lm3", "lm6", "lm6+lodr2"]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return rehearse(bench_lm_fusion.run, tmp_path_factory.mktemp("lm_fusion"))


@pytest.mark.slow  # the module fixture: the section in about 10-15 s on one CPU thread
def test_the_lms_are_estimated_and_densified(rehearsal: dict) -> None:
    (setup,) = rehearsal["setup"]
    assert setup["greedy_batch_sizes"] == list(REHEARSAL_CASE.greedy_batch_sizes)
    assert setup["targets"] == TARGETS == {"greedy": 0.8, "beam": 0.75}
    assert (setup["lm_weight"], setup["lodr_weight"]) == (0.3, 0.1)
    lms = {lm["order"]: lm for lm in rehearsal["lm"]}
    assert sorted(lms) == [2, 3, 6]
    for order, lm in lms.items():
        assert len(lm["ngrams"]) == order and all(n > 0 for n in lm["ngrams"])
        assert lm["states"] >= lm["dense_states"] > 0 and lm["bytes"] > 0
        # the toy LMs fit in dense rows whole: no back-off walked
        assert lm["dense_order"] == order - 1 and lm["sparse_levels"] == 0
        assert lm["text_tokens"] >= REHEARSAL_CASE.lm_tokens


@pytest.mark.slow
def test_each_search_and_lm_gets_its_own_blank_shift(rehearsal: dict) -> None:
    calibrations = {(c["search"], c["lm"]): c for c in rehearsal["calibration"]}
    assert set(calibrations) == {(s, v) for s in ("greedy", "beam") for v in [PLAIN, *VARIANTS]}
    for c in calibrations.values():
        assert math.isfinite(c["blank_bias_shift"]) and c["target_tokens_per_second"] == 3.8
    # an LM makes tokens dearer: its searches need a lower blank to emit as often
    for search in ("greedy", "beam"):
        plain = calibrations[search, PLAIN]["blank_bias_shift"]
        assert all(calibrations[search, v]["blank_bias_shift"] < plain for v in VARIANTS)
    (plan,) = rehearsal["beam_plan"]
    assert plan["calibration_steps"] == REHEARSAL_CASE.calibration_steps  # no deadline here
    assert plan["pass_s"] > 0 and plan["round_estimate_s"] > plan["pass_s"]


@pytest.mark.slow
def test_every_case_is_timed_against_the_plain_search(rehearsal: dict) -> None:
    costs = {(c["search"], c["batch_size"], c["lm"]): c for c in rehearsal["cost"]}
    greedy = [("greedy", b, v) for b in REHEARSAL_CASE.greedy_batch_sizes for v in VARIANTS]
    beam = [("beam", REHEARSAL_CASE.beam_batch, v) for v in VARIANTS]
    assert list(costs) == greedy + beam
    for (search, _, _), c in costs.items():
        assert c["rounds"] == REHEARSAL_CASE.rounds  # no deadline outside the runner
        assert c["ratio"] == pytest.approx(c["search_seconds_plain"] / c["search_seconds"], 1e-4)
        assert c["search_rtfx"] == pytest.approx(c["audio_seconds"] / c["search_seconds"], 1e-4)
        assert c["target"] == TARGETS[search] and c["meets_target"] == (c["ratio"] >= c["target"])
        # the calibrated searches emit tokens, and the LM changes what they emit
        assert c["tokens"] > 0 and c["tokens_plain"] > 0 and c["utterances_changed"] > 0
    assert all(c["cuda_graphs"] is False for c in costs.values() if c["search"] == "greedy")
    assert all(c["beam_size"] == 8 for c in costs.values() if c["search"] == "beam")
    (targets,) = rehearsal["targets"]
    assert [(t["search"], t["batch_size"], t["lm"]) for t in targets["cases"]] == list(costs)


@pytest.mark.slow
def test_label_looping_with_each_lm_equals_frame_looping_and_no_graph_on_a_cpu(
    rehearsal: dict,
) -> None:
    agreements = rehearsal["agreement"]
    assert [a["lm"] for a in agreements] == list(CHECKED)
    for a in agreements:
        assert a["label_looping_differs"] == 0 and a["tokens"] > 0
        assert a["batch_size"] == min(REHEARSAL_CASE.greedy_batch_sizes)
        assert a["utterances"] == REHEARSAL_CASE.utterances
    graphs = rehearsal["graph"]
    assert len(graphs) == len(REHEARSAL_CASE.greedy_batch_sizes) * (1 + len(VARIANTS))
    assert all(g["captured"] is None for g in graphs)  # the fused step ran eagerly
    # a rehearsal judges nothing: its figures are of a CPU and a toy model
    (summary,) = rehearsal["summary"]
    assert summary == {"record": "summary", "failures": [], "warnings": []}


# -- the parts ------------------------------------------------------------------------------


def test_the_lm_text_is_seeded_text_tokens_that_repeat() -> None:
    sentences = lm_text(64, 3000, 40)
    assert sentences == lm_text(64, 3000, 40)
    assert sentences != lm_text(64, 3000, 40, seed=1)
    tokens = [t for s in sentences for t in s]
    assert 3000 <= len(tokens) < 3000 + 7 * 5  # stops at the sentence that reaches it
    assert min(tokens) >= FIRST_TEXT_ID and max(tokens) < 64
    trigrams = [tuple(s[i : i + 3]) for s in sentences for i in range(len(s) - 2)]
    assert len(set(trigrams)) < len(trigrams) / 2  # phrases repeat: n-grams do


def _timed_search(calls: list[str], seconds: dict[str, float]):
    """A stand-in search whose "time" is each LM's name's entry (a fake clock)."""

    class Search:
        def start(self, model, batch_size, device, biasing=None, first_frame=0, lm=None):
            return lm

        def advance(self, model, progress, encoder_out, encoder_lens):
            calls.append(progress)
            time.sleep(seconds[progress])
            return progress

        def best(self, progress):
            return [SimpleNamespace(tokens=[progress])]

    return Search()


def test_rounds_alternate_the_variants_and_stop_at_the_deadline() -> None:
    model = _random_model(VOCAB, "lstm")
    enc, lens = _batch()
    batches = [(enc[:2], lens[:2]), (enc[2:], lens[2:])]
    variants = {name: Variant(name, 0.0) for name in ("none", "a", "b")}
    calls: list[str] = []
    search = _timed_search(calls, {"none": 0.0, "a": 0.0, "b": 0.01})
    found = alternating(model, search, batches, variants, 3, math.inf)
    order = ["none", "a", "b"]
    assert calls == (order * 2) + (order[::-1] * 2) + (order * 2)  # per batch, reversed
    assert [len(s) for s in found.seconds.values()] == [3, 3, 3]
    assert min(found.seconds["b"]) >= 0.02  # two batches each round
    assert found.hyps["a"][0].tokens == ["a"] and len(found.hyps["a"]) == 2  # round 1's
    calls.clear()
    found = alternating(model, search, batches, variants, 3, time.monotonic())
    assert [len(s) for s in found.seconds.values()] == [1, 1, 1]  # at least one round


def test_a_ratio_below_the_target_warns_only_when_judged() -> None:
    hyps = [SimpleNamespace(tokens=[5, 6])]
    rounds = Rounds(
        {PLAIN: [1.0, 1.2, 1.1], "lm3": [1.3, 1.4, 1.5], "lm6": [1.2, 1.25, 1.3]},
        {PLAIN: hyps, "lm3": [SimpleNamespace(tokens=[5, 7])], "lm6": hyps},
    )
    for judge, warnings in ((False, 0), (True, 1)):
        report = Report(io.StringIO())
        lines = cost_records(report, "greedy", 16, rounds, 10.0, judge)
        assert [line["lm"] for line in lines] == ["lm3", "lm6"]
        assert lines[0]["ratio"] == pytest.approx(1.1 / 1.4)  # medians: 0.786 < 0.8
        assert lines[1]["ratio"] == pytest.approx(1.1 / 1.25) and lines[1]["meets_target"]
        assert (lines[0]["utterances_changed"], lines[1]["utterances_changed"]) == (1, 0)
        assert len(report.warnings) == warnings and report.failures == []
    assert "greedy at batch 16 with lm3: 0.786" in report.warnings[0]


def test_the_key_read_for_the_graph_is_the_kept_search_s() -> None:
    """`graph_captured` reads the search `LabelLoopingGreedy` keeps: the same key (with
    graphs on CUDA), here found kept without graphs, on the CPU."""
    model = _random_model(VOCAB, "lstm")
    enc, lens = _batch()
    fusion = _fusion(1.0, lodr=True)
    for lm in (None, fusion):
        decode_with(LabelLoopingGreedy(GREEDY, loops="fused"), model, enc, lens, None, lm)
        assert kept_key(model, lm, enc.device, graphs=False) in _KEPT[model]
        assert kept_key(model, lm, enc.device) not in _KEPT[model]
        assert graph_captured(model, lm, enc.device) is None


def test_label_looping_that_differs_from_frame_looping_fails() -> None:
    model = _random_model(VOCAB, "lstm")
    enc, lens = _batch()
    variants = {name: Variant(_fusion(0.5), 0.0) for name in CHECKED}
    frame = decode_with(FrameLoopingGreedy(GREEDY), model, enc, lens, None, variants["lm3"].fusion)
    i = next(i for i, h in enumerate(frame) if h.tokens)  # one whose frames can differ
    moved = [*frame[:i], dataclasses.replace(frame[i], frames=[f + 1 for f in frame[i].frames])]
    found = Rounds({}, {"lm3": frame, "lm6+lodr2": moved + frame[i + 1 :]})
    report = Report(io.StringIO())
    check_agreement(report, model, [(enc, lens)], found, variants, 5)
    assert len(report.failures) == 1
    assert "with lm6+lodr2, label-looping greedy search differs" in report.failures[0]
    assert "on 1 of 5 utterances (batch 5)" in report.failures[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_kept_search_with_an_lm_replays_its_graph() -> None:
    model = _random_model(VOCAB, "lstm").float().cuda()
    enc, lens = _batch()
    enc = enc.float().cuda()
    fusion = _fusion(1.0, lodr=True)
    decode_with(LabelLoopingGreedy(GREEDY, loops="fused"), model, enc, lens, None, fusion)
    assert graph_captured(model, fusion, enc.device) is True

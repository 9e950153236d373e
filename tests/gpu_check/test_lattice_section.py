"""The lattice section's referee and bounds on a small real batch (CPU), and its TDT
lattice comparison (the Triton kernel interpreted)."""

import io
import json

import torch

from asr.gpu_check.joiner_loss import loss_and_grads
from asr.gpu_check.lattice import (
    FP32_GRAD_RTOL,
    GRAD_RTOL,
    TDT_DURATIONS,
    TDT_TERMS,
    LatticeCase,
    check_tdt,
    disagreement,
    float64_reference,
    implementations,
    padding_gradient,
    random_batch,
    tdt_outputs,
    tdt_scores,
)
from asr.gpu_check.report import Report
from asr.losses import lattice as torch_lattice

CASE = LatticeCase(3, 30, 8, 17, 16, 12, 16, repeats=1)


def test_fp32_lattices_sit_within_the_tight_bound_of_float64_and_a_wrong_gradient_fails() -> None:
    joiner, inputs = random_batch(CASE, "cpu")
    reference = float64_reference(joiner, inputs)
    assert reference[0].dtype == inputs[0].dtype  # compared in fp32
    for name in ("torch", "torchaudio"):
        result = loss_and_grads(implementations()[name], joiner, inputs)
        assert disagreement(result, reference)["ok"], name
        assert padding_gradient(result, inputs) == 0.0

    result = loss_and_grads(implementations()["torch"], joiner, inputs)
    wrong = [g.clone() for g in result]
    wrong[1][0, 0] += 0.1 * reference[1].abs().max()  # a tenth of the largest entry
    found = disagreement(wrong, reference, FP32_GRAD_RTOL)
    assert not found["ok"] and 0.09 < found["grad_rel"]["encoder_out"] < 0.11
    nudged = [g.clone() for g in result]
    nudged[1][0, 0] += 0.01 * reference[1].abs().max()  # fp32-rounding sized: 1 %
    assert disagreement(nudged, reference, FP32_GRAD_RTOL)["ok"]
    assert not disagreement(nudged, reference, GRAD_RTOL)["ok"]


def test_a_gradient_on_padding_is_found() -> None:
    joiner, inputs = random_batch(CASE, "cpu")
    result = loss_and_grads(implementations()["torch"], joiner, inputs)
    frames, tokens = inputs[3], inputs[4]
    short = int(frames.argmin())
    result[1][short, int(frames[short])] = 0.25  # the first frame past its length
    assert padding_gradient(result, inputs) == 0.25
    result[1][short, int(frames[short])] = 0.0
    few = int(tokens.argmin())
    result[2][few, int(tokens[few]) + 1] = -0.5  # past its transcript's end
    assert padding_gradient(result, inputs) == 0.5


TDT_CASE = LatticeCase(5, 9, 3, 17, 8, 8, 8, repeats=1)  # durations 0-4 against T <= 9


def test_the_tdt_scores_are_the_joiner_logits_node_scores() -> None:
    lse, z_blank, z_label, duration_lp, frames, tokens = tdt_scores(TDT_CASE, "cpu")
    assert lse.shape == (4, 9, 4) and duration_lp.shape == (4, 9, 4, len(TDT_DURATIONS))
    joiner, inputs = random_batch(TDT_CASE, "cpu", TDT_DURATIONS)
    f, k = int(frames[1]), int(tokens[1]) + 1
    with torch.no_grad():
        logits = joiner(inputs[0][1:2, :f, None], inputs[1][1:2, None, :k])[0]
    token_logits, duration_logits = logits[..., :17], logits[..., 17:]
    torch.testing.assert_close(lse[1, :f, :k], token_logits.logsumexp(-1))
    torch.testing.assert_close(z_blank[1, :f, :k], token_logits[..., 0])
    torch.testing.assert_close(duration_lp[1, :f, :k], duration_logits.log_softmax(-1))
    assert torch.all(lse[1, f:] == 0) and torch.all(duration_lp[1, :, k:] == 0)


def test_a_wrong_tdt_term_is_found() -> None:
    scores = tdt_scores(TDT_CASE, "cpu")
    want = tdt_outputs(torch_lattice, scores)
    assert len(want) == 1 + len(TDT_TERMS) and want[0].shape == (4,)
    assert disagreement(tdt_outputs(torch_lattice, scores), want, GRAD_RTOL, TDT_TERMS)["ok"]
    for i, name in enumerate(TDT_TERMS, start=1):
        wrong = [x.clone() for x in want]
        wrong[i][0, 1, 0] += 0.01 * want[i].abs().max()
        found = disagreement(wrong, want, GRAD_RTOL, TDT_TERMS)
        assert not found["ok"] and 0.009 < found["grad_rel"][name] < 0.011, name
    wrong = [x.clone() for x in want]
    wrong[0][2] *= 1 + 1e-4  # one sample's loss
    assert not disagreement(wrong, want, GRAD_RTOL, TDT_TERMS)["ok"]


def test_the_tdt_check_records_three_runs_and_three_agreements() -> None:
    stream = io.StringIO()
    report = Report(stream)
    check_tdt(report, TDT_CASE, "cpu")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (batch,) = [x for x in lines if x["record"] == "tdt_batch"]
    assert batch["samples"] == 4 and batch["durations"] == list(TDT_DURATIONS)
    runs = [x for x in lines if x["record"] == "tdt_implementation"]
    assert [r["implementation"] for r in runs] == ["triton_tdt", "torch_tdt", "torch_tdt_float64"]
    assert all(r["seconds"] > 0 and r["first_call_s"] > 0 for r in runs)
    agreements = [x for x in lines if x["record"] == "agreement"]
    assert [(a["implementation"], a["reference"], a["grad_rtol"]) for a in agreements] == [
        ("triton_tdt", "torch_tdt", GRAD_RTOL),
        ("triton_tdt", "torch_tdt_float64", FP32_GRAD_RTOL),
        ("torch_tdt", "torch_tdt_float64", FP32_GRAD_RTOL),
    ]
    assert all(a["ok"] and set(a["grad_rel"]) == set(TDT_TERMS) for a in agreements)
    assert report.failures == []

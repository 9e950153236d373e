"""The lattice section's referee and bounds on a small real batch (CPU)."""

from asr.gpu_check.joiner_loss import loss_and_grads
from asr.gpu_check.lattice import (
    FP32_GRAD_RTOL,
    GRAD_RTOL,
    LatticeCase,
    disagreement,
    float64_reference,
    implementations,
    padding_gradient,
    random_batch,
)

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

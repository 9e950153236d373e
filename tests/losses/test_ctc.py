import pytest
import torch
import torch.nn.functional as F

from asr.losses.ctc import ctc_loss


def _batch(blank: int = 0):
    g = torch.Generator().manual_seed(0)
    v = 7
    log_probs = torch.randn(3, 12, v, generator=g, dtype=torch.float64).log_softmax(-1)
    lens, target_lens = torch.tensor([12, 7, 4]), torch.tensor([5, 3, 0])
    non_blank = torch.tensor([i for i in range(v) if i != blank])
    targets = non_blank[torch.randint(0, v - 1, (3, 6), generator=g)]
    return log_probs, lens, targets, target_lens


@pytest.mark.parametrize("blank", [0, 6])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_matches_per_utterance_ctc(blank, reduction):
    log_probs, lens, targets, target_lens = _batch(blank)
    lp1 = log_probs.clone().requires_grad_(True)
    loss = ctc_loss(lp1, lens, targets, target_lens, blank=blank, reduction=reduction)
    lp2 = log_probs.clone().requires_grad_(True)
    per_utt = torch.stack(
        [
            F.ctc_loss(
                lp2[b, : lens[b]],  # (T, V) unbatched
                targets[b, : target_lens[b]],
                lens[b : b + 1],
                target_lens[b : b + 1],
                blank=blank,
                reduction="sum",
            )
            for b in range(3)
        ]
    )
    expected = {"mean": per_utt.mean(), "sum": per_utt.sum(), "none": per_utt}[reduction]
    assert loss.shape == expected.shape
    assert torch.allclose(loss, expected, rtol=1e-6)
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    (loss * weights if reduction == "none" else loss).sum().backward()
    (expected * weights if reduction == "none" else expected).sum().backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-8)
    for b in range(3):
        assert torch.all(lp1.grad[b, lens[b] :] == 0)


def test_empty_target_is_all_blank():
    log_probs, lens, targets, target_lens = _batch()
    loss = ctc_loss(log_probs, lens, targets, target_lens, reduction="none")
    assert loss[2].item() == pytest.approx(-log_probs[2, :4, 0].sum().item())


def test_impossible_alignment_counts_zero():
    log_probs, lens, targets, target_lens = _batch()
    targets[1, :5] = torch.tensor([1, 1, 1, 1, 1])  # repeats need blanks between them
    loss = ctc_loss(log_probs, lens, targets, torch.tensor([5, 5, 0]), reduction="none")
    assert loss[1].item() == 0.0 and torch.isfinite(loss).all()


def test_half_precision_input_is_computed_in_fp32():
    log_probs, lens, targets, target_lens = _batch()
    loss = ctc_loss(log_probs.bfloat16(), lens, targets, target_lens)
    assert loss.dtype == torch.float32
    exact = ctc_loss(log_probs, lens, targets, target_lens)
    assert loss.item() == pytest.approx(exact.item(), rel=1e-2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "target_lens": torch.tensor([5, 3, 7])}, "target_lens exceed U=6"),
        (lambda a: {**a, "log_prob_lens": torch.tensor([13, 7, 4])}, "log_prob_lens exceed T=12"),
        (lambda a: {**a, "targets": a["targets"][:2]}, "batch sizes differ"),
        (lambda a: {**a, "blank": 7}, r"blank=7.*\[0, 7\)"),
        (lambda a: {**a, "reduction": "batchmean"}, "reduction"),
    ],
)
def test_invalid_inputs_are_explained(change, message):
    log_probs, lens, targets, target_lens = _batch()
    args = dict(log_probs=log_probs, log_prob_lens=lens, targets=targets, target_lens=target_lens)
    with pytest.raises(ValueError, match=message):
        ctc_loss(**change(args))

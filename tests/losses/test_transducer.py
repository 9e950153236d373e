import functools

import pytest
import torch

from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner

LOSSES = [batched_transducer_loss, samplewise_transducer_loss]
# The sample-wise loss through the Triton kernels (interpreted on a CPU without CUDA).
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON_LATTICE = functools.partial(samplewise_transducer_loss, lattice="triton")

# warp-transducer's hand-checked case (B=1, T=2, U=2, V=5, targets [1, 2], blank 0):
# logits (T, U+1, V), their cost, and the gradient of the cost with respect to the logits.
WARP_LOGITS = [
    [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.6, 0.1, 0.1], [0.1, 0.1, 0.2, 0.8, 0.1]],
    [[0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.2, 0.1, 0.1], [0.7, 0.1, 0.2, 0.1, 0.1]],
]
WARP_COST = 4.495666
WARP_GRADS = [
    [
        [-0.13116688, -0.3999269, 0.17703125, 0.17703125, 0.17703125],
        [-0.18572757, 0.12247056, -0.18168412, 0.12247056, 0.12247056],
        [-0.32091254, 0.06269141, 0.06928472, 0.12624499, 0.06269141],
    ],
    [
        [0.05456069, -0.21824276, 0.05456069, 0.05456069, 0.05456069],
        [0.12073959, 0.12073959, -0.48295835, 0.12073959, 0.12073959],
        [-0.6925882, 0.16871116, 0.18645467, 0.16871116, 0.16871116],
    ],
]


def logits_in_encoder_out(enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """A test joiner: encoder_out carries the logits themselves.

    enc (B, T, 1, (U+1)*V) is unflattened to (B, T, U+1, V); pred (B, 1, U+1, 1) only
    broadcasts (times zero), so the gradient of encoder_out *is* the gradient of the logits.
    """
    logits = enc.unflatten(-1, (pred.size(-2), -1)).squeeze(-3)
    return logits + 0.0 * pred


@pytest.mark.parametrize(
    ("loss_fn", "device"), [*((f, "cpu") for f in LOSSES), (TRITON_LATTICE, TRITON_DEVICE)]
)
@pytest.mark.parametrize("blank_last", [False, True])
def test_warp_transducer_small_case(blank_last, loss_fn, device):
    logits, grads = torch.tensor(WARP_LOGITS), torch.tensor(WARP_GRADS)
    targets, blank = torch.tensor([[1, 2]]), 0
    if blank_last:  # relabel so that blank moves from index 0 to index V-1
        perm = [1, 2, 3, 4, 0]  # new id j holds old id perm[j]
        logits, grads, targets, blank = logits[..., perm], grads[..., perm], targets - 1, 4
    enc = logits.reshape(1, 2, 15).to(device).requires_grad_(True)
    pred = torch.zeros(1, 3, 1, device=device, requires_grad=True)
    lengths = torch.tensor([2], device=device)
    loss = loss_fn(
        logits_in_encoder_out,
        enc,
        pred,
        targets.to(device),
        lengths,
        lengths,
        blank=blank,
        reduction="sum",
    )
    loss.backward()
    assert loss.item() == pytest.approx(WARP_COST, abs=1e-5)
    assert torch.allclose(enc.grad.view(2, 3, 5).cpu(), grads, atol=1e-5)


def reference_nll(logits: torch.Tensor, targets: torch.Tensor, blank: int) -> torch.Tensor:
    """Textbook forward algorithm on one utterance: logits (T, U+1, V), targets (U,).

    alpha[t, u] = log P(first u tokens emitted by frame t); arcs: blank (t-1 -> t) and
    token u (u-1 -> u). Plain autograd, no fused softmax.
    """
    lp = logits.log_softmax(-1)
    n_t, n_u = lp.shape[:2]
    alpha: dict[tuple[int, int], torch.Tensor] = {(0, 0): lp.new_zeros(())}
    for t in range(n_t):
        for u in range(n_u):
            if t == u == 0:
                continue
            arcs = []
            if t > 0:
                arcs.append(alpha[t - 1, u] + lp[t - 1, u, blank])
            if u > 0:
                arcs.append(alpha[t, u - 1] + lp[t, u - 1, targets[u - 1]])
            alpha[t, u] = torch.logsumexp(torch.stack(arcs), dim=0)
    return -(alpha[n_t - 1, n_u - 1] + lp[n_t - 1, n_u - 1, blank])


def _random_batch(seed: int = 0, blank: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    v = 6
    joiner = Joiner(encoder_dim=5, predictor_dim=4, joint_dim=7, vocab_size=v).double()
    enc_lens, target_lens = torch.tensor([6, 3, 1, 5]), torch.tensor([4, 0, 2, 3])
    # Two frames and two tokens of padding beyond the longest lengths.
    enc = torch.randn(4, 8, 5, generator=g, dtype=torch.float64)
    pred = torch.randn(4, 7, 4, generator=g, dtype=torch.float64)
    non_blank = [i for i in range(v) if i != blank]
    targets = torch.tensor(non_blank)[torch.randint(0, v - 1, (4, 6), generator=g)]
    return joiner, enc, pred, targets, enc_lens, target_lens


@pytest.mark.parametrize("loss_fn", LOSSES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("blank", [0, 5])
def test_loss_and_gradients_match_reference(reduction, blank, loss_fn):
    """Against the textbook forward algorithm in float64: torchaudio (batched) computes in
    float32, so it gets float32 tolerances; the sample-wise loss keeps float64."""
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch(blank=blank)
    params = list(joiner.parameters())
    weights = torch.tensor([0.3, -1.2, 0.7, 2.0], dtype=torch.float64)  # distinct per sample

    enc1, pred1 = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    loss = loss_fn(
        joiner, enc1, pred1, targets, enc_lens, target_lens, blank=blank, reduction=reduction
    )
    scalar = (loss * weights).sum() if reduction == "none" else loss
    got = torch.autograd.grad(scalar, [enc1, pred1, *params])

    enc2, pred2 = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    nll = []
    for b in range(4):
        t, u = int(enc_lens[b]), int(target_lens[b])
        logits = joiner(enc2[b, :t, None], pred2[b, None, : u + 1])
        nll.append(reference_nll(logits, targets[b, :u], blank))
    nll = torch.stack(nll)
    expected = {"mean": nll.mean(), "sum": nll.sum(), "none": nll}[reduction]
    ref_scalar = (nll * weights).sum() if reduction == "none" else expected
    want = torch.autograd.grad(ref_scalar, [enc2, pred2, *params])

    assert loss.shape == expected.shape
    if loss_fn is batched_transducer_loss:
        assert loss.dtype == torch.float32  # torchaudio: fp32
        assert torch.allclose(loss.double(), expected, rtol=1e-5, atol=1e-5)
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=1e-4, atol=1e-6)
    else:
        assert loss.dtype == torch.float64
        assert torch.allclose(loss, expected, rtol=1e-10, atol=1e-12)
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=1e-9, atol=1e-12)
    # Frames and tokens beyond the lengths get no gradient.
    enc_grad, pred_grad = got[0], got[1]
    for b in range(4):
        assert torch.all(enc_grad[b, enc_lens[b] :] == 0)
        assert torch.all(pred_grad[b, target_lens[b] + 1 :] == 0)


@pytest.mark.parametrize("loss_fn", LOSSES)
def test_inputs_trimmed_to_the_lengths_give_the_same_loss(loss_fn):
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch()
    padded = loss_fn(joiner, enc, pred, targets, enc_lens, target_lens)
    trimmed = loss_fn(joiner, enc[:, :6], pred[:, :5], targets[:, :4], enc_lens, target_lens)
    assert torch.equal(padded, trimmed)


def test_bfloat16_autocast_logits_are_accepted():
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch()
    joiner = joiner.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = batched_transducer_loss(
            joiner, enc.float(), pred.float(), targets, enc_lens, target_lens
        )
    exact = batched_transducer_loss(
        joiner, enc.float(), pred.float(), targets, enc_lens, target_lens
    )
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(exact.item(), rel=0.05)


@pytest.mark.parametrize("loss_fn", LOSSES)
def test_logits_dtype_sets_the_joiner_precision_whatever_the_autocast(loss_fn):
    """float32 under bf16 autocast is the fp32 loss; bfloat16 without autocast rounds like
    autocast does; the result is float32 either way."""
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch()
    joiner, enc, pred = joiner.float(), enc.float(), pred.float()
    inputs = (joiner, enc, pred, targets, enc_lens, target_lens)
    exact = loss_fn(*inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_autocast = loss_fn(*inputs)
        kept_fp32 = loss_fn(*inputs, logits_dtype=torch.float32)
    asked_bf16 = loss_fn(*inputs, logits_dtype=torch.bfloat16)
    assert torch.allclose(kept_fp32, exact, rtol=1e-6)
    for low in (in_autocast, asked_bf16):  # bf16 matmuls: close, yet not the fp32 loss
        assert torch.allclose(low, exact, rtol=1e-2)
        assert not torch.allclose(low, exact, rtol=1e-6)
    assert {t.dtype for t in (kept_fp32, in_autocast, asked_bf16)} == {torch.float32}


def test_no_deprecation_warning_escapes(recwarn):
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch()
    batched_transducer_loss(joiner, enc, pred, targets, enc_lens, target_lens)
    assert not [w for w in recwarn if "deprecated" in str(w.message)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "targets": a["targets"][:3]}, "batch sizes differ"),
        (lambda a: {**a, "target_lens": torch.tensor([4, 0, 9, 3])}, r"target_lens.*U=6"),
        (lambda a: {**a, "encoder_lens": torch.tensor([6, 3, 9, 5])}, r"encoder_lens.*T=8"),
        (lambda a: {**a, "encoder_lens": torch.tensor([6, 0, 1, 5])}, r"encoder_lens.*\[1"),
        (lambda a: {**a, "predictor_out": a["predictor_out"][:, :4]}, r"target_lens\)\+1 = 5"),
        (lambda a: {**a, "encoder_out": a["encoder_out"][0]}, r"encoder_out \(B, T, D_enc\)"),
        (lambda a: {**a, "blank": 6}, r"blank=6.*\[0, 6\)"),
        (lambda a: {**a, "reduction": "avg"}, "reduction"),
    ],
)
@pytest.mark.parametrize("loss_fn", LOSSES)
def test_invalid_inputs_are_explained(change, message, loss_fn):
    joiner, enc, pred, targets, enc_lens, target_lens = _random_batch()
    args = dict(
        encoder_out=enc,
        predictor_out=pred,
        targets=targets,
        encoder_lens=enc_lens,
        target_lens=target_lens,
        blank=0,
        reduction="mean",
    )
    with pytest.raises(ValueError, match=message):
        loss_fn(joiner, **change(args))

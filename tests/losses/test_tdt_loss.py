"""The token-and-duration transducer (TDT) loss: the closed-form lattice against a float64
enumeration of every path, the sample-wise loss against the batched one under autograd,
and the options' checks."""

import itertools

import pytest
import torch

from asr.config_keys import ConfigError
from asr.losses.lattice import duration_grad_, logit_grad_, padded_labels, tdt_lattice
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.build import model_config
from asr.models.transducer import Joiner
from asr.training.objective import TransducerLossConfig

DURATION_SETS = [(0, 1, 2, 3, 4), (1,), (0, 1), (1, 2), (2, 0, 1), (0, 1, 2, 4, 8)]


def enumerated_nll(token_lp, duration_lp, labels, frames, tokens, durations):
    """-log of the sum over every path of one sample, each path written out: float64,
    differentiable, no recursion shared with the code under test."""
    total = []

    def walk(t, u, score):
        for i, length in enumerate(durations):
            if length >= 1 and t + length <= frames:  # a blank
                arc = score + token_lp[t, u, 0] + duration_lp[t, u, i]
                if t + length == frames:
                    if u == tokens:
                        total.append(arc)
                else:
                    walk(t + length, u, arc)
            if u < tokens and t + length < frames:  # the next label
                walk(t + length, u + 1, score + token_lp[t, u, labels[u]] + duration_lp[t, u, i])

    walk(0, 0, torch.zeros((), dtype=token_lp.dtype))
    return -torch.logsumexp(torch.stack(total), 0) if total else torch.tensor(float("inf"))


def lattice_inputs(seed, samples, frames, u1, vocab, durations):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(samples, frames, u1, vocab, generator=g, dtype=torch.float64)
    e = 2 * torch.randn(samples, frames, u1, len(durations), generator=g, dtype=torch.float64)
    targets = torch.randint(1, vocab, (samples, u1 - 1), generator=g)
    return z, e, targets


@pytest.mark.parametrize("durations", DURATION_SETS)
@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_lattice_equals_the_enumeration_of_every_path(durations, sigma):
    frames, tokens = torch.tensor([5, 4, 3, 1, 5]), torch.tensor([2, 1, 0, 0, 1])
    z, e, targets = lattice_inputs(1, 5, 5, 3, 5, durations)
    labels = padded_labels(targets, 3, blank=0, vocab=5)
    z_ref, e_ref = z.clone().requires_grad_(True), e.clone().requires_grad_(True)
    token_lp, duration_lp = torch.log_softmax(z_ref, -1) - sigma, torch.log_softmax(e_ref, -1)
    want = torch.stack(
        [
            enumerated_nll(token_lp[c], duration_lp[c], labels[c], int(f), int(k), durations)
            for c, (f, k) in enumerate(zip(frames, tokens, strict=True))
        ]
    )
    feasible = torch.isfinite(want)
    want_z, want_e = torch.autograd.grad(want[feasible].sum(), [z_ref, e_ref])

    lse = torch.logsumexp(z, -1)
    z_blank = z[..., 0].clone()
    z_label = z.gather(-1, labels[:, None, :, None].expand(5, 5, 3, 1))[..., 0].clone()
    nll, terms = tdt_lattice(
        lse,
        z_blank,
        z_label,
        torch.log_softmax(e, -1),
        frames,
        tokens,
        durations=durations,
        sigma=sigma,
        gradient=True,
    )
    torch.testing.assert_close(nll, want, rtol=1e-12, atol=1e-12)
    got_z = logit_grad_(z.clone(), labels, terms.tokens, blank=0)
    got_e = duration_grad_(e.clone(), terms)
    torch.testing.assert_close(got_z, want_z, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_e, want_e, rtol=1e-10, atol=1e-12)
    assert torch.isfinite(got_z).all() and torch.isfinite(got_e).all()


def test_a_blank_never_stays_on_its_frame():
    """With durations (0, 1), one frame and no token, the only path is one blank of duration
    1: a blank of duration 0 would loop, and has no probability in the lattice."""
    z, e, _ = lattice_inputs(2, 1, 1, 1, 3, (0, 1))
    nll, _ = tdt_lattice(
        torch.logsumexp(z, -1),
        z[..., 0].clone(),
        z[..., 0].clone(),
        torch.log_softmax(e, -1),
        torch.tensor([1]),
        torch.tensor([0]),
        durations=(0, 1),
        gradient=False,
    )
    want = -(torch.log_softmax(z, -1)[0, 0, 0, 0] + torch.log_softmax(e, -1)[0, 0, 0, 1])
    torch.testing.assert_close(nll[0], want)


def test_a_transcript_no_path_explains_has_infinite_loss_and_no_gradient():
    """Durations without 0 need a frame per emission: 3 tokens and a blank in 3 frames
    cannot be aligned."""
    z, e, targets = lattice_inputs(3, 1, 3, 4, 5, (1, 2))
    labels = padded_labels(targets, 4, blank=0, vocab=5)
    lse, z_blank = torch.logsumexp(z, -1), z[..., 0].clone()
    z_label = z.gather(-1, labels[:, None, :, None].expand(1, 3, 4, 1))[..., 0].clone()
    nll, terms = tdt_lattice(
        lse, z_blank, z_label, torch.log_softmax(e, -1), torch.tensor([3]), torch.tensor([3]),
        durations=(1, 2), gradient=True,
    )  # fmt: skip
    assert nll.item() == float("inf")
    assert (logit_grad_(z.clone(), labels, terms.tokens, blank=0) == 0).all()
    assert (duration_grad_(e.clone(), terms) == 0).all()


class WrappedJoiner(torch.nn.Module):
    """Not a stock Joiner, so the loss takes its generic (autograd) path."""

    def __init__(self, joiner: Joiner) -> None:
        super().__init__()
        self.joiner = joiner

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.joiner(enc, pred)


def random_tdt_batch(seed, durations, batch=5, frames=14, tokens=5, vocab=11):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(
        encoder_dim=12, predictor_dim=10, joint_dim=16, vocab_size=vocab, durations=durations
    )
    enc = torch.randn(batch, frames + 2, 12, generator=g)
    pred = torch.randn(batch, tokens + 2, 10, generator=g)
    targets = torch.randint(1, vocab, (batch, tokens + 1), generator=g)
    enc_lens = torch.randint(tokens + 1, frames + 1, (batch,), generator=g)
    target_lens = torch.randint(0, tokens + 1, (batch,), generator=g)
    enc_lens[0], target_lens[1] = frames, tokens
    return joiner, enc, pred, targets, enc_lens, target_lens


def loss_and_grads(loss_fn, joiner, module, enc, pred, *rest, reduction, **options):
    enc, pred = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    loss = loss_fn(module, enc, pred, *rest, reduction=reduction, **options)
    weights = torch.linspace(-1.0, 2.0, enc.size(0))
    scalar = (loss * weights).sum() if reduction == "none" else loss
    return loss.detach(), torch.autograd.grad(scalar, [enc, pred, *joiner.parameters()])


@pytest.mark.parametrize(
    ("durations", "sigma", "omega"),
    [((0, 1, 2, 3, 4), 0.05, 0.1), ((0, 1, 2, 3, 4), 0.0, 0.0), ((1,), 0.0, 0.3)]
    + [(d, 0.05, 0.0) for d in DURATION_SETS[2:]],
)
@pytest.mark.parametrize(("reduction", "options"), [("mean", {}), ("none", {"group_size": 3})])
@pytest.mark.parametrize("path", ["fused", "generic"])
def test_samplewise_equals_the_batched_loss_under_autograd(
    durations, sigma, omega, reduction, options, path
):
    joiner, *inputs = random_tdt_batch(4, durations)
    tdt = {"durations": durations, "sigma": sigma, "omega": omega}
    want = loss_and_grads(
        batched_transducer_loss, joiner, joiner, *inputs, reduction=reduction, **tdt
    )
    module = joiner if path == "fused" else WrappedJoiner(joiner)
    got = loss_and_grads(
        samplewise_transducer_loss, joiner, module, *inputs, reduction=reduction,
        lattice="torch", **tdt, **options,
    )  # fmt: skip
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(got[1], want[1], strict=True):
        scale = theirs.abs().max().clamp_min(1.0)
        torch.testing.assert_close(mine / scale, theirs / scale, rtol=1e-5, atol=1e-5)


def test_chunked_lattices_give_the_same_result():
    joiner, *inputs = random_tdt_batch(5, (0, 1, 2, 3, 4), batch=6)
    tdt = {"durations": (0, 1, 2, 3, 4), "reduction": "mean"}
    whole = loss_and_grads(samplewise_transducer_loss, joiner, joiner, *inputs, **tdt)
    one_by_one = loss_and_grads(
        samplewise_transducer_loss, joiner, joiner, *inputs, lattice_chunk_nodes=1, **tdt
    )
    torch.testing.assert_close(whole[0], one_by_one[0])
    for a, b in itertools.zip_longest(whole[1], one_by_one[1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sigma": 0.05}, "need durations"),
        ({"durations": (0, 2)}, "must hold 1"),
        ({"durations": (0, 1, 1)}, "must hold 1"),
        ({"durations": (0, 1), "omega": 1.0}, "omega must be in"),
    ],
)
def test_bad_tdt_options_are_explained(options, message):
    joiner, *inputs = random_tdt_batch(6, (0, 1))
    with pytest.raises(ValueError, match=message):
        samplewise_transducer_loss(joiner, *inputs, **options)


@pytest.mark.parametrize("durations", [[0, 2, 3], [-1, 0, 1], [0, 1, 1], "1", []])
def test_a_bad_duration_set_is_a_config_error_naming_the_key(durations):
    with pytest.raises(ConfigError, match=r"^model\.joiner\.durations="):
        model_config({"kind": "transducer", "joiner": {"durations": durations}})


def test_sigma_and_omega_are_checked():
    with pytest.raises(ConfigError, match="model.loss.omega"):
        TransducerLossConfig(omega=1.5)
    with pytest.raises(ConfigError, match="model.loss.sigma"):
        TransducerLossConfig(sigma=-0.1)

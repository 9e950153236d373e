"""The Triton lattice kernels against the PyTorch reference (asr.losses.lattice).

On CUDA when there is a GPU, else in Triton's interpreter on the CPU (slow: small sizes).
"""

import pytest
import torch

from asr.losses import lattice as ref
from asr.losses import triton_lattice as tri
from asr.losses.samplewise import samplewise_transducer_loss
from asr.models.transducer import Joiner

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float64: {"atol": 1e-12, "rtol": 1e-12}}
T, U1, V = 7, 5, 11
# Samples: full lengths, one frame, no token, and in between.
FRAMES, TOKENS = [T, 1, 4, 5], [U1 - 1, 2, 0, 3]


def batch(seed: int, dtype: torch.dtype, blank: int):
    """Logits (C, T, U1, V), labels (C, U1), frames and tokens (C,) on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(len(FRAMES), T, U1, V, generator=g, dtype=dtype)
    targets = torch.randint(0, V - 1, (len(FRAMES), U1 - 1), generator=g)
    targets += (targets >= blank).long()  # any token but blank
    labels = ref.padded_labels(targets, U1, blank=blank, vocab=V)
    lengths = torch.tensor(FRAMES), torch.tensor(TOKENS)
    return logits.to(DEVICE), labels.to(DEVICE), *(x.to(DEVICE) for x in lengths)


def ref_scores(logits: torch.Tensor, labels: torch.Tensor, blank: int) -> list[torch.Tensor]:
    scores = list(logits.new_empty((3, *logits.shape[:3])).unbind(0))
    ref.node_scores_(logits.clone(), labels, blank=blank, lse=scores[0], z_blank=scores[1],
                     z_label=scores[2])  # fmt: skip
    return scores


def outside(frames: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(C, T, U1) True at the nodes outside each sample."""
    t = torch.arange(T, device=DEVICE)[None, :, None]
    u = torch.arange(U1, device=DEVICE)[None, None, :]
    return (t >= frames[:, None, None]) | (u > tokens[:, None, None])


DTYPES_BLANKS = [(torch.float32, 0), (torch.float32, V - 1), (torch.float64, 0)]


@pytest.mark.parametrize(("dtype", "blank"), DTYPES_BLANKS)
def test_node_scores_into_strided_views(dtype, blank):
    logits, labels, _, _ = batch(0, dtype, blank)
    before = logits.clone()
    logits = logits.transpose(2, 3).contiguous().transpose(2, 3)  # strided over V too
    big = torch.full((3, 6, T + 2, U1 + 3), float("nan"), dtype=dtype, device=DEVICE)
    views = [big[i, 1:5, 1 : T + 1, :U1] for i in range(3)]
    wide_labels = labels.new_zeros(len(FRAMES), 2 * U1)[:, ::2].copy_(labels)  # strided
    tri.node_scores_(logits, wide_labels, blank=blank, lse=views[0], z_blank=views[1],
                     z_label=views[2])  # fmt: skip
    for got, want in zip(views, ref_scores(logits, labels, blank), strict=True):
        torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.equal(logits, before)  # only read
    big[:, 1:5, 1 : T + 1, :U1] = 0.0
    assert big.isnan().sum() == big.numel() - 3 * 4 * T * U1  # nothing outside the views


@pytest.mark.parametrize("gradient", [False, True])
@pytest.mark.parametrize(("dtype", "blank"), DTYPES_BLANKS)
def test_lattice_matches_the_reference(dtype, blank, gradient):
    logits, labels, frames, tokens = batch(1, dtype, blank)
    scores = ref_scores(logits, labels, blank)
    want_nll, want = ref.lattice(*[s.clone() for s in scores], frames, tokens, gradient=gradient)
    wide = logits.new_full((3, len(FRAMES), T, U1 + 2), float("nan"))  # strided inputs
    inputs = [wide[i, :, :, :U1].copy_(s) for i, s in enumerate(scores)]
    nll, got = tri.lattice(*inputs, frames, tokens, gradient=gradient)
    torch.testing.assert_close(nll, want_nll, **TOL[dtype])
    if not gradient:
        assert got is None
        assert all(torch.equal(x, s) for x, s in zip(inputs, scores, strict=True))
        return
    pad = outside(frames, tokens)
    for name in ("shift", "blank_move", "neg_label_move"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), **TOL[dtype])
    terms = [got.shift, got.blank_move, got.neg_label_move]
    assert all(x.data_ptr() == y.data_ptr() for x, y in zip(terms, inputs, strict=True))
    assert torch.all(got.shift[pad] == float("-inf"))
    assert torch.all(got.blank_move[pad] == 0) and torch.all(got.neg_label_move[pad] == 0)
    zero = got.neg_label_move == 0
    assert not got.neg_label_move[zero].signbit().any()  # +0.0 as in the reference, not -0.0
    last = torch.arange(U1, device=DEVICE)[None, None, :] == tokens[:, None, None]
    assert torch.all(got.neg_label_move[last.expand_as(pad)] == 0)  # no label from u = K
    assert wide[..., U1:].isnan().all()  # nothing written beside the views


def test_lattice_without_any_token():
    g = torch.Generator().manual_seed(2)
    scores = list(torch.randn(3, 3, 4, 1, generator=g, dtype=torch.float64).to(DEVICE))
    scores[0] = scores[0].abs() + 2  # lse above the logits
    frames, tokens = torch.tensor([4, 1, 2], device=DEVICE), torch.zeros(3, device=DEVICE).long()
    want_nll, want = ref.lattice(*[s.clone() for s in scores], frames, tokens, gradient=True)
    nll, got = tri.lattice(*scores, frames, tokens, gradient=True)
    torch.testing.assert_close(nll, want_nll, atol=1e-12, rtol=1e-12)
    for name in ("shift", "blank_move", "neg_label_move"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=1e-12, rtol=0)


@pytest.mark.parametrize("options", [{}, {"weights": True, "grad_clamp": 0.07}])
@pytest.mark.parametrize(("dtype", "blank"), DTYPES_BLANKS)
def test_logit_grad_from_strided_terms(dtype, blank, options):
    logits, labels, frames, tokens = batch(3, dtype, blank)
    _, terms = ref.lattice(*ref_scores(logits, labels, blank), frames, tokens, gradient=True)
    # A group of 3 samples padded to 6 frames and 4 positions, inside the chunk's terms.
    rows, f, u1 = slice(1, 4), 6, 4
    group, group_labels = logits[rows, :f, :u1], labels[rows, :u1]
    if options:
        g = torch.Generator().manual_seed(4)
        options = {**options, "weights": torch.rand(3, generator=g, dtype=dtype).to(DEVICE) - 0.5}
    want = ref.logit_grad_(group.clone(), group_labels, terms[rows, :f, :u1], blank=blank,
                           **options)  # fmt: skip
    got_all = logits.clone()
    got = got_all[rows, :f, :u1]  # the logits of a group may be a strided view as well
    out = tri.logit_grad_(got, group_labels, terms[rows, :f, :u1], blank=blank, **options)
    assert out is got
    torch.testing.assert_close(got, want, **TOL[dtype])
    if "grad_clamp" in options:
        assert got.abs().max() <= 0.07 * options["weights"].abs().max()
    got_all[rows, :f, :u1] = group
    assert torch.equal(got_all, logits)  # nothing written outside the view


@pytest.mark.parametrize(("dtype", "blank"), DTYPES_BLANKS)
def test_the_three_kernels_chain_to_nll_and_logit_grad_(dtype, blank):
    logits, labels, frames, tokens = batch(5, dtype, blank)
    targets = labels[:, :-1]
    weights = torch.linspace(-1.0, 2.0, len(FRAMES), dtype=dtype, device=DEVICE)
    want = logits.clone()
    want_nll = ref.nll_and_logit_grad_(want, targets, frames, tokens, blank=blank,
                                       weights=weights, grad_clamp=0.3)  # fmt: skip
    scores = logits.new_empty((3, *logits.shape[:3])).unbind(0)
    tri.node_scores_(logits, labels, blank=blank, lse=scores[0], z_blank=scores[1],
                     z_label=scores[2])  # fmt: skip
    nll, terms = tri.lattice(*scores, frames, tokens, gradient=True)
    tri.logit_grad_(logits, labels, terms, blank=blank, weights=weights, grad_clamp=0.3)
    torch.testing.assert_close(nll, want_nll, **TOL[dtype])
    torch.testing.assert_close(logits, want, **TOL[dtype])


def test_unsupported_devices():
    assert tri.is_supported(torch.device("cuda"))
    assert tri.is_supported(torch.device("cpu")) == tri.INTERPRET
    assert not tri.is_supported(torch.device("meta"))
    lse = torch.empty(2, 3, 4, device="meta")
    lengths = torch.ones(2, dtype=torch.long, device="meta")
    with pytest.raises(RuntimeError, match="cannot run on meta"):
        tri.lattice(lse, lse, lse, lengths, lengths, gradient=False)


# The TDT lattice: small lattices, the interpreted kernel takes about a second a case.
TDT_T, TDT_U1 = 5, 3  # U1 below a power of 2: lanes of the block beyond U1
DURATION_SETS = [(0, 1, 2, 3, 4), (1,), (0, 1), (1, 2), (0, 1, 2, 4, 8), (2, 0, 1)]
TDT_TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
}


def tdt_batch(seed: int, dtype: torch.dtype, durations: tuple[int, ...]):
    """Token scores lse, z_blank, z_label (C, T, U1), duration log-probs (C, T, U1, D),
    frames and tokens (C,): full lengths, one frame (with 2 tokens when a label may take
    0 frames, else none), shorter ones, one without tokens; every sample has a path."""
    g = torch.Generator().manual_seed(seed)
    c = 4
    lse = torch.rand(c, TDT_T, TDT_U1, generator=g, dtype=dtype) + 2
    z_blank, z_label = 2 * torch.randn(2, c, TDT_T, TDT_U1, generator=g, dtype=dtype)
    logits = torch.randn(c, TDT_T, TDT_U1, len(durations), generator=g, dtype=dtype)
    frames = torch.tensor([TDT_T, 1, 3, 2])
    tokens = torch.tensor([TDT_U1 - 1, 2 if 0 in durations else 0, 1, 0])
    tensors = (lse, z_blank, z_label, logits.log_softmax(-1), frames, tokens)
    return [x.to(DEVICE) for x in tensors]


def tdt_outputs(nll, terms) -> dict[str, torch.Tensor]:
    """The loss and every gradient term by name."""
    tok = terms.tokens
    return {"nll": nll, "shift": tok.shift, "blank_move": tok.blank_move,
            "neg_label_move": tok.neg_label_move, "log_occupancy": terms.log_occupancy,
            "duration_moves": terms.duration_moves}  # fmt: skip


def tdt_outside(frames: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(C, T, U1) True at the nodes outside each sample."""
    t = torch.arange(TDT_T, device=DEVICE)[None, :, None]
    u = torch.arange(TDT_U1, device=DEVICE)[None, None, :]
    return (t >= frames[:, None, None]) | (u > tokens[:, None, None])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("durations", DURATION_SETS)
def test_tdt_lattice_matches_the_reference(durations, dtype):
    lse, z_blank, z_label, duration_lp, frames, tokens = tdt_batch(7, dtype, durations)
    options = {"durations": durations, "sigma": 0.05, "gradient": True}
    scores = [lse, z_blank, z_label]
    want = tdt_outputs(*ref.tdt_lattice(*[s.clone() for s in scores], duration_lp, frames,
                                        tokens, **options))  # fmt: skip
    wide = lse.new_full((3, *lse.shape[:2], TDT_U1 + 2), float("nan"))  # strided inputs
    inputs = [wide[i, :, :, :TDT_U1].copy_(s) for i, s in enumerate(scores)]
    strided_lp = duration_lp.transpose(1, 2).contiguous().transpose(1, 2)
    got = tdt_outputs(*tri.tdt_lattice(*inputs, strided_lp, frames, tokens, **options))
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, **TDT_TOL[dtype], msg=name)
    token_terms = [got["shift"], got["blank_move"], got["neg_label_move"]]
    assert all(x.data_ptr() == y.data_ptr() for x, y in zip(token_terms, inputs, strict=True))
    assert wide[..., TDT_U1:].isnan().all()  # nothing written beside the views
    pad = tdt_outside(frames, tokens)
    assert torch.all(got["shift"][pad] == float("-inf"))
    assert torch.all(got["log_occupancy"][pad] == float("-inf"))
    assert torch.all(got["duration_moves"][pad] == 0)


@pytest.mark.parametrize(("durations", "dtype"), [((0, 1, 2, 3, 4), torch.float32),
                                                  ((2, 0, 1), torch.float64)])  # fmt: skip
def test_tdt_lattice_without_gradient_leaves_the_inputs(durations, dtype):
    lse, z_blank, z_label, duration_lp, frames, tokens = tdt_batch(8, dtype, durations)
    scores = [lse, z_blank, z_label]
    before = [s.clone() for s in (*scores, duration_lp)]
    options = {"durations": durations, "sigma": 0.05, "gradient": False}
    want_nll, _ = ref.tdt_lattice(*[s.clone() for s in scores], duration_lp, frames, tokens,
                                  **options)  # fmt: skip
    nll, terms = tri.tdt_lattice(*scores, duration_lp, frames, tokens, **options)
    assert terms is None
    torch.testing.assert_close(nll, want_nll, **TDT_TOL[dtype])
    assert all(torch.equal(x, y) for x, y in zip((*scores, duration_lp), before, strict=True))


def test_tdt_lattice_of_a_sample_without_a_path():
    """More tokens than frames and no zero duration: nll = inf, and zero occupancies
    (no NaN) for that sample; the others as the reference computes them."""
    durations = (1, 2)
    lse, z_blank, z_label, duration_lp, frames, tokens = tdt_batch(9, torch.float64, durations)
    tokens[1] = 2  # one frame, two tokens
    options = {"durations": durations, "sigma": 0.0, "gradient": True}
    want = tdt_outputs(*ref.tdt_lattice(lse.clone(), z_blank.clone(), z_label.clone(),
                                        duration_lp, frames, tokens, **options))  # fmt: skip
    got = tdt_outputs(*tri.tdt_lattice(lse, z_blank, z_label, duration_lp, frames, tokens,
                                       **options))  # fmt: skip
    assert got["nll"][1] == float("inf")
    assert torch.all(got["shift"][1] == float("-inf"))
    assert torch.all(got["log_occupancy"][1] == float("-inf"))
    for name in ("blank_move", "neg_label_move", "duration_moves"):
        assert torch.all(got[name][1] == 0), name
    others = [0, 2, 3]
    for name, value in want.items():
        torch.testing.assert_close(got[name][others], value[others], **TDT_TOL[torch.float64])


def test_tdt_lattice_checks_its_durations():
    lse, z_blank, z_label, duration_lp, frames, tokens = tdt_batch(10, torch.float32, (0, 1))
    with pytest.raises(ValueError, match="must hold 1"):
        tri.tdt_lattice(lse, z_blank, z_label, duration_lp, frames, tokens, durations=(0, 2),
                        gradient=False)  # fmt: skip
    with pytest.raises(ValueError, match="duration_lp has shape"):
        tri.tdt_lattice(lse, z_blank, z_label, duration_lp, frames, tokens, durations=(0, 1, 2),
                        gradient=False)  # fmt: skip


def loss_inputs(seed: int, blank: int, vocab: int = 7):
    """A fused Joiner and a padded batch of 5 with varied lengths (one T=1, one U=0)."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(encoder_dim=6, predictor_dim=5, joint_dim=8, vocab_size=vocab).to(DEVICE)
    enc = torch.randn(5, 9, 6, generator=g)
    pred = torch.randn(5, 5, 5, generator=g)
    targets = torch.randint(0, vocab - 1, (5, 4), generator=g)
    targets += (targets >= blank).long()
    lengths = torch.tensor([8, 1, 5, 8, 3]), torch.tensor([4, 2, 0, 1, 3])
    return joiner, *(x.to(DEVICE) for x in (enc, pred, targets, *lengths))


def loss_and_grads(joiner, enc, pred, *rest, reduction, **options):
    enc, pred = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    loss = samplewise_transducer_loss(joiner, enc, pred, *rest, reduction=reduction, **options)
    weights = torch.linspace(-1.0, 2.0, enc.size(0), device=DEVICE)
    scalar = (loss * weights).sum() if reduction == "none" else loss
    return loss.detach(), torch.autograd.grad(scalar, [enc, pred, *joiner.parameters()])


# every value of each option, and each pair of group size and blank (the interpreted kernels
# take seconds a case: not the whole product)
@pytest.mark.parametrize(
    ("reduction", "group_size", "blank"),
    [("none", 1, 0), ("none", 3, 6), ("mean", 3, 0), ("sum", 1, 6)],
)
def test_samplewise_loss_with_the_triton_lattice(reduction, group_size, blank):
    joiner, *inputs = loss_inputs(6, blank)
    options = {"blank": blank, "reduction": reduction, "group_size": group_size}
    want_loss, want_grads = loss_and_grads(joiner, *inputs, **options, lattice="torch")
    loss, grads = loss_and_grads(joiner, *inputs, **options, lattice="triton")
    torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

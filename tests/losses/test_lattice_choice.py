"""`lattice=auto` cannot stop a run: Triton kernels that fail or disagree are given up for
the PyTorch lattice with one warning. `auto` picks the PyTorch lattice on CPU, so these
tests inject the broken "fast" implementation through `FallbackLattice` (the test seam)."""

import logging
from types import SimpleNamespace

import pytest
import torch

from asr.losses import lattice as torch_lattice
from asr.losses import lattice_choice
from asr.losses.lattice_choice import (
    AUTO_ON_CUDA,
    FallbackLattice,
    active_lattice,
    lattice_disagreement,
    lattice_ops,
)
from asr.losses.samplewise import samplewise_transducer_loss
from asr.models.transducer import Joiner

LOGGER = "asr.losses.lattice_choice"


class CountingOps:
    """The PyTorch lattice, counting calls; `fail(name, args)` may raise instead."""

    def __init__(self, fail=None) -> None:
        self.calls = 0
        self.fail = fail or (lambda name, args: None)

    def __getattr__(self, name):
        function = getattr(torch_lattice, name)

        def call(*args, **kwargs):
            self.calls += 1
            self.fail(name, args)
            return function(*args, **kwargs)

        return call


def compile_error(name, args):
    raise RuntimeError("PassManager::run failed\n(the MLIR dump would follow)")


def fails_beyond_8_positions(name, args):
    """A kernel variant for longer label sequences that does not compile (U1 > 8)."""
    if name == "lattice" and args[0].size(-1) > 8:
        raise RuntimeError("out of resource: shared memory, Required: 264192")


def wrong_node_scores():
    """Kernels that compile but compute a wrong log-normalizer."""

    def node_scores_(logits, labels, *, blank, lse, z_blank, z_label):
        torch_lattice.node_scores_(
            logits, labels, blank=blank, lse=lse, z_blank=z_blank, z_label=z_label
        )
        lse.add_(0.01)

    return SimpleNamespace(
        node_scores_=node_scores_,
        lattice=torch_lattice.lattice,
        logit_grad_=torch_lattice.logit_grad_,
        tdt_lattice=torch_lattice.tdt_lattice,
    )


def wrong_duration_moves():
    """Kernels whose TDT lattice compiles but gets the durations' gradient term wrong
    (the plain lattice is right)."""

    def tdt_lattice(*args, **kwargs):
        nll, terms = torch_lattice.tdt_lattice(*args, **kwargs)
        if terms is not None:
            terms.duration_moves[..., 1] += 0.01
        return nll, terms

    return SimpleNamespace(
        node_scores_=torch_lattice.node_scores_,
        lattice=torch_lattice.lattice,
        logit_grad_=torch_lattice.logit_grad_,
        tdt_lattice=tdt_lattice,
    )


def batch(seed: int, tokens: int = 5):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(encoder_dim=6, predictor_dim=5, joint_dim=8, vocab_size=9)
    enc = torch.randn(4, 12, 6, generator=g)
    pred = torch.randn(4, tokens + 1, 5, generator=g)
    targets = torch.randint(1, 9, (4, tokens), generator=g)
    lengths = torch.tensor([12, 7, 1, 10]), torch.tensor([tokens, 0, 2, tokens - 1])
    return joiner, enc, pred, targets, *lengths


DURATIONS = (0, 1, 2, 3, 4)


def tdt_inputs(seed: int):
    """Token scores (C, T, U1), duration log-probs (C, T, U1, D), frames, tokens (C,)."""
    g = torch.Generator().manual_seed(seed)
    lse = torch.rand(3, 6, 4, generator=g) + 2
    z_blank, z_label = torch.randn(2, 3, 6, 4, generator=g)
    duration_lp = torch.randn(3, 6, 4, len(DURATIONS), generator=g).log_softmax(-1)
    return lse, z_blank, z_label, duration_lp, torch.tensor([6, 1, 4]), torch.tensor([3, 2, 0])


def tdt_results(ops, seed: int) -> list[torch.Tensor]:
    lse, z_blank, z_label, *rest = tdt_inputs(seed)
    nll, terms = ops.tdt_lattice(lse, z_blank, z_label, *rest, durations=DURATIONS, sigma=0.05,
                                 gradient=True)  # fmt: skip
    tokens = terms.tokens
    return [nll, tokens.shift, tokens.blank_move, tokens.neg_label_move, terms.log_occupancy,
            terms.duration_moves]  # fmt: skip


def loss_and_grads(joiner, enc, pred, *rest, lattice):
    enc, pred = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    loss = samplewise_transducer_loss(joiner, enc, pred, *rest, lattice=lattice)
    return [loss.detach(), *torch.autograd.grad(loss, [enc, pred, *joiner.parameters()])]


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_kernel_that_does_not_compile_falls_back_with_one_warning(caplog):
    fast = CountingOps(fail=compile_error)
    auto = FallbackLattice(lambda: fast, check=False)
    inputs = batch(0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first = loss_and_grads(*inputs, lattice=auto)
        second = loss_and_grads(*inputs, lattice=auto)
    assert_same(first, loss_and_grads(*inputs, lattice="torch"))
    assert_same(second, first)
    assert fast.calls == 1  # tried once, never again
    assert auto.active == "torch"
    (message,) = warnings_of(caplog)
    assert "node_scores_ failed (RuntimeError: PassManager::run failed)" in message
    assert "model.loss.lattice=torch" in message


def test_a_later_kernel_variant_that_fails_falls_back_mid_run(caplog):
    fast = CountingOps(fail=fails_beyond_8_positions)
    auto = FallbackLattice(lambda: fast, check=False)
    short, long = batch(1, tokens=5), batch(2, tokens=12)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got_short = loss_and_grads(*short, lattice=auto)
        assert auto.active == "triton" and fast.calls > 0 and not warnings_of(caplog)
        calls = fast.calls
        got_long = loss_and_grads(*long, lattice=auto)
    assert_same(got_short, loss_and_grads(*short, lattice="torch"))
    assert_same(got_long, loss_and_grads(*long, lattice="torch"))
    assert fast.calls == calls + 5  # node scores of the 4 samples, then the failed lattice
    (message,) = warnings_of(caplog)
    assert "lattice failed (RuntimeError: out of resource: shared memory" in message


def test_kernels_that_disagree_are_caught_on_first_use(caplog):
    auto = FallbackLattice(wrong_node_scores)
    inputs = batch(3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = loss_and_grads(*inputs, lattice=auto)
    assert_same(got, loss_and_grads(*inputs, lattice="torch"))
    (message,) = warnings_of(caplog)
    assert "the loss differs from the PyTorch reference" in message
    assert active_lattice(auto, torch.device("cpu")).startswith("torch (fell back: the loss")


def test_a_failing_import_falls_back(caplog):
    def load():
        raise ImportError("libcuda.so.1: cannot open shared object file")

    auto = FallbackLattice(load)
    inputs = batch(4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = loss_and_grads(*inputs, lattice=auto)
    assert_same(got, loss_and_grads(*inputs, lattice="torch"))
    (message,) = warnings_of(caplog)
    assert "loading it failed (ImportError: libcuda.so.1" in message


def test_a_tdt_kernel_that_fails_falls_back_with_one_warning(caplog):
    def tdt_fails(name, args):
        if name == "tdt_lattice":
            raise RuntimeError("PassManager::run failed")

    fast = CountingOps(fail=tdt_fails)
    auto = FallbackLattice(lambda: fast, check=False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        first, second = tdt_results(auto, 0), tdt_results(auto, 0)
    assert_same(first, tdt_results(torch_lattice, 0))
    assert_same(second, first)
    assert fast.calls == 1 and auto.active == "torch"
    (message,) = warnings_of(caplog)
    assert "tdt_lattice failed (RuntimeError: PassManager::run failed)" in message


def test_a_tdt_kernel_that_disagrees_is_caught_on_first_use(caplog):
    auto = FallbackLattice(wrong_duration_moves)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = loss_and_grads(*batch(7), lattice=auto)  # a plain transducer loss checks it too
    assert_same(got, loss_and_grads(*batch(7), lattice="torch"))
    assert_same(tdt_results(auto, 1), tdt_results(torch_lattice, 1))
    (message,) = warnings_of(caplog)
    assert "the TDT duration term differs from the PyTorch reference" in message


def test_out_of_memory_is_not_a_kernel_failure():
    def out_of_memory(name, args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    auto = FallbackLattice(lambda: CountingOps(fail=out_of_memory), check=False)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        loss_and_grads(*batch(5), lattice=auto)
    assert auto.active == "triton" and auto.reason == ""


def test_triton_fails_loudly(monkeypatch):
    def broken(*args, **kwargs):
        compile_error("node_scores_", args)

    kernels = SimpleNamespace(
        is_supported=lambda device: True, node_scores_=broken, lattice=broken, logit_grad_=broken
    )
    monkeypatch.setattr(lattice_choice, "_import_triton_lattice", lambda: kernels)
    with pytest.raises(RuntimeError, match="PassManager::run failed"):
        loss_and_grads(*batch(6), lattice="triton")


def test_the_real_kernels_pass_the_first_use_check():
    """Triton's kernels (interpreted on the CPU here), the TDT lattice's included, agree
    with the reference, so the check cannot give them up by a false alarm."""
    from asr.losses import triton_lattice

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert lattice_disagreement(triton_lattice, torch_lattice, device) == ""
    assert "differs" in lattice_disagreement(wrong_node_scores(), torch_lattice, device)
    assert "TDT duration term differs" in lattice_disagreement(
        wrong_duration_moves(), torch_lattice, device
    )


def test_auto_is_the_fallback_on_cuda_and_the_reference_elsewhere():
    assert lattice_ops("auto", torch.device("cuda")) is AUTO_ON_CUDA
    assert lattice_ops("auto", torch.device("cpu")) is torch_lattice
    assert active_lattice("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="lattice='cuda' is unknown"):
        lattice_ops("cuda", torch.device("cpu"))

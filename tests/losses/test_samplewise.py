"""The sample-wise loss against the batched reference (torchaudio) and its own options."""

import pytest
import torch
from torch import nn

from asr.losses import lattice as torch_lattice
from asr.losses.lattice_choice import lattice_ops
from asr.losses.samplewise import plan_chunks, plan_groups, tanh_joint_parts
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner
from asr.profiling import launching_ops


class WrappedJoiner(nn.Module):
    """Not a stock Joiner, so the loss takes its generic (autograd) path."""

    def __init__(self, joiner: Joiner) -> None:
        super().__init__()
        self.joiner = joiner

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return self.joiner(enc, pred)


def random_batch(seed: int, batch: int = 6, frames: int = 30, tokens: int = 9, vocab: int = 17):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    joiner = Joiner(encoder_dim=12, predictor_dim=10, joint_dim=16, vocab_size=vocab)
    enc = torch.randn(batch, frames + 3, 12, generator=g)  # padded beyond the longest
    pred = torch.randn(batch, tokens + 2, 10, generator=g)
    targets = torch.randint(1, vocab, (batch, tokens + 1), generator=g)
    enc_lens = torch.randint(1, frames + 1, (batch,), generator=g)
    target_lens = torch.randint(0, tokens + 1, (batch,), generator=g)
    enc_lens[0], target_lens[1] = frames, tokens  # a sample at each maximum
    return joiner, enc, pred, targets, enc_lens, target_lens


def loss_and_grads(loss_fn, joiner, module, enc, pred, *rest, reduction="mean", **options):
    enc, pred = enc.clone().requires_grad_(True), pred.clone().requires_grad_(True)
    loss = loss_fn(module, enc, pred, *rest, reduction=reduction, **options)
    weights = torch.linspace(-1.0, 2.0, enc.size(0))
    scalar = (loss * weights).sum() if reduction == "none" else loss
    grads = torch.autograd.grad(scalar, [enc, pred, *joiner.parameters()])
    return loss.detach(), grads


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


class ReluJoiner(Joiner):
    """A Joiner subclass that forms its logits otherwise: it must not take the fused path."""

    def joint(self, enc_projected: torch.Tensor, pred_projected: torch.Tensor) -> torch.Tensor:
        return self.output(torch.relu(enc_projected + pred_projected))


def test_only_a_joiner_that_offers_its_tanh_parts_takes_the_fused_path():
    joiner, *inputs = random_batch(0)
    assert tanh_joint_parts(joiner) == (
        joiner.project_encoder,
        joiner.project_predictor,
        joiner.output,
    )
    assert tanh_joint_parts(WrappedJoiner(joiner)) is None  # offers nothing
    relu = ReluJoiner(encoder_dim=12, predictor_dim=10, joint_dim=16, vocab_size=17)
    relu.load_state_dict(joiner.state_dict())
    assert tanh_joint_parts(relu) is None
    ref, ref_grads = loss_and_grads(batched_transducer_loss, relu, relu, *inputs)
    got, grads = loss_and_grads(samplewise_transducer_loss, relu, relu, *inputs)
    assert rel_error(got, ref) < 1e-4  # the generic path computed the relu joiner's loss
    for g, r in zip(grads, ref_grads, strict=True):
        assert rel_error(g, r) < 1e-4


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("path", ["fused", "generic"])
@pytest.mark.parametrize(
    ("group_size", "chunk_nodes"), [(1, 1 << 22), (4, 1 << 22), (8, 1), (1, 600)]
)
def test_float32_matches_the_batched_reference(reduction, path, group_size, chunk_nodes):
    # chunk_nodes: the whole batch in one lattice recursion, or one group per recursion,
    # or a few groups per recursion
    for seed in range(3):
        joiner, *inputs = random_batch(seed)
        module = joiner if path == "fused" else WrappedJoiner(joiner)
        ref, ref_grads = loss_and_grads(
            batched_transducer_loss, joiner, module, *inputs, reduction=reduction
        )
        got, grads = loss_and_grads(
            samplewise_transducer_loss,
            joiner,
            module,
            *inputs,
            reduction=reduction,
            group_size=group_size,
            lattice_chunk_nodes=chunk_nodes,
        )
        assert got.shape == ref.shape
        assert rel_error(got, ref) < 1e-4
        for g, r in zip(grads, ref_grads, strict=True):
            assert rel_error(g, r) < 1e-4


@pytest.mark.parametrize("path", ["fused", "generic"])
def test_without_gradients_only_the_loss_is_computed(path):
    joiner, *inputs = random_batch(0)
    module = joiner if path == "fused" else WrappedJoiner(joiner)
    with torch.no_grad():
        loss = samplewise_transducer_loss(module, *inputs, reduction="none")
    assert not loss.requires_grad
    reference = batched_transducer_loss(joiner, *inputs, reduction="none")
    assert rel_error(loss, reference.detach()) < 1e-5


def test_frozen_joiner_output_layer_still_trains_the_inputs():
    joiner, enc, pred, *rest = random_batch(1)
    joiner.output.requires_grad_(False)
    enc = enc.clone().requires_grad_(True)
    samplewise_transducer_loss(joiner, enc, pred, *rest).backward()
    enc_ref = enc.detach().clone().requires_grad_(True)
    batched_transducer_loss(joiner, enc_ref, pred, *rest).backward()
    assert joiner.output.weight.grad is None
    assert rel_error(enc.grad, enc_ref.grad) < 1e-4


@pytest.mark.parametrize("path", ["fused", "generic"])
def test_bfloat16_logits_stay_close(path):
    joiner, *inputs = random_batch(2)
    module = joiner if path == "fused" else WrappedJoiner(joiner)
    exact, exact_grads = loss_and_grads(samplewise_transducer_loss, joiner, module, *inputs)
    low, low_grads = loss_and_grads(
        samplewise_transducer_loss, joiner, module, *inputs, logits_dtype=torch.bfloat16
    )
    assert low.dtype == torch.float32
    assert low.item() == pytest.approx(exact.item(), rel=0.02)
    for g, e in zip(low_grads, exact_grads, strict=True):
        cosine = torch.nn.functional.cosine_similarity(g.flatten(), e.flatten(), dim=0)
        assert cosine > 0.98


@pytest.mark.parametrize("path", ["fused", "generic"])
def test_joiner_precision_follows_autocast_unless_given(path):
    joiner, *inputs = random_batch(4)
    module = joiner if path == "fused" else WrappedJoiner(joiner)
    args = (samplewise_transducer_loss, joiner, module, *inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto, auto_grads = loss_and_grads(*args)
        bf16, bf16_grads = loss_and_grads(*args, logits_dtype=torch.bfloat16)
        fp32, _ = loss_and_grads(*args, logits_dtype=torch.float32)
    assert torch.equal(auto, bf16) and not torch.equal(auto, fp32)
    assert all(torch.equal(a, b) for a, b in zip(auto_grads, bf16_grads, strict=True))


def test_grad_clamp_bounds_every_logit_gradient():
    # A joiner whose encoder input *is* the logits: d loss / d enc = d loss / d logits.
    def logits_in_encoder_out(enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        return enc.unflatten(-1, (pred.size(-2), -1)).squeeze(-3) + 0.0 * pred

    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(1, 5, 4, 6, generator=g)
    targets, lens = torch.tensor([[1, 2, 3]]), (torch.tensor([5]), torch.tensor([3]))
    grads = {}
    for clamp in (None, 0.05):
        enc = logits.reshape(1, 5, 24).requires_grad_(True)
        pred = torch.zeros(1, 4, 1)
        loss = samplewise_transducer_loss(
            logits_in_encoder_out, enc, pred, targets, *lens, reduction="sum", grad_clamp=clamp
        )
        loss.backward()
        grads[clamp] = enc.grad
    assert grads[None].abs().max() > 0.05
    assert grads[0.05].abs().max() <= 0.05 + 1e-7
    unclamped = grads[None].abs() < 0.05
    assert torch.equal(grads[0.05][unclamped], grads[None][unclamped])


def test_groups_hold_similar_sizes_largest_first():
    frames, tokens = [10, 50, 20, 50, 5], [3, 9, 4, 2, 1]  # lattice sizes 40, 500, 100, 150, 10
    assert plan_groups(frames, tokens, 2) == [[1, 3], [2, 0], [4]]
    assert plan_groups(frames, tokens, 1) == [[1], [3], [2], [0], [4]]
    # A node budget: [1] alone (500), then 3 and 2 pad to 50 x 5 each (500 > 400) ...
    assert plan_groups(frames, tokens, 8, max_group_nodes=400) == [[1], [3], [2, 0, 4]]
    assert plan_groups(frames, tokens, 8, max_group_nodes=1) == [[1], [3], [2], [0], [4]]
    with pytest.raises(ValueError, match="group_size"):
        plan_groups(frames, tokens, 0)


def test_chunks_share_a_recursion_within_their_node_budget():
    frames, tokens = [10, 50, 20, 50, 5], [3, 9, 4, 2, 1]
    groups = plan_groups(frames, tokens, 1)  # [[1], [3], [2], [0], [4]]
    assert plan_chunks(groups, frames, tokens, 1 << 20) == [groups]
    # [1] and [3] pad to 2 x 50 x 10 = 1000 nodes; adding [2] would make 1500
    assert plan_chunks(groups, frames, tokens, 1000) == [[[1], [3]], [[2], [0], [4]]]
    assert plan_chunks(groups, frames, tokens, 1) == [[g] for g in groups]
    with pytest.raises(ValueError, match="lattice_chunk_nodes"):
        plan_chunks(groups, frames, tokens, 0)


def _launching_ops_per_sample(frames: int, tokens: int) -> float:
    from torch.profiler import profile

    counts = []
    for batch in (2, 6):
        joiner, enc, pred, *rest = random_batch(0, batch=batch, frames=frames, tokens=tokens)
        enc.requires_grad_(True)
        with profile() as prof:
            samplewise_transducer_loss(joiner, enc, pred, *rest).backward()
        counts.append(launching_ops(prof.key_averages()))
    return (counts[1] - counts[0]) / 4


def test_each_sample_adds_a_fixed_number_of_ops_whatever_its_length():
    # The lattice recursion runs once for the batch: a longer sample does not add ops.
    short, long = _launching_ops_per_sample(12, 3), _launching_ops_per_sample(48, 12)
    assert short == long
    assert short <= 60


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"logits_dtype": torch.float64}, "logits_dtype"),
        ({"grad_clamp": 0.0}, "grad_clamp"),
        ({"group_size": 0}, "group_size"),
        ({"max_group_nodes": 0}, "max_group_nodes"),
        ({"lattice": "cuda"}, "lattice='cuda' is unknown"),
    ],
)
def test_bad_options_are_explained(options, message):
    joiner, *inputs = random_batch(0)
    with pytest.raises(ValueError, match=message):
        samplewise_transducer_loss(joiner, *inputs, **options)


def test_auto_lattice_is_pytorch_ops_off_cuda():
    # Triton kernels are the default on CUDA only (tests/losses/test_triton_lattice.py)
    assert lattice_ops("auto", torch.device("cpu")) is torch_lattice
    assert lattice_ops("torch", torch.device("cuda")) is torch_lattice

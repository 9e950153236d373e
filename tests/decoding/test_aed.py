"""Greedy and beam search of the attention encoder-decoder against plain references."""

import itertools
import math

import pytest
import torch

from asr.decoding.aed import (
    AedSearchOptions,
    beam_search,
    decode,
    greedy_search,
    max_output_lengths,
)
from asr.decoding.search import decode_nbest
from asr.models.aed import EncoderDecoder
from asr.models.build import build_model

VOCAB = 40


def trained_looking_aed(vocab: int = VOCAB, seed: int = 0) -> EncoderDecoder:
    """A random model whose EOS is likely enough that hypotheses end before the limit."""
    torch.manual_seed(seed)
    cfg = {
        "kind": "aed",
        "encoder": {"input_dim": 20, "d_model": 32, "num_layers": 2, "num_heads": 2}
        | {"conv_kernel_size": 7, "dropout": 0.0},
        "decoder": {"d_model": 32, "num_layers": 2, "num_heads": 4, "dropout": 0.0},
    }
    model = build_model(cfg, vocab).double().eval()
    with torch.no_grad():
        model.decoder.output_bias[model.eos_id] = 2.5
    return model


def encoded(model: EncoderDecoder, lens: list[int], seed: int = 1) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    feats = torch.randn(len(lens), max(lens), 20, dtype=torch.double)
    return model.encode(feats, torch.tensor(lens))


@torch.no_grad()
def uncached_greedy(model: EncoderDecoder, enc, enc_lens, max_tps: float) -> list[list[int]]:
    """Greedy search without any cache: the whole prefix through the decoder every step."""
    limits = max_output_lengths(enc_lens, model.frame_seconds, max_tps).tolist()
    out = []
    for i in range(enc.size(0)):
        prefix = [model.bos_id]
        while len(prefix) - 1 < limits[i]:
            logits = model.decoder(torch.tensor([prefix]), enc[i : i + 1], enc_lens[i : i + 1])
            token = int(logits[0, -1].argmax())
            if token == model.eos_id:
                break
            prefix.append(token)
        out.append(prefix[1:])
    return out


LENS = [120, 97, 64, 30, 111, 8]


def test_cached_greedy_gives_exactly_the_tokens_of_uncached_greedy() -> None:
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, LENS)
    hyps = greedy_search(model, enc, enc_lens, max_tps=6)
    assert hyps == uncached_greedy(model, enc, enc_lens, max_tps=6)
    limits = max_output_lengths(enc_lens, model.frame_seconds, 6).tolist()
    lengths = [len(h) for h in hyps]
    assert any(n < limit for n, limit in zip(lengths, limits, strict=True))  # some chose EOS
    assert all(n <= limit for n, limit in zip(lengths, limits, strict=True))
    assert len(set(lengths)) > 1  # rows finished at different steps


def test_batched_greedy_equals_greedy_one_utterance_at_a_time() -> None:
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, LENS)
    batched = greedy_search(model, enc, enc_lens, max_tps=6)
    alone = [
        greedy_search(model, enc[i : i + 1, : enc_lens[i]], enc_lens[i : i + 1], max_tps=6)[0]
        for i in range(len(LENS))
    ]
    assert batched == alone


def test_beam_search_of_beam_one_is_greedy_search() -> None:
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, LENS)
    greedy = greedy_search(model, enc, enc_lens, max_tps=6)
    assert beam_search(model, enc, enc_lens, AedSearchOptions(beam_size=1, max_tps=6)) == greedy
    assert decode(model, enc, enc_lens, AedSearchOptions(beam_size=1, max_tps=6)) == greedy


@torch.no_grad()
def sequence_score(model: EncoderDecoder, enc, enc_lens, tokens: list[int]) -> float:
    """log P(tokens + EOS) under the model, with the full (uncached) decoder."""
    inputs = torch.tensor([[model.bos_id, *tokens]])
    log_probs = model.decoder(inputs, enc, enc_lens)[0].log_softmax(-1)
    targets = [*tokens, model.eos_id]
    return float(sum(log_probs[i, t] for i, t in enumerate(targets)))


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_a_beam_wider_than_every_hypothesis_finds_the_best_sequence(length_penalty: float) -> None:
    """Exhaustive search over a 6-token vocabulary and at most 3 tokens (EOS forced after
    the third): with a beam wider than every step's candidates, beam search must return
    the best-scoring sequence."""
    model = trained_looking_aed(vocab=6, seed=3)
    enc, enc_lens = encoded(model, [48], seed=4)  # 12 frames x 40 ms x 6 tokens/s -> 3 tokens
    limit = int(max_output_lengths(enc_lens, model.frame_seconds, 6)[0])
    assert limit == 3
    best, best_score = None, -math.inf
    for n in range(limit + 1):
        for tokens in itertools.product(range(6), repeat=n):
            if model.eos_id in tokens:
                continue
            score = sequence_score(model, enc, enc_lens, list(tokens))
            score /= (n + 1) ** length_penalty
            if score > best_score:
                best, best_score = list(tokens), score
    found = beam_search(
        model, enc, enc_lens, AedSearchOptions(6**3, length_penalty=length_penalty, max_tps=6)
    )
    assert found == [best]
    greedy = greedy_search(model, enc, enc_lens, max_tps=6)[0]
    g = len(greedy)
    greedy_score = sequence_score(model, enc, enc_lens, greedy) / (g + 1) ** length_penalty
    assert best_score >= greedy_score


def test_beam_search_batches_like_one_utterance_at_a_time() -> None:
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, LENS)
    batched = beam_search(model, enc, enc_lens, AedSearchOptions(beam_size=4, max_tps=6))
    alone = [
        beam_search(
            model,
            enc[i : i + 1, : enc_lens[i]],
            enc_lens[i : i + 1],
            AedSearchOptions(beam_size=4, max_tps=6),
        )[0]
        for i in range(len(LENS))
    ]
    assert batched == alone


def test_nbest_lists_start_with_the_best_and_go_down() -> None:
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, LENS)
    best = beam_search(model, enc, enc_lens, AedSearchOptions(beam_size=4, max_tps=6))
    lists = decode_nbest(model, enc, enc_lens, AedSearchOptions(beam_size=4, max_tps=6), 3)
    assert [hyps[0][0] for hyps in lists] == best
    for hyps in lists:
        scores = [score for _, score in hyps]
        assert 1 <= len(hyps) <= 3 and scores == sorted(scores, reverse=True)
        assert len({tuple(tokens) for tokens, _ in hyps}) == len(hyps)  # distinct
    with pytest.raises(ValueError, match="needs a beam search at least as wide"):
        decode_nbest(model, enc, enc_lens, AedSearchOptions(beam_size=2), 3)


def test_search_options_are_checked() -> None:
    with pytest.raises(ValueError, match="beam_size"):
        AedSearchOptions(beam_size=0)
    with pytest.raises(ValueError, match="max_tps"):
        AedSearchOptions(max_tps=0)
    model = trained_looking_aed()
    with pytest.raises(ValueError, match="encoder_out"):
        greedy_search(model, torch.zeros(2, 3), torch.tensor([1, 2]))


@pytest.mark.parametrize(("positions", "eos_bias"), [("sinusoidal", 2.2), ("learned", 2.5)])
def test_static_cache_greedy_equals_greedy(positions, eos_bias):
    """The preallocated-cache search (CUDA's, here eager) gives greedy search's tokens;
    one instance serves batches of different sizes and lengths."""
    from asr.decoding.aed import StaticGreedySearch

    model = trained_looking_aed()
    if positions == "learned":
        torch.manual_seed(3)
        cfg = {
            "kind": "aed",
            "encoder": {"input_dim": 20, "d_model": 32, "num_layers": 2, "num_heads": 2}
            | {"conv_kernel_size": 7, "dropout": 0.0},
            "decoder": {"d_model": 32, "num_layers": 1, "num_heads": 4, "dropout": 0.0}
            | {"positions": "learned", "max_positions": 64},
        }
        model = build_model(cfg, VOCAB).double().eval()
    with torch.no_grad():  # EOS likely enough to end some hypotheses, not all at once
        model.decoder.output_bias[model.eos_id] = eos_bias
    search = StaticGreedySearch(model, max_tps=12.0)
    ended_early = emitted = 0
    for lens in ([90, 31, 57, 8, 66], [40], [120, 3]):
        enc, enc_lens = encoded(model, lens)
        expected = greedy_search(model, enc, enc_lens, max_tps=12.0)
        assert search(enc, enc_lens) == expected
        assert expected == uncached_greedy(model, enc, enc_lens, 12.0)
        limits = max_output_lengths(enc_lens, model.frame_seconds, 12.0).tolist()
        ended_early += sum(len(h) < n for h, n in zip(expected, limits, strict=True))
        emitted += sum(map(len, expected))
    assert ended_early > 0 and emitted > 20  # EOS ends hypotheses, not only the limit


def test_static_cache_greedy_stops_at_the_limit_with_eos_suppressed():
    from asr.decoding.aed import StaticGreedySearch

    model = trained_looking_aed()
    with torch.no_grad():
        model.decoder.output_bias[model.eos_id] = -math.inf
    enc, enc_lens = encoded(model, [50, 23, 7])
    got = StaticGreedySearch(model, max_tps=9.0)(enc, enc_lens)
    limits = max_output_lengths(enc_lens, model.frame_seconds, 9.0).tolist()
    assert [len(h) for h in got] == limits
    assert got == greedy_search(model, enc, enc_lens, max_tps=9.0)


def test_static_state_keeps_its_tensors():
    """A CUDA graph replays into the tensors it captured: the step writes in place."""
    model = trained_looking_aed()
    enc, enc_lens = encoded(model, [30, 12])
    with torch.inference_mode():
        state = model.decoder.static_state(2, 30, 10, enc.device, torch.double)
        model.decoder.load_static_state(state, enc, enc_lens)
        tensors = [*state.self_k, *state.self_v, state.self_mask, state.position]
        pointers = [t.data_ptr() for t in tensors]
        tokens = torch.full((2,), model.bos_id)
        for _ in range(10):
            model.decoder.step_static(tokens, state)
    assert [t.data_ptr() for t in tensors] == pointers
    assert int(state.position) == 10 and bool(state.self_mask.all())

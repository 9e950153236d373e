"""Token-and-duration transducers (TDT) in every transducer search: a hand-built joiner
whose tokens and durations are known moves each search exactly as far as its durations
say (and never visits the frames in between); on random models the frame- and
label-looping greedy searches agree, beam 1 is greedy, an unpruned beam finds what an
exhaustive search over the alignments finds, a wider beam never does worse than greedy,
and chunk-by-chunk decoding (durations that jump past a chunk's end) equals the whole."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asr.decoding.biasing import BiasingGraph
from asr.decoding.confidence import token_confidence
from asr.decoding.durations import fold_landings
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.search import decode_with, search_whole
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from asr.models.build import build_model
from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer
from tests.decoding.searching import beam_nbest, greedy_timed, label_looping
from tests.decoding.test_transducer import BLANK, CountingPredictor, V

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is fastest

DURATIONS = (0, 1, 2, 3, 4)
T = 10  # frames of the hand-built model
U_MAX = 32  # tokens it may emit


class LongCountingPredictor(CountingPredictor):
    """`CountingPredictor` that counts up to U_MAX tokens."""

    def step(self, last_tokens, state):
        u = state + 1
        return F.one_hot(u, U_MAX).double(), u


LOOPS = [pytest.param(False, id="eager-loops"), pytest.param(True, id="graph-body")]


# -- a hand-built TDT: each (frame, tokens so far) says its token and duration ----------
class DurationTableJoiner(nn.Module):
    """Emits TABLE[frame, u] = (token, duration): encoder frames are one-hot frame
    indices, predictor outputs one-hot u (`CountingPredictor`); the token logits are 10 x
    one-hot(token), the duration logits 10 x one-hot(the duration's index)."""

    vocab_size = V
    durations = DURATIONS

    def __init__(self, table: dict[tuple[int, int], tuple[int, int]], default=(BLANK, 1)):
        super().__init__()
        tokens = torch.full((T, U_MAX), default[0])
        lasting = torch.full((T, U_MAX), DURATIONS.index(default[1]))
        for (frame, u), (token, duration) in table.items():
            tokens[frame, u], lasting[frame, u] = token, DURATIONS.index(duration)
        logits = torch.cat([F.one_hot(tokens, V), F.one_hot(lasting, len(DURATIONS))], dim=-1)
        self.register_buffer("logits", 10.0 * logits.double())  # (T, U_MAX, V + D)

    def project_encoder(self, x):
        return x

    def project_predictor(self, x):
        return x

    def joint(self, enc, pred):
        return torch.einsum("bt,bu,tuv->bv", enc, pred, self.logits)

    def split(self, logits):
        return logits[..., :V], logits[..., V:]


# Frame 0 emits 3 and skips to 2; its blank skips to 5; 5 emits 4 (duration 0: it stays)
# and 5 (on to 6); 6's blank of duration 0 moves on one frame; 7 emits 6 and jumps past
# the end (frame 11 of 10). Visited: 0, 2, 5, 6, 7.
TABLE = {(0, 0): (3, 2), (2, 1): (BLANK, 3), (5, 1): (4, 0), (5, 2): (5, 1)}
TABLE |= {(6, 3): (BLANK, 0), (7, 3): (6, 4)}
EXPECTED = [([3, 4, 5, 6], [0, 5, 5, 7], [2, 0, 1, 4]), ([3, 4, 5], [0, 5, 5], [2, 0, 1])]


def _hand_built(table=TABLE, default=(BLANK, 1)):
    joiner = DurationTableJoiner(table, default)
    model = Transducer(nn.Identity(), LongCountingPredictor(), joiner)
    enc = F.one_hot(torch.arange(T), T).double().expand(2, T, T)
    return model, enc, torch.tensor([T, 6])


def _timed(hyps):
    return [(list(h.tokens), list(h.frames), list(h.durations)) for h in hyps]


def _greedy_searches():
    yield "frame", FrameLoopingGreedy()
    yield "label", LabelLoopingGreedy(loops="eager")
    yield "fused", LabelLoopingGreedy(loops="fused")


@pytest.mark.parametrize("name", ["frame", "label", "fused"])
def test_greedy_moves_by_the_predicted_durations_and_skips_the_frames_between(name):
    search = dict(_greedy_searches())[name]
    model, enc, lens = _hand_built()
    progress = search_whole(search, model, enc, lens)
    assert _timed(search.best(progress)) == EXPECTED
    assert progress.visited == [5, 3]  # frames 0 2 5 6 7 of 10; 0 2 5 of 6
    assert progress.rows.skip.tolist() == [1, 0]  # 7 + 4 is one frame past the end
    assert progress.consumed == [10, 6]


@pytest.mark.parametrize("beam", [1, 3])
def test_beam_search_moves_by_the_predicted_durations(beam):
    model, enc, lens = _hand_built()
    search = BeamSearch(BeamOptions(beam_size=beam, nbest=beam))
    progress = search_whole(search, model, enc, lens)
    assert _timed(search.best(progress)) == EXPECTED
    if beam == 1:  # (the frames a wider beam visits are those of all its hypotheses)
        assert progress.visited == [5, 3]


@pytest.mark.parametrize("name", ["frame", "label", "fused", "beam"])
def test_a_duration_past_the_chunk_s_end_carries_into_the_next_chunk(name):
    """Frame 2's blank jumps to 5, past the first chunk (frames 0-3): the next chunk starts
    one frame in."""
    search = dict(_greedy_searches()).get(name) or BeamSearch(BeamOptions(beam_size=1))
    model, enc, lens = _hand_built()
    progress = search.start(model, 2, "cpu")
    progress = search.advance(model, progress, enc[:, :4], torch.tensor([4, 4]))
    assert progress.rows.skip.tolist() == [1, 1]
    progress = search.advance(model, progress, enc[:, 4:], lens - 4)
    assert _timed(search.best(progress)) == EXPECTED
    assert progress.visited == [5, 3]


@pytest.mark.parametrize("symbols", [1, 2, 3])
def test_tokens_of_duration_zero_stay_until_the_symbol_limit(symbols):
    model, enc, lens = _hand_built(table={}, default=(4, 0))  # never blank, never moves
    options = GreedyOptions(max_symbols_per_frame=symbols)
    expected = [[f for f in range(n) for _ in range(symbols)] for n in (T, 6)]
    for fused in (False, True):
        hyps = label_looping(model, enc, lens, options, fused)
        assert [h.frames for h in hyps] == expected
    assert greedy_timed(model, enc, lens, options) == hyps
    assert all(d == 0 for h in hyps for d in h.durations)
    beam = BeamOptions(beam_size=1, max_symbols_per_frame=symbols)
    assert [list(h[0].frames) for h in beam_nbest(model, enc, lens, beam)] == expected


def test_a_token_always_moves_on_its_duration():
    model, enc, lens = _hand_built(table={}, default=(4, 2))  # never blank, two frames on
    for name, search in _greedy_searches():
        progress = search_whole(search, model, enc, lens)
        assert [h.frames for h in search.best(progress)] == [[0, 2, 4, 6, 8], [0, 2, 4]], name
        assert progress.visited == [5, 3], name


def test_confidence_reads_the_token_distribution_only():
    model, enc, lens = _hand_built()
    expected = float(token_confidence((10.0 * F.one_hot(torch.tensor(3), V)).log_softmax(-1)))
    for _, search in _greedy_searches():
        first = decode_with(search, model, enc, lens)[0].confidences[0]
        assert first == pytest.approx(expected, abs=1e-6)
    beam = beam_nbest(model, enc, lens, BeamOptions(beam_size=2))[0][0]
    assert beam.confidences[0] == pytest.approx(expected, abs=1e-6)
    # with the V + D logits in one distribution it would be another number
    mixed = torch.cat([10.0 * F.one_hot(torch.tensor(3), V), 10.0 * F.one_hot(torch.tensor(2), 5)])
    assert float(token_confidence(mixed.log_softmax(-1))) != pytest.approx(expected, abs=1e-3)


def test_durations_that_land_on_one_frame_are_one_candidate():
    log_probs = torch.tensor([[-0.5, -1.0, -3.0], [-2.0, -0.2, -4.0]], dtype=torch.float64)
    best, which, moves = fold_landings(log_probs, [1, 1, 2])  # a blank's 0 and 1
    assert moves == [1, 2]
    assert best.tolist() == [[-0.5, -3.0], [-0.2, -4.0]]
    assert which.tolist() == [[0, 2], [1, 2]]
    same, index, kept = fold_landings(log_probs, [0, 1, 2])
    assert same is log_probs and kept == [0, 1, 2] and index.tolist() == [[0, 1, 2]] * 2


# -- random-weight TDT models ----------------------------------------------------------
def _random_tdt(kind="lstm", seed=0, vocab=9, durations=DURATIONS, dtype=torch.float32):
    torch.manual_seed(seed)
    config = PredictorConfig(embed_dim=8, hidden_dim=10, kind=kind, context_size=2, num_layers=2)
    predictor = Predictor(config, vocab_size=vocab)
    joiner = Joiner(
        encoder_dim=6, predictor_dim=10, joint_dim=12, vocab_size=vocab, durations=durations
    )
    return Transducer(nn.Identity(), predictor, joiner).to(dtype).eval()


def _random_batch(seed=1, frames=40, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    enc = 3 * torch.randn(6, frames, 6, generator=generator).to(dtype)
    return enc, torch.tensor([frames, frames // 2 - 3, 1, 0, frames - 7, 5])


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("kind", ["lstm", "stateless"])
@pytest.mark.parametrize("symbols", [1, 3])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "biased"])
def test_label_looping_gives_frame_looping_s_tokens_frames_and_durations(
    fused, kind, symbols, biased
):
    model = _random_tdt(kind)
    enc, lens = _random_batch()
    graph = BiasingGraph.from_tokens([([4, 5], 2.0), ([7, 8, 7], 1.5)], 9) if biased else None
    options = GreedyOptions(max_symbols_per_frame=symbols)
    frame = FrameLoopingGreedy(options)
    label = LabelLoopingGreedy(options, loops="fused" if fused else "eager")
    expected = search_whole(frame, model, enc, lens, graph)
    found = search_whole(label, model, enc, lens, graph)
    assert label.best(found) == frame.best(expected)  # tokens, frames, confidences, durations
    assert found.visited == expected.visited
    assert found.rows.skip.tolist() == expected.rows.skip.tolist()
    hyps = frame.best(expected)
    assert sum(len(h.tokens) for h in hyps) > 15  # the random model does emit tokens
    assert any(d > 1 for h in hyps for d in h.durations)
    assert sum(expected.visited) < sum(lens.tolist())  # frames were skipped
    assert hyps[3].tokens == [] and expected.visited[3] == 0


def test_a_tdt_built_from_a_config_decodes_random_features_alike_in_every_greedy_search():
    torch.manual_seed(3)
    encoder = {"input_dim": 20, "d_model": 16, "num_layers": 1, "num_heads": 2}
    encoder |= {"conv_kernel_size": 3, "subsampling_channels": 4, "dropout": 0.0}
    config = {
        "kind": "transducer",
        "encoder": encoder,
        "predictor": {"embed_dim": 16, "hidden_dim": 16, "dropout": 0.0},
        "joiner": {"joint_dim": 16, "durations": list(DURATIONS)},
    }
    model = build_model(config, 12).eval()
    assert model.durations == DURATIONS
    features = 2 * torch.randn(3, 80, 20)
    with torch.inference_mode():
        out, lens = model.encode(features, torch.tensor([80, 57, 31]))
    expected = greedy_timed(model, out, lens)
    for fused in (False, True):
        assert label_looping(model, out, lens, fused=fused) == expected
    assert sum(len(h.tokens) for h in expected) > 3
    for hyp, n in zip(expected, lens.tolist(), strict=True):
        assert all(0 <= f < n for f in hyp.frames) and hyp.frames == sorted(hyp.frames)
        assert all(0 <= t < 12 for t in hyp.tokens) and all(d in DURATIONS for d in hyp.durations)
    beam = decode_with(BeamSearch(BeamOptions(beam_size=3)), model, out, lens)
    assert all(all(0 <= f < n for f in h.frames) for h, n in zip(beam, lens.tolist(), strict=True))


@pytest.mark.parametrize("kind", ["lstm", "stateless"])
@pytest.mark.parametrize("symbols", [1, 2, 3])
def test_beam_one_is_greedy_search(kind, symbols):
    model = _random_tdt(kind, dtype=torch.float64)
    enc, lens = _random_batch(dtype=torch.float64)
    greedy = greedy_timed(model, enc, lens, GreedyOptions(max_symbols_per_frame=symbols))
    options = BeamOptions(beam_size=1, max_symbols_per_frame=symbols)
    beam = [hyps[0].timed() for hyps in beam_nbest(model, enc, lens, options)]
    assert _timed(beam) == _timed(greedy)  # tokens, frames and durations
    for b, g in zip(beam, greedy, strict=True):  # beam scores in float64, greedy in float32
        assert b.confidences == pytest.approx(g.confidences, abs=1e-5)
    assert sum(len(g.tokens) for g in greedy) > 15


def test_beam_batched_equals_one_by_one():
    model = _random_tdt("lstm", seed=1, dtype=torch.float64)
    enc, lens = _random_batch(seed=2, frames=16, dtype=torch.float64)
    options = BeamOptions(beam_size=4, nbest=4)
    batched = beam_nbest(model, enc, lens, options)
    for i, n in enumerate(lens.tolist()):
        alone = beam_nbest(model, enc[i : i + 1, :n], lens[i : i + 1], options)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-9)
        assert len({h.tokens for h in alone}) == len(alone)  # equal tokens are one hypothesis


def _exhaustive(model: Transducer, enc: torch.Tensor, symbols: int) -> dict[tuple, float]:
    """Every token sequence the decoding rules can reach, with the log-sum over its
    alignments: each step at frame p < T picks a symbol and a duration, log P(symbol) +
    log P(duration); a blank moves max(d, 1) frames on, a token d (at least 1 with the
    frame's `symbols` tokens); durations that land on the same frame count once, with the
    most probable of them."""
    frames, blank, durations = enc.size(0), model.blank_id, model.durations
    totals: dict[tuple[int, ...], float] = {}

    def landing(log_probs, moves):
        best: dict[int, float] = {}
        for move, lp in zip(moves, log_probs.tolist(), strict=True):
            best[move] = max(best.get(move, -math.inf), lp)
        return best.items()

    def walk(p, emitted_here, seq, out, state, score):
        if p >= frames:
            totals[seq] = math.log(math.exp(totals.get(seq, -math.inf)) + math.exp(score))
            return
        token_logits, duration_logits = model.joiner.split(model.joiner(enc[p : p + 1], out))
        token_lp, duration_lp = token_logits.log_softmax(-1)[0], duration_logits.log_softmax(-1)[0]
        at_least_one = [max(d, 1) for d in durations]
        for move, lp in landing(duration_lp, at_least_one):
            walk(p + move, 0, seq, out, state, score + float(token_lp[blank]) + lp)
        last = emitted_here + 1 == symbols
        for token in range(model.vocab_size):
            if token == blank:
                continue
            next_out, next_state = model.predictor.step(torch.tensor([token]), state)
            for move, lp in landing(duration_lp, at_least_one if last else list(durations)):
                here = emitted_here + 1 if move == 0 else 0
                gained = score + float(token_lp[token]) + lp
                walk(p + move, here, (*seq, token), next_out, next_state, gained)

    state = model.predictor.init_state(1, "cpu")
    out, state = model.predictor.step(torch.tensor([blank]), state)
    walk(0, 0, (), out, state, 0.0)
    return totals


@pytest.mark.parametrize(
    ("durations", "symbols", "frames"),
    [((1, 2), 1, 4), ((0, 1, 2), 1, 3), ((0, 1, 2), 2, 2)],
    ids=["no-zero", "zero-folded", "zero-stays"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_an_unpruned_beam_finds_the_exhaustive_search_s_best(durations, symbols, frames, seed):
    model = _random_tdt(seed=seed, vocab=3, durations=durations, dtype=torch.float64)
    enc = 2 * torch.randn(1, frames, 6, dtype=torch.float64)
    with torch.inference_mode():
        exhaustive = _exhaustive(model, enc[0], symbols)
    wide = BeamOptions(beam_size=100, max_symbols_per_frame=symbols, nbest=len(exhaustive))
    hyps = beam_nbest(model, enc, torch.tensor([frames]), wide)[0]
    assert hyps[0].tokens == max(exhaustive, key=exhaustive.__getitem__)
    assert {h.tokens: pytest.approx(h.score, abs=1e-9) for h in hyps} == exhaustive
    if 0 not in durations:  # every step's probabilities sum to 1: so do the alignments'
        assert math.isclose(sum(math.exp(h.score) for h in hyps), 1.0, rel_tol=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wider_beam_finds_hypotheses_at_least_as_likely_as_greedy(seed):
    """Beam 1 is greedy search and scores its one alignment; a beam of 4 ends with a
    hypothesis at least as likely (its alignments summed)."""
    model = _random_tdt("lstm", seed=seed, dtype=torch.float64)
    enc, lens = _random_batch(seed=seed + 5, frames=24, dtype=torch.float64)
    greedy = beam_nbest(model, enc, lens, BeamOptions(beam_size=1))
    wide = beam_nbest(model, enc, lens, BeamOptions(beam_size=4))
    pairs = [(g[0].score, w[0].score) for g, w in zip(greedy, wide, strict=True) if g]
    assert all(w >= g - 1e-9 for g, w in pairs)
    assert any(w > g + 1e-3 for g, w in pairs)  # and often more likely


@pytest.mark.parametrize("search", ["frame", "label", "beam"])
def test_chunk_by_chunk_equals_the_whole(search):
    model = _random_tdt("lstm", dtype=torch.float64)
    enc, lens = _random_batch(seed=3, frames=30, dtype=torch.float64)
    make = {
        "frame": lambda: FrameLoopingGreedy(),
        "label": lambda: LabelLoopingGreedy(loops="fused"),
        "beam": lambda: BeamSearch(BeamOptions(beam_size=4)),
    }[search]
    whole = decode_with(make(), model, enc, lens)
    searcher = make()
    progress = searcher.start(model, 6, "cpu")
    carried = 0
    for chunk in (slice(0, 7), slice(7, 11), slice(11, 23), slice(23, 30)):
        part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
        progress = searcher.advance(model, progress, enc[:, chunk], part)
        carried += int((progress.rows.skip > 0).sum())
    assert searcher.best(progress) == whole
    assert carried > 0  # some duration did jump past a chunk's end
    assert progress.visited == search_whole(make(), model, enc, lens).visited


def test_greedy_searches_take_turns_on_a_tdt_stream():
    model = _random_tdt("stateless", seed=2)
    enc, lens = _random_batch(seed=4, frames=24)
    whole = greedy_timed(model, enc, lens)
    searches = [LabelLoopingGreedy(loops="eager"), FrameLoopingGreedy()]
    progress = searches[0].start(model, 6, "cpu")
    for i, chunk in enumerate((slice(0, 5), slice(5, 13), slice(13, 24))):
        part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
        progress = searches[i % 2].advance(model, progress, enc[:, chunk], part)
    assert progress.best() == whole


def _holds(tokens, phrase) -> bool:
    tokens = list(tokens)
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens)))


def test_biasing_recovers_a_phrase_on_a_tdt():
    """The best hypothesis has 4 then 2; a phrase 4 5 makes beam and greedy search take 5
    after 4, each at the duration the model gave it."""
    model = _random_tdt("lstm", seed=0, dtype=torch.float64)
    enc, lens = _random_batch(seed=6, frames=20, dtype=torch.float64)
    plain = beam_nbest(model, enc, lens, BeamOptions(beam_size=4))[0][0]
    assert _holds(plain.tokens, [4, 2]) and not _holds(plain.tokens, [4, 5])
    assert not _holds(greedy_timed(model, enc, lens)[0].tokens, [4, 5])
    phrase = BiasingGraph.from_tokens([([4, 5], 5.0)], 9)
    biased = beam_nbest(model, enc, lens, BeamOptions(beam_size=4), phrase)[0][0]
    assert _holds(biased.tokens, [4, 5])
    assert len(biased.durations) == len(biased.tokens) == len(biased.frames)
    greedy = greedy_timed(model, enc, lens, biasing=phrase)[0]
    assert _holds(greedy.tokens, [4, 5])
    assert label_looping(model, enc, lens, biasing=phrase)[0] == greedy

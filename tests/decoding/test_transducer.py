import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asr.decoding.transducer import GreedyOptions
from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer
from tests.decoding.searching import greedy_timed, greedy_tokens

BLANK, V, ROWS, U_MAX = 0, 7, 8, 16


class CountingPredictor(nn.Module):
    """Its state is u, the number of tokens emitted so far; its output is one-hot(u)."""

    vocab_size = V

    def init_state(self, batch_size: int, device) -> torch.Tensor:
        return torch.full((batch_size,), -1, device=device)

    def step(self, last_tokens: torch.Tensor, state: torch.Tensor):
        u = state + 1
        return F.one_hot(u, U_MAX).double(), u


class TableJoiner(nn.Module):
    """Emits TABLE[row, u]: encoder frames are one-hot row indices, predictor outputs one-hot u."""

    vocab_size = V

    def __init__(self, table: dict[tuple[int, int], int], default: int = BLANK) -> None:
        super().__init__()
        ids = torch.full((ROWS, U_MAX), default)
        for (row, u), token in table.items():
            ids[row, u] = token
        self.register_buffer("logits", F.one_hot(ids, V).double())  # (ROWS, U_MAX, V)

    def project_encoder(self, x):
        return x

    def project_predictor(self, x):
        return x

    def joint(self, enc, pred):
        return torch.einsum("br,bu,ruv->bv", enc, pred, self.logits)


# Sample A reads rows 0-3, sample B rows 4-6 and then a padded frame on row 7, which
# would emit forever: B must stop at its own length.
TABLE = {(0, 0): 3, (2, 1): 5, (2, 2): 6, (3, 3): 2, (5, 0): 1, (5, 1): 1}
TABLE.update({(7, u): 4 for u in range(U_MAX)})


def _hand_built(table=TABLE, default=BLANK):
    model = Transducer(nn.Identity(), CountingPredictor(), TableJoiner(table, default))
    rows = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    return model, F.one_hot(rows, ROWS).double(), torch.tensor([4, 3])


def test_hand_built_joiner_gives_its_sequence():
    model, enc, lens = _hand_built()
    assert greedy_tokens(model, enc, lens) == [[3, 5, 6, 2], [1, 1]]


def test_max_symbols_per_frame_moves_on():
    model, enc, lens = _hand_built()
    # One symbol per frame: frame 2 emits 5 then moves on; frame 3 sees u=2 -> blank.
    assert greedy_tokens(model, enc, lens, GreedyOptions(max_symbols_per_frame=1)) == [
        [3, 5],
        [1],
    ]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_never_blank_joiner_emits_exactly_k_per_frame(k):
    model, enc, lens = _hand_built(table={}, default=4)
    hyps = greedy_tokens(model, enc, lens, GreedyOptions(max_symbols_per_frame=k))
    assert hyps == [[4] * (4 * k), [4] * (3 * k)]


def test_invalid_options():
    model, enc, lens = _hand_built()
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        greedy_tokens(model, enc, lens, GreedyOptions(max_symbols_per_frame=0))
    with pytest.raises(ValueError, match="encoder_lens"):
        greedy_tokens(model, enc, lens[:1])


@pytest.mark.parametrize(("kind", "context_size"), [("lstm", 2), ("stateless", 2)])
def test_batched_equals_one_by_one(kind, context_size):
    torch.manual_seed(0)
    vocab = 9
    config = PredictorConfig(embed_dim=8, hidden_dim=10, kind=kind, context_size=context_size)
    predictor = Predictor(config, vocab_size=vocab)
    joiner = Joiner(encoder_dim=6, predictor_dim=10, joint_dim=12, vocab_size=vocab)
    model = Transducer(nn.Identity(), predictor, joiner).double().eval()
    enc = 3 * torch.randn(5, 14, 6, dtype=torch.float64)
    lens = torch.tensor([14, 7, 1, 10, 3])
    batched = greedy_tokens(model, enc, lens)
    one_by_one = [
        greedy_tokens(model, enc[i : i + 1, :n], lens[i : i + 1])[0]
        for i, n in enumerate(lens.tolist())
    ]
    assert batched == one_by_one
    assert sum(map(len, batched)) > 10  # the random model does emit tokens
    assert all(0 < t < vocab for hyp in batched for t in hyp)
    assert len(batched[2]) <= GreedyOptions().max_symbols_per_frame


def test_zero_length_sample_and_empty_batch():
    model, enc, lens = _hand_built()
    assert greedy_tokens(model, enc, torch.tensor([0, 3])) == [[], [1, 1]]
    assert greedy_tokens(model, enc[:0], lens[:0]) == []


def test_greedy_search_gives_each_token_s_frame():

    model, enc, lens = _hand_built()
    timed = greedy_timed(model, enc, lens)
    # TABLE: frame 0 emits 3; frame 2 emits 5 and 6; frame 3 emits 2; B's frame 1 emits 1, 1
    assert [(t.tokens, t.frames) for t in timed] == [([3, 5, 6, 2], [0, 2, 2, 3]), ([1, 1], [1, 1])]
    one = greedy_timed(model, enc, lens, GreedyOptions(max_symbols_per_frame=1))
    assert [(t.tokens, t.frames) for t in one] == [([3, 5], [0, 2]), ([1], [1])]

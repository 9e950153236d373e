"""The networks an ONNX export holds, as plain modules with tensor inputs and outputs.

A transducer is three graphs in icefall's contract, which sherpa-onnx decodes unchanged:

- encoder: `x` (N, T, F) raw log-mel, `x_lens` (N,) -> `encoder_out` (N, T', J),
  `encoder_out_lens` (N,). The per-utterance normalization training used runs inside, and
  the joiner's encoder projection too, so the joiner adds two J-vectors.
- decoder (stateless predictor): `y` (N, context) token ids, -1 before the start ->
  `decoder_out` (N, J), the predictor's output already projected by the joiner.
  LSTM predictor: `y` (N, 1), `h`, `c` (N, layers, H) -> `decoder_out`, `next_h`, `next_c`.
- joiner: `encoder_out` (N, J), `decoder_out` (N, J) -> `logit` (N, V).

An attention encoder-decoder is two graphs: the encoder gives the cross-attention keys and
values of every decoder layer per frame, (N, T', 2 x layers x D), so that a decoding step
never recomputes them; the decoder takes one token per row, its self-attention cache
(layers, N, H, S, Dh) and that memory, and gives log-probabilities of the next token and
the grown cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.aed import DecoderState, EncoderDecoder, _heads
from asr.models.attention import lengths_to_mask
from asr.models.transducer import Transducer

LSTM_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # nn.LSTM's, per layer
NORM_EPSILON = 1e-5  # asr.data.features.normalize_features's: std + 1e-5


def normalize_per_utterance(x: Tensor, x_lens: Tensor) -> Tensor:
    """x (N, T, F) -> each utterance's valid frames minus their mean, over their standard
    deviation (+ 1e-5), as `asr.data.features.normalize_features` does with numpy."""
    valid = lengths_to_mask(x_lens, x.size(1))[:, :, None].to(x.dtype)  # (N, T, 1)
    count = x_lens.to(x.dtype).clamp(min=1)[:, None, None]
    mean = (x * valid).sum(dim=1, keepdim=True) / count
    var = ((x - mean).square() * valid).sum(dim=1, keepdim=True) / count
    return (x - mean) / (var.sqrt() + NORM_EPSILON)


class EncoderGraph(nn.Module):
    """Raw features -> encoder output (the transducer's: projected for the joiner)."""

    def __init__(self, model: Transducer | EncoderDecoder, normalize: bool) -> None:
        super().__init__()
        self.model, self.normalize = model, normalize

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        if self.normalize:
            x = normalize_per_utterance(x, x_lens)
        out, out_lens = self.model.encode(x, x_lens)
        if isinstance(self.model, Transducer):
            out = self.model.joiner.project_encoder(out)
        else:
            out = aed_memory(self.model, out, out_lens)
        return out, out_lens.to(torch.int64)


class StatelessDecoderGraph(nn.Module):
    """The last `context_size` tokens (-1: before the start, read as blank) -> the
    predictor's projected output."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.predictor, self.joiner = model.predictor, model.joiner
        self.blank_id = model.blank_id

    def forward(self, y: Tensor) -> Tensor:
        y = torch.where(y < 0, torch.full_like(y, self.blank_id), y)
        out = self.predictor._run(y, None)[0][:, -1]
        return self.joiner.project_predictor(out)


class LstmDecoderGraph(nn.Module):
    """The last token (N, 1) and the LSTM state h, c (N, layers, H) -> the projected output
    and the next state. One step of each layer is written out from the LSTM's weights
    (PyTorch's gate order i, f, g, o): the exporter's LSTM operator fails to load for a
    batch-first LSTM with a given state."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.predictor, self.joiner = model.predictor, model.joiner

    def forward(self, y: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lstm = self.predictor.lstm
        x = self.predictor.embedding(y[:, 0])
        next_h, next_c = [], []
        for layer in range(lstm.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(lstm, f"{name}_l{layer}") for name in LSTM_WEIGHTS)
            gates = F.linear(x, w_ih, b_ih) + F.linear(h[:, layer], w_hh, b_hh)
            i, f, g, o = gates.chunk(4, dim=-1)
            cell = torch.sigmoid(f) * c[:, layer] + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(cell)
            next_h.append(x)
            next_c.append(cell)
        out = self.joiner.project_predictor(x)
        return out, torch.stack(next_h, dim=1), torch.stack(next_c, dim=1)


class JoinerGraph(nn.Module):
    """Projected encoder frame and predictor output -> logits."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.joiner = model.joiner

    def forward(self, encoder_out: Tensor, decoder_out: Tensor) -> Tensor:
        return self.joiner.joint(encoder_out, decoder_out)


def aed_memory(model: EncoderDecoder, encoder_out: Tensor, encoder_lens: Tensor) -> Tensor:
    """encoder_out (N, T, D_enc) -> every decoder layer's cross-attention keys and values
    per frame, (N, T, 2 x layers x D): what `AedDecoderGraph` reads."""
    memory, _ = model.decoder._memory(encoder_out, encoder_lens)
    return torch.cat([layer.cross_kv(memory) for layer in model.decoder.layers], dim=-1)


class AedDecoderGraph(nn.Module):
    """One token per row -> log-probabilities of the next token and the grown cache.

    Inputs: `tokens` (N, 1); `self_k`, `self_v` (layers, N, H, S, Dh), the cache of the S
    tokens fed before (S = 0 at BOS); `memory` (N, T, 2 x layers x D) from the encoder graph;
    `memory_lens` (N,). Outputs: `log_probs` (N, V), `next_self_k`, `next_self_v` with S + 1.
    """

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.decoder = model.decoder

    def forward(
        self, tokens: Tensor, self_k: Tensor, self_v: Tensor, memory: Tensor, memory_lens: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        heads = self.decoder.layers[0].num_heads
        cross = [_heads(part, heads) for part in memory.chunk(2 * len(self.decoder.layers), -1)]
        state = DecoderState(
            cross_k=cross[0::2],
            cross_v=cross[1::2],
            memory_mask=lengths_to_mask(memory_lens, memory.size(1))[:, None, None, :],
            self_k=list(self_k.unbind(0)),
            self_v=list(self_v.unbind(0)),
        )
        logits, grown = self.decoder.step(tokens[:, 0], state)
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs, torch.stack(grown.self_k), torch.stack(grown.self_v)

"""The graphs `asr.inference.onnx_export` traces: plain modules with tensor inputs and
outputs around a model's parts, one per file of each sherpa-onnx contract.

- icefall's contract (a stateless predictor): encoder `x` (N, T, F) raw log-mel, `x_lens`
  -> `encoder_out` (N, T', J) (the joiner's encoder projection inside, so the joiner adds
  two J-vectors), `encoder_out_lens`; decoder `y` (N, context) token ids, -1 before the
  start -> `decoder_out` (N, J), projected; joiner -> `logit` (N, V).
- NeMo's offline contract (an LSTM predictor): encoder `audio_signal` (N, F, T), `length`
  -> `outputs` (N, J, T'), `encoded_lengths`; decoder `targets` (N, 1) int32,
  `target_length`, `states_h`, `states_c` (layers, N, H) -> `outputs` (N, J, 1), lengths,
  the next states; joiner (N, J, T), (N, J, U) -> (N, T, U, V); ids in NeMo's order, the
  blank last. A token-and-duration transducer's joiner gives one duration logit per skip
  after them, and the encoder's metadata says TDT (`asr.inference.onnx_durations`).
- NeMo's online contract (a streaming encoder): the encoder takes one chunk and the caches
  `cache_last_channel`, `cache_last_time`, `cache_last_channel_len`, and gives their next
  values (`NemoStreamingEncoderGraph`); decoder and joiner as offline.

An attention encoder-decoder is two graphs: the encoder gives the cross-attention keys and
values of every decoder layer per frame, (N, T', 2 x layers x D), so that a decoding step
never recomputes them; the decoder takes one token per row, its self-attention cache
(layers, N, H, S, Dh) and that memory, and gives log-probabilities of the next token and
the grown cache. (`LstmDecoderGraph`, the LSTM step written out, serves NeMo's decoder.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.inference.onnx_durations import NO_SKIP_LOGIT, skip_layout
from asr.models.aed import DecoderState, EncoderDecoder, _heads
from asr.models.attention import lengths_to_mask
from asr.models.conformer import Chunking, ConformerEncoder, StreamingState
from asr.models.transducer import Transducer
from asr.normalization import per_utterance

LSTM_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # nn.LSTM's, per layer


class EncoderGraph(nn.Module):
    """Raw features -> encoder output (the transducer's: projected for the joiner)."""

    def __init__(self, model: Transducer | EncoderDecoder, normalize: bool) -> None:
        super().__init__()
        self.model, self.normalize = model, normalize

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        if self.normalize:
            x = per_utterance(x, x_lens)
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


class NemoEncoderGraph(nn.Module):
    """sherpa-onnx's offline NeMo encoder: `audio_signal` (N, F, T) raw log-mel, `length`
    (N,) -> `outputs` (N, J, T') projected for the joiner, `encoded_lengths` (N,)."""

    def __init__(self, model: Transducer, normalize: bool) -> None:
        super().__init__()
        self.encoder = EncoderGraph(model, normalize)  # not `graph`: the exporter's own name

    def forward(self, audio_signal: Tensor, length: Tensor) -> tuple[Tensor, Tensor]:
        out, lens = self.encoder(audio_signal.transpose(1, 2), length)
        return out.transpose(1, 2), lens


def history_slots(encoder: ConformerEncoder) -> int:
    """The layer slots of `cache_last_time` (D x (K-1) floats each) that carry a streaming
    encoder's subsampling history (P x F floats; none without the subsampling cache)."""
    floats = encoder.history_frames * encoder.config.input_dim
    per_slot = encoder.output_dim * (encoder.config.conv_kernel_size - 1)
    return -(-floats // per_slot)


class NemoStreamingEncoderGraph(nn.Module):
    """sherpa-onnx's online NeMo encoder: one chunk `audio_signal` (N, F, W) of raw
    log-mel (W = the chunk's feature frames), `length` (N,), and the caches of
    `StreamingState`: `cache_last_channel` (N, layers, left, D), `cache_last_time`
    (N, layers + S, D, K-1), `cache_last_channel_len` (N,) -> `outputs` (N, J, chunk)
    projected for the joiner, `encoded_lengths`, and the three caches for the next chunk.

    With the subsampling cache, the last P feature frames of the chunk before (the
    subsampling's history) ride in the S extra slots of `cache_last_time`
    (`history_slots`), which sherpa-onnx passes through unread; a stream's first chunk
    (`cache_last_channel_len` 0) has none. sherpa-onnx then encodes the chunks training
    saw. (NeMo's own way, a window of P frames more than its shift, moves every chunk's
    edge by P frames: measured in recipes/demo/RESULTS.md, "Streaming".)"""

    def __init__(self, model: Transducer, chunking: Chunking) -> None:
        super().__init__()
        self.model, self.chunking = model, chunking

    def forward(
        self,
        audio_signal: Tensor,
        length: Tensor,
        cache_last_channel: Tensor,
        cache_last_time: Tensor,
        cache_last_channel_len: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        encoder = self.model.encoder
        x, p = audio_signal.transpose(1, 2), encoder.history_frames
        n, f, layers = x.size(0), x.size(2), len(encoder.layers)
        history = cache_last_time[:, layers:].flatten(1)[:, : p * f].reshape(n, p, f)
        state = StreamingState(
            cache_last_channel,
            cache_last_channel_len,
            cache_last_time[:, :layers],
            history,
            torch.where(cache_last_channel_len > 0, p, 0),
            x.new_zeros(n, f),
            torch.zeros_like(cache_last_channel_len),
        )
        out, lens, state = encoder.step(x, length, state, self.chunking)
        out = self.model.joiner.project_encoder(out).transpose(1, 2)
        slots = cache_last_time[:, layers:]
        packed = F.pad(state.history.flatten(1), (0, slots[0].numel() - p * f))
        conv = torch.cat([state.conv, packed.reshape(slots.shape)], dim=1)
        return out, lens.to(torch.int64), state.attention, conv, state.attention_len


class NemoDecoderGraph(nn.Module):
    """sherpa-onnx's NeMo LSTM decoder, ids with the blank last: `targets` (N, 1) int32,
    `target_length` (N,) int32, `states_h` and `states_c` (layers, N, H) -> `outputs`
    (N, J, 1) projected for the joiner, `prednet_lengths`, the next h and c."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.lstm = LstmDecoderGraph(model)
        self.vocab_size = model.vocab_size

    def forward(
        self, targets: Tensor, target_length: Tensor, states_h: Tensor, states_c: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        ours = (targets.long() + 1) % self.vocab_size  # NeMo's blank, V-1, is our 0
        h, c = states_h.transpose(0, 1), states_c.transpose(0, 1)
        out, next_h, next_c = self.lstm(ours, h, c)
        lengths = target_length.clamp(min=0)  # a new tensor: an output may not be an input
        return out[:, :, None], lengths, next_h.transpose(0, 1), next_c.transpose(0, 1)


class SkipLogits(nn.Module):
    """A TDT joiner's duration logits (..., D), in the order of its durations -> sherpa-onnx's
    layout (`asr.inference.onnx_durations.skip_layout`): logit i for a skip of i frames,
    -inf for a skip that was not trained."""

    def __init__(self, durations: tuple[int, ...] | None) -> None:
        super().__init__()
        layout = None if durations is None else skip_layout(durations)
        index = None if layout is None else torch.tensor(layout)
        self.register_buffer("layout", index, persistent=False)

    def forward(self, logits: Tensor) -> Tensor:
        if self.layout is None:
            return logits
        floor = logits.new_full((*logits.shape[:-1], 1), NO_SKIP_LOGIT)
        return torch.cat([logits, floor], dim=-1).index_select(-1, self.layout)


class NemoJoinerGraph(nn.Module):
    """sherpa-onnx's NeMo joiner: `encoder_outputs` (N, J, T), `decoder_outputs` (N, J, U),
    both projected -> `outputs` (N, T, U, V) with the blank last; a TDT joiner's duration
    logits follow the V token logits, one per skip (`SkipLogits`)."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.joiner = model.joiner
        vocab = model.vocab_size
        self.register_buffer("order", torch.arange(1, vocab + 1) % vocab, persistent=False)
        self.skips = SkipLogits(model.durations)

    def forward(self, encoder_outputs: Tensor, decoder_outputs: Tensor) -> Tensor:
        enc = encoder_outputs.transpose(1, 2)[:, :, None, :]  # (N, T, 1, J)
        dec = decoder_outputs.transpose(1, 2)[:, None, :, :]  # (N, 1, U, J)
        tokens, durations = self.joiner.split(self.joiner.joint(enc, dec))
        tokens = tokens.index_select(-1, self.order)
        return tokens if durations is None else torch.cat([tokens, self.skips(durations)], -1)


class JoinerGraph(nn.Module):
    """Projected encoder frame and predictor output -> logits (a TDT joiner's duration
    logits one per skip, `SkipLogits`)."""

    def __init__(self, model: Transducer) -> None:
        super().__init__()
        self.joiner = model.joiner
        self.skips = SkipLogits(model.durations)

    def forward(self, encoder_out: Tensor, decoder_out: Tensor) -> Tensor:
        logits = self.joiner.joint(encoder_out, decoder_out)
        tokens, durations = self.joiner.split(logits)
        return logits if durations is None else torch.cat([tokens, self.skips(durations)], -1)


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

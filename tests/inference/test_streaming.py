"""The streaming recognizer: audio in pieces of any size, one stream or several that start
and end at different times, greedy and beam search, gives the tokens (and token frames)
that decoding the whole utterance through the same chunked masks gives; odd input ends
in a final result; models and chunk sizes it cannot stream are refused in one line."""

from pathlib import Path

import numpy as np
import pytest
import torch

from asr.data.features import FeatureConfig
from asr.decoding.hypotheses import TimedTokens
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.audio import read_audio
from asr.inference.recognizer import Recognizer
from asr.inference.streaming import StreamingRecognizer
from asr.models.build import build_model
from asr.models.conformer import Chunking
from asr.models.transducer import Transducer
from tests.decoding.searching import beam_nbest, greedy_timed

FEATURES = FeatureConfig(frontend="librosa", normalize="none")
CHUNKS, LEFTS = (2, 4), (6, 12)


def _model(
    vocab_size: int,
    streaming: bool = True,
    subsampling_cache: bool = False,
    durations: list[int] | None = None,
) -> Transducer:
    torch.manual_seed(0)
    encoder = {"input_dim": 80, "d_model": 32, "num_layers": 2, "num_heads": 2}
    encoder |= {"conv_kernel_size": 5, "subsampling_channels": 8, "dropout": 0.0}
    if streaming:
        encoder["feature_stats"] = "unused"
        encoder["streaming"] = {
            "chunk_sizes": [*CHUNKS, -1],
            "left_contexts": list(LEFTS),
            "subsampling_cache": subsampling_cache,
        }
    model = build_model(
        {
            "kind": "transducer",
            "encoder": encoder,
            "predictor": {"embed_dim": 32, "hidden_dim": 32, "dropout": 0.0},
            "joiner": {"joint_dim": 32, "durations": durations},
        },
        vocab_size,
    )
    if streaming:
        model.encoder.set_feature_stats(torch.full((80,), -8.0), torch.full((80,), 3.0))
    return model.eval()


@pytest.fixture(scope="module")
def audio(test_flacs: list[Path]) -> list[np.ndarray]:
    return [read_audio(path) for path in test_flacs[:3]]


def _whole(model: Transducer, samples: np.ndarray, chunking: Chunking, beam: int):
    """(tokens, frames) of the whole utterance through the chunked masks (and followed by
    the silence that ends a stream)."""
    hyp = _whole_hypothesis(model, samples, chunking, beam)
    return hyp.tokens, hyp.frames


def _whole_hypothesis(
    model: Transducer, samples: np.ndarray, chunking: Chunking, beam: int
) -> TimedTokens:
    """`_whole`'s best hypothesis (with its confidences and durations)."""
    recognizer = Recognizer(model, None, FEATURES, chunking=chunking)  # type: ignore[arg-type]
    feats = recognizer.features_of(samples)
    with torch.no_grad():
        out, lens = model.encode(feats[None], torch.tensor([feats.shape[0]]), chunking)
    if beam == 1:
        return greedy_timed(model, out, lens)[0]
    return beam_nbest(model, out, lens, BeamOptions(beam))[0][0].timed()


def _streamed(
    recognizer: StreamingRecognizer, audio: list[np.ndarray], piece: int, delays: list[int]
):
    """Feed each recording in pieces of `piece` samples, recording i starting after
    `delays[i]` pieces, all decoded together; (tokens, frames) of each."""
    streams = [recognizer.create_stream() for _ in audio]
    rounds = max(d + -(-len(a) // piece) for a, d in zip(audio, delays, strict=True)) + 1
    for r in range(rounds):
        for stream, samples, delay in zip(streams, audio, delays, strict=True):
            start = (r - delay) * piece
            if 0 <= start < len(samples):
                stream.accept_waveform(samples[start : start + piece])
            elif start >= len(samples):
                stream.finish()
        recognizer.decode(streams)
    assert all(s.done for s in streams)
    return [(stream.best().tokens, stream.best().frames) for stream in streams]


# With the subsampling cache a stream's subsampling runs on other tensor shapes than the
# whole utterance's, which rounds differently (within 1e-5: tests/models); greedy search
# is robust to it, a beam of random-weight hypotheses with near-equal scores is not.
@pytest.mark.parametrize(
    "chunk,left,beam,cache",
    [(2, 6, 1, False), (4, 12, 1, False), (4, 12, 4, False), (2, 6, 1, True)],
    ids=["2-6-greedy", "4-12-greedy", "4-12-beam4", "2-6-greedy-subsampling_cache"],
)
def test_streaming_equals_the_whole_utterance_through_the_same_masks(
    tokenizer, audio, chunk, left, beam, cache
):
    model = _model(tokenizer.vocab_size, subsampling_cache=cache)
    chunking = Chunking(chunk, left)
    expected = [_whole(model, a, chunking, beam) for a in audio]
    assert all(tokens for tokens, _ in expected)  # random weights emit tokens
    recognizer = StreamingRecognizer(model, tokenizer, FEATURES, chunking, beam_size=beam)
    for piece in (160, 5923, 16000):  # 10 ms, an odd size, 1 s
        assert _streamed(recognizer, audio[:1], piece, [0]) == expected[:1], piece
    # Three concurrent streams that start (and so end) at different times.
    assert _streamed(recognizer, audio, 1600, [0, 3, 11]) == expected


@pytest.mark.parametrize(
    "chunk,left,beam", [(2, 6, 1), (4, 12, 4)], ids=["2-6-greedy", "4-12-beam4"]
)
def test_a_tdt_streams_as_it_decodes_the_whole_utterance_through_the_same_masks(
    tokenizer, audio, chunk, left, beam
):
    """A token-and-duration transducer: a duration that jumps past a chunk's end carries
    into the next chunk (`HypothesisState.skip`), so streaming gives the whole utterance's
    tokens, frames and durations, and skips the frames it skips."""
    model = _model(tokenizer.vocab_size, durations=[0, 1, 2, 3, 4])
    chunking = Chunking(chunk, left)
    recognizer = StreamingRecognizer(model, tokenizer, FEATURES, chunking, beam_size=beam)

    def timed(hyp):
        return hyp.tokens, hyp.frames, hyp.durations

    expected = [timed(_whole_hypothesis(model, a, chunking, beam)) for a in audio]
    assert all(tokens for tokens, _, _ in expected)  # random weights emit tokens
    assert any(d > 1 for _, _, durations in expected for d in durations)
    streams = [recognizer.create_stream() for _ in audio]
    carried = 0  # rows whose duration jumped past the end of a chunk
    for start in range(0, max(len(a) for a in audio) + 1600, 1600):  # 0.1 s pieces, together
        for stream, samples in zip(streams, audio, strict=True):
            if start < len(samples):
                stream.accept_waveform(samples[start : start + 1600])
            else:
                stream.finish()
        while stepped := recognizer.decode_round(streams):
            carried += sum(int(s.decoding.search.rows.skip[0]) > 0 for s in stepped)
    assert all(s.done for s in streams)
    assert [timed(s.best()) for s in streams] == expected
    assert carried > 0
    for stream in streams:  # the search ran the joiner on fewer frames than it decoded
        assert stream.decoding.search.visited[0] < stream.frames_decoded


def test_partial_results_grow_and_the_final_one_comes_after_finish(tokenizer, audio):
    model = _model(tokenizer.vocab_size)
    recognizer = StreamingRecognizer(model, tokenizer, FEATURES, Chunking(2, 6))
    stream = recognizer.create_stream()
    partials = []
    for start in range(0, len(audio[0]), 1600):
        stream.accept_waveform(audio[0][start : start + 1600])
        recognizer.decode([stream])
        partials.append(stream.tokens.copy())
    assert not stream.done
    stream.finish()
    recognizer.decode([stream])
    assert stream.done
    final = stream.tokens
    assert all(final[: len(p)] == p for p in partials)  # each partial is a prefix
    assert len(final) >= len(partials[-1])
    transcript = stream.transcript()
    assert transcript.text == tokenizer.decode(final)
    seconds = len(audio[0]) / 16000
    assert all(0 <= w.start <= w.end <= seconds for w in transcript.words)


def test_odd_input_gets_a_final_result(tokenizer, audio):
    model = _model(tokenizer.vocab_size)
    recognizer = StreamingRecognizer(model, tokenizer, FEATURES, Chunking(2, 6))
    nothing = recognizer.create_stream()
    nothing.finish()
    silence = recognizer.create_stream()
    silence.accept_waveform(np.zeros(8000, dtype=np.float32))
    silence.finish()
    ragged = recognizer.create_stream()
    for size in (0, 1, 7, 0, 399, 1, 2500, 0, 13):  # empty and tiny pieces, mid-chunk stop
        ragged.accept_waveform(audio[0][:size])
    ragged.finish()
    streams = [nothing, silence, ragged]
    recognizer.decode(streams)
    assert all(s.done for s in streams)
    assert nothing.text == "" and nothing.transcript().words == []
    assert isinstance(silence.text, str) and isinstance(ragged.text, str)
    with pytest.raises(ValueError, match="finished"):
        ragged.accept_waveform(audio[0][:10])


def test_what_cannot_stream_is_refused_in_one_line(tokenizer):
    offline = _model(tokenizer.vocab_size, streaming=False)
    with pytest.raises(ValueError, match="trained with full context"):
        StreamingRecognizer(offline, tokenizer, FEATURES)
    model = _model(tokenizer.vocab_size)
    with pytest.raises(ValueError, match=r"chunk size 3 frames was not trained.*\[2, 4\]"):
        StreamingRecognizer(model, tokenizer, FEATURES, Chunking(3, 6))
    with pytest.raises(ValueError, match="per utterance"):
        StreamingRecognizer(model, tokenizer, FeatureConfig(frontend="librosa"))
    recognizer = StreamingRecognizer(model, tokenizer, FEATURES)
    assert recognizer.chunking == Chunking(4, 12)  # the largest trained by default
    assert recognizer.chunk_seconds == pytest.approx(4 * 4 / 100)

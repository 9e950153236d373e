"""ONNX export of token-and-duration transducers (TDT) in sherpa-onnx's NeMo contract: the
graphs give PyTorch's outputs (the duration logits one per skip, as sherpa-onnx reads them),
this package's greedy search over onnxruntime skips the frames the durations say, and
sherpa-onnx's offline recognizer decodes the export with its durations as we do; a
streaming TDT model and an old sherpa-onnx are refused in one line.

The models have random weights: `_calibrate` makes blanks, tokens and every duration win
often, so that a decode takes every rule (a token that stays on its frame, the cap of
tokens per frame, a blank that must move, skips past several frames)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from asr.data.features import FeatureConfig
from asr.decoding.search import decode_timed
from asr.decoding.transducer import GreedyOptions
from asr.inference.audio import read_audio
from asr.inference.bundle import BUNDLE_FORMAT, load_bundle
from asr.inference.cli import export_main
from asr.inference.onnx_durations import (
    ONLINE_TDT,
    SHERPA_TDT_TOKENS_PER_FRAME,
    SHERPA_TDT_VERSION,
    sherpa_tdt_note,
)
from asr.inference.onnx_export import _sherpa_note
from asr.inference.onnx_runtime import load_onnx_model, load_onnx_recognizer, open_session
from asr.inference.recognizer import load_recognizer
from asr.models.build import build_model
from asr.models.transducer import Transducer
from asr.normalization import per_utterance
from asr.tokens import WORD_START

pytestmark = pytest.mark.slow

NEMO = (0, 1, 2, 3, 4)  # NeMo's durations: logit i is a skip of i frames as it stands
GAPPY = (1, 0, 3)  # another order and no 2: the export lays them out as sherpa-onnx reads
EXPORTS = {  # name: (predictor, durations, front end)
    "nemo": ("lstm", NEMO, "librosa_povey"),
    "gappy": ("lstm", GAPPY, "librosa_povey"),
    "stateless": ("stateless", (0, 2, 1), "kaldi"),  # icefall's contract: ours alone
}


def _config(predictor: str, durations: tuple[int, ...], streaming: bool = False) -> dict:
    encoder = {"input_dim": 80, "d_model": 32, "num_layers": 1, "num_heads": 2}
    encoder |= {"subsampling_channels": 8, "dropout": 0.0}
    if streaming:
        encoder["streaming"] = {"chunk_sizes": [2, -1], "left_contexts": [6]}
    return {
        "kind": "transducer",
        "encoder": encoder,
        "predictor": {"kind": predictor, "embed_dim": 32, "hidden_dim": 32, "dropout": 0.0},
        "joiner": {"joint_dim": 32, "durations": list(durations)},
    }


def _calibrate(model: Transducer, feats: torch.Tensor) -> None:
    """Random weights emit a token at nearly every step, nearly always with one duration:
    center each duration's logit and lift the blank's to the best token's, both on average
    over the frames of `feats` (T, F) and a few predictor states."""
    joiner, vocab = model.joiner, model.vocab_size
    assert model.blank_id == 0
    with torch.no_grad():
        enc, _ = model.encode(per_utterance(feats)[None], torch.tensor([len(feats)]))
        tokens = torch.randint(1, vocab, (1, 16), generator=torch.Generator().manual_seed(1))
        pred = model.predictor(tokens, torch.tensor([16]))
        token_logits, duration_logits = joiner.split(joiner(enc[0][:, None], pred))
        joiner.output.bias[vocab:] -= duration_logits.mean(dim=(0, 1))
        lift = token_logits[..., 1:].max(dim=-1).values - token_logits[..., 0]
        joiner.output.bias[0] += lift.mean()


def _write_bundle(path: Path, config: dict, frontend: str, tokenizer, audio: np.ndarray) -> Path:
    """A bundle of a random-weight model of `config`, calibrated on `audio`."""
    torch.manual_seed(0)
    model = build_model(config, tokenizer.vocab_size).eval()
    features = FeatureConfig(frontend=frontend, normalize="none")
    feats = torch.from_numpy(features.extractor().extract(audio, 16000))
    _calibrate(model, feats)
    bundle = {
        "format": BUNDLE_FORMAT,
        "model": config,
        "features": {"frontend": frontend},  # per-utterance normalization, the default
        "tokenizer": tokenizer.to_bytes(),
        "state_dict": model.state_dict(),
        "averaged": [],
        "ema": False,
    }
    torch.save(bundle, path)
    return path


@pytest.fixture(scope="module")
def audio(test_flacs: list[Path]) -> list[np.ndarray]:
    return [read_audio(flac) for flac in test_flacs[:6]]


@pytest.fixture(scope="module")
def exports(tokenizer, audio, cli, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (bundle, its ONNX export by asr-export), for each of `EXPORTS`."""
    made = {}
    for name, (predictor, durations, frontend) in EXPORTS.items():
        directory = tmp_path_factory.mktemp(name)
        config = _config(predictor, durations)
        bundle = _write_bundle(directory / "model.bundle.pt", config, frontend, tokenizer, audio[0])
        out = directory / "onnx"
        printed = cli("asr-export", bundle, "--format", "onnx", "--no-int8", "-o", out)
        assert f"wrote 4 files to {out}" in printed
        if predictor == "lstm":  # the installed sherpa-onnx reads durations
            assert "sherpa-onnx" not in printed, printed
        else:
            assert "sherpa-onnx reads durations only in NeMo's transducer contract" in printed
        made[name] = (bundle, out)
    return made


def _reference(model: Transducer, encoder_out: torch.Tensor, max_symbols: int):
    """Greedy TDT search of one utterance's encoder output (T, D), NeMo's rules written
    out: the best token and the best duration d of each step; a token is emitted (the
    predictor steps) and the search moves d frames, staying on the frame for d = 0 until
    `max_symbols` tokens were emitted there; a blank moves max(d, 1). -> (tokens, frames)."""
    joiner, durations, blank = model.joiner, model.durations, model.blank_id
    enc = joiner.project_encoder(encoder_out)
    out, state = model.predictor.step(torch.tensor([blank]), model.predictor.init_state(1, "cpu"))
    pred = joiner.project_predictor(out)
    tokens, frames = [], []
    t = emitted_here = 0
    while t < len(enc):
        token_logits, duration_logits = joiner.split(joiner.joint(enc[t][None], pred))
        token, skip = int(token_logits.argmax()), durations[int(duration_logits.argmax())]
        if token != blank:
            tokens.append(token)
            frames.append(t)
            emitted_here += 1
            out, state = model.predictor.step(torch.tensor([token]), state)
            pred = joiner.project_predictor(out)
        if skip == 0 and (token == blank or emitted_here == max_symbols):
            skip = 1
        if skip:
            emitted_here = 0
        t += skip
    return tokens, frames


@torch.inference_mode()
def _references(bundle: Path, audio: list[np.ndarray], max_symbols: int):
    """`_reference` of each recording, through the bundle's model."""
    recognizer = load_recognizer(bundle)
    found = []
    for samples in audio:
        feats = recognizer.features_of(samples)
        enc, _ = recognizer.model.encode(feats[None], torch.tensor([len(feats)]))
        found.append(_reference(recognizer.model, enc[0], max_symbols))
    return found


@pytest.mark.long  # three exports, shared by the tests that decode them (make test-long)
def test_the_graphs_give_pytorchs_outputs_with_a_logit_per_skip(exports):
    for name, (bundle, directory) in exports.items():
        model = load_bundle(bundle)[0]
        ours, _, _ = load_onnx_model(directory)
        nemo = EXPORTS[name][0] == "lstm"
        vocab, durations = model.vocab_size, model.durations
        assert ours.durations == durations and ours.joiner.vocab_size == vocab
        gen = torch.Generator().manual_seed(0)
        feats, lens = torch.randn(2, 150, 80, generator=gen), torch.tensor([150, 111])
        with torch.no_grad():
            enc, enc_lens = model.encode(per_utterance(feats, lens), lens)
            enc = model.joiner.project_encoder(enc)
            got, got_lens = ours.encode(feats, lens)
            assert torch.equal(got_lens, enc_lens)
            for b, n in enumerate(enc_lens.tolist()):
                torch.testing.assert_close(got[b, :n], enc[b, :n], atol=1e-4, rtol=1e-4)
            tokens = torch.tensor([0, 5, 17])  # our ids; NeMo's have the blank last
            state, onnx_state = model.predictor.init_state(3, "cpu"), ours.predictor.init_state(3)
            out, _ = model.predictor.step(tokens, state)
            onnx_tokens = (tokens - 1) % vocab if nemo else tokens
            onnx_out, _ = ours.predictor.step(onnx_tokens, onnx_state)
            pred = model.joiner.project_predictor(out)
            torch.testing.assert_close(onnx_out, pred, atol=1e-5, rtol=1e-4)
            logits = model.joiner.joint(enc[0, :3], pred)  # (3, V + D)
            onnx_logits = ours.joiner.joint(enc[0, :3], pred)
            order = (torch.arange(vocab) + 1) % vocab if nemo else torch.arange(vocab)
            expected = torch.cat([logits[:, order], logits[:, vocab:]], dim=-1)
            torch.testing.assert_close(onnx_logits, expected, atol=1e-5, rtol=1e-4)
            # joiner.onnx itself: logit i of the durations part is a skip of i frames
            session = open_session(directory / "joiner.onnx")
            feed = [x.numpy() for x in (enc[0, :3], pred)]
            names = [i.name for i in session.get_inputs()]
            feed = [x[:, :, None] for x in feed] if nemo else feed
            raw = torch.from_numpy(session.run(None, dict(zip(names, feed, strict=True)))[0])
            raw = raw.reshape(3, -1)
            assert raw.size(1) == vocab + max(durations) + 1
            for skip in range(max(durations) + 1):
                column = raw[:, vocab + skip]
                if skip in durations:
                    want = logits[:, vocab + durations.index(skip)]
                    torch.testing.assert_close(column, want, atol=1e-5, rtol=1e-4)
                else:
                    assert torch.all(column == float("-inf")), (name, skip)


@pytest.mark.long  # three exports, shared by the tests that decode them (make test-long)
@torch.inference_mode()
@pytest.mark.parametrize("max_symbols", [SHERPA_TDT_TOKENS_PER_FRAME, 2])
def test_our_onnxruntime_greedy_search_skips_the_durations(exports, audio, max_symbols):
    """`asr-transcribe --onnx`'s search: the reference's tokens and frames, and those of
    the project's greedy search on the PyTorch model."""
    options = GreedyOptions(max_symbols)
    for name, (bundle, directory) in exports.items():
        expected = _references(bundle, audio, max_symbols)
        assert sum(len(t) for t, _ in expected) > 20, name  # the model emits tokens
        ours = load_onnx_recognizer(directory, max_symbols_per_frame=max_symbols)
        pytorch = load_recognizer(bundle, max_symbols_per_frame=max_symbols)
        vocab = ours.model.joiner.vocab_size
        for samples, want in zip(audio, expected, strict=True):
            feats = ours.features_of(samples)
            enc, lens = ours.model.encode(feats[None], torch.tensor([len(feats)]))
            hyp = decode_timed(ours.model, enc, lens, options)[0]
            tokens = [(t + 1) % vocab for t in hyp.tokens] if name != "stateless" else hyp.tokens
            assert (tokens, hyp.frames) == want, name
            feats = pytorch.features_of(samples)
            enc, lens = pytorch.model.encode(feats[None], torch.tensor([len(feats)]))
            hyp = decode_timed(pytorch.model, enc, lens, options)[0]
            assert (hyp.tokens, hyp.frames) == want, name


def _sherpa(directory: Path, audio: list[np.ndarray], tmp_path: Path) -> list[dict]:
    """sherpa-onnx's offline NeMo transducer on each recording, in a subprocess (a contract
    it cannot read would end the process): its tokens (pieces, ▁ as a space) and their
    timestamps."""
    np.save(tmp_path / "audio.npy", np.array(audio, dtype=object), allow_pickle=True)
    script = f"""
import json, numpy as np, sherpa_onnx
d = {str(directory)!r} + "/"
recognizer = sherpa_onnx.OfflineRecognizer.from_transducer(
    d + "encoder.onnx", d + "decoder.onnx", d + "joiner.onnx", d + "tokens.txt",
    num_threads=1, model_type="nemo_transducer")
results = []
for samples in np.load({str(tmp_path / "audio.npy")!r}, allow_pickle=True):
    stream = recognizer.create_stream()
    stream.accept_waveform(16000, samples)
    recognizer.decode_stream(stream)
    r = stream.result
    results.append({{"tokens": list(r.tokens), "timestamps": list(r.timestamps)}})
print(json.dumps(results))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.long  # three exports, shared by the tests that decode them (make test-long)
@pytest.mark.parametrize("name", ["nemo", "gappy"])
def test_sherpa_onnx_decodes_the_export_with_its_durations(
    exports, audio, tokenizer, name, tmp_path
):
    bundle, directory = exports[name]
    meta = {p.key: p.value for p in onnx.load(directory / "encoder.onnx").metadata_props}
    assert meta["url"] == "tdt" and meta["model_type"] == "EncDecRNNTBPEModel"
    expected = _references(bundle, audio, SHERPA_TDT_TOKENS_PER_FRAME)
    got = _sherpa(directory, audio, tmp_path)
    frame_seconds = load_recognizer(bundle).model.frame_seconds
    for (tokens, frames), result in zip(expected, got, strict=True):
        pieces = [tokenizer.id_to_piece(t).replace(WORD_START, " ") for t in tokens]
        assert result["tokens"] == pieces  # pieces: random weights emit <s>, which no text has
        assert result["timestamps"] == pytest.approx([f * frame_seconds for f in frames])


def test_a_streaming_tdt_model_is_refused_in_one_line(
    tokenizer, audio, tmp_path, capsys, monkeypatch
):
    """sherpa-onnx's online recognizer reads no durations."""
    monkeypatch.setattr("sys.argv", ["asr-export"])
    config = _config("lstm", NEMO, streaming=True)
    bundle = _write_bundle(tmp_path / "model.bundle.pt", config, "librosa", tokenizer, audio[0])
    with pytest.raises(SystemExit) as stop:
        export_main([str(bundle), "--format", "onnx", "-o", str(tmp_path / "onnx")])
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"asr-export: error: {ONLINE_TDT}"]


def test_an_old_sherpa_onnx_is_told_which_version_reads_durations(monkeypatch):
    for fine in ("2.0.1", SHERPA_TDT_VERSION, "1.13.0", None):  # None: not installed
        assert sherpa_tdt_note("nemo", fine) is None
    note = sherpa_tdt_note("nemo", "1.12.13")
    assert note is not None and len(note.splitlines()) == 1
    assert note.startswith("sherpa-onnx 1.12.13 is too old to read durations")
    assert f"sherpa-onnx {SHERPA_TDT_VERSION} or newer" in note
    model = build_model(_config("lstm", NEMO), 16)
    features = FeatureConfig(frontend="librosa_povey")
    monkeypatch.setattr("asr.inference.onnx_export.installed_sherpa_onnx", lambda: "1.12.9")
    assert _sherpa_note(model, features, "nemo") == sherpa_tdt_note("nemo", "1.12.9")
    monkeypatch.setattr("asr.inference.onnx_export.installed_sherpa_onnx", lambda: "2.0.1")
    assert _sherpa_note(model, features, "nemo") is None

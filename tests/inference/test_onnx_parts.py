"""The parts of the ONNX export that need no exporter: the normalization inside the encoder
graph and the token table that replaces the SentencePiece model."""

from __future__ import annotations

import numpy as np
import torch

from asr.data.features import normalize_features
from asr.inference.onnx_export import normalize_per_utterance, tokens_txt
from asr.inference.onnx_runtime import TokenTable


def test_graph_normalization_equals_the_training_one_on_valid_frames() -> None:
    gen = np.random.default_rng(0)
    utterances = [gen.normal(3.0, 2.0, (n, 80)).astype(np.float32) for n in (57, 31, 1)]
    padded = torch.full((3, 57, 80), -23.03)  # sherpa-onnx's padding value
    for i, u in enumerate(utterances):
        padded[i, : len(u)] = torch.from_numpy(u)
    lens = torch.tensor([len(u) for u in utterances])
    out = normalize_per_utterance(padded, lens)
    for i, u in enumerate(utterances):
        expected = normalize_features(u, "per_utterance")
        np.testing.assert_allclose(out[i, : len(u)].numpy(), expected, rtol=1e-4, atol=1e-4)


def test_tokens_txt_decodes_as_the_tokenizer_does(tokenizer, tiny_corpus, tmp_path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(tokens_txt(tokenizer))
    lines = path.read_text().splitlines()
    assert lines[:4] == ["<blk> 0", "<unk> 1", "<s> 2", "</s> 3"]
    assert len(lines) == tokenizer.vocab_size
    table = TokenTable(path)
    texts = list(tiny_corpus.transcripts("test-clean").values())
    assert texts
    for text in texts:
        ids = tokenizer.encode(text)
        assert table.decode(ids) == tokenizer.decode(ids) == text

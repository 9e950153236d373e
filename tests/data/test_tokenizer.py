import io
from pathlib import Path

import pytest
import sentencepiece as spm

from asr.data.tokenizer import Tokenizer, train_tokenizer
from asr.tokens import BLANK_ID, BOS_ID, EOS_ID, PAD_ID, UNK_ID

TRAIN, DEV = "train-clean-100", "dev-clean"


def test_special_ids_are_0_to_3(tokenizer: Tokenizer) -> None:
    assert (BLANK_ID, UNK_ID, BOS_ID, EOS_ID, PAD_ID) == (0, 1, 2, 3, 0)
    pieces = [tokenizer.id_to_piece(i) for i in range(4)]
    assert pieces == ["<blk>", "<unk>", "<s>", "</s>"]
    assert tokenizer.vocab_size == 64


def test_round_trip_on_every_transcript(tiny_corpus, tokenizer: Tokenizer) -> None:
    texts = [*tiny_corpus.transcripts(TRAIN).values(), *tiny_corpus.transcripts(DEV).values()]
    assert len(texts) > 30
    for text in texts:
        ids = tokenizer.encode(text)
        assert min(ids) > EOS_ID, f"special id in the encoding of {text!r}: {ids}"
        assert tokenizer.decode(ids) == text


def test_decode_drops_special_ids(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("PLEASE SWIM")
    assert tokenizer.decode([BOS_ID, *ids, BLANK_ID, EOS_ID]) == "PLEASE SWIM"


def test_unknown_character_maps_to_unk(tokenizer: Tokenizer) -> None:
    # The corpus is upper-case letters and apostrophes only: digits were never seen.
    ids = tokenizer.encode("SWIM 42 TIMES")
    assert UNK_ID in ids
    assert tokenizer.encode("SWIM TIMES").count(UNK_ID) == 0


def test_bytes_round_trip_and_load(tiny_corpus, tokenizer: Tokenizer) -> None:
    again = Tokenizer.from_bytes(tokenizer.to_bytes())
    loaded = Tokenizer.load(tiny_corpus.tokenizer)
    text = next(iter(tiny_corpus.transcripts(DEV).values()))
    assert again.encode(text) == loaded.encode(text) == tokenizer.encode(text)


def test_load_of_missing_file_names_path_and_stage(tmp_path: Path) -> None:
    missing = tmp_path / "tokenizer" / "bpe64.model"
    with pytest.raises(FileNotFoundError) as err:
        Tokenizer.load(missing)
    assert str(missing) in str(err.value)
    assert "'tokenizer' stage" in str(err.value)


def test_unigram_model(tiny_corpus, tmp_path: Path) -> None:
    texts = list(tiny_corpus.transcripts(TRAIN).values())
    path = tmp_path / "unigram48.model"
    tok = train_tokenizer(texts, path, vocab_size=48, model_type="unigram")
    assert path.is_file()
    assert tok.vocab_size == 48
    assert [tok.id_to_piece(i) for i in range(4)] == ["<blk>", "<unk>", "<s>", "</s>"]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
    assert Tokenizer.load(path).to_bytes() == tok.to_bytes()


def test_rejects_unknown_model_type_and_empty_texts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'bpe' or 'unigram'.*'char'"):
        train_tokenizer(["A B"], tmp_path / "x.model", model_type="char")
    with pytest.raises(ValueError, match="zero non-empty transcripts"):
        train_tokenizer(["", "  "], tmp_path / "x.model")
    assert not (tmp_path / "x.model").exists()


def test_model_with_other_special_ids_is_rejected(tiny_corpus) -> None:
    # A SentencePiece model trained with its defaults (unk=0, bos=1, eos=2): not ours.
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(tiny_corpus.transcripts(TRAIN).values()),
        model_writer=buffer,
        vocab_size=40,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="at id 0, expected '<blk>'"):
        Tokenizer.from_bytes(buffer.getvalue())

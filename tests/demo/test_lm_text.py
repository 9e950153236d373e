"""asr-make-lm-text: sentences of the demo's grammar, none of a dev or test part, on a
tiny corpus's transcripts (written from its plan: no audio)."""

import gzip
from pathlib import Path

import pytest

from asr.demo.lm_text import EXCLUDED_PARTS, draw_sentences, main, make_lm_text
from asr.demo.plan import (
    CONTEXT_PART,
    DEV_PLAIN_PART,
    MAX_WORDS,
    MIN_WORDS,
    Utterance,
    plan_corpus,
)

TINY = {"train_hours": 0.05, "dev_minutes": 0.5, "test_minutes": 0.5, "seed": 3}


def write_transcripts(root: Path, part: str, texts: list[str]) -> None:
    """`texts` as one chapter's transcript of `part` in the LibriSpeech layout."""
    folder = root / "LibriSpeech" / part / "1001" / "1"
    folder.mkdir(parents=True)
    lines = [f"1001-1-{i:04d} {text.upper()}\n" for i, text in enumerate(texts)]
    (folder / "1001-1.trans.txt").write_text("".join(lines))


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """A tiny corpus's transcripts; its test parts hold sentences that the LM text's own
    seeded draws come to, so that some must be dropped."""
    plan = plan_corpus(**TINY)
    parts: dict[str, list[str]] = {part: [utt.text for utt in utts] for part, utts in plan.items()}
    drawn, _ = draw_sentences(400, seed=0)
    parts["test-clean"] += drawn[10:15]  # what the text would otherwise hold
    parts[CONTEXT_PART] = drawn[100:103]
    parts[DEV_PLAIN_PART] = drawn[300:302]
    for part, texts in parts.items():
        write_transcripts(tmp_path, part, texts)
    return tmp_path, parts


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_no_sentence_of_a_dev_or_test_part_is_written(corpus, tmp_path: Path) -> None:
    root, parts = corpus
    out = tmp_path / "lm" / "text.txt.gz"
    summary = make_lm_text(out, root, sentences=2000, seed=0)
    lines = read(out)
    assert len(lines) == summary["written"] == 2000
    assert all(
        line == line.upper() and MIN_WORDS <= len(line.split()) <= MAX_WORDS for line in lines
    )
    excluded = {text.upper() for part in EXCLUDED_PARTS for text in parts.get(part, [])}
    assert not set(lines) & excluded
    assert summary["dropped"] >= 10  # the sentences put in test-clean and the context sets
    assert summary["sources"]["test-clean"] == len(parts["test-clean"])
    assert summary["sources"][DEV_PLAIN_PART] == 2 and "dev-other" not in summary["sources"]
    # the rest are the stream's draws in order; training sentences are not excluded
    drawn, _ = draw_sentences(2000 + summary["dropped"], seed=0)
    kept = [text.upper() for text in drawn if text.upper() not in excluded]
    assert lines == kept[:2000]
    training = {text.upper() for text in parts["train-clean-100"]}
    assert summary["training"] == sum(line in training for line in lines)
    # the same bytes again; another seed, other sentences
    first = out.read_bytes()
    make_lm_text(out, root, sentences=2000, seed=0)
    assert out.read_bytes() == first
    assert read(out)[:50] != read(make_lm_text_to(tmp_path / "other.gz", root, seed=1))[:50]


def make_lm_text_to(out: Path, root: Path, seed: int) -> Path:
    make_lm_text(out, root, sentences=50, seed=seed)
    return out


def test_the_lm_stream_is_none_of_the_plans() -> None:
    """Its draws are not a part's: the plan's sentences come from "<seed>:<part>"."""
    plan = plan_corpus(**{**TINY, "seed": 0})
    drawn, _ = draw_sentences(50, seed=0)
    planned: list[Utterance] = plan["train-clean-100"]
    assert drawn[:20] != [utt.text for utt in planned[:20]]


def test_the_command(corpus, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, _ = corpus
    out = tmp_path / "text.txt.gz"
    main([str(out), "--corpus", str(root), "--sentences", "300"])
    printed = capsys.readouterr().out
    assert "wrote 300 sentences" in printed and "dropped" in printed
    assert len(read(out)) == 300
    with pytest.raises(SystemExit):  # one line naming the folder
        main([str(out), "--corpus", str(tmp_path / "none")])
    assert "none/LibriSpeech/dev-clean: no transcripts" in capsys.readouterr().err

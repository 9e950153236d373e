"""The language-model options (issue 67): `--lm`, `--lm-weight`, `--lodr`, `--lodr-weight` of
asr-transcribe (offline and streaming), asr-decode and asr-serve, `lm=` of the recognizers,
and asr-sweep, on the shared training run's bundle and the tiny streaming model, with real
token n-grams trained over the tiny tokenizer: weight 0 gives the text without an LM, a
large weight changes it, and bad input is one line naming the file or value."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import asr
from asr.decoding import fusion as fusion_module
from asr.decoding.kneser_ney import KneserNeyCounter, train_kneser_ney
from asr.decoding.lm import write_arpa
from asr.inference.audio import read_audio
from asr.inference.cli import decode_main, serve_main, transcribe_main
from asr.inference.language_model import DEFAULT_LM_WEIGHT, DEFAULT_LODR_WEIGHT
from asr.inference.recognizer import Recognizer
from asr.inference.server import ServeConfig
from asr.inference.streaming import StreamingRecognizer, load_streaming_recognizer
from asr.inference.sweep import main as sweep_main
from asr.inference.sweep import phrase_recall
from tests.inference.test_serve import NO_ENDPOINTS, final_text, serving, stream

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

LARGE = "5"  # MAX_LM_WEIGHT: the LM's sentence, not the audio's


@pytest.fixture(scope="module")
def lms(tiny_corpus, tokenizer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ARPA files: `lm`, a trigram of the dev transcripts over the tokenizer's pieces;
    `lodr`, a bigram of the training transcripts; `words`, a bigram over words (not the
    model's pieces); `broken`, a truncated ARPA file."""
    root = tmp_path_factory.mktemp("lms")
    paths = {name: root / f"{name}.arpa" for name in ("lm", "lodr", "words", "broken")}
    for name, part, order in (("lm", "dev-clean", 3), ("lodr", "train-clean-100", 2)):
        counter = KneserNeyCounter(order, tokenizer.id_to_piece)
        for text in tiny_corpus.transcripts(part).values():
            counter.add(tokenizer.encode(text))
        write_arpa(counter.estimate(), paths[name])
    words = [text.split() for text in tiny_corpus.transcripts("dev-clean").values()]
    write_arpa(train_kneser_ney(words, 2), paths["words"])
    lines = paths["lm"].read_text().splitlines()
    paths["broken"].write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    return paths


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def _error(capsys, main, argv: list[str]) -> str:
    """The one line a console script's `main(argv)` ends with on bad input (exit status 1)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1 and len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def _usage_error(capsys, main, argv: list[str]) -> str:
    """argparse's error line of `main(argv)` (exit status 2), after the usage."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_transcribe_with_an_lm_offline(bundle: Path, test_flacs, lms, capsys, tmp_path) -> None:
    """--lm-weight 0 gives the text without an LM (greedy and beam, with LODR and phrases
    too); the largest weight changes it; the command line and load_model(...).transcribe
    give the same; an LM file is read once per recognizer."""
    files = [str(f) for f in test_flacs[:3]]
    lm, lodr = str(lms["lm"]), str(lms["lodr"])
    for search in ([], ["--beam-size", "3"]):
        transcribe_main([str(bundle), *files, *search])
        plain = _lines(capsys)
        transcribe_main([str(bundle), *files, *search, "--lm", lm, "--lm-weight", "0"])
        assert _lines(capsys) == plain
        zero = ["--lm", lm, "--lm-weight", "0", "--lodr", lodr, "--lodr-weight", "0"]
        transcribe_main([str(bundle), *files, *search, *zero])
        assert _lines(capsys) == plain
        transcribe_main([str(bundle), *files, *search, "--lm", lm, "--lm-weight", LARGE])
        fused = _lines(capsys)
        assert fused != plain and len(fused) == len(plain)
    recognizer = asr.load_model(bundle, beam_size=3)
    assert isinstance(recognizer, Recognizer)
    texts = recognizer.transcribe(files, lm=lms["lm"], lm_weight=float(LARGE))
    assert [f"{f}\t{t}" for f, t in zip(files, texts, strict=True)] == fused
    # read once: the same fusion object for the same file and weights, the tables shared
    first = recognizer.language_model(lms["lm"], 0.3)
    assert recognizer.language_model(str(lms["lm"]), 0.3) is first
    other = recognizer.language_model(lms["lm"], 0.5, lms["lodr"])
    assert other.lm is first.lm and other.lodr_weight == DEFAULT_LODR_WEIGHT
    assert recognizer.language_model(lms["lm"]).weight == DEFAULT_LM_WEIGHT
    assert recognizer.transcribe(files, lm=first) == recognizer.transcribe(files, lm=lms["lm"])
    # phrases and the LM together (both add), json with word times
    args = [str(bundle), files[0], "--output-format", "json", "--timestamps"]
    transcribe_main(args)
    word = json.loads(_lines(capsys)[0])["words"][0]["word"]
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(f"{word}\n")
    for weight in ("0", LARGE):
        transcribe_main(
            args + ["--biasing-phrases", str(phrases), "--lm", lm, "--lm-weight", weight]
        )
        (boosted,) = _lines(capsys)
        greedy = asr.load_model(bundle)
        expected = greedy.transcribe([files[0]], biasing=[word], lm=lm, lm_weight=float(weight))
        assert json.loads(boosted)["text"] == expected[0]
        if weight == "0":
            assert expected == greedy.transcribe([files[0]], biasing=[word])


def test_decode_with_an_lm_records_it(bundle: Path, test_cuts: Path, lms, capsys, tmp_path):
    """asr-decode with --lm and --lodr: wer.json and the output directory's name say which
    LMs and weights; weight 0 gives the WER without them; n-best lists too."""
    plain_dir, zero_dir = tmp_path / "plain", tmp_path / "zero"
    decode_main([str(bundle), str(test_cuts), "--beam-size", "3", "-o", str(plain_dir)])
    plain = json.loads((plain_dir / "wer.json").read_text())
    assert "language_model" not in plain
    lm = ["--lm", str(lms["lm"]), "--lm-weight", "0.5", "--lodr", str(lms["lodr"])]
    decode_main([str(bundle), str(test_cuts), "--beam-size", "3", *lm, "-o", str(zero_dir)])
    zero = json.loads((zero_dir / "wer.json").read_text())
    assert zero["language_model"] == {
        "lm": str(lms["lm"]),
        "lm_weight": 0.5,
        "lodr": str(lms["lodr"]),
        "lodr_weight": DEFAULT_LODR_WEIGHT,
    }
    # the LM at 0 and LODR at 0 is the search without them
    zero_weights = ["--lm-weight", "0", "--lodr-weight", "0"]
    decode_main(
        [str(bundle), str(test_cuts), "--beam-size", "3", *lm, *zero_weights]
        + ["--nbest", "2", "-o", str(zero_dir)]
    )
    zero = json.loads((zero_dir / "wer.json").read_text())
    for key in ("wer", "substitutions", "deletions", "insertions", "ref_words"):
        assert zero[key] == plain[key], key
    hyps = [json.loads(line) for line in (zero_dir / "hyps.jsonl").read_text().splitlines()]
    assert hyps and all(1 <= len(h["nbest"]) <= 2 for h in hyps)
    capsys.readouterr()
    # without -o: the directory beside the model names the LM and its weights
    decode_main([str(bundle), str(test_cuts), "--lm", str(lms["lm"]), "--lm-weight", LARGE])
    printed = capsys.readouterr().out
    (out,) = [p for p in bundle.parent.glob("decode-*-lm-lm-w5") if p.is_dir()]
    summary = json.loads((out / "wer.json").read_text())
    assert summary["language_model"] == {"lm": str(lms["lm"]), "lm_weight": 5.0}
    assert f"({out}/hyps.jsonl)" in printed


def test_streaming_transcribe_and_create_stream_fuse_the_lm(
    streaming_run: Path, test_flacs, lms, capsys
) -> None:
    """asr-transcribe --streaming --lm: weight 0 gives the text without an LM, a large weight
    what the streaming recognizer gives with that LM; a stream restarted after an endpoint
    keeps its LM."""
    files = [str(f) for f in test_flacs[:2]]
    args = [str(streaming_run), *files, "--streaming", "--chunk-ms", "160"]
    transcribe_main(args)
    plain = _lines(capsys)
    transcribe_main(args + ["--lm", str(lms["lm"]), "--lm-weight", "0"])
    assert _lines(capsys) == plain
    transcribe_main(args + ["--lm", str(lms["lm"]), "--lm-weight", LARGE])
    fused = _lines(capsys)
    recognizer = load_streaming_recognizer(streaming_run, 160)
    texts = [t.text for t in recognizer.transcribe(files, lm=lms["lm"], lm_weight=5.0)]
    assert fused == [f"{f}\t{t}" for f, t in zip(files, texts, strict=True)]
    assert fused != plain
    stream_ = recognizer.create_stream(lm=lms["lm"], lm_weight=5.0)
    fused_search = stream_.decoding.search.lm
    assert fused_search is not None and stream_.lm is recognizer.language_model(lms["lm"], 5.0)
    stream_.accept_waveform(read_audio(files[0]))
    recognizer.decode([stream_])
    recognizer.restart_search(stream_)
    assert stream_.decoding.search.lm is fused_search
    assert recognizer.create_stream(lm=lms["lm"], lm_weight=5.0).lm is stream_.lm


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--lm-weight", "-1", "must be between 0 and 5.0 (useful weights: 0.1-0.7), got -1"),
        ("--lm-weight", "nan", "got nan"),
        ("--lm-weight", "inf", "got inf"),
        ("--lm-weight", "1e308", "got 1e308"),
        ("--lodr-weight", "6", "must be between 0 and 5.0 (useful weights: 0.1-0.7), got 6"),
        ("--lm-weight", "high", "must be a number, got 'high'"),
    ],
)
def test_bad_weights_are_one_line_before_the_model_is_read(option, value, message, capsys):
    """argparse refuses them, naming the option and the value: no model is read."""
    for main in (transcribe_main, decode_main):
        line = _usage_error(capsys, main, ["model.pt", "a.flac", option, value])
        assert f"argument {option}: the weight " in line and line.endswith(message)
    line = _usage_error(capsys, serve_main, ["model.pt", option, value])
    assert f"argument {option}: the weight " in line and line.endswith(message)
    line = _usage_error(capsys, sweep_main, ["model.pt", "m.jsonl.gz", option, value])
    assert f"argument {option}: each weight " in line and line.endswith(message)


def test_bad_lm_input_is_one_line_naming_it(
    bundle: Path, test_flacs, test_cuts, lms, capsys, monkeypatch, tmp_path
) -> None:
    flac = str(test_flacs[0])
    model = str(bundle)
    cases = [  # (arguments, the one line)
        (["--lm-weight", "0.3"], "--lm-weight goes with --lm (a language model)"),
        (["--lodr", str(lms["lodr"])], "--lodr goes with --lm (a language model)"),
        (["--lm", str(lms["lm"]), "--lodr-weight", "0.1"], "--lodr-weight goes with --lodr"),
        (["--lm", str(tmp_path / "none.arpa")], f"language model not found: {tmp_path}/none.arpa"),
        (
            ["--lm", str(lms["lm"]), "--lodr", str(tmp_path / "no.arpa")],
            f"language model not found: {tmp_path}/no.arpa",
        ),
        (["--lm", str(lms["words"])], f"{lms['words']}: "),
        (["--lm", str(lms["broken"])], f"{lms['broken']}:"),
    ]
    for args, message in cases:
        for main, inputs in ((transcribe_main, [flac]), (decode_main, [str(test_cuts)])):
            line = _error(capsys, main, [model, *inputs, *args, "-o", str(tmp_path)])
            assert message in line, (main, args, line)
    # the words LM: which token, how many
    line = _error(capsys, transcribe_main, [model, flac, "--lm", str(lms["words"])])
    assert "are not the model's pieces, the first" in line and "asr-train-lm --tokenizer" in line
    # the LM's tables too big for the device: their size, before decoding starts
    monkeypatch.setattr(fusion_module, "free_bytes", lambda device: 1000)
    line = _error(capsys, transcribe_main, [model, flac, "--lm", str(lms["lm"])])
    assert "the language model's tables take" in line and "more than half the" in line
    line = _error(capsys, sweep_main, [model, str(test_cuts), "--lm", str(lms["lm"])])
    assert "the language model's tables take" in line
    monkeypatch.undo()
    # asr-serve: before the model is read; asr-sweep likewise
    for args, message in cases[:4]:
        line = _error(capsys, serve_main, [str(tmp_path / "absent.pt"), *args])
        assert message in line
    line = _error(capsys, sweep_main, [model, str(test_cuts), "--lm-weight", "0,1"])
    assert "--lm-weight goes with --lm ARPA" in line
    # the recognizer's keywords
    recognizer = asr.load_model(bundle)
    with pytest.raises(ValueError, match=r"^lm_weight goes with lm \(a language model\)$"):
        recognizer.transcribe([flac], lm_weight=0.3)
    fused = recognizer.language_model(lms["lm"], 0.3)
    with pytest.raises(ValueError, match="^lm_weight goes with an LM file: an LmFusion holds"):
        recognizer.transcribe([flac], lm=fused, lm_weight=0.5)
    with pytest.raises(ValueError, match="^lm_weight must be between 0 and 5"):
        recognizer.transcribe([flac], lm=lms["lm"], lm_weight=-0.1)


def test_sweep_encodes_once_and_tabulates_every_combination(
    bundle: Path, test_cuts: Path, lms, capsys, tmp_path, monkeypatch
) -> None:
    """asr-sweep: one row per combination, the best marked, the JSON written; the row
    without an LM or phrases has asr-decode's WER; the encoder runs once per batch, however
    many combinations."""
    calls = []
    encode = Recognizer._encode
    monkeypatch.setattr(Recognizer, "_encode", lambda self, f: calls.append(1) or encode(self, f))
    plain_dir = tmp_path / "plain"
    decode_main([str(bundle), str(test_cuts), "--beam-size", "2", "-o", str(plain_dir)])
    plain = json.loads((plain_dir / "wer.json").read_text())
    capsys.readouterr()
    decoded_batches = len(calls)
    calls.clear()
    first_word = {}
    for line in (plain_dir / "hyps.jsonl").read_text().splitlines():
        ref = json.loads(line)["ref"].split()
        first_word[ref[0]] = first_word.get(ref[0], 0) + 1
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(f"{max(first_word, key=first_word.get)}\nZORVAK ZANZIBAR\n")
    out = tmp_path / "sweep.json"
    sweep_main(
        [str(bundle), str(test_cuts), "--beam-size", "2", "--lm", str(lms["lm"])]
        + ["--lm-weight", f"0,{LARGE}", "--lodr", str(lms["lodr"]), "--lodr-weight", "0,0.1"]
        + ["--biasing-phrases", str(phrases), "--biasing-score", "0,3", "-o", str(out)]
    )
    printed = capsys.readouterr().out
    assert len(calls) == decoded_batches  # encoded once for the 6 combinations
    assert "skipping 2 combinations with a LODR weight above the LM's" in printed
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table[0].startswith("| LM weight | LODR weight | biasing score | WER % |")
    assert len(table) == 2 + 6 and sum("**best**" in line for line in table) == 1
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["lm_weight"], r["lodr_weight"], r["biasing_score"]) for r in rows] == [
        (lm, lodr, score)
        for lm in (0.0, 5.0)
        for lodr in (0.0, 0.1)
        for score in (0.0, 3.0)
        if lodr <= lm
    ]
    base = rows[0]
    for key in ("wer", "substitutions", "deletions", "insertions", "ref_words"):
        assert base[key] == plain[key], key
    assert all(r["recall"] is not None and 0.0 <= r["recall"] <= 1.0 for r in rows)
    errors = [r["substitutions"] + r["deletions"] + r["insertions"] for r in rows]
    ranked = [(e, -r["recall"], i) for i, (e, r) in enumerate(zip(errors, rows, strict=True))]
    assert report["best"] == rows[min(ranked)[2]]
    # (the tiny model's WER is 100 % either way: the errors' kinds tell the texts apart)
    counts = [(r["substitutions"], r["deletions"], r["insertions"]) for r in rows]
    assert all(c != counts[0] for c, r in zip(counts, rows, strict=True) if r["lm_weight"] == 5.0)
    assert f"best: --lm-weight {report['best']['lm_weight']:g}" in printed
    # one list alone: the default lists of the others are not swept
    sweep_main([str(bundle), str(test_cuts), "--lm", str(lms["lm"]), "--lm-weight", "0,0.2"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert table[0].startswith("| LM weight | WER % |") and len(table) == 2 + 2


def test_phrase_recall_counts_whole_words_case_aside() -> None:
    refs = ["THE ZORVAK SAID", "NO PHRASE HERE", "ZORVAKS AND NEW YORK"]
    hyps = ["the zorvak said", "", "ZORVAKS AND NEW YORKER"]
    assert phrase_recall(refs, hyps, ["Zorvak", "new york"]) == 0.5
    assert phrase_recall(refs, hyps, ["ABSENT"]) is None


@pytest.fixture(scope="module")
def streaming_recognizer(streaming_run: Path) -> StreamingRecognizer:
    return load_streaming_recognizer(streaming_run, 160)


def test_served_connections_share_one_lm(streaming_recognizer, test_flacs, lms, monkeypatch):
    """asr-serve with an LM: every connection's search fuses the same LmFusion (so that
    their streams share search steps), and each final equals the streaming recognizer's
    text with that LM."""
    recognizer = streaming_recognizer
    audio = [read_audio(f) for f in test_flacs[:2]]
    lm = recognizer.language_model(lms["lm"], 2.0)
    expected = [t.text for t in recognizer.transcribe(audio, lm=lm)]
    plain = [t.text for t in recognizer.transcribe(audio)]
    assert expected != plain  # the LM matters here
    streams = []
    create = recognizer.create_stream

    def recorded(*args, **kwargs):
        streams.append(create(*args, **kwargs))
        return streams[-1]

    monkeypatch.setattr(recognizer, "create_stream", recorded)
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS), lm=lm) as base:

        async def both() -> list[list[dict]]:
            return await asyncio.gather(*(stream(base, a) for a in audio))

        results = asyncio.run(both())
    assert [final_text(m) for m in results] == expected
    assert len(streams) == 2 and all(s.lm is lm for s in streams)
    searched = {id(s.decoding.search.lm) for s in streams}
    assert len(searched) == 1 and streams[0].decoding.search.lm is not None

"""`asr-export`, `asr-transcribe` and `asr-decode` (`asr.inference.cli`) as a shell runs
them, on the shared training run and on an attention encoder-decoder run."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

import asr
from asr.data.corpus import load_cuts
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.bundle import export_bundle
from asr.inference.cli import decode_main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def test_command_line_errors_are_one_line_naming_the_file(
    bundle: Path, cli, tmp_path: Path
) -> None:
    """Bad input ends a console script with one line on stderr, exit 1, no traceback;
    ASR_DEBUG=1 shows the traceback."""
    truncated = tmp_path / "model.bundle.pt"
    truncated.write_bytes(bundle.read_bytes()[:100_000])
    bad_flac = tmp_path / "bad.flac"
    bad_flac.write_text("not audio")
    cases = [
        (["asr-transcribe", truncated, bad_flac], f"cannot read {truncated}: truncated"),
        (["asr-transcribe", bundle, tmp_path / "none.flac"], "audio file not found"),
        (["asr-transcribe", bundle, bad_flac], f"cannot read audio {bad_flac}: Error opening"),
        (["asr-decode", bundle, tmp_path / "none.jsonl.gz"], "manifest not found"),
        (["asr-export", tmp_path / "none.ckpt"], "checkpoint not found"),
    ]
    debug = [["asr-transcribe", truncated, bad_flac], "ASR_DEBUG"]
    # all at once: each spends ~2 s importing torch
    running = [
        subprocess.Popen(
            cli.command(name, *args),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=cli.env if message != "ASR_DEBUG" else {**cli.env, "ASR_DEBUG": "1"},
        )
        for (name, *args), message in [*cases, debug]
    ]
    for process, ((name, *_), message) in zip(running, [*cases, debug], strict=True):
        stderr = process.communicate(timeout=120)[1]
        assert process.returncode == 1, stderr
        if message == "ASR_DEBUG":  # ASR_DEBUG=1 shows the traceback
            assert "Traceback" in stderr
            continue
        assert stderr.startswith(f"{name}: error: ") and message in stderr
        assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_transcribe_cli_prints_one_line_per_file(bundle: Path, test_flacs, cli) -> None:
    files = test_flacs[:3]
    lines = cli("asr-transcribe", bundle, *files, "--device", "cpu").splitlines()
    expected = asr.load_model(bundle).transcribe(files)
    assert lines == [f"{path}\t{text}" for path, text in zip(files, expected, strict=True)]


def test_beam_search_through_the_cli_and_load_model(bundle: Path, test_flacs, cli) -> None:
    files = test_flacs[:3]
    recognizer = asr.load_model(bundle, beam_size=4)
    assert recognizer.options == BeamOptions(beam_size=4)  # a transducer: modified beam search
    expected = recognizer.transcribe(files)
    lines = cli("asr-transcribe", bundle, "--beam-size", "4", *files, "--device", "cpu")  # mixed
    assert lines.splitlines() == [f"{p}\t{t}" for p, t in zip(files, expected, strict=True)]


@pytest.fixture(scope="module")
def decoded(bundle: Path, test_cuts: Path, cli, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("decode")
    printed = cli("asr-decode", bundle, test_cuts, "-o", out, "--device", "cpu")
    summary = next(line for line in printed.splitlines() if line.startswith("{"))
    assert json.loads(summary) == json.loads((out / "wer.json").read_text())
    assert f"on {json.loads(summary)['ref_words']} words" in printed
    return out


def _hyps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "hyps.jsonl").read_text().splitlines()]


def test_decode_lists_the_n_best(bundle: Path, test_cuts: Path, cli, tmp_path: Path, capsys):
    out = tmp_path / "nbest"
    args = ("--beam-size", "4", "--nbest", "3", "-o", out, "--device", "cpu")
    cli("asr-decode", bundle, test_cuts, *args)
    lines = _hyps(out)
    assert lines and all(1 <= len(line["nbest"]) <= 3 for line in lines)
    for line in lines:
        assert line["nbest"][0]["hyp"] == line["hyp"]
        scores = [entry["score"] for entry in line["nbest"]]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, in this process
        decode_main([str(bundle), str(test_cuts), "--nbest", "2"])
    assert exited.value.code == 2
    assert "--nbest 2 needs --beam-size of at least 2" in capsys.readouterr().err


def test_decode_and_export_pick_the_same_averaged_model(
    trained_run, bundle: Path, decoded: Path, test_cuts: Path, cli, tmp_path: Path
) -> None:
    # `--epoch E --avg N` on the run's checkpoints/ makes the bundle fixture's model (the
    # last two epochs) in asr-export and in asr-decode alike
    last = str(trained_run.epochs - 1)
    exported = tmp_path / "e.bundle.pt"
    cli("asr-export", trained_run.checkpoints, "--epoch", last, "--avg", "2", "-o", exported)
    again, first = torch.load(exported), torch.load(bundle)
    assert again["averaged"] == first["averaged"]
    assert all(torch.equal(again["state_dict"][k], v) for k, v in first["state_dict"].items())
    out = tmp_path / "decode"
    # the options between the model and the manifest, as the docs type them
    choice = ("--epoch", last, "--avg", "2")
    cli("asr-decode", trained_run.checkpoints.parent, *choice, test_cuts, "-o", out)
    assert _hyps(out) == _hyps(decoded)


def test_decode_totals_are_the_sums_of_the_lines(decoded: Path, test_cuts: Path) -> None:
    summary, hyps = json.loads((decoded / "wer.json").read_text()), _hyps(decoded)
    refs = {c.id: c.supervisions[0].text for c in load_cuts(test_cuts)}
    assert hyps and all(h["ref"] == refs[h["id"]] for h in hyps)
    for key in ("substitutions", "deletions", "insertions", "ref_words"):
        assert summary[key] == sum(h[key] for h in hyps), key
    assert summary["ref_words"] == sum(len(h["ref"].split()) for h in hyps)
    errors = summary["substitutions"] + summary["deletions"] + summary["insertions"]
    assert summary["wer"] == round(100 * errors / summary["ref_words"], 3)


def test_decode_covers_every_cut(decoded: Path, test_cuts: Path) -> None:
    summary, hyps = json.loads((decoded / "wer.json").read_text()), _hyps(decoded)
    cut_ids = [c.id for c in load_cuts(test_cuts)]
    assert summary["utterances_skipped"] == 0
    assert sorted(h["id"] for h in hyps) == sorted(cut_ids)


def test_decode_counts_unreadable_audio_as_all_deletions(
    bundle: Path, decoded: Path, test_cuts: Path, cli, tmp_path
):
    from dataclasses import replace

    from lhotse import CutSet
    from lhotse.audio import AudioSource

    cuts = list(load_cuts(test_cuts))
    gone = AudioSource(type="file", channels=[0], source=str(tmp_path / "gone.flac"))
    lost = replace(cuts[0], recording=replace(cuts[0].recording, sources=[gone]))
    CutSet.from_cuts([lost, *cuts[1:]]).to_file(tmp_path / "damaged.jsonl.gz")
    printed = cli("asr-decode", bundle, tmp_path / "damaged.jsonl.gz", "-o", tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "wer.json").read_text())
    full = json.loads((decoded / "wer.json").read_text())
    words = len(cuts[0].supervisions[0].text.split())
    assert summary["utterances"] == len(cuts) and summary["utterances_skipped"] == 1
    assert summary["ref_words"] == full["ref_words"]  # the WER is over every utterance asked for
    line = next(h for h in _hyps(tmp_path / "out") if h["id"] == lost.id)
    assert line["hyp"] == "" and line["deletions"] == words and "unreadable" in line
    assert "1 utterance(s) had unreadable audio and count as all deletions" in printed


def test_decode_a_manifest_smaller_than_the_bucket_count(bundle: Path, test_cuts, cli, tmp_path):
    few = load_cuts(test_cuts).subset(first=4)
    few.to_file(tmp_path / "few.jsonl.gz")
    cli("asr-decode", bundle, tmp_path / "few.jsonl.gz", "-o", tmp_path / "out")
    assert len(_hyps(tmp_path / "out")) == 4


# --- attention encoder-decoder: asr-train, export, load_model, asr-decode, asr-transcribe ---


def test_load_model_decode_and_transcribe_work_for_the_aed(
    aed_run, test_cuts: Path, test_flacs, cli, tmp_path
):
    bundle = export_bundle(aed_run / "checkpoints" / "last.ckpt", tmp_path / "aed.bundle.pt")
    flacs = test_flacs[:3]
    greedy = asr.load_model(bundle).transcribe(flacs)
    assert len(greedy) == 3 and all(isinstance(t, str) for t in greedy)
    lines = cli("asr-transcribe", bundle, *flacs, "--device", "cpu").splitlines()
    assert lines == [f"{p}\t{t}" for p, t in zip(flacs, greedy, strict=True)]
    for beam in (3,):  # greedy: asr-transcribe above
        out = tmp_path / f"beam{beam}"
        cli("asr-decode", bundle, test_cuts, "-o", out, "--beam-size", str(beam))
        summary = json.loads((out / "wer.json").read_text())
        assert summary["utterances_skipped"] == 0 and summary["ref_words"] > 0
        hyps = {h["id"]: h["hyp"] for h in _hyps(out)}
        assert len(hyps) == len(test_flacs)
    beam3 = asr.load_model(bundle, beam_size=3).transcribe(flacs)
    assert len(beam3) == 3

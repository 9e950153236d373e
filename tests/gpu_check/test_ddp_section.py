"""The GPU check's `ddp` section: its noise corpus loads through the real data path, its
checks catch a wrong backend and a DGC run that sent nothing sparse (its whole run on the CPU:
test_rehearsal.py)."""

import io
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from asr.data.corpus import load_cuts
from asr.data.tokenizer import Tokenizer
from asr.gpu_check.ddp import RUNS, check_run, summarize
from asr.gpu_check.noise_corpus import DEV, TRAIN, WORDS, make_noise_corpus
from asr.gpu_check.report import Report
from asr.gpu_check.train_runs import MAX_STEPS, Started, ended


def test_noise_corpus_loads_with_lhotse(tmp_path: Path) -> None:
    corpus = make_noise_corpus(tmp_path / "corpus", train=8, dev=3, seed=1)
    cuts = {part: list(load_cuts(corpus.cuts(part))) for part in (TRAIN, DEV)}
    assert {part: len(c) for part, c in cuts.items()} == {TRAIN: 8, DEV: 3}
    for cut in cuts[TRAIN] + cuts[DEV]:
        assert 1.0 <= cut.duration <= 4.0 and cut.sampling_rate == 16_000
        speaker, chapter, _ = cut.id.split("-")
        assert cut.recording.sources[0].source.endswith(f"/{speaker}/{chapter}/{cut.id}.flac")
        words = cut.supervisions[0].text.split()
        assert words and all(w.lower() in WORDS and w.isupper() for w in words)
    audio = cuts[TRAIN][0].load_audio()
    assert 0.005 < float(np.std(audio)) < 0.02  # low-level noise, no digital silence
    assert Tokenizer.load(corpus.tokenizer).vocab_size == 64
    again = make_noise_corpus(tmp_path / "again", train=8, dev=3, seed=1)
    assert [c.supervisions[0].text for c in load_cuts(again.cuts(TRAIN))] == [
        c.supervisions[0].text for c in cuts[TRAIN]
    ]


LOG = """[2026-11-26 09:41:40,101][asr.train][INFO] - precision: 32-true
Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1
distributed_backend=gloo
All distributed processes registered. Starting with 1 processes
"""


def metrics_rows(losses: list[str], sent: list[float], dense: float) -> list[dict[str, str]]:
    """metrics.csv rows as Lightning's CSV logger writes them: the loss logged at steps
    0.., `CompressionMonitor`'s traffic after each optimizer step (1..)."""
    rows = [{"step": str(i), "train/loss": loss} for i, loss in enumerate(losses)]
    rows += [
        {"step": str(i + 1), "comm/payload_bytes": str(s), "comm/bucket_bytes": str(dense)}
        for i, s in enumerate(sent)
    ]
    rows += [{"step": str(i), "val/wer": "100.0"} for i in range(2, len(losses), 3)]
    return rows


def test_summarize_reads_the_log_and_the_metrics() -> None:
    plain, dgc = RUNS
    rows = metrics_rows(["5.0", "4.0", "3.5"], [100.0, 10.0, 1.0], 100.0)
    facts = summarize(dgc, LOG, rows)
    assert facts["backend"] == "gloo" and facts["optimizer_steps"] == 3
    assert facts["precision"] == "32-true" and facts["validations"] == 1
    assert facts["losses"] == [5.0, 4.0, 3.5] and facts["losses_finite"]
    assert facts["dgc"]["sparse_steps"] == 2 and not facts["lattice_given_up"]
    nan_loss = [*rows[:2], {"step": "2", "train/loss": "nan"}]
    facts = summarize(plain, LOG + "the triton lattice kernels are given up", nan_loss)
    assert "dgc" not in facts and facts["lattice_given_up"] and not facts["losses_finite"]


def test_check_run_fails_on_a_wrong_backend_and_a_dense_dgc_run(tmp_path: Path) -> None:
    _, dgc = RUNS
    losses = [str(5.0 - i) for i in range(MAX_STEPS)]
    facts = summarize(dgc, LOG, metrics_rows(losses, [100.0] * MAX_STEPS, 100.0))
    facts["dgc"]["rank_state_saved"] = True
    report = Report(io.StringIO())
    check_run(report, dgc, "cpu", 0, tmp_path / "log", facts)
    assert len(report.failures) == 1 and "no sparse step" in report.failures[0]
    report = Report(io.StringIO())
    check_run(report, dgc, "cuda", 0, tmp_path / "log", facts)
    assert any("backend gloo, expected nccl" in f for f in report.failures)
    assert any("precision 32-true, expected bf16-mixed" in f for f in report.failures)
    log = tmp_path / "failed.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "ValueError: bad key\n")
    report = Report(io.StringIO())
    check_run(report, dgc, "cpu", 1, log, facts)
    (failure,) = report.failures
    assert "exited 1" in failure and failure.endswith("line 29\nValueError: bad key")
    assert "line 10\n" not in failure  # the last 20 lines only


def test_ended_yields_runs_as_they_end_and_kills_them_at_the_deadline(tmp_path: Path) -> None:
    def start(seconds: float) -> Started:
        command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
        process = subprocess.Popen(command)
        return Started(RUNS[0], process, time.monotonic(), [], tmp_path, tmp_path / "log")

    slow, quick = start(60), start(0)
    began = time.monotonic()
    done = list(ended([slow, quick], deadline=began + 0.5))
    assert [(s is quick, s.exit_code) for s in done] == [(True, 0), (False, None)]
    assert slow.process.poll() is not None and 0.5 <= slow.wall_s < 10.0

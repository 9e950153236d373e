"""The GPU check's runner: one line without CUDA; sections in their own processes whose
lines are relayed as they come, whose faults, crashes and overruns are reported, and
whose stray prints cannot corrupt the JSON. The sections here are small modules written
by the tests (a real section's code is tested by the CPU rehearsal, test_rehearsal.py)."""

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.runner import (
    GPU_BENCH,
    GPU_CHECK,
    SECTIONS,
    Lines,
    Section,
    Suite,
    main,
    run_section,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "suite", "words"),
    [("gpu_check.py", "gpu_check", "nothing was checked"),
     ("gpu_bench.py", "gpu_bench", "nothing was measured")],
)  # fmt: skip
def test_without_cuda_it_ends_at_once_with_one_line(
    tmp_path: Path, script: str, suite: str, words: str
) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine with one
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    seconds = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    record = json.loads(line)
    assert record["section"] == suite and record["status"] == "no_cuda"
    assert "no CUDA device" in record["message"] and words in record["message"]
    assert not done.stderr.strip()
    assert not (tmp_path / "exp").exists()  # nothing written
    assert seconds < 30, seconds  # imports torch and stops: a few seconds


def test_the_limits_keep_the_check_within_7_minutes() -> None:
    assert sum(s.limit_s for s in SECTIONS) <= 420
    names = ["env", "lattice", "training", "aed", "ddp", "ssl", "streaming"]
    assert [s.name for s in SECTIONS] == names


@pytest.mark.parametrize("suite", [GPU_CHECK, GPU_BENCH], ids=lambda s: s.name)
def test_the_docs_give_each_limit_and_their_total(suite: Suite) -> None:
    """docs/gpu.md's tables and totals are the runner's: a changed limit changes the page."""
    text = (ROOT / "docs" / "gpu.md").read_text()
    for s in suite.sections:
        assert f"| `{s.name}` | {s.limit_s:g} s |" in text, s.name
    total = sum(s.limit_s for s in suite.sections)
    assert f"The {suite.noun}'s limits add up to {total:g} s" in text


FAKES = {
    "fake_ok": """
        def run(report, options):
            print("a stray print")  # must not reach the JSON lines
            report.record("measured", value=1.5, device=options.device, limit_s=options.limit_s)
    """,
    "fake_fault": """
        def run(report, options):
            report.record("measured", value=2)
            report.fail("the answers differ")
            report.warn("slower than the target")
    """,
    "fake_crash": """
        def run(report, options):
            report.record("measured", value=3)
            raise ValueError("a bug in the section")
    """,
    "fake_hang": """
        import subprocess, time
        def run(report, options):
            child = subprocess.Popen(["sleep", "300"])
            report.record("started", child=child.pid)
            time.sleep(300)
    """,
}


@pytest.fixture
def fake_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, code in FAKES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    return tmp_path


def run_fake(tmp_path: Path, module: str, limit: float = 60) -> tuple[str, list[dict]]:
    out = io.StringIO()
    options = SectionOptions("cpu", tmp_path / "work", 2**30)
    status = run_section(Section(module, module, limit, limit, ""), options, Lines(None, out))
    return status, [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_passing_section_streams_its_lines(fake_sections: Path) -> None:
    status, lines = run_fake(fake_sections, "fake_ok")
    assert status == "pass"
    assert [line["record"] for line in lines] == ["measured", "summary", "status"]
    assert lines[0] == {
        "section": "fake_ok",
        "record": "measured",
        "value": 1.5,
        "device": "cpu",
        "limit_s": 60,
    }  # fmt: skip: the runner gives the section its limit
    assert lines[-1]["status"] == "pass" and lines[-1]["exit_code"] == 0
    assert (fake_sections / "work" / "fake_ok").is_dir()  # its scratch space


def test_a_fault_fails_the_section_and_a_warning_does_not(fake_sections: Path) -> None:
    status, lines = run_fake(fake_sections, "fake_fault")
    assert status == "fail"
    summary = next(line for line in lines if line["record"] == "summary")
    assert summary["failures"] == ["the answers differ"]
    assert summary["warnings"] == ["slower than the target"]


def test_a_crash_reports_what_was_measured_and_the_traceback(fake_sections: Path) -> None:
    status, lines = run_fake(fake_sections, "fake_crash")
    assert status == "error"
    records = {line["record"]: line for line in lines}
    assert records["measured"]["value"] == 3
    assert "ValueError: a bug in the section" in records["error"]["traceback"]
    assert records["status"]["exit_code"] == 1


def test_an_overrun_is_stopped_with_its_subprocesses(fake_sections: Path) -> None:
    began = time.monotonic()
    status, lines = run_fake(fake_sections, "fake_hang", limit=8)
    assert status == "timeout"
    assert 8 <= time.monotonic() - began < 30
    started = next(line for line in lines if line["record"] == "started")  # relayed at once
    assert lines[-1]["limit_s"] == 8 and "stderr_tail" in lines[-1]
    time.sleep(0.5)
    assert not running(started["child"])  # the section's own child was stopped too


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a killed orphan may wait to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_report_lines_are_plain_json() -> None:
    out = io.StringIO()
    report = Report(out)
    report.record("x", path=Path("/a"), ratio=1 / 3, inf=float("inf"), pair=(1, 2))
    report.finish()
    first, summary = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {"record": "x", "path": "/a", "ratio": 0.333333, "inf": "inf", "pair": [1, 2]}
    assert summary == {"record": "summary", "failures": [], "warnings": []}


def fake_suite(output_dir: Path) -> Suite:
    sections = tuple(Section(name, name, 60, 60, "") for name in ("fake_ok", "fake_fault"))
    return Suite(
        "fake_suite", "a suite of fakes", "fakes", "faked", sections, ("nothing",), output_dir
    )


def test_a_suite_runs_its_sections_and_names_its_summary(
    fake_sections: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(fake_sections)
    suite = fake_suite(Path("exp/fakes"))
    assert main(["--rehearse", "--only", "fake_ok"], suite=suite) == 0
    (output,) = (fake_sections / "exp" / "fakes").glob("fake_suite-*.jsonl")  # its default
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert {line["section"] for line in lines} == {"fake_ok", "fake_suite"}
    summary = lines[-1]
    assert summary["record"] == "summary" and summary["status"] == "pass"
    assert summary["sections"] == {"fake_ok": "pass"} and summary["not_executed"] == ["nothing"]
    assert (fake_sections / "exp" / "fakes" / "work" / "fake_ok").is_dir()  # its work folder
    assert main(["--rehearse", "-o", "all.jsonl"], suite=suite) == 1  # fake_fault fails
    last = json.loads((fake_sections / "all.jsonl").read_text().splitlines()[-1])
    assert last["sections"] == {"fake_ok": "pass", "fake_fault": "fail"}


def test_only_names_a_suites_own_sections(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["--only", "lattice"], suite=GPU_BENCH)  # a section of the check, not the bench
    assert "unknown sections ['lattice']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--only", "batching"], suite=GPU_CHECK)

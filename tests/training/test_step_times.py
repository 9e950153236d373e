"""`StepTimes` (`debug.step_times_dir`): one JSON line per optimizer step and rank, with the
seconds since the rank's previous step and its all-reduce wait where that is timed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from asr.training.step_times import StepTimes


def test_one_line_per_optimizer_step_with_its_seconds_and_wait(tmp_path: Path) -> None:
    waits = iter([0.5, None])
    recorder = StepTimes(tmp_path, allreduce_wait=lambda: next(waits))
    module = SimpleNamespace(last_step_audio_seconds=12.5)
    for step, pause in ((1, 0.0), (1, 0.0), (2, 0.05)):  # the second: inside accumulation
        time.sleep(pause)
        recorder.on_train_batch_end(SimpleNamespace(global_step=step, global_rank=3), module)
    lines = (tmp_path / "rank3.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert (first["step"], first["step_s"], first["allreduce_wait_s"]) == (1, None, 0.5)
    assert second["step"] == 2 and second["allreduce_wait_s"] is None
    assert second["step_s"] == pytest.approx(0.05, abs=0.04)
    assert first["audio_seconds"] == 12.5


def test_without_a_timed_allreduce_the_wait_is_none(tmp_path: Path) -> None:
    recorder = StepTimes(tmp_path)
    recorder.on_train_batch_end(SimpleNamespace(global_step=1, global_rank=0), SimpleNamespace())
    (line,) = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert json.loads(line)["allreduce_wait_s"] is None

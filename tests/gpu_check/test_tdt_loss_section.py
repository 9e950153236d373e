"""The GPU bench's `tdt-loss` section rehearsed in this process at toy sizes on the CPU
(Triton interpreted): its records and their fields, and a batched loss that runs out of
memory (the whole bench through its runner: test_gpu_bench.py)."""

import io

import pytest
import torch

from asr.gpu_check import bench_tdt_loss
from asr.gpu_check.bench_tdt_loss import (
    MEMORY_RATIO_TARGET,
    REHEARSAL_HEADLINE,
    REHEARSAL_LIBRISPEECH,
    TIME_RATIO_TARGET,
    against_batched,
    warm_then_timed,
)
from asr.gpu_check.loss_runs import LATTICES, TARGET_BYTES, build_joiner, full_length_inputs
from asr.gpu_check.report import Report
from tests.gpu_check.section_reports import rehearse, reported


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return rehearse(bench_tdt_loss.run, tmp_path_factory.mktemp("tdt"))


@pytest.mark.slow  # the module fixture: the section in about 8 s (Triton interpreted)
def test_the_setup_names_both_cases_and_the_targets(rehearsal: dict) -> None:
    (setup,) = rehearsal["setup"]
    case = REHEARSAL_HEADLINE
    assert (setup["batch"], setup["frames"], setup["tokens"]) == (case.batch, 8, 2)
    assert setup["durations"] == [0, 1, 2, 3, 4] and setup["sigma"] == 0.05
    assert setup["omega"] == 0.0 and setup["dtype"] == "float32"
    assert setup["librispeech"]["batch"] == REHEARSAL_LIBRISPEECH.batch
    assert "probe" not in setup["librispeech"]  # the whole batch always runs
    assert setup["target_bytes"] == TARGET_BYTES == 6e9 and setup["triton_interpreted"]
    assert (setup["memory_ratio_target"], setup["time_ratio_target"]) == (0.1, 1.0)
    # encoder_out (B, T, D) and predictor_out (B, U+1, D) in float32, targets and lengths
    # in int64
    floats = case.batch * (case.frames * case.encoder_dim + (case.tokens + 1) * case.predictor_dim)
    assert setup["input_bytes"] == 4 * floats + 8 * case.batch * (case.tokens + 2)


@pytest.mark.slow  # the module fixture: the section in about 8 s (Triton interpreted)
def test_the_headline_batch_runs_whole_with_both_lattices(rehearsal: dict) -> None:
    measured = rehearsal["samplewise"]
    assert [m["lattice"] for m in measured] == list(LATTICES)
    case = REHEARSAL_HEADLINE
    for m in measured:
        # no scaling at toy sizes: the whole batch ran, timed and measured
        assert not m["scaled"] and m["timed_utterances"] == case.batch and m["seconds"] > 0
        assert m["probe_utterances"] == case.probe and m["probe_s"] > 0 and m["warmup_s"] > 0
        assert m["seconds_per_utterance"] == pytest.approx(m["seconds"] / case.batch, rel=1e-4)
        # on the CPU, the growth of the resident set: rough, but a count of bytes
        assert isinstance(m["peak_bytes"], int) and m["peak_bytes"] >= 0 and m["meets_target"]


@pytest.mark.slow  # the module fixture: the section in about 8 s (Triton interpreted)
def test_the_librispeech_batch_compares_each_lattice_with_the_batched_loss(
    rehearsal: dict,
) -> None:
    runs = rehearsal["librispeech"]
    assert [(r["loss"], r["lattice"]) for r in runs] == [
        ("samplewise", "triton"), ("samplewise", "torch"), ("batched", None),
    ]  # fmt: skip
    for r in runs:
        assert r["batch"] == REHEARSAL_LIBRISPEECH.batch and not r["out_of_memory"]
        assert r["seconds"] > 0 and r["warmup_s"] > 0 and r["peak_bytes"] >= 0
    batched = runs[-1]
    compared = rehearsal["against_batched"]
    assert [c["lattice"] for c in compared] == list(LATTICES)
    for c, ours in zip(compared, runs, strict=False):
        assert not c["batched_out_of_memory"]
        ratio = ours["seconds"] / batched["seconds"]
        assert c["time_ratio"] == pytest.approx(ratio, rel=1e-3)
        assert c["meets_time_target"] == (c["time_ratio"] <= TIME_RATIO_TARGET)
        if batched["peak_bytes"]:  # the resident set may not grow on the CPU
            assert c["meets_memory_target"] == (c["memory_ratio"] <= MEMORY_RATIO_TARGET)
    # a rehearsal judges no target (its figures are of the CPU): no warning, no failure
    (summary,) = rehearsal["summary"]
    assert summary["warnings"] == [] and summary["failures"] == []


def out_of_memory_loss(*args: object) -> torch.Tensor:
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB\nmore")


def test_a_batched_loss_out_of_memory_is_recorded_and_judged_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = REHEARSAL_LIBRISPEECH
    joiner = build_joiner(case, "cpu")
    inputs = full_length_inputs(case, case.batch, "cpu")
    found = warm_then_timed(out_of_memory_loss, joiner, inputs, case, "cpu")
    assert found == {
        "out_of_memory": True, "seconds": None, "peak_bytes": None,
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 40.00 GiB",
    }  # fmt: skip
    monkeypatch.setattr(bench_tdt_loss, "LATTICES", ("torch",))  # no interpreted Triton
    monkeypatch.setattr(bench_tdt_loss, "batched", lambda case: out_of_memory_loss)
    stream = io.StringIO()
    report = Report(stream)
    against_batched(report, case, joiner, "cpu", judge=True)
    by_kind = reported(stream)
    assert by_kind["librispeech"][-1]["out_of_memory"]
    (compared,) = by_kind["against_batched"]
    assert compared["batched_out_of_memory"] and compared["memory_ratio"] is None
    assert compared["meets_memory_target"] is None and compared["meets_time_target"] is None
    assert report.warnings == [] and report.failures == []


def test_a_missed_target_warns_for_the_triton_lattice_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Judged (as on a GPU): the batched loss 'faster and smaller' than the sample-wise
    one gives both warnings."""
    case = REHEARSAL_LIBRISPEECH
    joiner = build_joiner(case, "cpu")
    figures = iter([
        {"out_of_memory": False, "seconds": 2.0, "peak_bytes": 500},  # sample-wise, Triton
        {"out_of_memory": False, "seconds": 0.5, "peak_bytes": 1000},  # batched
    ])  # fmt: skip
    monkeypatch.setattr(bench_tdt_loss, "LATTICES", ("triton",))
    monkeypatch.setattr(bench_tdt_loss, "warm_then_timed", lambda *args: next(figures))
    report = Report(io.StringIO())
    (compared,) = against_batched(report, case, joiner, "cpu", judge=True).values()
    assert compared["memory_ratio"] == 0.5 and compared["time_ratio"] == 4.0
    assert len(report.warnings) == 2 and report.failures == []
    assert "0.500 x the batched one's memory" in report.warnings[0]
    assert "4.00 x the batched one's time" in report.warnings[1]

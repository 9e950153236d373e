"""The GPU bench (`scripts/gpu_bench.py`): one line without CUDA, and the whole bench
rehearsed on the CPU (`--rehearse`: every section's real code at toy sizes, Triton
interpreted), so that its first run on a GPU does not stop on a bug of its own. One run for
the module; each test reads what one section reported."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr.gpu_check.bench_batching import LOSSES, STRATEGIES
from asr.gpu_check.bench_batching import REHEARSAL_CASE as BATCHING
from asr.gpu_check.bench_lm_fusion import REHEARSAL_CASE as LM_FUSION
from asr.gpu_check.bench_loss import REHEARSAL_CASE as LOSS
from asr.gpu_check.bench_streaming import MAX_BLANK_BIAS
from asr.gpu_check.bench_streaming import REHEARSAL_CASE as STREAMING
from asr.gpu_check.bench_tdt_loss import REHEARSAL_HEADLINE as TDT
from asr.gpu_check.loss_runs import LATTICES, TARGET_BYTES
from asr.gpu_check.runner import GPU_BENCH

ROOT = Path(__file__).resolve().parents[2]


def test_the_sections_and_their_limits() -> None:
    names = ["loss-headline", "tdt-loss", "batching", "decode", "lm-fusion", "streaming"]
    assert list(GPU_BENCH.section_names) == names
    assert all(s.limit_s <= 180 for s in GPU_BENCH.sections)  # 3 minutes each on one H100
    # 9.5 minutes in all: the whole bench and the runner's own start within 10 minutes
    assert sum(s.limit_s for s in GPU_BENCH.sections) <= 570
    decode = next(s for s in GPU_BENCH.sections if s.name == "decode")
    assert (decode.module, decode.limit_s, decode.rehearsal_limit_s) == (
        "asr.gpu_check.bench_decode", 150, 240,
    )  # fmt: skip


# --- the whole bench rehearsed on the CPU --------------------------------------------------


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """{"done": the finished process, "lines": the file's JSON lines, "by_section"}; output
    and work folder relative, as `make gpu-bench` gives them."""
    tmp = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_bench.py"), "--rehearse", "-o",
         "bench.jsonl", "--work-dir", "work"],
        capture_output=True, text=True, timeout=900, cwd=tmp,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    lines = [json.loads(line) for line in (tmp / "bench.jsonl").read_text().splitlines()]
    by_section: dict[str, list[dict]] = {}
    for line in lines:
        by_section.setdefault(line["section"], []).append(line)
    return {"done": done, "lines": lines, "by_section": by_section}


def records(rehearsal: dict, section: str, kind: str) -> list[dict]:
    return [line for line in rehearsal["by_section"][section] if line["record"] == kind]


@pytest.mark.slow
@pytest.mark.long
def test_every_section_passes_and_streams_to_stdout_and_the_file(rehearsal: dict) -> None:
    done = rehearsal["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in done.stdout.splitlines()] == rehearsal["lines"]
    (summary,) = records(rehearsal, "gpu_bench", "summary")
    assert summary["status"] == "pass" and summary["rehearsal"]
    assert summary["sections"] == dict.fromkeys(GPU_BENCH.section_names, "pass")
    for name in GPU_BENCH.section_names:
        (status,) = records(rehearsal, name, "status")
        assert status["seconds"] < status["limit_s"]
    # label looping with a context graph gave frame-looping's tokens, on a graph that did
    # change some hypotheses
    (biasing,) = records(rehearsal, "decode", "context_biasing")
    assert biasing["label_looping_differs"] == 0 and biasing["states"] > 1


@pytest.mark.slow
@pytest.mark.long
def test_loss_headline_measures_both_lattices_and_torchaudios_largest_batch(
    rehearsal: dict,
) -> None:
    (setup,) = records(rehearsal, "loss-headline", "setup")
    assert (setup["batch"], setup["frames"], setup["tokens"]) == (LOSS.batch, 16, 4)
    assert setup["target_bytes"] == TARGET_BYTES == 6e9 and setup["triton_interpreted"]
    assert setup["input_bytes"] > 0 and setup["predicted_peak_bytes"] > 0
    measured = records(rehearsal, "loss-headline", "samplewise")
    assert [m["lattice"] for m in measured] == list(LATTICES)
    for m in measured:
        # the whole batch ran (no scaling at toy sizes), timed and measured
        assert not m["scaled"] and m["timed_utterances"] == LOSS.batch and m["seconds"] > 0
        assert m["seconds_per_utterance"] == pytest.approx(m["seconds"] / LOSS.batch, rel=1e-4)
        assert m["probe_s"] > 0 and m["predicted_s"] > 0 and m["warmup_s"] > 0
        # on the CPU, the growth of the resident set: pages the allocator reuses do not show
        assert isinstance(m["peak_bytes"], int) and m["peak_bytes"] >= 0
        assert m["meets_target"]
    (baseline,) = records(rehearsal, "loss-headline", "torchaudio")
    # no out-of-memory on the CPU: the search stops at the headline batch
    assert baseline["largest_batch"] == LOSS.batch and baseline["bound"] == "headline batch"
    assert (
        baseline["int32_logits_batch_limit"] > LOSS.batch
        and baseline["memory_batch_estimate"] is None
    )
    assert [p["batch"] for p in baseline["probes"]] == [1, 2, 4, LOSS.batch]
    assert all(p["fits"] and p["seconds"] > 0 for p in baseline["probes"])
    assert baseline["seconds"] > 0 and baseline["peak_bytes"] >= 0
    (against,) = records(rehearsal, "loss-headline", "against_torchaudio")
    assert against["batch_ratio"] == 1.0
    triton = measured[0]
    ratio = baseline["seconds_per_utterance"] / triton["seconds_per_utterance"]
    assert against["seconds_per_utterance_ratio"] == pytest.approx(ratio, rel=1e-3)
    (summary,) = records(rehearsal, "loss-headline", "summary")
    assert summary["warnings"] == [] and summary["failures"] == []


@pytest.mark.slow
@pytest.mark.long
def test_tdt_loss_measures_the_headline_batch_and_the_batched_loss(rehearsal: dict) -> None:
    """The section's records as the runner relays them (their fields in detail:
    test_tdt_loss_section.py)."""
    (setup,) = records(rehearsal, "tdt-loss", "setup")
    assert (setup["batch"], setup["durations"]) == (TDT.batch, [0, 1, 2, 3, 4])
    measured = records(rehearsal, "tdt-loss", "samplewise")
    assert [m["lattice"] for m in measured] == list(LATTICES)
    assert all(not m["scaled"] and m["meets_target"] for m in measured)
    compared = records(rehearsal, "tdt-loss", "librispeech")
    assert [(c["loss"], c["lattice"]) for c in compared] == [
        ("samplewise", "triton"), ("samplewise", "torch"), ("batched", None),
    ]  # fmt: skip
    assert len(records(rehearsal, "tdt-loss", "against_batched")) == len(LATTICES)
    (summary,) = records(rehearsal, "tdt-loss", "summary")
    assert summary["warnings"] == [] and summary["failures"] == []


@pytest.mark.slow
@pytest.mark.long
def test_batching_runs_both_strategies_with_both_losses(rehearsal: dict) -> None:
    (setup,) = records(rehearsal, "batching", "setup")
    assert len(setup["duration_bins"]) == BATCHING.num_buckets
    assert len(setup["bins_2d"]) == BATCHING.num_buckets * BATCHING.num_token_buckets
    assert setup["longest_1d_bucket"]["max_duration"] == setup["duration_bins"][-1]
    searches = {
        (r["strategy"], r["loss"]): r for r in records(rehearsal, "batching", "batch_sizes")
    }
    plans = {(r["strategy"], r["loss"]): r for r in records(rehearsal, "batching", "plan")}
    runs = {(r["strategy"], r["loss"]): r for r in records(rehearsal, "batching", "run")}
    pairs = {(s, x) for s in STRATEGIES for x in LOSSES}
    assert set(searches) == set(plans) == set(runs) == pairs
    for loss in LOSSES:
        # the baseline's one max_duration: the longest bucket's batch size x its duration
        longest = searches[("buckets_1d", loss)]
        edge, size = longest["bucket_duration_bins"][0], longest["bucket_batch_size"][0]
        one_d = plans[("buckets_1d", loss)]
        assert one_d["sampler"]["max_duration"] == pytest.approx(size * edge, rel=1e-5)
        # the default: a searched batch size per 2D bucket, and the TPS filter
        two_d = plans[("buckets_2d", loss)]
        assert (
            two_d["sampler"]["bucket_batch_size"]
            == searches[("buckets_2d", loss)]["bucket_batch_size"]
        )
        assert two_d["sampler"]["bucket_duration_bins"] == setup["bins_2d"]
        assert two_d["sampler"]["max_tps"] == setup["max_tps"]
        # over an epoch, 2D buckets pad tokens and transducer lattices less than 1D ones
        for kind in ("token_padding", "lattice_padding"):
            assert two_d["epoch"][kind] < one_d["epoch"][kind]
    for run in runs.values():
        assert run["steps"] == BATCHING.steps and run["stopped_by"] == "steps"
        assert run["oom_steps"] == 0 and run["losses_finite"] and run["seconds"] > 0
        assert run["audio_seconds_per_step"] > 0 and run["audio_seconds_per_second"] > 0
        rate = run["audio_seconds_per_step"] * run["steps"] / run["seconds"]
        assert run["audio_seconds_per_second"] == pytest.approx(rate, rel=1e-3)
        for kind in ("frame_padding", "token_padding", "lattice_padding"):
            assert 0 <= run[kind] < 1
        assert run["lattice"] == ("torch" if run["loss"] == "samplewise" else None)
    (ratios,) = records(rehearsal, "batching", "ratios")
    for loss in LOSSES:
        got = ratios[f"2d_over_1d_{loss}"]["audio_seconds_per_second"]
        want = (
            runs[("buckets_2d", loss)]["audio_seconds_per_second"]
            / runs[("buckets_1d", loss)]["audio_seconds_per_second"]
        )
        assert got == pytest.approx(want, rel=1e-3)
    for strategy in STRATEGIES:
        got = ratios[f"samplewise_over_torchaudio_{strategy}"]["audio_seconds_per_step"]
        want = (
            runs[(strategy, "samplewise")]["audio_seconds_per_step"]
            / runs[(strategy, "batched")]["audio_seconds_per_step"]
        )
        assert got == pytest.approx(want, rel=1e-3)


@pytest.mark.slow
@pytest.mark.long
def test_lm_fusion_times_each_search_with_each_lm(rehearsal: dict) -> None:
    """The section's records as the runner relays them (their fields in detail:
    test_lm_fusion_section.py)."""
    costs = records(rehearsal, "lm-fusion", "cost")
    searches = [("greedy", b) for b in LM_FUSION.greedy_batch_sizes]
    assert sorted({(c["search"], c["batch_size"]) for c in costs}) == sorted(
        [*searches, ("beam", LM_FUSION.beam_batch)]
    )
    assert {c["lm"] for c in costs} == {"lm3", "lm6", "lm6+lodr2"}
    assert all(c["ratio"] > 0 and c["tokens"] > 0 for c in costs)
    assert all(
        a["label_looping_differs"] == 0 for a in records(rehearsal, "lm-fusion", "agreement")
    )
    (targets,) = records(rehearsal, "lm-fusion", "targets")
    assert len(targets["cases"]) == len(costs)
    (summary,) = records(rehearsal, "lm-fusion", "summary")
    assert summary["warnings"] == [] and summary["failures"] == []


@pytest.mark.slow
@pytest.mark.long
def test_streaming_trains_at_each_chunk_and_decodes_each_number_of_streams(
    rehearsal: dict,
) -> None:
    (setup,) = records(rehearsal, "streaming", "setup")
    chunks = setup["trained_chunk_frames"]
    assert chunks == [4, 8, 16, -1]  # demo_streaming: 160, 320, 640 ms and full context
    trained = records(rehearsal, "streaming", "training")
    assert [t["chunk_frames"] for t in trained] == chunks
    for t in trained:
        assert t["oom_steps"] == 0 and t["losses_finite"] and t["seconds_per_step"] > 0
        assert t["batch_size"] == STREAMING.train_batch
        assert t["chunk_ms"] == (None if t["chunk_frames"] == -1 else 40 * t["chunk_frames"])
    (decode_setup,) = records(rehearsal, "streaming", "decode_setup")
    assert 0 < decode_setup["blank_bias_added"] < MAX_BLANK_BIAS
    # far below the 75 tokens a second random weights emit without the raised blank
    assert decode_setup["calibration_tokens_per_second"] < 10
    decodes = {
        (d["chunk_frames"], d["streams"]): d for d in records(rehearsal, "streaming", "decode")
    }
    streamed = [c for c in chunks if c != -1]
    assert set(decodes) == {(c, n) for c in streamed for n in STREAMING.stream_counts}
    for (_, streams), d in decodes.items():
        assert d["audio_s"] == pytest.approx(streams * STREAMING.stream_seconds)
        assert d["rtfx"] == pytest.approx(d["audio_s"] / d["seconds"], rel=1e-4)
        assert math.isfinite(d["tokens_per_audio_second"])

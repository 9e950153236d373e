"""The whole GPU check rehearsed on the CPU (`scripts/gpu_check.py --rehearse`): every
section's real code at toy sizes, Triton interpreted and gloo in NCCL's place, so that the
check's first run on a GPU does not stop on a bug of its own. One run for the module; each
test reads what one section reported."""

import importlib.metadata
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr.frames import FRAMES_PER_SECOND
from asr.gpu_check.aed import REHEARSAL_CASE
from asr.gpu_check.random_models import TOKENS_PER_SECOND, utterance_features
from asr.gpu_check.runner import SECTION_NAMES
from asr.gpu_check.ssl import MAX_STEPS as SSL_STEPS
from asr.gpu_check.streaming import CHUNKS, STREAMS
from asr.gpu_check.train_runs import MAX_STEPS
from asr.gpu_check.training import REHEARSAL_CASE as REHEARSAL_CASE_TRAINING

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """{"exit_code", "stdout", "file": the JSON lines file, "by_section": section -> lines}.
    Output and work folder are relative, as `make gpu-check` gives them (the first GPU run
    failed on a relative work folder that the training runs resolved from their own)."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    output = tmp / "check.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--rehearse", "-o", "check.jsonl",
         "--work-dir", "work"],
        capture_output=True, text=True, timeout=900, cwd=tmp,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    by_section: dict[str, list[dict]] = {}
    for line in lines:
        by_section.setdefault(line["section"], []).append(line)
    return {"done": done, "lines": lines, "by_section": by_section, "work": tmp / "work"}


def records(rehearsal: dict, section: str, kind: str) -> list[dict]:
    return [line for line in rehearsal["by_section"][section] if line["record"] == kind]


def test_every_section_passes_and_streams_to_stdout_and_the_file(rehearsal: dict) -> None:
    done = rehearsal["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in done.stdout.splitlines()] == rehearsal["lines"]
    (summary,) = records(rehearsal, "gpu_check", "summary")
    assert summary["status"] == "pass" and summary["rehearsal"]
    assert summary["sections"] == dict.fromkeys(SECTION_NAMES, "pass")
    assert any("AD-PSGD" in item for item in summary["not_executed"])
    for name in SECTION_NAMES:
        (status,) = records(rehearsal, name, "status")
        assert status["seconds"] < status["limit_s"]


def test_env_names_the_stack(rehearsal: dict) -> None:
    (env,) = records(rehearsal, "env", "environment")
    assert env["rehearsal"] and env["python"] == sys.version.split()[0]
    assert env["packages"]["torch"] == importlib.metadata.version("torch")
    assert env["packages"]["triton"] == importlib.metadata.version("triton")
    assert env["torch_cuda"] == torch.version.cuda
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert env["commit"].startswith(head.stdout.strip()[:7])


def test_lattice_implementations_agree(rehearsal: dict) -> None:
    found = {r["implementation"] for r in records(rehearsal, "lattice", "implementation")}
    assert found == {"triton", "torch", "torchaudio"}
    agreements = records(rehearsal, "lattice", "agreement")
    assert [(a["implementation"], a["reference"]) for a in agreements] == [
        ("triton", "torch"),
        ("triton", "torch_float64"),
        ("torch", "torch_float64"),
        ("torchaudio", "torch_float64"),
        ("triton_tdt", "torch_tdt"),  # the TDT lattice, after `auto`
        ("triton_tdt", "torch_tdt_float64"),
        ("torch_tdt", "torch_tdt_float64"),
    ]
    assert all(a["ok"] and a["loss_rel"] <= 1e-5 for a in agreements)
    assert [a["grad_rtol"] for a in agreements] == [1e-3, 5e-2, 5e-2, 5e-2, 1e-3, 5e-2, 5e-2]
    tdt = records(rehearsal, "lattice", "tdt_implementation")
    assert [t["implementation"] for t in tdt] == ["triton_tdt", "torch_tdt", "torch_tdt_float64"]
    measured = records(rehearsal, "lattice", "implementation")
    assert all(m["padding_grad_max"] == 0.0 for m in measured)
    (auto,) = records(rehearsal, "lattice", "auto")
    assert auto == {"section": "lattice", "record": "auto", "active": "triton", "reason": ""}


def test_training_searches_batch_sizes_then_trains_without_oom(rehearsal: dict) -> None:
    probes = records(rehearsal, "training", "probe")
    assert probes and probes[0]["max_duration"] == max(p["max_duration"] for p in probes)
    (setup,) = records(rehearsal, "training", "setup")
    (sizes,) = records(rehearsal, "training", "batch_sizes")
    assert sizes["bucket_duration_bins"] == setup["bucket_duration_bins"]
    assert len(probes) == sizes["probes"]
    buckets = zip(sizes["bucket_duration_bins"], sizes["bucket_batch_size"], strict=True)
    for duration, size in buckets:
        tried = [p for p in probes if p["max_duration"] == duration]
        # each bucket's size is the largest that fitted, every refusal was larger, and
        # every fit stayed under the budget
        assert 1 <= size == max(p["batch_size"] for p in tried if p["fits"])
        assert all(p["batch_size"] > size for p in tried if not p["fits"])
        budget = setup["memory_budget_bytes"]
        assert all(p["peak_bytes"] <= budget for p in tried if p["fits"] and p["peak_bytes"])
    assert sizes["bucket_batch_size"] == sorted(sizes["bucket_batch_size"], reverse=True)
    (steps,) = records(rehearsal, "training", "steps")
    assert steps["oom_steps"] == 0 and steps["losses_finite"] and steps["lattice"] == "torch"
    assert steps["steps"] == REHEARSAL_CASE_TRAINING.steps
    assert steps["batch_size"] == sizes["bucket_batch_size"][-1]
    assert steps["bucket"] == sizes["bucket_duration_bins"][-1]
    audio = steps["batch_size"] * steps["bucket"]
    # the report keeps 6 significant digits
    assert steps["audio_seconds_per_step"] == pytest.approx(audio, rel=1e-5)
    rate = audio / steps["seconds_per_step"]
    assert steps["audio_seconds_per_second"] == pytest.approx(rate, rel=1e-5)


def test_aed_decodes_fixed_token_counts_and_reports_a_ratio_per_batch_size(
    rehearsal: dict,
) -> None:
    models = {m["model"]: m for m in records(rehearsal, "aed", "model")}
    assert models["deep"]["decoder_layers"] > models["flash"]["decoder_layers"]
    # demo presets: x4 subsampling, 40 ms encoder frames; each utterance decodes
    # ceil(encoder seconds x rate) tokens.
    frames = [f.shape[0] for f in utterance_features(REHEARSAL_CASE, 80)]
    expected = sum(math.ceil(math.ceil(n / 4) * 0.04 * TOKENS_PER_SECOND) for n in frames)
    decodes = {(d["batch_size"], d["model"]): d for d in records(rehearsal, "aed", "decode")}
    assert set(decodes) == {(b, m) for b in REHEARSAL_CASE.batch_sizes for m in models}
    audio_s = sum(frames) / FRAMES_PER_SECOND
    for line in decodes.values():
        assert line["tokens"] == expected
        assert len(line["pass_seconds"]) == REHEARSAL_CASE.repeats
        median = statistics.median(line["pass_seconds"])
        assert line["seconds"] == pytest.approx(median, rel=1e-5)  # 6 digits kept
        assert line["rtfx"] == pytest.approx(audio_s / line["seconds"], rel=0.01)
        assert 0 < line["search_seconds"] < line["seconds"]
        assert 0 < line["encoder_seconds"] < line["seconds"]
        rate = line["tokens"] / line["search_seconds"]
        assert line["search_tokens_per_second"] == pytest.approx(rate, rel=1e-5)
    ratios = {r["batch_size"]: r for r in records(rehearsal, "aed", "ratio")}
    assert sorted(ratios) == sorted(REHEARSAL_CASE.batch_sizes)
    for size, ratio in ratios.items():
        deep, flash = decodes[(size, "deep")], decodes[(size, "flash")]
        assert ratio["rtfx_ratio"] == pytest.approx(flash["rtfx"] / deep["rtfx"], rel=1e-4)
        assert ratio["decoder_only_ratio"] > 0
    # Missing the speed target warns; it is never a failure.
    (summary,) = records(rehearsal, "aed", "summary")
    assert len(summary["warnings"]) == sum(r["rtfx_ratio"] < 2.5 for r in ratios.values())


def test_ddp_trains_both_runs_over_gloo(rehearsal: dict) -> None:
    runs = {r["run"]: r for r in records(rehearsal, "ddp", "train_run")}
    assert set(runs) == {"ddp", "ddp_dgc"}
    for record in runs.values():
        assert record["exit_code"] == 0 and record["backend"] == "gloo"
        assert record["precision"] == "32-true" and record["validations"] == 2
        assert record["optimizer_steps"] == MAX_STEPS and len(record["losses"]) == MAX_STEPS
        assert record["losses_finite"] and not record["lattice_given_up"]
        assert "trainer.strategy=ddp" in record["overrides"]
    # the same weights and the same first batch: the same loss before any exchange
    assert runs["ddp"]["losses"][0] == runs["ddp_dgc"]["losses"][0]
    dgc = runs["ddp_dgc"]["dgc"]
    assert dgc["compression"][:2] == [1.0, 1.0]  # the dense AdamW steps
    # 2 dense AdamW steps, then the warm-up's sparsities; the 4th sparse step's top-k is
    # 0.4 % of the entries (8 bytes each: int32 index, fp32 value) against 4 bytes each dense
    assert dgc["sparsity"][:2] == [0.0, 0.0]
    assert dgc["payload_bytes"][:2] == dgc["bucket_bytes"][:2] and dgc["bucket_bytes"][0] > 0
    assert dgc["sparsity"][2:] == pytest.approx([0.75, 0.9375, 0.984375, 0.996], abs=1e-5)
    assert dgc["sparse_steps"] == MAX_STEPS - 2
    assert dgc["compression"][-1] == pytest.approx(1 / (2 * 0.004), rel=0.01)
    assert dgc["rank_state_saved"]
    log = rehearsal["work"] / "ddp" / "ddp_dgc.log"
    assert "gradient clipping moves into the DGC hook" in log.read_text()


def test_ssl_pre_trains_both_objectives_over_gloo(rehearsal: dict) -> None:
    runs = {r["run"]: r for r in records(rehearsal, "ssl", "train_run")}
    assert set(runs) == {"ssl_best_rq", "ssl_w2v_bert"}
    for record in runs.values():
        assert record["exit_code"] == 0 and record["backend"] == "gloo"
        assert record["precision"] == "32-true" and record["validations"] == 2
        assert not record["decoded"] and record["terms_missing"] == []
        assert record["optimizer_steps"] == SSL_STEPS and record["losses_finite"]
        assert all(0 < share <= 1 for share in record["code_use"])
    # BEST-RQ starts from chance: a cross-entropy near ln(64) over its 64 codes
    assert runs["ssl_best_rq"]["losses"][0] == pytest.approx(math.log(64), abs=0.5)


def test_streaming_trains_with_drawn_chunks_and_streams_equal_whole_utterances(
    rehearsal: dict,
) -> None:
    (train,) = records(rehearsal, "streaming", "train_run")
    assert train["exit_code"] == 0 and train["losses_finite"]
    assert train["optimizer_steps"] == MAX_STEPS
    (decode,) = records(rehearsal, "streaming", "decode")
    assert decode["streams"] == STREAMS and decode["precision"] == "fp32"  # the CPU rehearsal
    for chunk in CHUNKS:
        assert decode[f"chunk_{chunk}"]["fp32_equal_to_whole"] == STREAMS
        assert decode[f"chunk_{chunk}"]["rtfx"] > 0 and decode[f"chunk_{chunk}"]["tokens"] > 0

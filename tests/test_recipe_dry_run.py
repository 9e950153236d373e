"""The recipes as a new user runs them (a clean environment whose PATH has no asr-train, a
checkout with or without .venv): --dry-run, finding the project's environment, each stage
started alone, and the batches the demo trains with."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asr.data.buckets import SamplerConfig
from asr.training.config_files import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]
CLEAN_PATH = "/usr/bin:/bin"


def _checkout(tmp_path: Path, venv: bool) -> Path:
    """A copy of the recipes in a checkout of its own; its .venv (when `venv`) is the
    environment running the tests, which has asr-train."""
    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "recipes", root / "recipes", ignore=shutil.ignore_patterns("*.md"))
    if venv:
        (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return root


def _recipe(root: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`script` of the checkout `root`, run from `root` in a clean environment."""
    home = root.parent / "home"
    home.mkdir(exist_ok=True)
    environment = [f"HOME={home}", f"PATH={CLEAN_PATH}", "LANG=C.UTF-8"]
    environment += [f"{key}={value}" for key, value in env.items()]
    return subprocess.run(
        ["env", "-i", *environment, "bash", f"recipes/{script}", *args],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_demo_dry_run_lists_the_stages_and_writes_nothing(tmp_path: Path) -> None:
    root = _checkout(tmp_path, venv=True)
    work = tmp_path / "work"
    before = sorted(root.rglob("*"))
    args = ("--dry-run", "--stage", "train", "--", "trainer.max_epochs=4")
    done = _recipe(root, "demo/run.sh", *args, DATA=f"{work}/data", EXP=f"{work}/exp")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.splitlines()[0] == f"using {root}/.venv (asr-train was not on PATH)"
    listed = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == ["stage 6: train", "stage 7: decode", "stage 8: lm", "stage 9: export",
                      "stage 10: transcribe", "stage 11: plots"]  # fmt: skip
    assert "train overrides: trainer.max_epochs=4" in done.stdout.splitlines()
    assert f"tokenizer: {work}/data/tokenizer/bpe128.model" in done.stdout
    assert not work.exists() and sorted(root.rglob("*")) == before
    # the overrides are checked as the training would check them
    done = _recipe(root, "demo/run.sh", "--dry-run", "--", "trainer.no_such_key=1")
    assert done.returncode != 0 and "trainer.no_such_key" in done.stderr


def test_without_an_environment_the_recipes_say_where_to_make_one(tmp_path: Path) -> None:
    root = _checkout(tmp_path, venv=False)
    for script in ("demo/run.sh", "demo/ssl.sh", "demo/augment.sh", "librispeech/run.sh"):
        done = _recipe(root, script, "--dry-run")
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f'asr-train not found: run "make install" in {root} (it creates .venv), '
            "or activate the environment where asr is installed\n"
        )
        assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--stage", "nope"], "unknown stage 'nope'; stages: corpus manifests"),
        (["--stage", "12"], "unknown stage '12'"),
        (["--stop-stage", "--dry-run"], "--stop-stage needs a stage; stages: corpus"),
        (["--stage", "plots", "--stop-stage", "train"],
         "no stage to run: --stage plots (11) is after --stop-stage train (6)"),
        (["--dryrun"], "unknown argument '--dryrun'; usage: recipes/demo/run.sh [--stage S]"),
    ],
)  # fmt: skip
def test_stage_arguments_checked_before_anything_runs(
    tmp_path: Path, args: list[str], error: str
) -> None:
    done = _recipe(_checkout(tmp_path, venv=False), "demo/run.sh", "--dry-run", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(error), done.stderr


def test_librispeech_and_ssl_dry_runs(tmp_path: Path) -> None:
    root = _checkout(tmp_path, venv=True)
    args = ("--dry-run", "--stage", "pretrain", "--stop-stage", "finetune", "--", "a=b c")
    done = _recipe(root, "librispeech/run.sh", *args, PARTS="mini")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:4] == [
        "  stage 13: pretrain", "  stage 14: finetune", r"train overrides: a=b\ c"
    ]  # fmt: skip
    assert "training on train-clean-5" in done.stdout and "musan" not in done.stdout
    # the optional MUSAN stage: listed, skipped unless MUSAN=1, which would download MUSAN
    done = _recipe(root, "librispeech/run.sh", "--dry-run", "--stop-stage", "perturb")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:5] == [
        "  stage 0: download", "  stage 1: manifests", "  stage 2: musan", "  stage 3: perturb"
    ]  # fmt: skip
    assert "musan: skipped (MUSAN=1 downloads MUSAN, 11 GB, for training with noise)" in (
        done.stdout
    )
    done = _recipe(root, "librispeech/run.sh", "--dry-run", "--stage", "musan", MUSAN="1")
    assert done.returncode == 0, done.stderr
    assert "musan: downloads MUSAN (11 GB) into data/librispeech/musan unless it is there, " in (
        done.stdout
    )
    assert "writes data/librispeech/manifests/musan_cuts.jsonl.gz\n" in done.stdout
    done = _recipe(root, "librispeech/run.sh", "--dry-run", MUSAN="yes")
    assert done.returncode == 2 and "MUSAN must be 0 or 1, not 'yes'" in done.stderr
    # --shar (or SHAR=1): stage 5 writes Shar shards too; a recipe without it refuses it
    for args, env in ((["--shar"], {}), ([], {"SHAR": "1"})):
        done = _recipe(root, "librispeech/run.sh", "--dry-run", *args, PARTS="mini", **env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith(", Shar shards: data/librispeech/shar")
    done = _recipe(root, "librispeech/run.sh", "--dry-run", SHAR="yes")
    assert done.returncode == 2 and "SHAR must be 0 or 1, not 'yes'" in done.stderr
    done = _recipe(root, "demo/ssl.sh", "--dry-run", "--shar")
    assert done.returncode == 2 and "unknown argument '--shar'" in done.stderr
    done = _recipe(root, "demo/ssl.sh", "--dry-run", "--stage", "finetune", SEED="7")
    assert done.returncode == 0, done.stderr
    assert "  ssl stage 5: finetune\n  ssl stage 6: decode\n  ssl stage 7: compare\n" in done.stdout
    runs = "fine-tuning runs: scratch_lr0.0015-seed7 scratch_lr0.003-seed7 best_rq_lr0.0015-seed7"
    assert runs in done.stdout and "w2v_bert_lr0.003-seed7\n" in done.stdout
    assert "pre-training cuts: data/demo/manifests/librispeech_cuts_train-clean-100-feats" in (
        done.stdout
    )
    done = _recipe(root, "demo/augment.sh", "--dry-run", "--stage", "testsets", SNRS="10")
    assert done.returncode == 0, done.stderr
    assert "  augment stage 2: testsets\n  augment stage 3: train\n" in done.stdout
    assert "models: none none_12ep augment\ntest sets: test-clean test-clean-snr10 test-clean-" in (
        done.stdout
    )
    done = _recipe(root, "demo/augment.sh", "--dry-run", MODELS="none noisy")
    assert done.returncode == 2 and "MODELS: unknown model 'noisy' (none, none_12ep," in done.stderr
    assert not (root / "data").exists() and not (root / "exp").exists()


def _stdout_after_banner(done: subprocess.CompletedProcess) -> str:
    """What the recipe printed after its last stage banner (`=== stage N: ...`)."""
    lines = done.stdout.splitlines()
    banners = [i for i, line in enumerate(lines) if line.startswith("=== ")]
    assert banners, done.stdout[-2000:]
    return "\n".join(lines[banners[-1] + 1 :])


@pytest.mark.slow
def test_demo_trains_with_the_shipped_batches_unless_searched(tmp_path: Path) -> None:
    """Stage 6 as typed, with `--cfg job` after the overrides: asr-train prints the sampler it
    would train with. By default the preset's shipped buckets and batch sizes; with
    BATCH_SEARCH=1 the searched file, which replaces them."""
    root = _checkout(tmp_path, venv=True)
    work = tmp_path / "work"
    args = ("--stage", "train", "--stop-stage", "train", "--", "--cfg", "job", "-p", "data.sampler")
    env = {"DATA": f"{work}/data", "EXP": f"{work}/exp"}
    shipped = yaml.safe_load((CONFIG_DIR / "batches" / "demo.yaml").read_text())
    done = _recipe(root, "demo/run.sh", *args, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    sampler = yaml.safe_load(_stdout_after_banner(done))
    assert sampler["bins_file"] is None
    for key in ("bucket_duration_bins", "bucket_batch_size", "max_tps"):
        assert sampler[key] == shipped[key], key
    searched = work / "exp" / "batch_sizes.yaml"  # what stage 5 writes with BATCH_SEARCH=1
    searched.parent.mkdir(parents=True)
    plan = {"bucket_duration_bins": [[4.0, 50], [9.0, 90]], "bucket_batch_size": [6, 3]}
    searched.write_text(yaml.safe_dump(plan))
    done = _recipe(root, "demo/run.sh", *args, BATCH_SEARCH="1", **env)
    assert done.returncode == 0, done.stderr[-3000:]
    sampler = yaml.safe_load(_stdout_after_banner(done))
    assert sampler["bins_file"] == str(searched)
    sampler["seed"] = 0  # an interpolation, unresolved without --resolve
    config = SamplerConfig.from_mapping(sampler)  # as the training reads it
    assert config.bucket_duration_bins == ((4.0, 50), (9.0, 90))
    assert config.bucket_batch_size == (6, 3) and config.max_tps is None
    assert sorted(p.name for p in work.rglob("*")) == ["batch_sizes.yaml", "exp"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "stages"),
    [("demo/run.sh", range(4, 12)), ("librispeech/run.sh", range(9, 13))],
)
def test_each_later_stage_starts_alone_and_fails_only_on_what_is_missing(
    tmp_path: Path, script: str, stages: range
) -> None:
    """`--stage N` before anything was made, as a user types it: a stage that needs an
    earlier one's output stops with a message naming it, never on a shell error (an unset
    variable, a bad number)."""
    root = _checkout(tmp_path, venv=True)
    work = tmp_path / "work"
    for stage in stages:
        env = {"DATA": f"{work}/data", "EXP": f"{work}/exp"}
        args = ("--stage", str(stage), "--stop-stage", str(stage))
        done = _recipe(root, script, *args, **env)
        shell_errors = ("unbound variable", "invalid integer", "syntax error", "command not found")
        assert not any(e in done.stderr for e in shell_errors), (stage, done.stderr[-2000:])
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1]
            assert str(work) in last or "no epoch checkpoint" in last, (stage, last)


@pytest.mark.slow
def test_a_streaming_preset_trains_the_model_it_starts_from_first(tmp_path: Path) -> None:
    """demo_streaming's train stage, its init_from missing: the recipe trains experiment=demo
    into that bundle's directory first (here it stops there, the corpus not made, naming
    it); an init_from that no recipe makes is refused before anything runs."""
    root = _checkout(tmp_path, venv=True)
    work = tmp_path / "work"
    env = {"DATA": f"{work}/data", "EXP": f"{work}/exp", "EXPERIMENT": "demo_streaming"}
    args = ("--stage", "train", "--stop-stage", "train", "--")
    init = work / "full" / "model.bundle.pt"
    done = _recipe(root, "demo/run.sh", *args, f"init_from={init}", **env)
    assert done.returncode != 0
    assert f"init_from={init} is missing: training experiment=demo into {init.parent}" in (
        done.stdout
    )
    assert "stage 3: features" in done.stdout and str(work / "data") in done.stderr
    assert not (work / "exp").exists()  # the streaming model was not started
    done = _recipe(root, "demo/run.sh", *args, f"init_from={work}/weights.pt", **env)
    assert done.returncode == 2
    assert f"init_from={work}/weights.pt: no such file" in done.stderr


@pytest.mark.slow
def test_the_demo_picks_its_device(tmp_path: Path) -> None:
    """DEVICE=cuda (what DEVICE=auto picks where torch sees a GPU) trains the demo preset on one
    GPU, DEVICE=cpu on the CPU: the same shipped batches and schedule, the precision `auto`
    resolves per device. Rehearsed here, on any machine, by the config stage 6 would train
    with."""
    root = _checkout(tmp_path, venv=True)
    args = ("--stage", "train", "--stop-stage", "train", "--", "--cfg", "job", "-p", "")
    shipped = yaml.safe_load((CONFIG_DIR / "batches" / "demo.yaml").read_text())
    for device, accelerator in (("cuda", "gpu"), ("cpu", "cpu")):
        done = _recipe(root, "demo/run.sh", *args, DEVICE=device)
        assert done.returncode == 0, done.stderr[-3000:]
        config = yaml.safe_load(_stdout_after_banner(done))
        trainer = config["trainer"]
        assert (trainer["accelerator"], trainer["devices"], trainer["precision"]) == (
            accelerator,
            1,
            "auto",
        )
        assert config["data"]["sampler"]["bucket_batch_size"] == shipped["bucket_batch_size"]
    done = _recipe(root, "demo/run.sh", "--dry-run", DEVICE="tpu")
    assert done.returncode == 2 and "DEVICE must be auto, cpu or cuda, not 'tpu'" in done.stderr
    done = _recipe(root, "demo/run.sh", "--dry-run", BEAM="0")
    assert done.returncode == 2 and "BEAM must be a beam size" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    "avx2" not in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"),
    reason="an x86 CPU with AVX2",
)
def test_the_demo_runs_the_same_kernels_on_every_cpu(tmp_path: Path) -> None:
    """On the CPU the recipe's commands run AVX2 kernels (torch, oneDNN, MKL), whatever
    the CPU has beyond, unless CPU_ISA=native; what the user set is kept. Read back from the
    environment asr-train sees (`oc.env` in the config it prints)."""
    root = _checkout(tmp_path, venv=True)
    keys = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")
    seen = [f"+seen.{key}=${{oc.env:{key},unset}}" for key in keys]
    args = ("--stage", "train", "--stop-stage", "train", "--", *seen, "--cfg", "job", "--resolve")
    args += ("-p", "seen")

    def kernels(**env: str) -> dict[str, str]:
        done = _recipe(root, "demo/run.sh", *args, DEVICE="cpu", **env)
        assert done.returncode == 0, done.stderr[-3000:]
        return yaml.safe_load(_stdout_after_banner(done))

    assert kernels() == dict(zip(keys, ("avx2", "AVX2", "AVX2"), strict=True))
    assert kernels(CPU_ISA="native") == dict.fromkeys(keys, "unset")
    assert kernels(ATEN_CPU_CAPABILITY="default")["ATEN_CPU_CAPABILITY"] == "default"
    done = _recipe(root, "demo/run.sh", "--dry-run", CPU_ISA="avx512")
    assert done.returncode == 2 and "CPU_ISA must be avx2 or native, not 'avx512'" in done.stderr

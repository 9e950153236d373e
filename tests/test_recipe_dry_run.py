"""The recipes' --dry-run and their finding the project's environment, as a new user runs
them: a clean environment whose PATH has no asr-train, a checkout with or without .venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert listed == ["stage 6: train", "stage 7: decode", "stage 8: export",
                      "stage 9: transcribe", "stage 10: plots"]  # fmt: skip
    assert "train overrides: trainer.max_epochs=4" in done.stdout.splitlines()
    assert f"tokenizer: {work}/data/tokenizer/bpe128.model" in done.stdout
    assert not work.exists() and sorted(root.rglob("*")) == before
    # the overrides are checked as the training would check them
    done = _recipe(root, "demo/run.sh", "--dry-run", "--", "trainer.no_such_key=1")
    assert done.returncode != 0 and "trainer.no_such_key" in done.stderr


def test_without_an_environment_the_recipes_say_where_to_make_one(tmp_path: Path) -> None:
    root = _checkout(tmp_path, venv=False)
    for script in ("demo/run.sh", "demo/ssl.sh", "librispeech/run.sh"):
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
        (["--stage", "11"], "unknown stage '11'"),
        (["--stop-stage", "--dry-run"], "--stop-stage needs a stage; stages: corpus"),
        (["--stage", "plots", "--stop-stage", "train"],
         "no stage to run: --stage plots (10) is after --stop-stage train (6)"),
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
        "  stage 11: pretrain", "  stage 12: finetune", r"train overrides: a=b\ c"
    ]  # fmt: skip
    assert "training on train-clean-5" in done.stdout
    done = _recipe(root, "demo/ssl.sh", "--dry-run", "--stage", "finetune", SEED="7")
    assert done.returncode == 0, done.stderr
    assert "  ssl stage 4: finetune\n  ssl stage 5: decode\n  ssl stage 6: compare\n" in done.stdout
    assert "fine-tuning runs: scratch_lr0.0015-seed7 scratch_lr0.003-seed7" in done.stdout
    assert not (root / "data").exists() and not (root / "exp").exists()

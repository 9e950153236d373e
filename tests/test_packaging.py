"""A wheel of the package carries its Hydra configs, and an install from it composes
them (not the checkout's): what a non-editable install or the Docker image gets."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.long
def test_a_wheel_install_finds_its_configs_and_page(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ beside the sources
    shutil.copytree(ROOT / "asr", source / "asr", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps"]
        + ["--quiet", "-w", str(tmp_path / "dist")],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("asr-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "asr" / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
    page = {p.relative_to(ROOT).as_posix() for p in (ROOT / "asr" / "inference" / "web").iterdir()}
    assert "asr/inference/web/index.html" in page and page <= names, sorted(page - names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import hydra; from asr.training.command import CONFIG_DIR;"
        "hydra.initialize_config_dir(config_dir=CONFIG_DIR, version_base='1.3');"
        "cfg = hydra.compose('train', overrides=['experiment=demo']);"
        "print(CONFIG_DIR); print(cfg.model.encoder.d_model)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout
    )
    assert done.returncode == 0, done.stderr[-2000:]
    config_dir, d_model = done.stdout.split()
    assert Path(config_dir) == site / "asr" / "configs" and d_model == "144"

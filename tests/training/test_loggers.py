import logging
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger

from asr.training.loggers import (
    WANDB_MODES,
    LoggerConfig,
    WandbConfig,
    build_loggers,
    resolve_wandb_mode,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No W&B variables and an empty HOME (no ~/.netrc): nothing from this machine leaks in."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize("mode", WANDB_MODES)
def test_wandb_mode_environment_variable_wins(monkeypatch, mode: str) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode(mode) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_wandb_mode(mode) == "offline"


@pytest.mark.parametrize("mode", ["online", "offline", "disabled"])
def test_explicit_mode_is_kept(monkeypatch, mode: str) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode(mode) == mode


def test_auto_without_a_key_is_offline(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="asr.training.loggers"):
        assert resolve_wandb_mode("auto") == "offline"
    assert "no API key" in caplog.text


def test_auto_with_a_netrc_key_but_no_server_is_offline(
    monkeypatch, clean_environment: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A key for the configured host in ~/.netrc, and a host where nothing listens on 443.
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1")
    netrc = clean_environment / ".netrc"
    netrc.write_text(f"machine 127.0.0.1\n  login user\n  password {'k' * 40}\n")
    netrc.chmod(0o600)
    with caplog.at_level(logging.INFO, logger="asr.training.loggers"):
        assert resolve_wandb_mode("auto") == "offline"
    assert "127.0.0.1 unreachable" in caplog.text
    assert "no API key" not in caplog.text


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(
        ValueError, match="logger.wandb.mode='cloud' is unknown; valid: .*'offline'"
    ):
        resolve_wandb_mode("cloud")


def test_csv_only_and_disabled_wandb_give_one_csv_logger(tmp_path: Path) -> None:
    for cfg in (LoggerConfig(wandb=None), LoggerConfig(wandb=WandbConfig(mode="disabled"))):
        loggers = build_loggers(cfg, tmp_path / "exp", run_config={})
        assert len(loggers) == 1 and isinstance(loggers[0], CSVLogger)
        assert Path(loggers[0].log_dir) == tmp_path / "exp" / "csv" / "version_0"
    assert build_loggers(LoggerConfig(csv=False, wandb=None), tmp_path, run_config={}) == []

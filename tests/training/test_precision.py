"""`trainer.precision: auto`: bf16 on GPUs that compute it, float32 on every CPU."""

from pathlib import Path

import pytest
import torch

from asr.training.precision import device_type, emulated_bf16, native_bf16, resolve_precision


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_native_bf16_follows_the_cpu_flags_and_the_isa_limits(monkeypatch) -> None:
    flags = cpu_flags()
    has_bf16 = bool({"avx512_bf16", "amx_bf16", "amx_tile"} & flags)
    for variable in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(variable, raising=False)
    assert native_bf16("cpu") == has_bf16
    assert emulated_bf16("bf16-mixed", "cpu") == (not has_bf16)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the no-AVX-512 path of any x86 CPU
    assert not native_bf16("cpu") and emulated_bf16("bf16-mixed", "cpu")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert not native_bf16("cpu")
    assert not emulated_bf16("32-true", "cpu")


def test_auto_is_fp32_on_every_cpu() -> None:
    """A CPU run's precision must not depend on the CPU (the demo's WER would)."""
    assert resolve_precision("auto", "cpu") == "32-true"
    expected = "bf16-mixed" if native_bf16("cuda") else "32-true"
    assert resolve_precision("auto", "gpu") == expected


def test_explicit_precisions_pass_through():
    assert resolve_precision("32-true", "cpu") == "32-true"
    assert resolve_precision("bf16-mixed", "gpu") == "bf16-mixed"
    assert resolve_precision(32, "cpu") == "32"


def test_accelerators_name_their_device():
    assert device_type("gpu") == "cuda" and device_type("cpu") == "cpu"
    assert device_type("auto") == ("cuda" if torch.cuda.is_available() else "cpu")

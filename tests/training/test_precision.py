"""`trainer.precision: auto` follows the hardware's bf16 support."""

from pathlib import Path

import pytest
import torch

from asr.training.precision import device_type, native_bf16, resolve_precision


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_auto_is_bf16_exactly_on_cpus_with_bf16_instructions():
    flags = cpu_flags()
    assert native_bf16("cpu") == bool({"avx512_bf16", "amx_bf16", "amx_tile"} & flags)
    expected = "bf16-mixed" if native_bf16("cpu") else "32-true"
    assert resolve_precision("auto", "cpu") == expected


def test_explicit_precisions_pass_through():
    assert resolve_precision("32-true", "cpu") == "32-true"
    assert resolve_precision("bf16-mixed", "gpu") == "bf16-mixed"
    assert resolve_precision(32, "cpu") == "32"


def test_accelerators_name_their_device():
    assert device_type("gpu") == "cuda" and device_type("cpu") == "cpu"
    assert device_type("auto") == ("cuda" if torch.cuda.is_available() else "cpu")

"""GPU check, section `env`: the stack the check ran on (a pass proves that stack, not
the one `pyproject.toml` pins) and the device."""

from __future__ import annotations

import sys

import torch

from asr.gpu_check.facts import device_facts, package_versions, project_commit
from asr.gpu_check.report import Report, SectionOptions


def run(report: Report, options: SectionOptions) -> None:
    report.record(
        "environment",
        python=sys.version.split()[0],
        packages=package_versions(),
        torch_cuda=torch.version.cuda,
        commit=project_commit(),
        rehearsal=options.rehearsal,
        **device_facts(options.device),
    )

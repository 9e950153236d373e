import os
import subprocess
import sys

import pytest
import torch

from asr.training.cuda_allocator import ALLOC_CONF_VARS, EXPANDABLE, use_expandable_segments


def test_expandable_segments_are_asked_for_unless_the_user_set_the_allocator() -> None:
    env: dict[str, str] = {}
    assert use_expandable_segments(env) == EXPANDABLE
    assert env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}

    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        users = {name: "max_split_size_mb:128"}
        assert use_expandable_segments(users) == "max_split_size_mb:128"
        assert users == {name: "max_split_size_mb:128"}

    empty = {"PYTORCH_CUDA_ALLOC_CONF": ""}  # set but empty: nothing asked for
    assert use_expandable_segments(empty) == EXPANDABLE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator is CUDA's")
@pytest.mark.parametrize(
    ("users", "expandable"), [(None, True), ("expandable_segments:False", False)]
)
def test_the_setting_makes_a_fresh_process_allocate_expandable_segments(
    users: str | None, expandable: bool
) -> None:
    """In a new process (the allocator reads its setting once): our setting, or the user's,
    is what CUDA's allocator then runs with."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_VARS}
    if users is not None:
        env["PYTORCH_ALLOC_CONF"] = users
    code = (
        "from asr.training.cuda_allocator import expandable_segments_active, "
        "use_expandable_segments\nuse_expandable_segments()\nprint(expandable_segments_active())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == str(expandable)

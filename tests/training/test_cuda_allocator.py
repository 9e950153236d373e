import torch

from asr.training.cuda_allocator import (
    EXPANDABLE,
    expandable_segments_active,
    use_expandable_segments,
)


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


def test_without_cuda_the_allocator_state_is_unknown() -> None:
    if not torch.cuda.is_available():
        assert expandable_segments_active() is None

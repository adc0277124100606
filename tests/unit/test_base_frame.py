"""`base_frame.call_at_base`: the script runs as from the base of a data-stack chunk, and is otherwise called as it is.

What it is for (the same time as a direct run, at any depth pytest calls from) is measured in `bench/`, not here: these
tests check that the call is a plain call to the script and that the frame in front of it has the designed size.
"""

from __future__ import annotations

import platform
import sys
import traceback

import pytest

from pytest_trainer import base_frame


def test_the_function_gets_its_arguments_and_its_result_comes_back() -> None:
    namespace: dict[str, object] = {}
    assert base_frame.call_at_base(exec, "answer = 6 * 7", namespace) is None
    assert namespace["answer"] == 42
    assert base_frame.call_at_base(divmod, 17, 5) == (3, 2)


def test_an_error_comes_back_with_the_frame_that_raised_it() -> None:
    def build() -> None:
        raise ValueError("the script's own error")

    with pytest.raises(ValueError, match="the script's own error") as raised:
        base_frame.call_at_base(build)
    assert [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)][-1] == "build"


@pytest.mark.skipif(
    platform.python_implementation() != "CPython" or sys.version_info < (3, 11),
    reason="frames live on chunked data stacks from CPython 3.11 on; before, the call is direct",
)
def test_the_frame_in_front_fills_a_chunk_to_a_direct_runs_room() -> None:
    trampoline = base_frame._trampoline()
    assert trampoline is not None
    code = trampoline.__code__
    size = (
        code.co_nlocals + len(code.co_cellvars) + len(code.co_freevars) + code.co_stacksize + base_frame.FRAME_SPECIALS
    )
    # Larger than a 16 KiB chunk can hold, so it opens one of 32 KiB, and leaves a direct run's room after it.
    assert size * 8 > 16 * 1024
    assert base_frame.CHUNK_SLOTS - base_frame.CHUNK_HEADER - size == base_frame.DIRECT_RUN_ROOM == 2044

"""The session's huge pages for torch's large CPU tensors: asked for on Linux, a user's own setting kept, the environment
put back at the end."""

from __future__ import annotations

from pytest_trainer.huge_pages import VARIABLE, HugePages


def test_asked_for_on_linux_and_taken_back_at_the_end() -> None:
    environ: dict[str, str] = {"PATH": "/usr/bin"}
    pages = HugePages(environ, "linux")
    pages.enable()
    assert environ == {"PATH": "/usr/bin", VARIABLE: "1"}
    pages.enable()  # the second stage of the session changes nothing
    pages.restore()
    assert environ == {"PATH": "/usr/bin"}


def test_a_users_own_setting_is_kept() -> None:
    for value in ("0", "1"):
        environ = {VARIABLE: value}
        pages = HugePages(environ, "linux")
        pages.enable()
        pages.restore()
        assert environ == {VARIABLE: value}


def test_not_asked_for_where_torch_does_not_read_it() -> None:
    for platform in ("darwin", "win32"):
        environ: dict[str, str] = {}
        HugePages(environ, platform).enable()
        assert environ == {}


def test_a_value_changed_during_the_session_is_left_as_it_is() -> None:
    environ: dict[str, str] = {}
    pages = HugePages(environ, "linux")
    pages.enable()
    environ[VARIABLE] = "0"  # a test of the user's own turned it off for the processes it starts
    pages.restore()
    assert environ == {VARIABLE: "0"}


def test_a_command_that_sets_it_is_run_with_its_own_value() -> None:
    environ: dict[str, str] = {}
    HugePages(environ, "linux", commanded=True).enable()
    assert environ == {}

"""The user's output folders and working directory, put back as they were before the script ran.

The plugin points every `TrainingArguments.output_dir` at a temporary folder, so the Trainer writes nothing where the
user would see it. A framework that builds the Trainer for its user (axolotl, say) may still write into the folder its
own config names (the config, the tokenizer, a log) after building the Trainer and before `train()`: that folder is
watched from the moment the script names it and put back when the session ends (the stages may read what the
script wrote: a base model it saved and loaded). A file the run created is removed, a small file
it changed gets its old content back, and what cannot be put back (a large file rewritten) is named for the report.
What the run made in the working directory (a framework's dataset cache) is removed too.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

#: Files up to this size are kept in memory when a folder starts being watched, so that a change can be undone.
KEPT_FILE_BYTES = 1 << 20
#: At most this much is kept in memory for one folder.
KEPT_BYTES = 32 << 20
#: A file system stamps files from a coarser clock than time.time_ns(): a file written just after the script started
#: can carry a time a few milliseconds before it.
CLOCK_GRANULARITY_NS = 50_000_000
#: What test tools keep in the working directory (never the script's).
TOOL_CACHES = (".hypothesis", ".pytest_cache", "__pycache__")


@dataclass
class _Watched:
    folder: Path
    #: The outermost folder that did not exist when the watch began (the whole of it is the run's), or None.
    created: Path | None
    #: (size, mtime_ns) of each file under the folder when the watch began.
    files: dict[Path, tuple[int, int]] = field(default_factory=dict)
    folders: set[Path] = field(default_factory=set)
    #: The content of the small files, to put back.
    content: dict[Path, bytes] = field(default_factory=dict)


class UserFolders:
    """The output folders a script named, each watched from then on, and put back by `restore`.

    A folder that holds the script itself or the sandbox is not watched: it is the project, not an output folder,
    and other processes may be writing there too.
    """

    def __init__(self, script: Path, sandbox: Path) -> None:
        self._project = Path(os.path.abspath(script)).parent
        self._sandbox = Path(os.path.abspath(sandbox))
        self._watched: dict[Path, _Watched] = {}
        #: When the script started: a file written since (before its folder was named: a framework's log) is the run's.
        self._started = time.time_ns() - CLOCK_GRANULARITY_NS
        #: The working directory the script starts in, and what it holds then: a framework's cache made there (axolotl's
        #: last_run_prepared) is the run's too.
        self._cwd = Path.cwd()
        self._entries = set(os.listdir(self._cwd))
        #: What the script made there, found when it stopped (None: not looked for yet).
        self._made: list[Path] | None = None

    def watch(self, folder: str | os.PathLike[str]) -> None:
        """Start watching `folder` (relative to the working directory now) unless one watched holds it already."""
        path = Path(os.path.abspath(folder))
        if (
            any(path.is_relative_to(known) for known in self._watched)
            or self._project.is_relative_to(path)
            or self._sandbox.is_relative_to(path)
            or path.is_relative_to(self._sandbox)
        ):
            return
        watched = _Watched(path, self._created(path))
        if watched.created is None:
            _snapshot(watched, self._started)
        self._watched = {known: value for known, value in self._watched.items() if not known.is_relative_to(path)}
        self._watched[path] = watched

    def _created(self, path: Path) -> Path | None:
        """The outermost folder of `path` that the run made: one missing now, or one holding only what the run wrote
        (a framework that opens its log there before it builds its training arguments); None where `path` was there."""
        made = None
        while path != path.parent and not self._project.is_relative_to(path):
            if path.exists() and not self._new(path):
                break
            made, path = path, path.parent
        return made

    def _new(self, folder: Path) -> bool:
        """Whether `folder` and everything in it were written since the script started."""
        try:
            if not folder.is_dir() or folder.stat().st_mtime_ns < self._started:
                return False
            return all(
                Path(root, name).stat().st_mtime_ns >= self._started
                for root, folders, files in os.walk(folder)
                for name in [*folders, *files]
            )
        except OSError:
            return False

    def written(self) -> list[str]:
        """What the script wrote, found once it stopped: one line per folder, as `restore` will put it back (nothing
        is changed yet). What appears later (pytest's own reports, say) is not the script's."""
        self._made = self._made_in_working_directory()
        shared = "PYTEST_XDIST_WORKER" in os.environ
        return [line for watched in self._watched.values() if (line := _restore(watched, act=False))] + [
            f"{path}: made by the script before train(); left, as other pytest processes work in this directory too"
            if shared
            else f"{path}: made by the script before train(), in the working directory; removed when the session ends"
            for path in self._made
        ]

    def restore(self) -> None:
        """Put every watched folder back, and remove what the script made in the working directory (unless other
        pytest processes share it: pytest-xdist)."""
        made = self._made if self._made is not None else self._made_in_working_directory()
        for watched in self._watched.values():
            _restore(watched, act=True)
        self._watched.clear()
        if "PYTEST_XDIST_WORKER" not in os.environ:
            for path in made:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        self._made = []

    def _made_in_working_directory(self) -> list[Path]:
        """Entries of the working directory that the script made, whole (but for a watched folder: said once, as
        one)."""
        made = []
        for name in sorted(set(os.listdir(self._cwd)) - self._entries - set(TOOL_CACHES)):
            path = self._cwd / name
            if any(
                path == watched.created or path.is_relative_to(watched.folder) for watched in self._watched.values()
            ):
                continue
            if self._new(path) or (path.is_file() and path.stat().st_mtime_ns >= self._started):
                made.append(path)
        return made


def _snapshot(watched: _Watched, started: int) -> None:
    """What the folder holds, but for the files written since the script started (those are the run's)."""
    if not watched.folder.is_dir():
        return
    kept = 0
    for root, folders, files in os.walk(watched.folder):
        watched.folders.update(Path(root, name) for name in folders)
        for name in files:
            path = Path(root, name)
            try:
                status = path.stat()
            except OSError:
                continue
            if status.st_mtime_ns >= started:
                continue
            watched.files[path] = (status.st_size, status.st_mtime_ns)
            if status.st_size <= KEPT_FILE_BYTES and kept + status.st_size <= KEPT_BYTES:
                try:
                    watched.content[path] = path.read_bytes()
                except OSError:
                    continue
                kept += status.st_size


def _restore(watched: _Watched, act: bool) -> str | None:
    """Put a watched folder back (`act`), or only say what putting it back does."""
    if watched.created is not None:
        if not watched.created.exists():
            return None
        written = sum(len(files) for _, _, files in os.walk(watched.created))
        if act:
            shutil.rmtree(watched.created, ignore_errors=True)
        return (
            f"{watched.created}: created by the script before train(), with {written} files; removed when the "
            "session ends"
        )
    if not watched.folder.is_dir():
        return None
    removed, put_back, lost = [], [], []
    for root, _, files in os.walk(watched.folder):
        for name in files:
            path = Path(root, name)
            before = watched.files.get(path)
            if before is None:
                if act:
                    path.unlink(missing_ok=True)
                removed.append(path)
                continue
            status = path.stat()
            if (status.st_size, status.st_mtime_ns) == before:
                continue
            if path not in watched.content:
                lost.append(path)
                continue
            if act:
                path.write_bytes(watched.content[path])
                os.utime(path, ns=(status.st_atime_ns, before[1]))
            put_back.append(path)
    for root, folders, _ in sorted(os.walk(watched.folder), key=lambda entry: -len(Path(entry[0]).parts)):
        for name in folders:
            path = Path(root, name)
            if act and path not in watched.folders:
                shutil.rmtree(path, ignore_errors=True)
    if not (removed or put_back or lost):
        return None
    said = [f"{len(removed)} new files removed"] if removed else []
    said += [f"{len(put_back)} changed files put back"] if put_back else []
    said += [f"rewritten and too large to put back: {', '.join(path.name for path in lost)}"] if lost else []
    return f"{watched.folder}: written by the script before train(); {'; '.join(said)} when the session ends"

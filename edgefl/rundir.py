"""Output folders edgefl owns, and the one way it writes files into them.

An output folder (a run, a comparison, a figures folder) is claimed by writing the marker file
`.edgefl-run` into it before anything else; a folder that already holds other files and no marker
is never written into, and only a marked folder whose every entry edgefl wrote is ever emptied.

Every file is written by `write_file`: a uniquely named temporary file beside the target (created
with O_EXCL, so never through a symlink), fsync, then `os.replace`, which replaces a symlink at the
target itself and never writes its target, then an fsync of the folder. Appends to the CSV logs
open with O_NOFOLLOW. A failed write (disk full, a read-only folder) is a `WriteFailed` naming the
file.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgefl.errors import EdgeflError

MARKER = ".edgefl-run"
CHECKPOINT = "checkpoint.pt"  # edgefl.checkpoint's file, named here without importing torch
# what edgefl writes into a folder of each kind (figures/ is a folder of its own kind)
RUN_FILES = {MARKER, "scenario.toml", "metrics.csv", "clients.csv", "events.csv", "clients.parquet",
             "events.parquet", "trace.json",
             "summary.json", CHECKPOINT, "figures", "report.html"}
FIGURE_NAMES = {"accuracy", "speedup", "breakdown", "memory", "epsilon", "timeline"}
FIGURE_FILES = {MARKER, *(f"{n}.{ext}" for n in FIGURE_NAMES for ext in ("png", "svg"))}


def run_timeline(name: str) -> bool:
    """Whether `name` is a run's timeline figure (`timeline-<run>.png` or `.svg`), which edgefl plot
    draws beside the FIGURE_FILES when it plots several runs."""
    return name.startswith("timeline-") and name.endswith((".png", ".svg"))


class WriteFailed(EdgeflError):
    """A file could not be written: the storage is full, read-only or gone."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(str(path), "write", f"cannot write it ({_reason(exc)}); free space or make "
                         "the folder writable, then run again")
        self.path, self.reason = path, _reason(exc)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def write_file(path: Path, data: bytes | str) -> None:
    """Atomically replace `path` with `data` (a str is written as UTF-8), in a held folder only while
    it is still the folder held (`in_place`)."""
    payload = data.encode() if isinstance(data, str) else data
    in_place(path.parent)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would create it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            _write_all(f.fileno(), payload)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(path.parent)
    except OSError as exc:
        raise WriteFailed(path, exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable: fsync the folder (where the file system supports it)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system that cannot sync folders
            raise
    finally:
        os.close(fd)


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


class Appender:
    """An append-only file opened without following a symlink; every append is fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EdgeflError(str(path), "file", "is a symbolic link; edgefl never writes "
                                  "through one: remove it and run again") from None
            raise WriteFailed(path, exc) from None

    def append(self, payload: bytes) -> None:
        in_place(self.path.parent)
        try:
            same = os.path.samestat(os.fstat(self.fd), os.lstat(self.path))
        except OSError:
            same = False
        if not same:
            raise EdgeflError(str(self.path), "file", "was removed or replaced (by a link or another file) "
                              "while the run wrote it, so its rows stop here; put the run's file back, "
                              "then continue with edgefl run --resume")
        try:
            _write_all(self.fd, payload)
            os.fsync(self.fd)
        except OSError as exc:
            raise WriteFailed(self.path, exc) from None

    def close(self) -> None:
        os.close(self.fd)


_HELD: dict[Path, int] = {}  # the folders this process holds (as their writers name them) -> locked fd


def hold(folder: Path, flag: str = "--out") -> None:
    """Hold the folder `folder` for this process until `let_go`: an exclusive lock on the folder
    itself (flock on its descriptor, which the kernel drops when the process ends, however it
    ends), so no two processes write one run folder; one another process holds is refused with a
    line naming it. Holding a folder this process holds already does nothing."""
    key = _key(folder)
    if key in _HELD:
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise EdgeflError(str(folder), flag, f"cannot be opened as a folder ({_reason(exc)}); choose "
                          f"another {flag}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(os.fstat(fd).st_ino)
        os.close(fd)
        who = "another edgefl" + (f" (pid {pid})" if pid else "")
        raise EdgeflError(str(folder), flag, f"{who} is writing this run folder; wait until it ends, or "
                          f"choose another {flag}") from None
    except OSError:  # a file system without flock on folders (some NFS): held unlocked, still watched
        pass
    _HELD[key] = fd


def _key(folder: Path) -> Path:
    """A held folder's key: its absolute path as spelled (symlinks not followed: a link put in its
    place is not the folder held), the same however a caller spells it relative to here."""
    return Path(os.path.abspath(folder))


def let_go(folder: Path) -> None:
    """Release a folder `hold` took (nothing when this process does not hold it)."""
    fd = _HELD.pop(_key(folder), None)
    if fd is not None:
        os.close(fd)


def _holder(inode: int) -> int | None:
    """The pid holding a flock on the folder of `inode`, from the kernel's table (/proc/locks, Linux)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


def in_place(folder: Path) -> None:
    """Refuse to write into a held folder that is no longer the folder held: moved, deleted, or
    replaced by another folder or by a link to one (a user's files are never written that way)."""
    fd = _HELD.get(_key(folder))
    if fd is None:
        return
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(folder))
    except OSError:
        same = False
    if not same:
        raise EdgeflError(str(folder), "run folder", "was moved, deleted or replaced while the run wrote "
                          "it, so nothing more was written; put the run folder back, then continue with "
                          "edgefl run --resume")


def drop_temporary(folder: Path) -> None:
    """Remove the temporary files (`.NAME.*.tmp`) a killed writer left in a run folder this process
    holds: no other process writes there."""
    assert _key(folder) in _HELD, "only a held folder's temporary files are known to be no one's"
    for entry in folder.iterdir():
        if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.is_file() \
                and not entry.is_symlink():
            entry.unlink()


def claim(folder: Path, kind: str, flag: str = "--out") -> None:
    """Make `folder` an output folder of `kind` (run, compare, figures): create it, or take an
    empty one, or one already marked as this kind; refuse anything else with one line."""
    where = str(folder)
    found = probe(folder, flag)
    if found == "link":
        raise EdgeflError(where, flag, "is a symbolic link; give the folder it points to, or another "
                          "folder")
    if found == "file":
        raise EdgeflError(where, flag, "is a file, not a folder; choose another " + flag)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        entries = sorted(p.name for p in folder.iterdir())
    except OSError as exc:
        raise EdgeflError(where, flag, f"cannot create or read this folder ({_reason(exc)}); choose "
                          f"another {flag}") from None
    marked = marker_kind(folder)
    if entries and marked is None and MARKER in entries:
        raise EdgeflError(where, flag, f"{DAMAGED}; choose an empty or new folder")
    if entries and marked is None:
        raise EdgeflError(where, flag, f"holds files (e.g. {entries[0]!r}) and no {MARKER} marker, so "
                          "edgefl cannot tell they are its own; choose an empty or new folder")
    if marked is not None and marked != kind:
        raise EdgeflError(where, flag, f"holds an edgefl {marked} folder, not a {kind} folder; choose "
                          "another " + flag)
    if marked is None:
        write_marker(folder, kind)


def probe(path: Path, flag: str) -> str:
    """What `path` is, without following a symlink: missing, link, dir or file; a path that cannot
    even be looked at (too long, under a file, no permission) is one line naming `flag`."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise EdgeflError(str(path), flag, f"cannot be used ({_reason(exc)}); choose another "
                          f"{flag}") from None
    return "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "file"


def refuse_links(folder: Path) -> None:
    """The rule for symbolic links inside an output folder (a comparison's method and seed folders,
    their files, figures/): refused, never followed, the first found named in one line. Followed, a
    link to a finished run would be kept as this folder's run, and a link to a folder would have
    edgefl replace files there that it never made."""
    for root, dirs, files in os.walk(folder):  # links to folders are listed, not walked into
        dirs.sort()
        link = next((Path(root) / n for n in sorted([*dirs, *files]) if (Path(root) / n).is_symlink()), None)
        if link is not None:
            raise EdgeflError(str(link), "symbolic link", f"edgefl follows no link inside its output "
                              f"folder {folder} (it reads and replaces what is there); put the folder "
                              "or file itself there, or remove the link")


DAMAGED = (f"its {MARKER} marker is damaged (not the JSON edgefl writes), so edgefl cannot tell what "
           "wrote the folder")
ORIGIN = "origin"  # a run marker's key: the scenario file the run started from (profiles, trace beside it)


def write_marker(folder: Path, kind: str, fingerprint: dict[str, str] | None = None) -> None:
    write_file(folder / MARKER, json.dumps({"kind": kind, **(fingerprint or {})}, indent=2) + "\n")


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's fields, or None when the folder has no (readable) marker."""
    path = folder / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("kind"), str) else None


def marker_kind(folder: Path) -> str | None:
    marker = read_marker(folder)
    return None if marker is None else str(marker["kind"])


def clear_run(folder: Path, flag: str = "--out") -> None:
    """Empty a marked run folder for --overwrite, after checking that edgefl wrote every entry in it;
    anything else and nothing is deleted."""
    where = str(folder)
    if marker_kind(folder) != "run":
        why = DAMAGED if (folder / MARKER).exists() else f"holds no edgefl run ({MARKER} missing)"
        raise EdgeflError(where, flag, f"{why}; edgefl replaces only its own run folders: choose another "
                          + flag)
    strange = _foreign(folder, RUN_FILES)
    figures = folder / "figures"
    if not strange and figures.is_dir() and not figures.is_symlink():
        strange = [f"figures/{n}" for n in _foreign(figures, FIGURE_FILES)
                   if not (run_timeline(n) and (figures / n).is_file())]
    if strange:
        raise EdgeflError(where, flag, f"holds {strange[0]!r}, which edgefl did not write; move it "
                          "out, or choose another " + flag)
    try:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except OSError as exc:
        raise EdgeflError(where, flag, f"cannot empty it ({_reason(exc)})") from None


def _foreign(folder: Path, known: set[str]) -> list[str]:
    """Entries edgefl did not write: unknown names, and known ones of the wrong type."""
    out = []
    for entry in sorted(folder.iterdir()):
        temporary = entry.name.startswith(".") and entry.name.endswith(".tmp")
        is_dir = entry.is_dir() and not entry.is_symlink()
        if not temporary and (entry.name not in known or is_dir != (entry.name == "figures")):
            out.append(entry.name)
    return out


@functools.cache
def code_version() -> dict[str, str]:
    """The package version and a hash of the edgefl sources."""
    from edgefl.version import __version__

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {"edgefl": __version__, "code": digest.hexdigest()[:16]}


def profile_digests(profiles: Sequence[Path]) -> dict[str, str]:
    """Each profile file's own digest, keyed `profile:<file>` (`profile:apps/<file>`, ...: as the
    profile search path lays them out): a run's marker keeps them, so that a resume refused for a
    changed profile names the file."""
    return {f"profile:{p.parent.name + '/' if p.parent.name in ('apps', 'networks') else ''}{p.name}":
            hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in profiles}


def fingerprint(scenario_text: str, profiles: Sequence[Path] = ()) -> dict[str, str]:
    """What a run belongs to: its resolved scenario, the code's version and the device, app and
    network profile files it used (wherever along the profile search path they were found)."""
    digest = hashlib.sha256()
    for path in profiles:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {**code_version(), "profiles": digest.hexdigest()[:16],
            "scenario": hashlib.sha256(scenario_text.encode()).hexdigest()[:16]}

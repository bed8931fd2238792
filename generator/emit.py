"""Render specs in memory, compare with what is on disk, write all or nothing.

A generation run first renders every requested module in memory. Only when
all of them succeeded is anything written, in three steps: every destination
is checked (its folder can be a folder, the path holds a regular file or
nothing); every changed module is written to a temporary file beside its
destination; then each temporary file replaces its destination
(``os.replace``). A failure at any step undoes the steps before it, so a run
either writes every module or leaves every file and folder as it was.
"""

from __future__ import annotations

import difflib
import os
import secrets
import shutil
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from generator.diagnostics import Diagnostics, SpecError, field_key, printable
from generator.limits import MAX_EXISTING_OUTPUT_BYTES
from generator.naming import TARGETS, output_path, spec_display_path
from generator.render import finish, is_sealed_output, render_unformatted
from generator.resolve import resolve_text
from generator.spec.mixin import MixinSpec
from generator.yaml_loader import read_spec_file


@dataclass(frozen=True)
class Rendered:
    """One module: the templates' output, formatted when first asked for
    (``--check`` formats only the modules whose seal does not match)."""

    spec: Path
    target: str
    path: Path
    unformatted: str

    @cached_property
    def source(self) -> str:
        return finish(self.unformatted)


class OutputError(Exception):
    """An output cannot be read or written; the message is one line."""


def render_spec(
    spec: Path,
    targets: tuple[str, ...] | None,
    out_dir: Path,
    shown: str | None = None,
) -> list[Rendered]:
    """Validate and render one spec for each target (raises SpecError).

    ``targets`` None: every target the spec has (a spec with a vLLM-only
    import has no standalone module); a target named that the spec lacks is
    refused, at each import it has no module for. The spec is read once: the
    module is generated from, and its header hashes, the same bytes.
    ``shown``: how diagnostics name the spec.
    """
    data, text = read_spec_file(spec, shown or str(spec))
    ir = resolve_text(text, shown or str(spec))
    display = spec_display_path(spec)
    if targets is None:
        targets = ir.targets
    _refuse_missing_targets(ir, targets)
    return [
        Rendered(
            spec,
            target,
            output_path(out_dir, target, ir.stem),
            render_unformatted(ir, target, data, display),
        )
        for target in targets
    ]


def _refuse_missing_targets(ir: MixinSpec, targets: tuple[str, ...]) -> None:
    """SpecError, at each vLLM-only import, when a target the spec has no
    module for is asked for."""
    diags = Diagnostics()
    for target in targets:
        for imp in ir.imports_without(target):
            diags.error(
                imp.location,
                f"imports.{field_key(imp.name)}",
                f"no {target} module (a vLLM-only import): the spec generates "
                "its vllm module only; generate it with --target vllm, or give "
                f"the import a {target} stand-in of this project "
                "(reference_towers.*)",
            )
    if diags.items:
        raise SpecError(diags.sorted())


# -- reading what is there ----------------------------------------------------


def _os_problem(what: str, path: Path, exc: OSError) -> OutputError:
    return OutputError(f"cannot {what} {printable(str(path))}: {exc.strerror or exc}")


def read_existing(path: Path, limit: int = MAX_EXISTING_OUTPUT_BYTES) -> bytes | None:
    """The bytes of the regular file at ``path`` (at most ``limit`` + 1), or
    ``None`` when nothing is there; OutputError for anything else (a folder,
    a device, a file that cannot be read)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_problem("read", path, exc) from None
    if not stat.S_ISREG(info.st_mode):
        what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise OutputError(
            f"{printable(str(path))} is {what}; a generated module goes there"
        )
    try:
        with open(path, "rb") as fh:
            return fh.read(limit + 1)
    except OSError as exc:
        raise _os_problem("read", path, exc) from None


def _check_folder(folder: Path) -> None:
    """OutputError unless ``folder`` is a folder or can be created: its
    nearest existing ancestor is a folder (``--out`` naming a file fails
    here, before anything is written)."""
    for candidate in (folder, *folder.parents):
        try:
            info = os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise _os_problem("write into", folder, exc) from None
        if not stat.S_ISDIR(info.st_mode):
            raise OutputError(
                f"cannot write into {printable(str(folder))}: "
                f"{printable(str(candidate))} is not a folder"
            )
        return


# -- writing all or nothing ---------------------------------------------------


@dataclass(frozen=True)
class _Change:
    """One destination whose content changes."""

    path: Path
    data: bytes
    mode: int | None  # the existing file's permission bits; None: a new file


@dataclass
class _Transaction:
    """What a write has done so far, so that it can be undone."""

    created_folders: list[Path] = field(default_factory=list)
    temporaries: dict[Path, Path] = field(default_factory=dict)  # destination ->
    backups: dict[Path, Path] = field(default_factory=dict)  # destination -> old
    replaced: list[Path] = field(default_factory=list)


def _temporary_name(path: Path, role: str) -> Path:
    return path.with_name(f".{path.name}.{role}-{secrets.token_hex(6)}")


def _write_temporary(change: _Change, tx: _Transaction) -> None:
    """The new content beside its destination. A new file gets the mode the
    umask leaves of 0666, as ``open`` creates files; a replaced file keeps
    its permission bits."""
    tmp = _temporary_name(change.path, "new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    tx.temporaries[change.path] = tmp
    with os.fdopen(fd, "wb") as fh:
        if change.mode is not None:
            os.fchmod(fh.fileno(), change.mode)
        fh.write(change.data)


def _make_folders(folder: Path, tx: _Transaction) -> None:
    missing = []
    for candidate in (folder, *folder.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    for candidate in reversed(missing):
        os.mkdir(candidate)
        tx.created_folders.append(candidate)


def _back_up(path: Path, tx: _Transaction) -> None:
    """A second name for what is at ``path`` (a hard link, else a copy;
    a symbolic link stays one), which restores it if a later step fails."""
    backup = _temporary_name(path, "old")
    tx.backups[path] = backup
    try:
        os.link(path, backup, follow_symlinks=False)
    except OSError:
        shutil.copy2(path, backup, follow_symlinks=False)


def _undo(tx: _Transaction) -> None:
    """Best effort: every replaced file restored, every new one removed,
    every temporary file and created folder removed."""
    for path in reversed(tx.replaced):
        backup = tx.backups.pop(path, None)
        try:
            if backup is not None:
                os.replace(backup, path)
            else:
                os.unlink(path)
        except OSError:
            pass
    for leftover in [*tx.temporaries.values(), *tx.backups.values()]:
        try:
            os.unlink(leftover)
        except OSError:
            pass
    for folder in reversed(tx.created_folders):
        try:
            os.rmdir(folder)
        except OSError:
            pass


def _commit(changes: list[_Change]) -> None:
    tx = _Transaction()
    current = Path()
    try:
        for change in changes:
            current = change.path
            _make_folders(change.path.parent, tx)
            _write_temporary(change, tx)
        for change in changes:
            current = change.path
            if change.mode is not None:
                _back_up(change.path, tx)
            os.replace(tx.temporaries[change.path], change.path)
            del tx.temporaries[change.path]
            tx.replaced.append(change.path)
    except BaseException as exc:
        _undo(tx)
        if isinstance(exc, OSError):
            raise _os_problem("write", current, exc) from None
        raise
    for backup in tx.backups.values():
        try:
            os.unlink(backup)
        except OSError:
            pass


def _mode(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise _os_problem("read", path, exc) from None


def write_all(rendered: list[Rendered]) -> list[bool]:
    """Write every rendered module, or none (raises OutputError); for each,
    whether it was written (False: the file already held it)."""
    seen: dict[str, Path] = {}
    changes: list[_Change] = []
    written: list[bool] = []
    for item in rendered:
        data = item.source.encode("utf-8")
        real = os.path.realpath(item.path)
        if real in seen:
            raise OutputError(
                f"cannot write {printable(str(item.path))}: it is the same file "
                f"as {printable(str(seen[real]))}"
            )
        seen[real] = item.path
        _check_folder(item.path.parent)
        old = read_existing(item.path, len(data))
        written.append(old != data)
        if old != data:
            changes.append(
                _Change(item.path, data, None if old is None else _mode(item.path))
            )
    _commit(changes)
    return written


# -- --check ------------------------------------------------------------------


def unified_diff(path: Path, expected: str, current: bytes | None = None) -> str:
    """What ``gen-mixin`` would change in ``path``; ``current``: its bytes
    (read here when not given). Bytes that are not UTF-8 show as U+FFFD."""
    if current is None:
        current = read_existing(path) or b""
    text = current.decode("utf-8", errors="replace")
    shown = printable(str(path))
    return "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{shown} (on disk)",
            tofile=f"{shown} (from spec)",
        )
    )


@dataclass(frozen=True)
class CheckResult:
    stale: list[tuple[Path, str]]  # (path, diff)
    orphaned: list[Path]


def check(
    rendered: list[Rendered],
    out_dir: Path,
    targets: tuple[str, ...] | None,
    all_specs: bool,
) -> CheckResult:
    """Stale files (content differs or missing) and, when every spec of the
    project was given, orphaned files (generated modules without a spec: a
    standalone module of a spec with a vLLM-only import is one) in the
    folders of ``targets`` (None: every target's).
    Raises OutputError when an output path holds something unreadable."""
    stale = []
    for item in rendered:
        current = read_existing(item.path)
        if current is not None and is_sealed_output(item.unformatted, current):
            continue
        if current != item.source.encode("utf-8"):
            stale.append((item.path, unified_diff(item.path, item.source, current)))
    orphaned: list[Path] = []
    if all_specs:
        expected = {os.path.realpath(item.path) for item in rendered}
        for target in targets or TARGETS:
            folder = out_dir / target
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.py")):
                if path.name == "__init__.py":
                    continue
                if os.path.realpath(path) not in expected:
                    orphaned.append(path)
    return CheckResult(stale, orphaned)


__all__ = [
    "TARGETS",
    "CheckResult",
    "OutputError",
    "Rendered",
    "check",
    "read_existing",
    "render_spec",
    "unified_diff",
    "write_all",
]

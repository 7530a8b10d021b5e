"""``extract``: restoring a bundle (or parts of it) to an ordinary directory tree, safely.

It owns the rules for writing bundle content to disk: content, modes, nanosecond mtimes, symlinks,
hard links, FIFOs, sockets, devices (as root; else warned about, in ``not_created``) and (as
root) owners are restored, and nothing is ever written outside DEST:

- every directory is opened relative to its parent's descriptor with ``O_NOFOLLOW``, and every
  file is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` relative to that descriptor, so no symlink —
  one from the bundle or one already in DEST — is ever followed while writing;
- names are checked again here (no ``/``, ``.``, ``..``, NUL), whatever the index says;
- a PATH to extract is resolved inside the bundle without following symlinks: a PATH through a
  symlink is refused rather than redirected.

Interruptions: a new DEST is filled under a temporary sibling (``publish.stage``, as a pack is)
and renamed once complete, so a failed or interrupted extract leaves nothing; into an existing
empty DEST, an interruption empties it again; into a non-empty one (``force``) it is said where
the partial tree is (``note_cleanup``).

Conflicts: DEST may be missing or an empty directory. A non-empty DEST needs ``force``; then files
and symlinks in the way are replaced, existing directories are merged into, and a directory where
a non-directory belongs is an error. A file whose content is damaged is removed again, reported in
the summary, and the rest is still extracted (with ``salvage``: kept, a hole where bytes were lost).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.read``, ``bundlefs.storage.publish``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat as statmod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from bundlefs.core import format as fmt
from bundlefs.errors import (
    CorruptDataError,
    EntryNotFound,
    ExtractError,
    NotADirectory,
    PackError,
    note_cleanup,
)
from bundlefs.read.bundle import Bundle
from bundlefs.read.salvage import LostRange, write_content
from bundlefs.storage import publish

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class ExtractSummary:
    dest: str
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    hardlinks: int = 0
    specials: int = 0  # FIFOs, sockets and devices
    bytes: int = 0
    damaged: list[str] = field(default_factory=list)  # files not extracted: content is damaged
    not_created: list[str] = field(default_factory=list)  # devices mknod refused (not root)
    lost: list[LostRange] = field(default_factory=list)  # with salvage: the holes left

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.not_created and not self.lost


def extract(
    bundle: Bundle,
    dest: str | os.PathLike,
    paths: Sequence[str | bytes] = (),
    *,
    force: bool = False,
    owners: bool | None = None,
    progress: Callable[[ExtractSummary], None] | None = None,
    salvage: bool = False,
) -> ExtractSummary:
    """Extract ``paths`` (default: everything) of ``bundle`` under ``dest``.

    ``owners`` restores uid/gid; by default only when running as root (others cannot chown).
    """
    dest_s = os.fsdecode(os.fspath(dest))
    if owners is None:
        owners = os.geteuid() == 0
    selected = _select(bundle, paths)
    writer = _Writer(bundle, dest_s, force, owners, progress)
    writer.salvage = salvage
    if not os.path.lexists(dest_s):
        # A new DEST is filled under a temporary name and renamed once complete: an extract
        # that fails or is interrupted leaves no partial tree that looks whole (a killed one
        # leaves ``.DEST.partial-PID``, which ``bundlefs gc`` removes).
        parent = os.path.dirname(os.path.abspath(dest_s))
        if not os.path.isdir(parent):
            raise ExtractError(f"cannot create {dest_s}: {parent} is not a directory")
        try:
            with publish.stage(dest_s, "partial tree") as (work, _work_id):
                _extract_into(writer, work, selected)
                try:
                    publish.move_new(work, dest_s)
                except FileExistsError:
                    raise ExtractError(
                        f"{dest_s} appeared while extracting; nothing was extracted"
                    ) from None
        except PackError as e:  # the temporary directory could not be made
            raise ExtractError(f"cannot extract into {dest_s}: {e}") from None
        return writer.summary
    empty = _check_dest(dest_s, force)
    try:
        _extract_into(writer, dest_s, selected)
    except KeyboardInterrupt as e:
        # An existing DEST stays: what was empty is emptied again, a --force one is said.
        if empty:
            _empty(dest_s)
            note_cleanup(e, f"removed what it had extracted into {dest_s}")
        else:
            note_cleanup(e, f"{dest_s} holds a partly extracted tree")
        raise
    return writer.summary


def _extract_into(
    writer: _Writer, dest: str, selected: list[tuple[list[bytes], fmt.Entry]]
) -> None:
    dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for parts, entry in selected:
            writer.extract_path(dest_fd, parts, entry, whole_bundle=not parts)
    finally:
        os.close(dest_fd)


def _empty(directory: str) -> None:
    """Remove everything in ``directory`` (all of it this extract's), not descending mounts."""
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _select(bundle: Bundle, paths: Sequence[str | bytes]) -> list[tuple[list[bytes], fmt.Entry]]:
    """Resolve PATHs to (components, entry) without following symlinks; drop nested selections."""
    if not paths:
        return [([], bundle.root)]
    resolved: dict[tuple[bytes, ...], fmt.Entry] = {}
    for path in paths:
        raw = os.fsencode(path)
        parts = [p for p in raw.split(b"/") if p and p != b"."]
        if b".." in parts:
            raise ExtractError(f"{os.fsdecode(raw)!r}: '..' is not allowed in a path to extract")
        entry = bundle.root
        for i, part in enumerate(parts):
            if entry.is_symlink:
                inside = os.fsdecode(b"/".join(parts[:i]))
                raise ExtractError(
                    f"{os.fsdecode(raw)!r} leads through the symbolic link {inside!r}, which "
                    "extract does not follow"
                )
            if not entry.is_dir:
                raise NotADirectory(
                    f"{os.fsdecode(raw)!r}: a component is not a directory", os.fsdecode(raw)
                )
            child = bundle.tree.lookup(entry, part)
            if child is None:
                raise EntryNotFound(
                    f"{os.fsdecode(raw)!r} does not exist in the bundle", os.fsdecode(raw)
                )
            entry = child
        resolved[tuple(parts)] = entry
    keys = sorted(resolved)
    out: list[tuple[tuple[bytes, ...], fmt.Entry]] = []
    for key in keys:
        if any(key[: len(k)] == k for k, _e in out):
            continue  # already inside a selected directory
        out.append((key, resolved[key]))
    return [(list(k), e) for k, e in out]


def _check_dest(dest: str, force: bool) -> bool:
    """That an existing ``dest`` may be extracted into; whether it is empty."""
    if not os.path.isdir(dest) or os.path.islink(dest):
        raise ExtractError(f"{dest} exists and is not a directory")
    empty = not os.listdir(dest)
    if not empty and not force:
        raise ExtractError(f"{dest} exists and is not empty (use --force to extract into it)")
    return empty


def _check_name(name: bytes) -> None:
    # The index reader validates names already; this is the last line of defence before the disk.
    if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
        raise ExtractError(f"the bundle holds an unsafe name {name!r}; refusing to extract it")


class _Writer:
    def __init__(self, bundle: Bundle, dest: str, force: bool, owners: bool, progress) -> None:
        self.bundle = bundle
        self.force = force
        self.owners = owners
        self.progress = progress
        self.summary = ExtractSummary(dest)
        # content inode -> path (components from DEST) of its first extracted name
        self._linked: dict[int, tuple[bytes, ...]] = {}
        self._dest_fd = -1
        self.salvage = False  # keep a damaged file, its lost ranges holes (read/salvage.py)

    def extract_path(
        self, dest_fd: int, parts: list[bytes], entry: fmt.Entry, *, whole_bundle: bool
    ) -> None:
        self._dest_fd = dest_fd
        if whole_bundle:
            self.summary.dirs += 1  # DEST itself is the root: counted, like the packer counts it
            self._fill_directory(dest_fd, (), entry)
            self._finish_directory(dest_fd, entry)
            return
        # Parents of a selected path are created plainly (like tar): no bundle metadata.
        fd = os.dup(dest_fd)
        try:
            for i, part in enumerate(parts[:-1]):
                _check_name(part)
                child = self._make_dir(fd, part, tuple(parts[: i + 1]))
                os.close(fd)
                fd = child
            self._write_entry(fd, tuple(parts[:-1]), parts[-1], entry)
        finally:
            os.close(fd)

    # -- directories -------------------------------------------------------------------------------

    def _make_dir(self, parent_fd: int, name: bytes, rel: tuple[bytes, ...]) -> int:
        """Create (or, when allowed, reuse) directory ``name`` and open it without following."""
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not statmod.S_ISDIR(st.st_mode):
                self._clear(parent_fd, name, st, rel)
                os.mkdir(name, 0o700, dir_fd=parent_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)

    def _fill_directory(self, fd: int, rel: tuple[bytes, ...], directory: fmt.Entry) -> None:
        # Iterative depth-first walk: deep trees must not hit the recursion limit. Each level
        # keeps one open descriptor (its children are created relative to it).
        stack: list[tuple[int, tuple[bytes, ...], fmt.Entry, Iterator]] = [
            (fd, rel, directory, self.bundle.tree.children(directory))
        ]
        try:
            while stack:
                dir_fd, dir_rel, dir_entry, children = stack[-1]
                item = next(children, None)
                if item is None:
                    stack.pop()
                    if stack:  # the caller finishes (and closes) the directory it passed in
                        self._finish_directory(dir_fd, dir_entry)
                        os.close(dir_fd)
                    continue
                name, entry = item
                _check_name(name)
                if entry.is_dir:
                    child_fd = self._make_dir(dir_fd, name, dir_rel + (name,))
                    self.summary.dirs += 1
                    stack.append(
                        (child_fd, dir_rel + (name,), entry, self.bundle.tree.children(entry))
                    )
                else:
                    self._write_entry(dir_fd, dir_rel, name, entry)
        finally:
            for dir_fd, _rel, _entry, _it in stack[1:]:
                os.close(dir_fd)

    def _finish_directory(self, fd: int, entry: fmt.Entry) -> None:
        """Owner, mode and mtime of a directory, set after its children (they change its mtime)."""
        if self.owners:
            uid, gid = self.bundle.tree.owner(entry)
            os.chown(fd, uid, gid)
        os.chmod(fd, statmod.S_IMODE(entry.mode))
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))

    # -- non-directories ---------------------------------------------------------------------------

    def _write_entry(
        self, dir_fd: int, dir_rel: tuple[bytes, ...], name: bytes, entry: fmt.Entry
    ) -> None:
        rel = dir_rel + (name,)
        if entry.is_dir:
            child = self._make_dir(dir_fd, name, rel)
            self.summary.dirs += 1
            try:
                self._fill_directory(child, rel, entry)
                self._finish_directory(child, entry)
            finally:
                os.close(child)
        elif entry.is_symlink:
            self._make_way(dir_fd, name, rel)
            os.symlink(entry.symlink, name, dir_fd=dir_fd)
            self._set_owner_and_mtime(dir_fd, name, entry)
            self.summary.symlinks += 1
        elif entry.is_file:
            first = self._linked.get(entry.ino)
            if first is not None:
                self._make_way(dir_fd, name, rel)
                os.link(
                    b"/".join(first),
                    name,
                    src_dir_fd=self._dest_fd,
                    dst_dir_fd=dir_fd,
                    follow_symlinks=False,
                )
                self.summary.hardlinks += 1
            elif self._write_file(dir_fd, name, rel, entry) and entry.nlink > 1:
                self._linked[entry.ino] = rel
        elif entry.is_special:
            self._make_special(dir_fd, name, rel, entry)
        self._tick()

    def _make_special(
        self, dir_fd: int, name: bytes, rel: tuple[bytes, ...], entry: fmt.Entry
    ) -> None:
        """A FIFO, socket or device with its owner, mode and mtime. A device mknod refuses (EPERM:
        not root; EINVAL: a number this kernel cannot hold) is one warning, and the rest goes on."""
        self._make_way(dir_fd, name, rel)
        try:
            os.mknod(name, entry.kind | 0o600, entry.rdev, dir_fd=dir_fd)
        except OSError as e:
            if entry.kind not in fmt.DEVICE_KINDS:
                raise
            why = "making a device node needs root" if e.errno == errno.EPERM else e.strerror
            self.summary.not_created.append(os.fsdecode(b"/".join(rel)))
            log.warning("%s: not created: %s", self.summary.not_created[-1], why)
            return
        self._set_owner_and_mtime(dir_fd, name, entry)
        os.chmod(name, statmod.S_IMODE(entry.mode), dir_fd=dir_fd)
        self.summary.specials += 1

    def _set_owner_and_mtime(self, dir_fd: int, name: bytes, entry: fmt.Entry) -> None:
        """Of a symlink or a special file, never following it: its owner (as root or with
        ``owners``) and its mtime."""
        if self.owners:
            uid, gid = self.bundle.tree.owner(entry)
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        os.utime(name, ns=(entry.mtime_ns, entry.mtime_ns), dir_fd=dir_fd, follow_symlinks=False)

    def _write_file(
        self, dir_fd: int, name: bytes, rel: tuple[bytes, ...], entry: fmt.Entry
    ) -> bool:
        """Create one file with its content and attributes; False if its content is damaged."""
        self._make_way(dir_fd, name, rel)
        path = os.fsdecode(b"/".join(rel))
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            lost = self.summary.lost if self.salvage else None
            try:  # a full disk is said with the file's name in DEST
                write_content(fd, self.bundle.content, entry, path, lost, self.summary.dest)
            except CorruptDataError:
                os.unlink(name, dir_fd=dir_fd)
                self.summary.damaged.append(path)
                return False
            if self.owners:
                uid, gid = self.bundle.tree.owner(entry)
                os.chown(fd, uid, gid)  # before chmod: chown clears set-id bits
            os.chmod(fd, statmod.S_IMODE(entry.mode))
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        finally:
            os.close(fd)
        self.summary.files += 1
        self.summary.bytes += entry.size
        return True

    def _make_way(self, dir_fd: int, name: bytes, rel) -> None:
        """Remove a non-directory in the way (only with ``force``; DEST is otherwise empty)."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        self._clear(dir_fd, name, st, rel)

    def _clear(self, dir_fd: int, name: bytes, st: os.stat_result, rel) -> None:
        shown = os.fsdecode(b"/".join(rel))
        if statmod.S_ISDIR(st.st_mode):
            raise ExtractError(f"{shown} is a directory in DEST where the bundle has a file")
        if not self.force:
            raise ExtractError(f"{shown} already exists in DEST (use --force to replace it)")
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(self.summary)

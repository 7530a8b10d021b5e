"""``ListedSource``: exactly the listed paths of a directory, stored in the listed order
(``pack --files-from``, as ``tar -T`` and ``rsync --files-from``).

A bundle's content is stored in the order a source streams it, so a list lets its user decide
what sits together (one sample's files in one record, a training split in one run of shards). The
tree itself is the synthetic tree's (sources/synthetic.py): names sorted as every bundle's are, and
each listed file's stored content placed in it.

Rules, checked before anything is read:

- a path is relative to SRC (``./`` and repeated ``/`` allowed); an absolute path is taken if it
  lies under SRC; one that leads out of SRC (``..`` above it, an absolute path elsewhere) is an
  error, and so is one that leads through a symlink (never followed, as ``extract`` never does);
- the directories above a listed path are implied, with their real attributes (an ``lstat`` each,
  once); a listed directory is packed itself, not what it holds (list that too);
- a path listed again is packed once, where it was first listed;
- a path that does not exist or cannot be read is a ``PackError``, or with ``skip_errors`` a
  warning and a skipped path (``SourceErrors``), as a directory walk reports one.

Memory: one small node per listed path and implied directory (the synthetic tree), and one read
chunk at a time.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.packing.sources.base``,
``bundlefs.packing.sources.synthetic``.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import stat as statmod
from collections.abc import Iterable, Iterator

from bundlefs.errors import PackError
from bundlefs.packing.sources.base import (
    READ_CHUNK,
    ContentSink,
    SourceErrors,
    excluded_below,
)
from bundlefs.packing.sources.synthetic import (
    Dir,
    File,
    LoadedTreeSource,
    Node,
    Special,
    Symlink,
    SyntheticStat,
    SyntheticTree,
    name_problem,
)

_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _synthetic(st: os.stat_result) -> SyntheticStat:
    """An entry's real status, as the synthetic tree holds it: names and inode numbers are the
    tree's (``number_files``), not the disk's."""
    return SyntheticStat(
        st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, st.st_size, st_rdev=st.st_rdev
    )


class ListedSource(LoadedTreeSource):
    """The paths ``paths`` of the directory ``root``, in that order (module docstring).

    A ``StreamingSource``: ``load`` reads the listed files once, in list order, storing their
    content through the content writer; then the builder walks the tree as from any source.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        paths: Iterable[str | bytes | os.PathLike[str]],
        errors: SourceErrors,
        *,
        excludes: tuple[str, ...] = (),
    ) -> None:
        self._root = os.fsencode(os.fspath(root))
        self.errors = errors
        self._excludes = excludes
        self._tree = SyntheticTree(self._refuse)
        self._dirs: dict[bytes, bool] = {b"": True}  # rel -> a real directory (checked once)
        self._files: dict[tuple[int, int], File] = {}  # (st_dev, st_ino) -> a hard link's content
        self._rels = self._relative(paths)
        self._loaded = False

    def _relative(self, paths: Iterable[str | bytes | os.PathLike[str]]) -> list[bytes]:
        """Each listed path relative to the root, normalised, once; ``PackError`` for one that
        leads out of it or that no bundle path can be."""
        absolute_root = os.path.abspath(self._root)
        seen: set[bytes] = set()
        out: list[bytes] = []
        for given in paths:
            raw = os.fsencode(given)
            path = raw
            if path.startswith(b"/"):
                path = os.path.relpath(path, absolute_root) if path != absolute_root else b"."
            path = posixpath.normpath(path)
            if path == b".." or path.startswith(b"../"):
                raise PackError(f"the listed path {os.fsdecode(raw)!r} is outside SRC")
            rel = b"" if path == b"." else path
            why = name_problem(rel.split(b"/")) if rel else None
            if why is not None:
                raise PackError(f"the listed path {os.fsdecode(raw)!r}: {why}")
            if rel not in seen:
                seen.add(rel)
                out.append(rel)
        return out

    def _refuse(self, rel: bytes, why: str) -> None:
        if not self.errors.skip_errors:
            raise PackError(f"cannot pack the listed path {os.fsdecode(rel)}: {why}")
        self.errors.skip(rel, why)

    # -- reading the listed files ------------------------------------------------------------------

    def load(self, content: ContentSink) -> None:
        """Place every listed path, storing file content in list order; then number contents."""
        if self._loaded:
            return
        try:
            root = os.stat(self._root)
        except OSError as e:
            raise PackError(f"cannot read the source: {e.strerror}") from e
        self._tree.place([], Dir(_synthetic(root)), _synthetic(root))
        for rel in self._rels:
            parts = rel.split(b"/") if rel else []
            if self._excludes and parts and excluded_below(parts, self._excludes):
                continue
            if self._parents_placed(parts):
                self._place(rel, parts, content)
        self._loaded = True
        self._tree.finish()

    def _parents_placed(self, parts: list[bytes]) -> bool:
        """The directories above ``parts`` placed with their own status; False (reported) if one
        is not a directory or cannot be read."""
        for i in range(1, len(parts)):
            rel = b"/".join(parts[:i])
            if rel in self._dirs:
                if not self._dirs[rel]:
                    return False
                continue
            try:
                st = os.lstat(os.path.join(self._root, rel))
            except OSError as e:
                self._dirs[rel] = False
                self.errors.report(rel, e)
                return False
            self._dirs[rel] = statmod.S_ISDIR(st.st_mode)
            if not self._dirs[rel]:
                what = "symbolic link" if statmod.S_ISLNK(st.st_mode) else "file"
                self._refuse(b"/".join(parts), f"it leads through the {what} {os.fsdecode(rel)}")
                return False
            self._tree.place(parts[:i], Dir(_synthetic(st)), _synthetic(st))
        return True

    def _place(self, rel: bytes, parts: list[bytes], content: ContentSink) -> None:
        path = os.path.join(self._root, rel) if rel else self._root
        try:
            st = os.lstat(path)
            node = self._node(rel, path, st)
        except OSError as e:  # gone, unreadable: reported (or skipped) as a directory walk does
            self.errors.report(rel, e)
            return
        if isinstance(node, int):  # a regular file, opened: its content now, in list order
            node = self._store(rel, path, node, content)
        self._tree.place(parts, node, _synthetic(st))

    def _node(self, rel: bytes, path: bytes, st: os.stat_result) -> Node | int:
        """The tree node of the entry at ``path`` — or, for a file not stored yet, its open
        descriptor."""
        mode = st.st_mode
        if statmod.S_ISREG(mode):
            linked = self._files.get((st.st_dev, st.st_ino)) if st.st_nlink > 1 else None
            return linked or _open_file(path)
        if statmod.S_ISLNK(mode):
            return Symlink(_synthetic(st), os.readlink(path))
        if statmod.S_ISDIR(mode):
            self._dirs[rel] = True
            return Dir(_synthetic(st))
        return Special(_synthetic(st))

    def _store(self, rel: bytes, path: bytes, fd: int, content: ContentSink) -> File:
        """Store the content of the open file ``fd`` (at ``path``, where it can be read again);
        a later name of it (a hard link) shares it."""
        try:
            st = os.fstat(fd)
            again = functools.partial(_reread, path, rel)
            stored = content.store_stream(rel, _chunks(fd, rel), _synthetic(st), again=again)
            node = File(stored)
        finally:
            os.close(fd)
        if st.st_nlink > 1:
            self._files[(st.st_dev, st.st_ino)] = node
        return node


def _open_file(path: bytes) -> int:
    """A regular file opened without following a symlink or blocking on a FIFO."""
    fd = os.open(path, _NOFOLLOW)
    try:
        if not statmod.S_ISREG(os.fstat(fd).st_mode):  # swapped since the lstat
            raise OSError(errno.EAGAIN, "it changed while the list was read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _reread(path: bytes, rel: bytes) -> Iterator[bytes]:
    """The file at ``path`` read again from its start (a pack on a base compared it first)."""
    try:
        fd = _open_file(path)
    except OSError as e:
        raise PackError(f"cannot read {os.fsdecode(rel)}: {e.strerror or e}") from e
    try:
        yield from _chunks(fd, rel)
    finally:
        os.close(fd)


def _chunks(fd: int, rel: bytes) -> Iterator[bytes]:
    """The file's bytes; a read that fails part-way is a ``PackError`` (its first bytes are in
    the shard already), not an error of the bundle being written (a full disk)."""
    while True:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except OSError as e:
            raise PackError(f"cannot read {os.fsdecode(rel)}: {e.strerror or e}") from e
        if not chunk:
            return
        yield chunk

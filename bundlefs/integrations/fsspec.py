"""``BundleFileSystem``: a bundle as a read-only fsspec file system, protocol ``bundle``.

It owns the translation between fsspec's file-system vocabulary (``ls``, ``info`` dicts,
``cat_file`` ranges, ``_open``) and the ``Bundle`` path API, so that every fsspec user (pandas,
pyarrow, dask, xarray…) reads files inside a bundle::

    fs = fsspec.filesystem("bundle", fo="data.bundle")
    pd.read_csv("bundle://d/t.csv", storage_options={"fo": "data.bundle"})
    fsspec.open("bundle://train/x.jpg::file:///data/data.bundle")
    fsspec.open("bundle://train/x.jpg::s3://bucket/data.bundle", s3={"anon": True})

Registered through the ``fsspec.specs`` entry point (pyproject.toml), so fsspec finds it by its
protocol without an import. Unlike fsspec's archive file systems (zip, tar), it lists nothing up
front: every call is a lookup in the bundle's index, so a bundle of millions of files opens at
once and costs no memory per file.

May import: ``bundlefs`` (the public face), ``bundlefs.errors``, ``bundlefs.read``; and fsspec.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import stat
from typing import Any, NoReturn

# fsspec ships no type information: its names are Any here (an ignore per import rather than a
# project-wide override for one optional dependency).
from fsspec import AbstractFileSystem  # type: ignore[import-untyped]
from fsspec.utils import stringify_path, tokenize  # type: ignore[import-untyped]

from bundlefs import Bundle, BundleStat
from bundlefs.errors import EntryNotFound, NotADirectory
from bundlefs.read.options import DEFAULT_CACHE_SIZE, ReadOptions, RemoteOptions

# Protocols whose paths are local files; any other is a bundle on an object store, opened by URL
# with the target's options as its storage options (docs/storage.md).
_LOCAL_PROTOCOLS = (None, "", "file", "local")


class BundleFileSystem(AbstractFileSystem):
    """A bundle, read-only, as an fsspec file system.

    ``fo`` is the bundle: a local path (str or path-like; ``file://`` URLs too, as a chained URL
    hands it over), a URL (``s3://bucket/x.bundle``, or ``bundle://PATH::s3://bucket/x.bundle``
    chained, the ``s3`` options then being the target's), or an open ``Bundle``, which the file
    system then uses and leaves open. ``cache_size``, ``check_index``, ``storage_options``,
    ``disk_cache``, ``disk_cache_size`` and ``store_timeout`` are ``Bundle``'s options
    (``bundlefs.ReadOptions``; the remote ones apply to a bundle at a URL).

    Paths are relative to the bundle's root (a leading ``/`` is allowed). ``info`` follows a
    final symlink, as ``os.stat`` and fsspec's local file system do (``islink`` and
    ``destination`` say it was one; a dangling one is ``type: "link"``); ``ls``, and so ``walk``,
    ``find``, ``glob`` and ``du``, list symlinks as ``type: "link"`` without following them, as
    ``os.walk`` does, so no directory is walked or counted twice and a symlink cycle ends. ``open``
    and ``cat`` follow symlinks. Every write raises ``OSError(EROFS)``.
    """

    protocol = "bundle"
    root_marker = ""

    def __init__(
        self,
        fo: str | os.PathLike[str] | Bundle = "",
        *,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        check_index: bool = True,
        storage_options: dict[str, Any] | None = None,
        disk_cache: str | None = None,
        disk_cache_size: int | None = None,
        store_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(fo, **kwargs)
        if isinstance(fo, Bundle):
            self.bundle = fo
            self._owns_bundle = False
        else:
            where, options = _bundle_location(fo, target_protocol, target_options)
            read = ReadOptions(cache_size=cache_size, check_index=check_index)
            if options is not None:  # a bundle at a URL: our storage options over the target's
                merged = {**options, **(storage_options or {})}
                remote = RemoteOptions(merged, disk_cache, disk_cache_size, store_timeout)
                read = dataclasses.replace(read, remote=remote)
            self.bundle = Bundle(where, options=read)
            self._owns_bundle = True
        self.fo = self.bundle.path

    def __str__(self) -> str:
        return f"<BundleFileSystem of {self.bundle.path}>"

    __repr__ = __str__

    def close(self) -> None:
        """Close the bundle (unless it was handed in open). fsspec caches file systems by their
        arguments: ``BundleFileSystem.clear_instance_cache()`` before opening the same again."""
        if self._owns_bundle:
            self.bundle.close()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        # Bundle paths are always relative to the bundle's root, as zip and tar paths are.
        stripped = super()._strip_protocol(path)
        if isinstance(stripped, list):
            return [p.lstrip("/") for p in stripped]
        return stripped.lstrip("/")

    def ukey(self, path: str) -> str:
        """Unique for a file's content: the bundle is immutable, so its id and the path do."""
        return str(tokenize(self.bundle.info().bundle_id, self._strip_protocol(path)))

    # -- listing and metadata --------------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """A directory's children (following a symlinked directory, as ``os.listdir``), listed
        without following their own symlinks; a file lists as itself, as fsspec requires."""
        path = self._strip_protocol(path)
        bundle = self.bundle
        if not bundle.isdir(path):
            info = self.info(path)  # FileNotFoundError when missing
            return [info if detail else info["name"]]
        prefix = path + "/" if path else ""
        if not detail:
            return [prefix + name for name in bundle.listdir(path)]
        out = []
        for child in bundle.scandir(path):
            name = prefix + str(child.name)
            lstat = bundle.stat_entry(child.entry)
            out.append(
                self._describe(
                    name, lstat, lstat, child.entry.symlink if child.is_symlink() else None
                )
            )
        return out

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        try:
            lstat = self.bundle.lstat(path)
        except (EntryNotFound, NotADirectory):
            raise FileNotFoundError(errno.ENOENT, "no such file in the bundle", path) from None
        if not stat.S_ISLNK(lstat.st_mode):
            return self._describe(path, lstat, lstat, None)
        destination = self.bundle.resolve(path, follow_symlinks=False).symlink
        try:
            target = self.bundle.stat(path)
        except (EntryNotFound, NotADirectory):  # dangling, or out of the bundle
            target = lstat
        return self._describe(path, target, lstat, destination)

    @staticmethod
    def _describe(
        name: str, st: BundleStat, lstat: BundleStat, destination: bytes | None
    ) -> dict[str, Any]:
        """The info dict of ``name``: ``st`` what it is (a followed symlink's target), ``lstat``
        the entry itself."""
        if stat.S_ISDIR(st.st_mode):
            kind, size = "directory", 0  # a bundle directory's st_size is its child count
        elif stat.S_ISREG(st.st_mode):
            kind, size = "file", st.st_size
        elif stat.S_ISLNK(st.st_mode):
            kind, size = "link", st.st_size
        else:  # a FIFO, socket or device (format version 4), as fsspec's local file system says
            kind, size = "other", 0
        out: dict[str, Any] = {
            "name": name,
            "size": size,
            "type": kind,
            "mode": st.st_mode,
            "mtime": st.st_mtime,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "islink": destination is not None,
        }
        if destination is not None:
            out["destination"] = os.fsdecode(destination)
        # What format version 2 stores (docs/format.md §3.3, §3.6): only where a file has it.
        if st.content_type is not None:
            out["content_type"] = st.content_type
        if st.user_data:
            out["user_data"] = _user_data(st.user_data)
        return out

    def du(
        self,
        path: str,
        total: bool = True,
        maxdepth: int | None = None,
        withdirs: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The bytes of the files below ``path``, as fsspec adds them up (every name of a
        hard-linked file counted, a symlink as what ``info`` says of it). In a bundle without
        hard links or symlinks, where the two agree, the total of a whole subtree is
        ``Bundle.du``: one lookup of its stored totals in a version-5 bundle."""
        config = self.bundle.config
        if not total or maxdepth is not None or config.hardlink_count or config.symlink_count:
            return super().du(path, total=total, maxdepth=maxdepth, withdirs=withdirs, **kwargs)
        path = self._strip_protocol(path)
        try:
            return self.bundle.du(path).bytes
        except (EntryNotFound, NotADirectory):
            raise FileNotFoundError(errno.ENOENT, "no such file in the bundle", path) from None

    def exists(self, path: str, **kwargs: Any) -> bool:
        # Without the base class's catch-all, which would also hide a damaged bundle. A dangling
        # symlink exists (as info describes it), as os.path.lexists says.
        return self.bundle.lexists(self._strip_protocol(path))

    def isdir(self, path: str) -> bool:
        return self.bundle.isdir(self._strip_protocol(path))

    def isfile(self, path: str) -> bool:
        return self.bundle.isfile(self._strip_protocol(path))

    def islink(self, path: str) -> bool:
        return self.bundle.islink(self._strip_protocol(path))

    # -- content ---------------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes ``start … end`` of a file (negative counts from the end, as fsspec's)."""
        path = self._strip_protocol(path)
        bundle = self.bundle
        if start is None and end is None:
            return bundle.read(path)  # a whole-file read: checked by the file's CRC
        entry = bundle.resolve(path)
        if entry.is_dir:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        size = entry.size
        first = 0 if start is None else (max(0, size + start) if start < 0 else start)
        last = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
        if last <= first:
            return b""
        return bytes(bundle.content.read_at(entry, first, last - first, path=path))

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> io.BufferedReader:
        """A seekable reader over the bundle's own file object: a seek and a read load only the
        records they touch (through the bundle's record cache), never the whole file."""
        if mode != "rb":
            _read_only(path)
        size = block_size if block_size and block_size > 0 else io.DEFAULT_BUFFER_SIZE
        return io.BufferedReader(self.bundle.open(self._strip_protocol(path), "rb"), size)

    # -- writes: refused ---------------------------------------------------------------------------

    def pipe_file(
        self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any
    ) -> NoReturn:
        _read_only(path)

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> NoReturn:
        _read_only(rpath)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> NoReturn:
        _read_only(path2)

    def mv(self, path1: str, path2: str, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only(path1)

    def rm_file(self, path: str) -> NoReturn:
        _read_only(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> NoReturn:
        _read_only(path)

    def rmdir(self, path: str) -> NoReturn:
        _read_only(path)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> NoReturn:
        _read_only(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> NoReturn:
        _read_only(path)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> NoReturn:
        _read_only(path)


def _read_only(path: Any) -> NoReturn:
    raise OSError(errno.EROFS, "a bundle is read-only", str(path))


def _bundle_location(
    fo: str | os.PathLike[str], protocol: str | None, options: dict[str, Any] | None
) -> tuple[str, dict[str, Any] | None]:
    """Where the bundle ``fo`` is: (a local path, None), or (its URL, its storage options)."""
    path = stringify_path(fo)
    if not isinstance(path, str) or not path:
        raise ValueError("a bundle file system needs fo: the bundle's path or URL")
    # A whole URL (chained, fsspec's HTTP file system keeps the scheme in the path it hands over).
    if "://" in path and (protocol is None or path.startswith(f"{protocol}://")):
        protocol, _, path = path.partition("://")
    if protocol in _LOCAL_PROTOCOLS:
        return path, None  # a local file system's options (auto_mkdir…) mean nothing to a reader
    return f"{protocol}://{path}", dict(options or {})


def _user_data(data: bytes) -> Any:
    """User data as ``pack --user-data`` stores it (a JSON object), decoded; other bytes as is."""
    try:
        return json.loads(data)
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError too)
        return data

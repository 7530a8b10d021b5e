"""Where a bundle goes, checked and published: what ``pack``, ``merge`` and a distributed pack
share once the bundle is built.

``check_destination`` checks DEST against the sources before anything is read (a local DEST that
overlaps the source or is not a bundle, a URL that is unreachable or taken, an object-store prefix
written into itself); ``publish_built`` builds the bundle in a locked temporary directory
(``bundlefs.storage.publish.stage``), seals it and moves it into place or uploads it, atomically
either way, and turns every failure into one ``PackError``; ``building`` is the same step as a
context (the ``Writer``'s bundle is built while its caller adds entries).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.packing.options``, ``bundlefs.packing.sources``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, IndexWriteError, PackError
from bundlefs.packing.options import PackOptions, PackSource
from bundlefs.packing.sources.streams import STDIN
from bundlefs.storage import publish
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.marker import is_bundle, not_a_bundle
from bundlefs.storage.objectstore.listing import is_remote_prefix
from bundlefs.storage.objectstore.upload import RemotePublisher, staging_path
from bundlefs.storage.objectstore.upload_progress import UploadProgress


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def source_paths(source: PackSource) -> list[str] | None:
    """The paths ``source`` names (one directory, or archives); None for an ``EntrySource``."""
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    if isinstance(source, Sequence):
        paths = [os.fspath(p) for p in source]
        if not paths:
            raise PackError("nothing to pack: no source given")
        return paths
    return None


def object_prefix(paths: list[str] | None, options: PackOptions) -> Location | None:
    """The store location when the source is an object-store prefix (one URL), else None; its
    storage options are the pack's (the same as a URL DEST's)."""
    if paths is None or not any(is_remote_prefix(p) for p in paths):
        return None
    if len(paths) > 1:
        raise PackError("an object-store prefix must be the only source")
    try:
        return parse_location(paths[0], options.storage_options)
    except BundleError as e:  # a URL without a bucket, a malformed BUNDLEFS_STORAGE_OPTIONS
        raise PackError(str(e)) from None


def _check_sources(paths: list[str]) -> None:
    """One directory, an object-store prefix, or archives (regular files, or "-" once): one
    sentence if not."""
    if len(paths) == 1 and paths[0] != STDIN and os.path.isdir(paths[0]):
        return
    if len(paths) == 1 and is_remote_prefix(paths[0]):
        return  # listed when the pack starts: an unreachable store fails then
    for path in paths:
        if path == STDIN:
            continue
        if os.path.isdir(path):
            raise PackError(f"{path} is a directory: several sources must all be archives")
        if not os.path.lexists(path):
            raise PackError(f"source {path} does not exist")
        if not os.path.isfile(path):
            raise PackError(f"source {path} is neither a directory nor an archive file")


def check_places(source: str, dest: str, force: bool) -> None:
    """Refuse a DEST that overlaps the source (either way, through any symlink) or is not ours."""
    parent, name = os.path.split(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise PackError(f"the directory to hold {dest} does not exist")
    # DEST itself may be a symlink (refused below); where it will be written is parent/name.
    dest_real = os.path.join(os.path.realpath(parent), name)
    source_real = os.path.realpath(source)
    if _inside(dest_real, source_real):
        raise PackError("the bundle cannot be written inside the tree being packed")
    if _inside(source_real, dest_real):
        raise PackError(f"the tree being packed is inside {dest}, which a pack would replace")
    if os.path.lexists(dest):
        if not os.path.isdir(dest) and not os.path.islink(dest):
            # A bundle is a directory the pack creates: --force would not help either.
            raise PackError(
                f"{dest} is a file, not a bundle: a bundle is a new directory "
                "(give a path that does not exist)"
            )
        if not force:
            raise PackError(f"{dest} already exists (use --force to replace it)")
        if not is_bundle(dest):
            raise not_a_bundle(dest)


def check_destination(
    paths: list[str] | None, dest: str, options: PackOptions
) -> tuple[Location, RemotePublisher | None]:
    """Where ``dest`` is, checked against the source ``paths`` (None: an ``EntrySource``) as
    ``pack`` checks it before reading anything: the sources exist, a local DEST does not overlap
    them and is new (or, with ``force``, a bundle), a URL is reachable and holds no bundle (or
    ``force``). Returns the location and, for a URL, its publisher; ``PackError`` if not."""
    try:
        location = parse_location(dest, options.storage_options)
    except PackError:
        raise
    except BundleError as e:  # a URL without a bucket, a malformed BUNDLEFS_STORAGE_OPTIONS
        raise PackError(str(e)) from None
    remote = None if location.is_local else RemotePublisher(location)
    prefix = object_prefix(paths, options)
    if paths is not None:
        _check_sources(paths)
    if prefix is not None and not location.is_local:
        source_root = f"{prefix.protocol}://{prefix.path.strip('/')}/"
        if f"{location.protocol}://{location.path.strip('/')}/".startswith(source_root):
            raise PackError("the bundle cannot be written inside the prefix being packed")
    if remote is not None:
        remote.check(options.force)  # a bad URL or credentials fail now, not after packing
    else:
        local = [os.devnull] if paths is None or prefix is not None else paths
        for path in local:
            if path != STDIN:
                check_places(path, location.path, options.force)
    return location, remote


Built = TypeVar("Built")


@dataclass(frozen=True)
class Staged:
    """A bundle being built: the locked temporary directory, its (st_dev, st_ino), and where the
    bundle goes once it is complete (its local path or URL)."""

    work: str
    work_id: tuple[int, int]
    dest: str


@contextlib.contextmanager
def building(
    location: Location,
    remote: RemotePublisher | None,
    *,
    force: bool,
    staging: str | None,
    what: str,
    upload_progress: Callable[[UploadProgress], None] | None = None,
) -> Iterator[Staged]:
    """A locked temporary directory to build a bundle in; when the body ends without an exception
    the (sealed) bundle is moved to ``location`` (a directory) or uploaded with ``remote`` (a URL):
    atomically either way, and nothing left behind on failure. Every failure of the body or of
    the publishing is one ``PackError``; ``what`` begins the sentence of a format error."""
    if remote is not None:
        dest = location.url
        staged = staging_path(location, staging)
    else:
        staged = dest = location.path  # file://PATH is PATH
    try:
        with publish.stage(staged) as (work, work_id):
            yield Staged(work, work_id, dest)
            if remote is None:
                publish.publish(work, dest, force)
            else:
                try:  # built and sealed locally, then uploaded with its marker last
                    remote.publish(work, force, progress=upload_progress)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    except IndexWriteError as e:
        raise PackError(f"cannot write the index of {dest}: {e.reason}") from e
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise PackError(f"cannot write the bundle {dest}: {e.strerror or e}{where}") from e
    except fmt.FormatError as e:
        raise PackError(f"{what}: {e}") from e


def publish_built(
    location: Location,
    remote: RemotePublisher | None,
    build: Callable[[str, tuple[int, int]], Built],
    *,
    force: bool,
    staging: str | None,
    what: str,
    upload_progress: Callable[[UploadProgress], None] | None = None,
) -> tuple[Built, str]:
    """Build a bundle with ``build(work, work_id)`` and publish it (``building``): what ``pack``
    and ``merge`` share, once the destination is checked. Returns what ``build`` returned and the
    bundle's local path or URL."""
    with building(
        location,
        remote,
        force=force,
        staging=staging,
        what=what,
        upload_progress=upload_progress,
    ) as staged:
        built = build(staged.work, staged.work_id)
    return built, staged.dest

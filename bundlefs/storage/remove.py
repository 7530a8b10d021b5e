"""Removing a bundle (``bundlefs rm``): ``remove_bundle``.

The completion marker goes first, so nothing opens the bundle while the rest is deleted and a
removal cut short leaves a leftover no reader mistakes for a bundle (a later pack to the place
replaces it). On an object store a bundle may hold shards that published bundles keep using
(format version 6: a pack on it by reference, packing/remote_base.py); while any does, the
removal is refused in one sentence (``references.refuse_if_referenced``) unless ``force``. The
bundle's own markers in its bases go with it. A local bundle never lends its shards (a local pack
on a base hard-links them), so it is removed as it is.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``
below it (``location``, ``marker``, ``index``, ``objectstore``, ``bases``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError, PackError
from bundlefs.storage.bases import resolve_base
from bundlefs.storage.index import IndexReader
from bundlefs.storage.location import Location
from bundlefs.storage.marker import is_bundle, not_a_bundle
from bundlefs.storage.objectstore.index_fetch import fetch_index
from bundlefs.storage.objectstore.references import marker_path, refuse_if_referenced
from bundlefs.storage.objectstore.upload import RemotePublisher


@dataclass
class Removed:
    """What ``remove_bundle`` removed: files or objects, and the bundles that still used its
    shards (only with ``force``)."""

    location: str
    objects: int = 0
    users: list[str] = field(default_factory=list)


def remove_bundle(location: Location, *, force: bool = False) -> Removed:
    """Remove the bundle at ``location``, its marker first. ``PackError`` (one sentence) for
    anything that is not a bundle, or one whose shards published bundles use (unless
    ``force``)."""
    if location.is_local:
        return _remove_local(location.path)
    publisher = RemotePublisher(location)
    state = publisher.scan()
    if state.foreign or not state.complete:
        raise not_a_bundle(location.url)
    if not force:
        with publisher.store_errors("looking for bundles that use its shards"):
            refuse_if_referenced(location, publisher.fs, "removed", "; --force removes it anyway")
    bases = _bases(location)
    root, fs = publisher.root, publisher.fs
    with publisher.store_errors("removing the bundle"):
        fs.rm_file(f"{root}/{fmt.MARKER_NAME}")
        rest = [f"{root}/{name}" for name in sorted(state.objects) if name != fmt.MARKER_NAME]
        if rest:
            fs.rm(rest)
    for base, bundle_id in bases:  # its markers in its bases: stale now, and tidied
        with contextlib.suppress(Exception):
            fs.rm_file(marker_path(base, bundle_id))
    return Removed(location.url, len(state.objects))


def _bases(location: Location) -> list[tuple[Location, bytes]]:
    """The bases the bundle at ``location`` keeps shards in, with its bundle id (none if its
    index cannot be read: its markers there are then left, stale)."""
    try:
        reader = IndexReader(fetch_index(location), check_checksum=False)
    except BundleError:
        return []
    try:
        own = reader.marker.bundle_id
        return [(resolve_base(location, base.location), own) for base in reader.bases]
    except BundleError:
        return []
    finally:
        reader.close()


def _remove_local(path: str) -> Removed:
    if not os.path.isdir(path) or not is_bundle(path):
        raise not_a_bundle(path)
    try:
        os.unlink(os.path.join(path, fmt.MARKER_NAME))
        count = sum(len(files) for _, _, files in os.walk(path))
        shutil.rmtree(path)
    except OSError as e:
        raise PackError(f"cannot remove {path}: {e.strerror}") from None
    return Removed(path, count + 1)

"""Shards a bundle on an object store keeps in its bases (format version 6), as publishing and
deleting see them: ``SharedShards`` and ``live_references``.

A pack to a URL on a base at a URL never uploads the base's bytes again. ``SharedShards`` says,
for the publish (storage/objectstore/upload.py), which of the new bundle's shards are references
(the file stays in the base: nothing uploaded) and which are copies (``pack --materialize``: the
store copies the object server-side, one request, no byte through this machine), and checks both
on the store before ``COMPLETE`` is written: each object's size (a HEAD) and its 32-byte header,
which names the bundle and position that wrote it (a ranged GET), against the new shard table.

Before that ``COMPLETE``, ``mark`` leaves in every base a marker, the object
``referenced-by/<new bundle id, hex>`` holding the new bundle's URL. A deletion tool asks
``live_references`` for the bundles that still use a bundle's shards: a marker counts while a
bundle with that very id is at that URL (a marker whose bundle is gone, or was replaced by
another, is stale and ignored; a bundle that cannot be asked counts, to be safe). Readers ignore
the markers, as they ignore any object that is not the bundle's.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``,
``bundlefs.storage.location``, ``bundlefs.storage.objectstore.{client, index_fetch}``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.errors import BundleError, NotABundleError, PackError
from bundlefs.storage.location import Location, parse_location
from bundlefs.storage.objectstore.client import error_reason
from bundlefs.storage.objectstore.index_fetch import fetch_marker

REFERENCED_BY = "referenced-by"  # the markers' folder under a base's prefix


@dataclass(frozen=True)
class RemoteShard:
    """A shard file on the store: where it is (in a base, or a copy's source), its size and the
    header block's first 32 bytes, as the new bundle's shard table says."""

    path: str  # the store's path (bucket/key), as the publisher's file system takes it
    size: int
    header: bytes


@dataclass
class SharedShards:
    """What a publish does not upload: shard name → a reference in a base, or a server-side
    copy's source; ``bases``, the bases referenced (each gets a marker)."""

    references: dict[str, RemoteShard] = field(default_factory=dict)
    copies: dict[str, RemoteShard] = field(default_factory=dict)
    bases: list[Location] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """The new bundle's shard names the publish does not upload."""
        return set(self.references) | set(self.copies)

    def copy(self, fs: Any, root: str, name: str) -> None:
        """Copy ``name``'s source to ``root/name`` on the store itself (no byte downloaded)."""
        fs.copy(self.copies[name].path, f"{root}/{name}")

    def check(self, fs: Any, root: str, url: str) -> None:
        """Every reference and every copy is on the store with the size and header the shard
        table says; ``PackError`` (the bundle is not published) if not."""
        objects = [(s.path, s) for s in self.references.values()]
        objects += [(f"{root}/{name}", s) for name, s in self.copies.items()]
        for path, shard in objects:
            with contextlib.suppress(Exception):
                fs.invalidate_cache(path)
            try:
                size = fs.info(path).get("size")
                header = fs.cat_file(path, start=0, end=fmt.SHARD_HEADER_SIZE)
            except FileNotFoundError:
                size, header = None, b""
            if size != shard.size or header != shard.header:
                raise PackError(
                    f"{path} is not the shard the base's index describes (the base changed "
                    f"while {url} was packed?); the bundle was not published"
                )

    def mark(self, fs: Any, url: str, bundle_id: bytes) -> None:
        """Leave the marker ``referenced-by/<bundle_id hex>`` (holding ``url``) in each base."""
        for base in self.bases:
            fs.pipe_file(marker_path(base, bundle_id), url.encode())


def marker_path(base: Location, bundle_id: bytes) -> str:
    """The store path of the marker the bundle ``bundle_id`` leaves in ``base``."""
    return f"{base.path.rstrip('/')}/{REFERENCED_BY}/{bundle_id.hex()}"


def live_references(location: Location, fs: Any) -> list[str]:
    """The URLs of the published bundles that keep shards in the bundle at ``location``
    (its ``referenced-by`` markers whose bundle is still there with that id), sorted."""
    folder = f"{location.path.rstrip('/')}/{REFERENCED_BY}"
    with contextlib.suppress(Exception):
        fs.invalidate_cache(folder)
    try:
        keys = fs.ls(folder, detail=False)
    except FileNotFoundError:
        return []
    live = []
    for key in keys:
        bundle_hex = key.rstrip("/").rsplit("/", 1)[-1]
        try:
            url = fs.cat_file(key).decode()
            marker = fmt.decode_marker(
                fetch_marker(parse_location(url, location.storage_options)), crc32c
            )
        except FileNotFoundError:
            continue  # removed meanwhile
        except (NotABundleError, UnicodeDecodeError):
            continue  # stale: its bundle is gone (or the marker is not one)
        except BundleError:
            live.append(url)  # cannot tell (unreachable): counted, to be safe
            continue
        if marker.bundle_id.hex() == bundle_hex:
            live.append(url)
    return sorted(live)


def refuse_if_referenced(location: Location, fs: Any, doing: str, hint: str = "") -> None:
    """One ``PackError`` sentence if published bundles keep shards in the bundle at
    ``location``: ``doing`` (removing or replacing it) would break them; ``hint`` ends it."""
    try:
        users = live_references(location, fs)
    except Exception as e:  # noqa: BLE001 - any back-end's failure to list: say it
        raise PackError(
            f"cannot tell whether bundles use the shards of {location.url} ({error_reason(e)}), "
            f"so it is not {doing}"
        ) from None
    if users:
        more = f" and {len(users) - 1} more" if len(users) > 1 else ""
        raise PackError(
            f"{location.url} holds shards that {users[0]}{more} use, so it is not {doing} "
            f"(remove those first, or repack them with --materialize{hint})"
        )

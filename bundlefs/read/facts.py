"""Facts about an open bundle: what ``info`` prints (``BundleInfo``; with ``info --dead`` its
live and dead bytes, ``storage.liveness``) and the shards whose size is not the shard table's
(``ShardDamage``, found at open by ``shard_damage``, named by ``verify``).

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``,
``bundlefs.read.assemble``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bundlefs.core import format as fmt
from bundlefs.errors import FormatError
from bundlefs.read.assemble import BundleParts
from bundlefs.storage.index import IndexReader
from bundlefs.storage.liveness import Liveness
from bundlefs.storage.store import LocalShardStore


@dataclass(frozen=True, slots=True)
class ShardDamage:
    """A shard file whose size is not what the shard table says, seen when the bundle opened
    (a stat, no read). The files stored in it may fail to read (EIO); ``verify`` names them."""

    shard: int
    name: str  # the file's name in the bundle directory
    expected: int  # its size by the shard table
    actual: int | None  # its size now; None: the file is missing

    def __str__(self) -> str:
        where = f"shard {self.shard} ({self.name})"
        if self.actual is None:
            return f"{where} is missing"
        if self.actual < self.expected:
            return (
                f"{where} is {self.expected - self.actual:,} bytes short: {self.actual:,} of "
                f"the {self.expected:,} its table entry says (truncated?)"
            )
        return f"{where} is {self.actual:,} bytes, not the {self.expected:,} its table entry says"

    def to_dict(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "name": self.name,
            "expected_bytes": self.expected,
            "actual_bytes": self.actual,
            "message": str(self),
        }


@dataclass(frozen=True, slots=True)
class BundleInfo:
    path: str
    config: fmt.Config
    bundle_id: bytes
    index_bytes: int
    shard_bytes: int
    meta: dict[str, str] | None = None  # the bundle's metadata (pack --meta)
    # A bundle at a URL only: where it lives, and its store's counters (RemoteShardStore.stats)
    location: str | None = None
    storage: dict[str, object] | None = None
    liveness: Liveness | None = None  # asked for (``Bundle.info(dead=True)``): O(files)
    bases: list[fmt.BaseRef] | None = None  # version 6: the bundles it keeps shards in

    @classmethod
    def of(
        cls, parts: BundleParts, shard_bytes: int, liveness: Liveness | None = None
    ) -> BundleInfo:
        """The facts of an open bundle whose shard files add up to ``shard_bytes``."""
        marker = parts.index.marker
        return cls(
            parts.path,
            parts.index.config,
            marker.bundle_id,
            marker.index_size,
            shard_bytes,
            parts.tree.meta(),
            location=None if parts.location.is_local else parts.location.url,
            storage=parts.storage_stats(),
            liveness=liveness,
            bases=parts.index.bases,
        )

    def to_dict(self) -> dict[str, object]:
        """The facts ``bundlefs info --json`` prints, in its key order (docs/cli.md); a bundle at
        a URL adds ``location`` and ``storage`` (docs/storage.md), ``info --dead`` the live and
        dead bytes after ``stored_bytes``."""
        c = self.config
        facts: dict[str, object] = {
            "path": self.path,
            "bundle_id": self.bundle_id.hex(),
            "format_version": c.format_version,
            "files": c.file_count,
            "dirs": c.dir_count,
            "symlinks": c.symlink_count,
            "hardlinks": c.hardlink_count,
            "specials": c.special_count,
            "entries": c.entry_count,
            "bytes": c.data_bytes,
            "stored_bytes": self.shard_bytes,
            **(self.liveness.to_dict() if self.liveness is not None else {}),
            "ratio": round(c.data_bytes / self.shard_bytes, 4) if self.shard_bytes else 0.0,
            "shards": c.shard_count,
            "index_bytes": self.index_bytes,
            "record_size": c.record_size,
            "block_size": c.block_size,
            "large_file_threshold": c.large_file_threshold,
            "compression": c.compression_name,
            "created_ns": c.created_ns,
            "content_types": c.content_type_count,
            # What every file's digest is (format version 5), or None: the bundle has none.
            "digests": fmt.DIGEST_NAME if c.format_version >= fmt.FIRST_V5_VERSION else None,
            "meta": dict(self.meta or {}),
            # Version 6: the bundles whose shards it reads (location as stored, bundle id).
            "bases": [
                {"location": b.location, "bundle_id": b.bundle_id.hex()} for b in self.bases or []
            ],
        }
        if self.location is not None:
            facts["location"] = self.location
            facts["storage"] = dict(self.storage or {})
        return facts


def shard_bytes(index: IndexReader) -> int:
    """The shard files' sizes by the shard table, added up (``info``'s "stored bytes")."""
    return sum(index.shard_info(i).file_size for i in range(index.config.shard_count))


def shard_damage(parts: BundleParts) -> list[ShardDamage]:
    """The shards whose file size differs from the shard table's (``Bundle.damaged_shards``):
    one stat per shard. A bundle at a URL is not asked (a request per shard): ``verify`` is."""
    store, index = parts.store, parts.index
    if not isinstance(store, LocalShardStore):
        return []
    version = index.marker.format_version
    found = []
    for shard in range(index.config.shard_count):
        name = fmt.shard_filename(shard, version)
        try:
            expected = index.shard_info(shard).file_size
            actual = store.file_size(name)
        except (FormatError, OSError):
            continue  # an unreadable descriptor or file: the first read (and verify) says so
        if actual != expected:
            found.append(ShardDamage(shard, name, expected, actual))
    return found

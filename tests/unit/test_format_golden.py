"""The worked example of docs/format.md §8: bundles decoded from the document alone.

The reader below reads every version the document defines: the worked example in version 6, the
committed version-1 bundle (twelve hex-named shards), version-2 bundle (twelve decimal-named zstd
shards), version-3, -4 and -5 bundles, the same tree packed today, bundles whose shard tables name
shards of those bundles (one ``bundlefs merge`` made, one made from the document alone), the
special files of version 4 (a FIFO, a socket and, as root, two devices: §3.3.2), version 5's file
digests and directory totals (§3.3, §3.8) and version 6's source records (§3.9).

Nothing here imports bundlefs except ``pack`` and ``merge`` (to write the bundles under test): the
reader below
is written from docs/format.md with ``struct``, ``lmdb``, ``lz4.block``, ``zstandard`` and
``crc32c`` (plus ``hashlib`` for the bundle id the document defines as BLAKE2b). The golden bytes
are computed by hand from the document's tables, so if the code and the document drift apart,
this test fails.

The tiny tree (three entries):

    /            directory, mode 0755            inode 1 (the root)
    hello.txt    "hello, bundle\\n" (14 bytes)   inode 2 ("hello.txt" < "link" bytewise), text/plain
    link         symlink -> "hello.txt"          inode 3

every entry with mtime 1_700_000_000_123_456_789 ns and, when the test runs as root, owner 1000:100.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
from pathlib import Path

import crc32c
import lmdb
import lz4.block
import pytest
import zstandard

from bundlefs import PackOptions, pack
from tests.conftest import SAMPLE_FILES
from tests.support.legacy_trees import SOURCE_DATE_EPOCH as V1_EPOCH
from tests.support.legacy_trees import V1_FILES, V1_PACK_OPTIONS, V2_PACK_OPTIONS, build_v1_tree

V1_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "v1-twelve-shards.bundle"
V2_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "v2-twelve-shards.bundle"
V3_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "v3-twelve-shards.bundle"
V4_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "v4-twelve-shards.bundle"
V5_BUNDLE = Path(__file__).resolve().parents[1] / "data" / "v5-twelve-shards.bundle"

CONTENT = b"hello, bundle\n"
MTIME_NS = 1_700_000_000_123_456_789  # 0x17979cfe3d85cd15
SOURCE_DATE_EPOCH = 1_700_000_000  # created_ns = 1.7e18 = 0x17979cfe362a0000
UID, GID = 1000, 100

# --- an independent reader, from the document -----------------------------------------------------


def u(fmt: str, data: bytes, offset: int = 0) -> tuple:
    """All integers are big-endian (§ introduction)."""
    return struct.unpack_from(">" + fmt, data, offset)


def read_marker(bundle: Path) -> dict:
    """§2: 52 bytes; magic, version, reserved, bundle_id, index_size, index_crc, shards, crc."""
    data = (bundle / "COMPLETE").read_bytes()
    assert len(data) == 52
    magic, version, reserved, bundle_id, index_size, index_crc, shard_count = u("8sII16sQII", data)
    assert magic == b"BNDLDONE" and version in (1, 2, 3, 4, 5, 6) and reserved == 0
    (marker_crc,) = u("I", data, 48)
    assert marker_crc == crc32c.crc32c(data[:48])
    return dict(
        version=version,
        bundle_id=bundle_id,
        index_size=index_size,
        index_crc=index_crc,
        shard_count=shard_count,
    )


def check_index_file(bundle: Path, marker: dict) -> None:
    """§2 steps 2–4 and §3.1, all before LMDB sees the file."""
    data = (bundle / "index" / "data.mdb").read_bytes()
    assert len(data) == marker["index_size"]
    assert crc32c.crc32c(data) == marker["index_crc"]
    assert hashlib.blake2b(data).digest()[:16] == marker["bundle_id"]
    # LMDB's own meta pages are little-endian: magic at 16, version at 20, page size at 40.
    magic, lmdb_version, page_size = struct.unpack_from("<II", data, 16) + struct.unpack_from(
        "<I", data, 40
    )
    assert (magic, lmdb_version) == (0xBEEFC0DE, 1)
    assert 512 <= page_size <= 65536 and page_size & (page_size - 1) == 0
    for meta in (0, page_size):
        (last_pg,) = struct.unpack_from("<Q", data, meta + 136)
        assert (last_pg + 1) * page_size <= len(data)
    if marker["version"] >= 6:  # §3.10: the page table, one CRC32C per page
        table = (bundle / "index" / "pages").read_bytes()
        magic, size, _zero, bundle_id, count = struct.unpack_from(">8sII16sQ", table)
        assert (magic, size, bundle_id) == (b"BNDLPAGE", page_size, marker["bundle_id"])
        assert count * page_size == len(data) and len(table) == 40 + 4 * count + 4
        assert struct.unpack_from(">I", table, len(table) - 4)[0] == crc32c.crc32c(table[:-4])
        for n, crc in enumerate(struct.unpack_from(f">{count}I", table, 40)):
            assert crc == crc32c.crc32c(data[n * page_size : (n + 1) * page_size])


class DocReader:
    """Reads a bundle using only the layouts of docs/format.md."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.marker = read_marker(bundle)
        check_index_file(bundle, self.marker)
        self.version = self.marker["version"]
        # §3: subdirectory mode, no lock file, five named databases (seven from version 2, eight
        # from version 5, and from version 6 an optional ninth, "sources").
        self.env = lmdb.open(str(bundle / "index"), readonly=True, lock=False, max_dbs=10)
        names = [b"config", b"entries", b"records", b"shards", b"owners"]
        if self.version >= 2:
            names += [b"types", b"meta"]
        if self.version >= 5:
            names += [b"totals"]
        self.dbs = {name: self.env.open_db(name, create=False) for name in names}
        if self.version >= 6:
            with contextlib.suppress(lmdb.NotFoundError):  # optional
                self.dbs[b"sources"] = self.env.open_db(b"sources", create=False)
        self.txn = self.env.begin()
        self.config = self.decode_config(self.raw(b"config", b"config"))
        assert self.config["version"] == self.version

    def close(self) -> None:
        self.txn.abort()
        self.env.close()

    def raw(self, db: bytes, key: bytes) -> bytes:
        value = self.txn.get(key, db=self.dbs[db])
        assert value is not None, (db, key)
        return value

    def items(self, db: bytes) -> list[tuple[bytes, bytes]]:
        return list(self.txn.cursor(db=self.dbs[db]))

    def shard_name(self, shard: int) -> str:
        """§1: eight decimal digits; version 1 used lowercase hex."""
        return f"shard-{shard:08x}" if self.version == 1 else f"shard-{shard:08d}"

    def decode_config(self, v: bytes) -> dict:
        """§3.2: 96 bytes."""
        assert len(v) == 96
        names = [
            "magic", "version", "content_type_count", "incompatible", "block_size", "record_size",
            "large_file_threshold", "compression", "shard_count", "owner_count", "entry_count",
            "file_count", "dir_count", "symlink_count", "hardlink_count", "data_bytes",
            "created_ns",
        ]  # fmt: skip
        config = dict(zip(names, u("8sHHIIIIB3xIIQQQQQQq", v), strict=True))
        assert config["magic"] == b"BUNDLEFS" and config["version"] in (1, 2, 3, 4, 5, 6)
        assert config["incompatible"] == 0
        if config["version"] == 1:
            config["content_type_count"] = 0  # reserved in version 1
        return config

    def content_type(self, e: dict) -> str | None:
        """§3.6: a u16 index into ``types``, whose values are ASCII media types."""
        if "content_type" not in e:
            return None
        assert e["content_type"] < self.config["content_type_count"]
        return self.raw(b"types", struct.pack(">H", e["content_type"])).decode("ascii")

    def meta(self) -> dict[str, str]:
        """§3.7: UTF-8 keys and values."""
        if self.version == 1:
            return {}
        return {k.decode(): v.decode() for k, v in self.items(b"meta")}

    def entry(self, ino: int) -> dict:
        """§3.3: a header and the kind's fixed part (§3.3.1's compact ones from version 3), then
        the optional parts the flags announce, then the name."""
        v = self.raw(b"entries", struct.pack(">I", ino))
        e, pos = self.compact_fixed(ino, v) if self.version >= 3 else self.fixed(ino, v)
        flags = e["flags"]
        assert flags & ~{1: 0x07, 5: 0x1F, 6: 0x1F}.get(self.version, 0x0F) == 0
        if e["mode"] & 0o170000 == 0o100000 and not flags & 0x01:  # a file that is not a LINK
            e["nlink"] = 1
            if flags & 0x04:  # NLINK
                (e["nlink"],) = u("I", v, pos)
                pos += 4
            if flags & 0x08:  # CONTENT_TYPE (from version 2): u16 index into types
                (e["content_type"],) = u("H", v, pos)
                pos += 2
        if flags & 0x02:  # USER_DATA: u16 length, then the bytes
            (n,) = u("H", v, pos)
            e["user_data"] = v[pos + 2 : pos + 2 + n]
            pos += 2 + n
        if flags & 0x10:  # DIGEST (from version 5; files only): 16 bytes right before the name
            assert e["mode"] & 0o170000 == 0o100000 and not flags & 0x01
            e["digest"] = v[pos : pos + 16]
            pos += 16
        e["name"] = v[pos:]
        return e

    def totals(self, ino: int) -> tuple[int, ...]:
        """§3.8 (from version 5): files, dirs, bytes, entries below a directory."""
        v = self.raw(b"totals", struct.pack(">I", ino))
        assert len(v) == 32
        return u("QQQQ", v)

    def check_totals(self) -> None:
        """§3.8's rules over the whole tree: every directory's totals are what its children add
        (a directory: itself and its totals; a file without LINK: itself and its size; anything
        else: itself), the root's are the config's counts, and only directories have a key."""
        dirs = []
        for key, _v in self.items(b"entries"):
            e = self.entry(u("I", key)[0])
            if e["mode"] & 0o170000 == 0o040000:
                dirs.append(e)
        assert [k for k, _v in self.items(b"totals")] == [struct.pack(">I", d["ino"]) for d in dirs]
        for d in dirs:
            files = subdirs = size = entries = 0
            for c in self.children(d):
                entries += 1
                if c["mode"] & 0o170000 == 0o040000:
                    f, s, b, n = self.totals(c["ino"])
                    files, subdirs, size, entries = (
                        files + f,
                        subdirs + s + 1,
                        size + b,
                        entries + n,
                    )
                elif c["mode"] & 0o170000 == 0o100000 and not c["flags"] & 0x01:
                    files, size = files + 1, size + c["size"]
            assert self.totals(d["ino"]) == (files, subdirs, size, entries), d["ino"]
        c = self.config
        root = (c["file_count"], c["dir_count"] - 1, c["data_bytes"], c["entry_count"] - 1)
        assert self.totals(1) == root

    def fixed(self, ino: int, v: bytes) -> tuple[dict, int]:
        """§3.3, versions 1 and 2: the 22-byte header, then the kind's fixed part."""
        mode, flags, reserved, owner, mtime_ns, size = u("HBBHqQ", v)
        e = dict(ino=ino, mode=mode, flags=flags, owner=owner, mtime_ns=mtime_ns, size=size)
        assert reserved == 0
        pos = 22
        kind = mode & 0o170000
        if kind == 0o100000 and flags & 0x01:  # LINK: u32 target
            (e["target"],) = u("I", v, pos)
            pos += 4
        elif kind == 0o100000:  # regular file: u64 location, u32 crc32c
            location, e["crc32c"] = u("QI", v, pos)
            e["shard"], e["offset"] = location >> 48, location & (2**48 - 1)
            pos += 12
        elif kind == 0o040000:  # directory: parent, first_child, nlink
            e["parent"], e["first_child"], e["nlink"] = u("III", v, pos)
            pos += 12
        elif kind == 0o120000:  # symlink: the target, `size` bytes
            e["symlink"] = v[pos : pos + size]
            pos += size
        else:
            raise AssertionError(f"file type {kind:o} is not in the format")
        return e, pos

    def compact_fixed(self, ino: int, v: bytes) -> tuple[dict, int]:
        """§3.3.1, version 3: mode, flags, layout, then each field as wide as the layout says.

        Every bundle this test reads was packed by bundlefs, so it also checks the writer's rule:
        each field at the narrowest width that holds it (a directory's size always u32).
        """
        mode, flags, layout = u("HBB", v)
        kind = mode & 0o170000
        is_file = kind == 0o100000 and not flags & 0x01  # a regular file without LINK
        assert layout & 0xC0 == 0  # bits 6-7 must be 0
        assert is_file or layout & 0x30 == 0  # WIDE_SHARD, WIDE_OFFSET: files only
        pos = 4
        width = (1, 2, 4, 8)[layout & 0x03]  # size: u8, u16, u32, u64
        size = int.from_bytes(v[pos : pos + width], "big")
        pos += width
        if layout & 0x04:  # MTIME_NS: i64 nanoseconds
            (mtime_ns,) = u("q", v, pos)
            pos += 8
            assert mtime_ns % 10**9 or not 0 <= mtime_ns < 2**32 * 10**9  # else u32 seconds
        else:  # u32 whole seconds
            (seconds,) = u("I", v, pos)
            mtime_ns = seconds * 10**9
            pos += 4
        owner = 0
        if layout & 0x08:  # OWNER: u16 index into owners; clear: owner 0
            (owner,) = u("H", v, pos)
            pos += 2
            assert owner != 0
        e = dict(ino=ino, mode=mode, flags=flags, owner=owner, mtime_ns=mtime_ns, size=size)
        if kind == 0o040000:
            assert width == 4  # a directory's size (child count) is always u32
        else:
            assert width == min(w for w in (1, 2, 4, 8) if size < 2 ** (8 * w))
        if is_file:  # shard u8/u16, offset u32/u64, crc32c u32
            shard_width, offset_width = (2 if layout & 0x10 else 1), (8 if layout & 0x20 else 4)
            e["shard"] = int.from_bytes(v[pos : pos + shard_width], "big")
            at = pos + shard_width
            e["offset"] = int.from_bytes(v[at : at + offset_width], "big")
            pos += shard_width + offset_width
            (e["crc32c"],) = u("I", v, pos)
            pos += 4
            assert e["offset"] <= 2**48 - 1
            assert shard_width == (2 if e["shard"] > 0xFF else 1)
            assert offset_width == (8 if e["offset"] > 0xFFFFFFFF else 4)
        elif kind == 0o100000:  # LINK: u32 target
            (e["target"],) = u("I", v, pos)
            pos += 4
        elif kind == 0o040000:  # directory: parent, first_child, nlink
            e["parent"], e["first_child"], e["nlink"] = u("III", v, pos)
            pos += 12
        elif kind == 0o120000:  # symlink: the target, `size` bytes
            e["symlink"] = v[pos : pos + size]
            pos += size
        elif kind in (0o010000, 0o140000) and self.version >= 4:  # FIFO, socket (§3.3.2)
            assert size == 0 and flags & ~0x02 == 0  # USER_DATA only
        elif kind in (0o020000, 0o060000) and self.version >= 4:  # char, block device: u32 x 2
            e["major"], e["minor"] = u("II", v, pos)
            pos += 8
            assert size == 0 and flags & ~0x02 == 0
        else:
            raise AssertionError(f"file type {kind:o} is not in the format")
        return e, pos

    def follow(self, e: dict) -> dict:
        return self.entry(e["target"]) if e["flags"] & 0x01 else e

    def children(self, directory: dict) -> list[dict]:
        """A directory's children are inodes first_child … first_child + size − 1."""
        first = directory["first_child"]
        return [self.entry(i) for i in range(first, first + directory["size"])]

    def lookup(self, path: str) -> dict:
        """§5 step 1: component by component from the root, by binary search over the children."""
        e = self.entry(1)
        for part in os.fsencode(path).split(b"/"):
            lo, hi = e["first_child"], e["first_child"] + e["size"] - 1
            while lo <= hi:
                mid = (lo + hi) // 2
                child = self.entry(mid)
                if child["name"] == part:
                    e = self.follow(child)
                    break
                lo, hi = (mid + 1, hi) if child["name"] < part else (lo, mid - 1)
            else:
                raise FileNotFoundError(path)
        return e

    def shard(self, index: int) -> dict:
        """§3.5: the shard table. Versions 1 and 2 store the first 20 bytes; the rest is the
        bundle's: the config's compression (always lz4 in version 1), the bundle's header."""
        v = self.raw(b"shards", struct.pack(">I", index))
        if self.version < 3:
            assert len(v) == 20
            file_size, stream_size, record_count = u("QQI", v)
            compression = 1 if self.version == 1 else self.config["compression"]
            header_version, header_index, header_id = self.version, index, bytes(16)
        else:
            assert len(v) == (52 if self.version >= 6 else 44)  # version 6: base, base_shard
            (file_size, stream_size, record_count, compression, header_version, reserved,
             header_index, header_id) = u("QQIBBHI16s", v[:44])  # fmt: skip
            assert reserved == 0
            # This reader reads bundles that keep every shard file themselves (base 0, §3.11).
            assert self.version < 6 or v[44:] == bytes(8)
            assert compression in (0, 1, 2)
            assert 1 <= header_version <= self.version
            assert header_version > 1 or compression == 1  # a version-1 shard says lz4
        if header_id == bytes(16):  # this bundle wrote it: its own version, index and id
            assert (header_version, header_index) == (self.version, index)
            header_id = self.marker["bundle_id"]
        return dict(
            file_size=file_size,
            stream_size=stream_size,
            record_count=record_count,
            compression=compression,
            header=b"BNDLSHRD" + struct.pack(">II", header_version, header_index) + header_id,
        )

    def record(self, shard: int, offset: int) -> dict:
        """§3.4: the greatest key ≤ (shard, offset)."""
        cursor = self.txn.cursor(db=self.dbs[b"records"])
        key = struct.pack(">IQ", shard, offset)
        if not cursor.set_range(key):
            positioned = cursor.last()  # every key is smaller: the last record
        elif cursor.key() != key:
            positioned = cursor.prev()  # the next key is greater: the one before it
        else:
            positioned = True
        assert positioned
        rec_shard, rec_offset = u("IQ", cursor.key())
        stored_offset, stored_length, length, crc, flags = u("QIIIB", cursor.value())
        assert rec_shard == shard and rec_offset <= offset < rec_offset + length
        return dict(
            offset=rec_offset,
            stored_offset=stored_offset,
            stored_length=stored_length,
            length=length,
            crc32c=crc,
            flags=flags,
        )

    def expand(self, shard: int, r: dict) -> bytes:
        """§5 step 2: read the stored bytes, check their CRC, then expand by the flags."""
        s = self.shard(shard)
        with open(self.bundle / self.shard_name(shard), "rb") as f:
            assert f.read(32) == s["header"]  # §4: what the shard table says it says
            assert os.fstat(f.fileno()).st_size == s["file_size"]
            f.seek(r["stored_offset"])
            stored = f.read(r["stored_length"])
        assert len(stored) == r["stored_length"]
        assert crc32c.crc32c(stored) == r["crc32c"]
        if r["flags"] & 0x01:  # ZEROS
            return bytes(r["length"])
        if r["flags"] & 0x02:  # RAW
            return stored
        # The shard's codec (§3.5): 1 lz4, 2 zstd; 0 (none) leaves no compressed record.
        if s["compression"] == 2:
            assert zstandard.frame_content_size(stored) == r["length"]  # one frame, sized
            data = zstandard.ZstdDecompressor().decompress(
                stored, max_output_size=r["length"], allow_extra_data=False
            )
        else:
            assert s["compression"] == 1
            data = lz4.block.decompress(stored, uncompressed_size=r["length"])
        assert len(data) == r["length"]
        return data

    def read(self, path: str) -> bytes:
        """§5 steps 2–3: the records overlapping the file's stream range, then the file CRC."""
        e = self.lookup(path)
        pos, stop = e["offset"], e["offset"] + e["size"]
        out = b""
        while pos < stop:
            r = self.record(e["shard"], pos)
            data = self.expand(e["shard"], r)
            take = min(stop, r["offset"] + r["length"]) - pos
            out += data[pos - r["offset"] : pos - r["offset"] + take]
            pos += take
        assert crc32c.crc32c(out) == e["crc32c"]
        if "digest" in e:  # §3.3 (version 5): SHA-256 of the content, its first 16 bytes
            assert e["digest"] == hashlib.sha256(out).digest()[:16]
        return out


# --- the worked example ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("golden") / "src"
    src.mkdir()
    (src / "hello.txt").write_bytes(CONTENT)
    os.symlink("hello.txt", src / "link")
    os.chmod(src / "hello.txt", 0o644)
    os.chmod(src, 0o755)
    for p in (src / "hello.txt", src / "link", src):
        if os.geteuid() == 0:
            os.chown(p, UID, GID, follow_symlinks=False)
        os.utime(p, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    dest = src.parent / "tiny.bundle"
    old = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = str(SOURCE_DATE_EPOCH)
    try:
        pack(str(src), str(dest), PackOptions(meta=(("origin", "golden"), ("ünï", "cødé"))))
    finally:
        if old is None:
            del os.environ["SOURCE_DATE_EPOCH"]
        else:
            os.environ["SOURCE_DATE_EPOCH"] = old
    return dest


@pytest.fixture
def reader(tiny: Path):
    r = DocReader(tiny)
    yield r
    r.close()


def h(text: str) -> bytes:
    """Bytes from hex digits grouped by spaces."""
    return bytes.fromhex(text)


MTIME = "17 97 9c fe 3d 85 cd 15"


def test_bundle_directory_holds_exactly_the_documented_files(tiny: Path) -> None:
    # §1: index/data.mdb, one shard, COMPLETE; no lock file.
    files = sorted(str(p.relative_to(tiny)) for p in tiny.rglob("*") if p.is_file())
    assert files == ["COMPLETE", "index/data.mdb", "index/pages", "shard-00000000"]


def test_golden_marker(tiny: Path, reader: DocReader) -> None:
    data = (tiny / "COMPLETE").read_bytes()
    index = (tiny / "index" / "data.mdb").read_bytes()
    body = (
        b"BNDLDONE"  # 0: magic
        + h("00 00 00 06")  # 8: format_version 6
        + h("00 00 00 00")  # 12: reserved
        + hashlib.blake2b(index).digest()[:16]  # 16: bundle_id
        + len(index).to_bytes(8, "big")  # 32: index_size
        + crc32c.crc32c(index).to_bytes(4, "big")  # 40: index_crc32c
        + h("00 00 00 01")  # 44: shard_count 1
    )
    assert data == body + crc32c.crc32c(body).to_bytes(4, "big")  # 48: marker_crc32c


def test_golden_config(reader: DocReader) -> None:
    assert reader.raw(b"config", b"config") == (
        b"BUNDLEFS"  # 0: magic
        + h("00 06")  # 8: format_version
        + h("00 01")  # 10: content_type_count: text/plain
        + h("00 00 00 00")  # 12: incompatible_features: none
        + h("00 00 10 00")  # 16: block_size 4096
        + h("00 04 00 00")  # 20: record_size 262144
        + h("00 10 00 00")  # 24: large_file_threshold 1 MiB
        + h("01 00 00 00")  # 28: compression lz4, 3 reserved bytes
        + h("00 00 00 01")  # 32: shard_count
        + h("00 00 00 01")  # 36: owner_count
        + h("00 00 00 00 00 00 00 03")  # 40: entry_count (root, hello.txt, link)
        + h("00 00 00 00 00 00 00 01")  # 48: file_count
        + h("00 00 00 00 00 00 00 01")  # 56: dir_count (the root)
        + h("00 00 00 00 00 00 00 01")  # 64: symlink_count
        + h("00 00 00 00 00 00 00 00")  # 72: hardlink_count
        + h("00 00 00 00 00 00 00 0e")  # 80: data_bytes 14
        + h("17 97 9c fe 36 2a 00 00")  # 88: created_ns = SOURCE_DATE_EPOCH × 10⁹
    )


def test_golden_owner(reader: DocReader) -> None:
    uid, gid = (UID, GID) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    assert reader.items(b"owners") == [(h("00 00"), struct.pack(">II", uid, gid))]


def test_golden_root_entry(reader: DocReader) -> None:
    assert reader.raw(b"entries", h("00 00 00 01")) == h(
        "41 ed"  # 0: mode S_IFDIR | 0755
        " 00"  # 2: flags
        " 06"  # 3: layout: size u32 (0x02, a directory's always is) | MTIME_NS (0x04); owner 0
        " 00 00 00 02"  # 4: size = child count 2
        f" {MTIME}"  # 8: mtime_ns (not whole seconds: i64)
        " 00 00 00 01"  # 16: parent (the root's parent is itself)
        " 00 00 00 02"  # 20: first_child
        " 00 00 00 02"  # 24: nlink = 2 + no subdirectories
        # 28: name: empty for the root (34 bytes in version 2)
    )


def test_golden_file_entry(reader: DocReader) -> None:
    assert (
        reader.raw(b"entries", h("00 00 00 02"))
        == h(
            "81 a4"  # 0: mode S_IFREG | 0644
            " 18"  # 2: flags CONTENT_TYPE | DIGEST
            " 04"  # 3: layout: size u8, MTIME_NS; owner 0, shard u8, offset u32 (0x10, 0x20 clear)
            " 0e"  # 4: size 14
            f" {MTIME}"  # 5: mtime_ns
            " 00"  # 13: shard 0
            " 00 00 00 00"  # 14: offset 0 in the shard's uncompressed stream
            " b4 71 21 97"  # 18: CRC32C("hello, bundle\n")
            " 00 00"  # 22: content type 0 (CONTENT_TYPE)
            " 2b d4 fe 6b 35 5a b1 cf 50 d3 ff 7e 73 c0 87 cc"  # 24: SHA-256, 16 bytes (DIGEST)
        )
        + b"hello.txt"
    )  # 40: the name, to the end of the value (24 in versions 3 and 4, 36 in version 2)


def test_golden_directory_totals(reader: DocReader) -> None:
    # §3.8: one key per directory (just the root here): 1 file, no directory below it, 14 bytes,
    # 2 entries (the file and the symlink).
    assert reader.items(b"totals") == [
        (
            h("00 00 00 01"),
            h(
                "00 00 00 00 00 00 00 01"  # 0: files
                " 00 00 00 00 00 00 00 00"  # 8: dirs
                " 00 00 00 00 00 00 00 0e"  # 16: bytes
                " 00 00 00 00 00 00 00 02"  # 24: entries
            ),
        )
    ]
    reader.check_totals()


def test_golden_content_types(reader: DocReader) -> None:
    # From the extension; index 0 is the first type the packer met.
    assert reader.items(b"types") == [(h("00 00"), b"text/plain")]
    assert reader.content_type(reader.lookup("hello.txt")) == "text/plain"


def test_golden_bundle_metadata(reader: DocReader) -> None:
    # Keys sort bytewise, as LMDB compares them; both are UTF-8.
    assert reader.items(b"meta") == [(b"origin", b"golden"), ("ünï".encode(), "cødé".encode())]


def test_golden_symlink_entry(reader: DocReader) -> None:
    assert (
        reader.raw(b"entries", h("00 00 00 03"))
        == h(
            "a1 ff"  # 0: mode S_IFLNK | 0777
            " 00"  # 2: flags
            " 04"  # 3: layout: size u8, MTIME_NS; owner 0
            " 09"  # 4: size = target length 9
            f" {MTIME}"  # 5: mtime_ns
        )
        + b"hello.txt"
        + b"link"
    )  # 13: the target (size bytes), then the name


def test_golden_record(reader: DocReader) -> None:
    # 14 bytes do not shrink under lz4: the one record is stored RAW right after the header block.
    key = h("00 00 00 00 00 00 00 00 00 00 00 00")  # shard 0, uncompressed offset 0
    assert reader.items(b"records") == [
        (
            key,
            h(
                "00 00 00 00 00 00 10 00"  # 0: stored_offset 4096 (one block_size past the header)
                " 00 00 00 0e"  # 8: stored_length 14
                " 00 00 00 0e"  # 12: length 14
                " b4 71 21 97"  # 16: CRC32C of the stored bytes (= the file's, as it is raw)
                " 02"  # 20: flags RAW
            ),
        )
    ]


def test_golden_shard_descriptor(reader: DocReader) -> None:
    assert reader.items(b"shards") == [
        (
            h("00 00 00 00"),
            h(
                "00 00 00 00 00 00 20 00"  # 0: file_size 8192 (header block + one padded record)
                " 00 00 00 00 00 00 00 0e"  # 8: uncompressed_size 14
                " 00 00 00 01"  # 16: record_count
                " 01"  # 20: compression lz4 (the packer's; this shard's one record is RAW)
                " 06"  # 21: header_version: this bundle's
                " 00 00"  # 22: reserved
                " 00 00 00 00"  # 24: header_index: this shard's
                " 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"  # 28: header_bundle_id: zeros,
                # this bundle's own (the packer wrote the shard before the bundle id existed)
                " 00 00 00 00"  # 44: base: 0, the file is in this bundle's directory (version 6)
                " 00 00 00 00"  # 48: base_shard: 0 when base is 0
            ),
        )
    ]


def test_golden_shard_file(tiny: Path, reader: DocReader) -> None:
    header = (
        b"BNDLSHRD"  # 0: magic
        + h("00 00 00 06")  # 8: format_version: the shard table's header_version
        + h("00 00 00 00")  # 12: shard_index: the shard table's header_index
        + reader.marker["bundle_id"]  # 16: as in COMPLETE (the shard table's id is zeros)
    )
    # The header block is padded to block_size; each record is padded to a block boundary.
    expected = header + bytes(4096 - 32) + CONTENT + bytes(4096 - len(CONTENT))
    assert (tiny / "shard-00000000").read_bytes() == expected


def test_golden_source_records(tiny: Path, reader: DocReader) -> None:
    # §3.9 (version 6): the one regular file, keyed by its inode number, with the ctime and inode
    # number its source file had when it was packed (the source machine's stat); the symlink and
    # the root have none.
    st = os.lstat(tiny.parent / "src" / "hello.txt")
    assert reader.items(b"sources") == [
        (
            h("00 00 00 02"),
            st.st_ctime_ns.to_bytes(8, "big", signed=True)  # 0: i64 ctime_ns
            + st.st_ino.to_bytes(8, "big"),  # 8: u64 st_ino
        )
    ]


def test_entries_are_numbered_breadth_first_in_name_order(reader: DocReader) -> None:
    root = reader.entry(1)
    assert [c["name"] for c in reader.children(root)] == [b"hello.txt", b"link"]
    assert [c["ino"] for c in reader.children(root)] == [2, 3]


def test_doc_reader_reads_the_file_and_the_symlink(reader: DocReader) -> None:
    assert reader.read("hello.txt") == CONTENT
    assert reader.lookup("link")["symlink"] == b"hello.txt"


def test_doc_reader_reads_every_file_of_the_sample_bundle(sample_bundle_path: Path) -> None:
    # The sample has multi-record lz4 files, ZEROS and RAW records and a hard link: every branch of
    # §3.4 and §5 is exercised by the document-only reader.
    r = DocReader(sample_bundle_path)
    try:
        flags = {v[20] for _k, v in r.items(b"records")}
        assert flags == {0x00, 0x01, 0x02}
        for path, content in SAMPLE_FILES.items():
            assert r.read(path) == content, path
    finally:
        r.close()


# --- the committed version-1 and version-2 bundles, and shard names past ten ----------------------


@pytest.fixture(scope="module")
def v1_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree both committed bundles were packed from."""
    return build_v1_tree(tmp_path_factory.mktemp("v1-tree") / "src")


def assert_reads_the_v1_tree(r: DocReader, tree: Path) -> None:
    """Every regular file of ``tree`` reads back; its symlink and hard link are what they were."""
    files = [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) == len(V1_FILES) + 2  # the empty file and the second name of d1/f01.bin
    for path in files:
        rel = str(path.relative_to(tree))
        assert r.read(rel) == path.read_bytes(), rel
    assert r.lookup("link-to-first")["symlink"] == b"d0/f00.bin"
    linked = r.lookup("d2/hardlink-of-d1-f01")  # a LINK entry, followed to its target
    assert linked["ino"] == r.lookup("d1/f01.bin")["ino"] and linked["nlink"] == 2
    assert r.lookup("d3/f03.bin")["mode"] == 0o100600


def test_doc_reader_reads_the_version_1_bundle_with_twelve_hex_named_shards(v1_tree: Path) -> None:
    r = DocReader(V1_BUNDLE)
    try:
        assert r.version == 1 and r.marker["shard_count"] == 12
        names = sorted(p.name for p in V1_BUNDLE.glob("shard-*"))
        assert names == [f"shard-{i:08x}" for i in range(12)]
        assert "shard-0000000a" in names and "shard-0000000b" in names
        assert_reads_the_v1_tree(r, v1_tree)
        assert r.content_type(r.lookup("d0/f00.bin")) is None  # version 1 has none
        assert r.meta() == {}
    finally:
        r.close()


def test_doc_reader_reads_the_version_2_bundle_with_twelve_decimal_named_zstd_shards(
    v1_tree: Path,
) -> None:
    r = DocReader(V2_BUNDLE)
    try:
        assert r.version == 2 and r.marker["shard_count"] == 12
        assert r.config["compression"] == 2 and r.config["created_ns"] == V1_EPOCH * 10**9
        assert any(v[20] == 0 for _k, v in r.items(b"records"))  # some records are zstd frames
        assert all(len(v) == 20 for _k, v in r.items(b"shards"))  # version 2's shard descriptor
        names = sorted(p.name for p in V2_BUNDLE.glob("shard-*"))
        assert names == [f"shard-{i:08d}" for i in range(12)]
        assert "shard-00000010" in names and "shard-00000011" in names
        assert_reads_the_v1_tree(r, v1_tree)
        assert r.meta() == {"made-by": "bundlefs 22d101b, format version 2"}
    finally:
        r.close()


def test_doc_reader_reads_the_version_3_bundle_with_its_compact_entries(v1_tree: Path) -> None:
    r = DocReader(V3_BUNDLE)
    try:
        assert r.version == 3 and r.marker["shard_count"] == 12
        assert all(len(v) == 44 for _k, v in r.items(b"shards"))  # the shard table
        assert all(v[21] == 3 for _k, v in r.items(b"shards"))  # every shard its own, version 3
        assert_reads_the_v1_tree(r, v1_tree)
        assert r.meta() == {"made-by": "bundlefs 6acabea, format version 3"}
    finally:
        r.close()


def test_doc_reader_reads_the_version_4_bundle_without_digests_or_totals(v1_tree: Path) -> None:
    r = DocReader(V4_BUNDLE)
    try:
        assert r.version == 4 and r.marker["shard_count"] == 12
        assert all(v[21] == 4 for _k, v in r.items(b"shards"))  # every shard its own, version 4
        assert b"totals" not in r.dbs and "digest" not in r.lookup("d0/f00.bin")
        assert_reads_the_v1_tree(r, v1_tree)
        assert r.meta() == {"made-by": "bundlefs 9791af2, format version 4"}
    finally:
        r.close()


def test_doc_reader_reads_the_version_5_bundle_with_digests_and_totals(v1_tree: Path) -> None:
    r = DocReader(V5_BUNDLE)
    try:
        assert r.version == 5 and r.marker["shard_count"] == 12
        assert all(v[21] == 5 for _k, v in r.items(b"shards"))  # every shard its own, version 5
        assert b"sources" not in r.dbs and "digest" in r.lookup("d0/f00.bin")
        assert_reads_the_v1_tree(r, v1_tree)
        r.check_totals()
        assert r.meta() == {"made-by": "bundlefs 5c0717b, format version 5"}
    finally:
        r.close()


@pytest.mark.parametrize(
    "options, codec", [(V1_PACK_OPTIONS, 1), (V2_PACK_OPTIONS, 2)], ids=["lz4", "zstd"]
)
def test_the_same_tree_packed_today_is_version_6_with_decimal_shard_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, v1_tree: Path, options: dict, codec: int
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(V1_EPOCH))
    dest = tmp_path / "v6.bundle"
    pack(str(v1_tree), str(dest), PackOptions(**options))
    r = DocReader(dest)
    try:
        assert r.version == 6 and r.marker["shard_count"] == 12
        names = sorted(p.name for p in dest.glob("shard-*"))
        assert names == [f"shard-{i:08d}" for i in range(12)]
        assert "shard-00000010" in names and "shard-00000011" in names
        # Every shard is the bundle's own: its codec, version 6, its own index, zeros for the id.
        for key, value in r.items(b"shards"):
            assert value[20:] == bytes([codec, 6, 0, 0]) + key + bytes(16) + bytes(8)  # base 0
        assert_reads_the_v1_tree(r, v1_tree)
        assert "digest" in r.lookup("d0/f00.bin") and "digest" in r.lookup("d1/f01.bin")
        r.check_totals()
    finally:
        r.close()


def test_doc_reader_reads_a_bundle_holding_shards_of_version_1_2_and_3_bundles(
    grafted_bundle_path: Path, v1_tree: Path
) -> None:
    # Shards 0-3 are the committed version-1 bundle's, 4-7 the version-2 bundle's (zstd), 8-11
    # the bundle's own: each one's header and codec come from the shard table (§3.5).
    r = DocReader(grafted_bundle_path)
    try:
        assert r.version == 6 and r.config["compression"] == 1
        v1_id = read_marker(V1_BUNDLE)["bundle_id"]
        v2_id = read_marker(V2_BUNDLE)["bundle_id"]
        table = [value for _key, value in r.items(b"shards")]
        assert [v[20] for v in table] == [1] * 4 + [2] * 4 + [1] * 4  # compression
        assert [v[21] for v in table] == [1] * 4 + [2] * 4 + [6] * 4  # header_version
        assert [v[24:28] for v in table] == [struct.pack(">I", i) for i in range(12)]
        assert [v[28:44] for v in table] == [v1_id] * 4 + [v2_id] * 4 + [bytes(16)] * 4
        assert (grafted_bundle_path / "shard-00000000").read_bytes()[8:32] == (
            struct.pack(">II", 1, 0) + v1_id  # the version-1 bundle's header, unchanged
        )
        assert_reads_the_v1_tree(r, v1_tree)
    finally:
        r.close()


def test_doc_reader_reads_a_merged_bundle_of_version_1_2_3_5_and_6_bundles(
    tmp_path: Path, v1_tree: Path
) -> None:
    # §8: the committed bundles and the tree packed today (version 6), merged at five prefixes. A
    # merge links the inputs' shard files in unchanged, so every shard of the result is another
    # bundle's. It copies digests: the files of the version-5 and today's bundles have theirs,
    # the others none. It records no source stats (§3.9).
    from bundlefs.packing.merge import MergeOptions, merge

    today = tmp_path / "today.bundle"
    pack(str(v1_tree), str(today), PackOptions(**V1_PACK_OPTIONS))
    dest = tmp_path / "merged.bundle"
    inputs = [V1_BUNDLE, V2_BUNDLE, V3_BUNDLE, V5_BUNDLE, today]
    merge(inputs, str(dest), MergeOptions(at=("v1", "v2", "v3", "v5", "v6")))
    r = DocReader(dest)
    try:
        assert r.version == 6 and r.marker["shard_count"] == 60
        assert r.items(b"sources") == []
        ids = [read_marker(b)["bundle_id"] for b in inputs]
        for key, value in r.items(b"shards"):
            (shard,) = u("I", key)
            version, index = (1, 2, 3, 5, 6)[shard // 12], shard % 12
            codec = 2 if version == 2 else 1
            assert (
                value[20:44]
                == bytes([codec, version, 0, 0]) + struct.pack(">I", index) + ids[shard // 12]
            )
        r.check_totals()
        for prefix in ("v1", "v2", "v3", "v5", "v6"):
            for path in v1_tree.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    rel = f"{prefix}/{path.relative_to(v1_tree)}"
                    assert ("digest" in r.lookup(rel)) == (prefix in ("v5", "v6")), rel
                    assert r.read(rel) == path.read_bytes(), rel
            assert r.lookup(f"{prefix}/link-to-first")["symlink"] == b"d0/f00.bin"
    finally:
        r.close()


def test_doc_reader_reads_a_zstd_bundle(tmp_path: Path, v1_tree: Path) -> None:
    dest = tmp_path / "z.bundle"
    pack(
        str(v1_tree), str(dest), PackOptions(compression="zstd:5", record_size=4096, block_size=512)
    )
    r = DocReader(dest)
    try:
        assert r.config["compression"] == 2
        assert all(r.shard(i)["compression"] == 2 for i in range(r.config["shard_count"]))
        assert any(v[20] == 0 for _k, v in r.items(b"records"))  # some records are zstd frames
        assert_reads_the_v1_tree(r, v1_tree)
    finally:
        r.close()


# --- special files (version 4, §3.3.2) ------------------------------------------------------------


@pytest.fixture(scope="module")
def specials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FIFO, a socket and (as root) a character device 1:3 and a block device 7:300000, each
    mode 0640 and mtime 1_700_000_000 s."""
    import socket

    src = tmp_path_factory.mktemp("specials") / "src"
    src.mkdir()
    os.mkfifo(src / "fifo", 0o640)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(src / "sock"))
    if os.geteuid() == 0:
        os.mknod(src / "chr", 0o020640, os.makedev(1, 3))
        os.mknod(src / "blk", 0o060640, os.makedev(7, 300000))
    for p in src.iterdir():
        os.chmod(p, 0o640)
        os.utime(p, ns=(SOURCE_DATE_EPOCH * 10**9,) * 2)
    dest = src.parent / "specials.bundle"
    pack(str(src), str(dest), PackOptions(created_ns=SOURCE_DATE_EPOCH * 10**9))
    return dest


def test_golden_special_file_entries(specials: Path) -> None:
    r = DocReader(specials)
    try:
        assert r.version == 6
        # Names sort bytewise: blk, chr, fifo, sock (inodes 2 to 5 as root, else fifo 2, sock 3).
        names = [b"blk", b"chr", b"fifo", b"sock"] if os.geteuid() == 0 else [b"fifo", b"sock"]
        # Layout 0x00, size u8 0, mtime u32 seconds 1_700_000_000; owner index 0 (the only owner
        # there is) is not stored.
        common = " 00 00 65 53 f1 00"
        golden = {
            b"fifo": h("11 a0 00" + common) + b"fifo",  # mode 0o010640, flags 0, then the name
            b"sock": h("c1 a0 00" + common) + b"sock",  # mode 0o140640
            b"chr": h("21 a0 00" + common + " 00 00 00 01 00 00 00 03") + b"chr",  # major, minor
            b"blk": h("61 a0 00" + common + " 00 00 00 07 00 04 93 e0") + b"blk",  # 7, 300000
        }
        for ino, name in enumerate(names, 2):
            assert r.raw(b"entries", struct.pack(">I", ino)) == golden[name], name
            e = r.entry(ino)
            assert e["name"] == name and e["size"] == 0
        if os.geteuid() == 0:
            assert (r.entry(2)["major"], r.entry(2)["minor"]) == (7, 300000)
            assert (r.entry(3)["major"], r.entry(3)["minor"]) == (1, 3)
        c = r.config
        # §3.2: no count field counts them; entry_count less the others does.
        counted = c["file_count"] + c["dir_count"] + c["symlink_count"] + c["hardlink_count"]
        assert c["entry_count"] - counted == len(names)
    finally:
        r.close()

"""The worked example of docs/format.md §8: bundles decoded from the document alone.

The reader below reads both versions the document defines: the worked example in version 2, and
the committed version-1 bundle with twelve hex-named shards next to the same tree packed today.

Nothing here imports bundlefs except ``pack`` (to write the bundles under test): the reader below
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
from tests.legacy_trees import SOURCE_DATE_EPOCH as V1_EPOCH
from tests.legacy_trees import V1_FILES, V1_PACK_OPTIONS, build_v1_tree

V1_BUNDLE = Path(__file__).parent / "data" / "v1-twelve-shards.bundle"

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
    assert magic == b"BNDLDONE" and version in (1, 2) and reserved == 0
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


class DocReader:
    """Reads a bundle using only the layouts of docs/format.md."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.marker = read_marker(bundle)
        check_index_file(bundle, self.marker)
        self.version = self.marker["version"]
        # §3: subdirectory mode, no lock file, five named databases (seven from version 2).
        self.env = lmdb.open(str(bundle / "index"), readonly=True, lock=False, max_dbs=7)
        names = [b"config", b"entries", b"records", b"shards", b"owners"]
        if self.version >= 2:
            names += [b"types", b"meta"]
        self.dbs = {name: self.env.open_db(name, create=False) for name in names}
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
        assert config["magic"] == b"BUNDLEFS" and config["version"] in (1, 2)
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
        """§3.3: 22-byte header, kind-specific part, optional parts, then the name."""
        v = self.raw(b"entries", struct.pack(">I", ino))
        mode, flags, reserved, owner, mtime_ns, size = u("HBBHqQ", v)
        e = dict(ino=ino, mode=mode, flags=flags, owner=owner, mtime_ns=mtime_ns, size=size)
        assert reserved == 0 and flags & ~(0x07 if self.version == 1 else 0x0F) == 0
        pos = 22
        kind = mode & 0o170000
        if kind == 0o100000 and flags & 0x01:  # LINK: u32 target
            (e["target"],) = u("I", v, pos)
            pos += 4
        elif kind == 0o100000:  # regular file: u64 location, u32 crc32c
            location, e["crc32c"] = u("QI", v, pos)
            e["shard"], e["offset"] = location >> 48, location & (2**48 - 1)
            pos += 12
            e["nlink"] = 1
            if flags & 0x04:  # NLINK
                (e["nlink"],) = u("I", v, pos)
                pos += 4
            if flags & 0x08:  # CONTENT_TYPE (version 2): u16 index into types
                (e["content_type"],) = u("H", v, pos)
                pos += 2
        elif kind == 0o040000:  # directory: parent, first_child, nlink
            e["parent"], e["first_child"], e["nlink"] = u("III", v, pos)
            pos += 12
        elif kind == 0o120000:  # symlink: the target, `size` bytes
            e["symlink"] = v[pos : pos + size]
            pos += size
        else:
            raise AssertionError(f"file type {kind:o} is not in the format")
        if flags & 0x02:  # USER_DATA: u16 length, then the bytes
            (n,) = u("H", v, pos)
            e["user_data"] = v[pos + 2 : pos + 2 + n]
            pos += 2 + n
        e["name"] = v[pos:]
        return e

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
        with open(self.bundle / self.shard_name(shard), "rb") as f:
            header = f.read(32)
            expected = struct.pack(">II", self.version, shard) + self.marker["bundle_id"]
            assert header == b"BNDLSHRD" + expected
            f.seek(r["stored_offset"])
            stored = f.read(r["stored_length"])
        assert len(stored) == r["stored_length"]
        assert crc32c.crc32c(stored) == r["crc32c"]
        if r["flags"] & 0x01:  # ZEROS
            return bytes(r["length"])
        if r["flags"] & 0x02:  # RAW
            return stored
        # Version 1: lz4 always. Version 2: the config's compression (1 lz4, 2 zstd).
        if self.version >= 2 and self.config["compression"] == 2:
            assert zstandard.frame_content_size(stored) == r["length"]  # one frame, sized
            data = zstandard.ZstdDecompressor().decompress(
                stored, max_output_size=r["length"], allow_extra_data=False
            )
        else:
            assert self.version == 1 or self.config["compression"] == 1
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
    assert files == ["COMPLETE", "index/data.mdb", "shard-00000000"]


def test_golden_marker(tiny: Path, reader: DocReader) -> None:
    data = (tiny / "COMPLETE").read_bytes()
    index = (tiny / "index" / "data.mdb").read_bytes()
    body = (
        b"BNDLDONE"  # 0: magic
        + h("00 00 00 02")  # 8: format_version 2
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
        + h("00 02")  # 8: format_version
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
        " 00"  # 3: reserved
        " 00 00"  # 4: owner 0
        f" {MTIME}"  # 6: mtime_ns
        " 00 00 00 00 00 00 00 02"  # 14: size = child count 2
        " 00 00 00 01"  # 22: parent (the root's parent is itself)
        " 00 00 00 02"  # 26: first_child
        " 00 00 00 02"  # 30: nlink = 2 + no subdirectories
        # name: empty for the root
    )


def test_golden_file_entry(reader: DocReader) -> None:
    assert (
        reader.raw(b"entries", h("00 00 00 02"))
        == h(
            "81 a4"  # 0: mode S_IFREG | 0644
            " 08 00"  # 2: flags CONTENT_TYPE, reserved
            " 00 00"  # 4: owner 0
            f" {MTIME}"  # 6: mtime_ns
            " 00 00 00 00 00 00 00 0e"  # 14: size 14
            " 00 00 00 00 00 00 00 00"  # 22: location: shard 0 << 48 | stream offset 0
            " b4 71 21 97"  # 30: CRC32C("hello, bundle\n")
            " 00 00"  # 34: content type 0 (CONTENT_TYPE)
        )
        + b"hello.txt"
    )  # 36: the name, to the end of the value


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
            " 00 00 00 00"  # 2: flags, reserved, owner 0
            f" {MTIME}"  # 6: mtime_ns
            " 00 00 00 00 00 00 00 09"  # 14: size = target length
        )
        + b"hello.txt"
        + b"link"
    )  # 22: the target (size bytes), then the name


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
            ),
        )
    ]


def test_golden_shard_file(tiny: Path, reader: DocReader) -> None:
    header = (
        b"BNDLSHRD"  # 0: magic
        + h("00 00 00 02")  # 8: format_version
        + h("00 00 00 00")  # 12: shard_index
        + reader.marker["bundle_id"]  # 16: as in COMPLETE
    )
    # The header block is padded to block_size; each record is padded to a block boundary.
    expected = header + bytes(4096 - 32) + CONTENT + bytes(4096 - len(CONTENT))
    assert (tiny / "shard-00000000").read_bytes() == expected


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


# --- version 1, and shard names past ten ----------------------------------------------------------


def _v1_contents() -> dict[str, bytes]:
    from tests.legacy_trees import _bytes

    return {rel: _bytes(rel, size, compressible) for rel, size, compressible in V1_FILES}


def test_doc_reader_reads_the_version_1_bundle_with_twelve_hex_named_shards() -> None:
    r = DocReader(V1_BUNDLE)
    try:
        assert r.version == 1 and r.marker["shard_count"] == 12
        names = sorted(p.name for p in V1_BUNDLE.glob("shard-*"))
        assert names == [f"shard-{i:08x}" for i in range(12)]
        assert "shard-0000000a" in names and "shard-0000000b" in names
        for path, content in _v1_contents().items():
            assert r.read(path) == content, path
        assert r.content_type(r.lookup("d0/f00.bin")) is None  # version 1 has none
        assert r.meta() == {}
    finally:
        r.close()


def test_the_same_tree_packed_today_is_version_2_with_decimal_shard_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(V1_EPOCH))
    src = build_v1_tree(tmp_path / "src")
    dest = tmp_path / "v2.bundle"
    pack(str(src), str(dest), PackOptions(**V1_PACK_OPTIONS))
    r = DocReader(dest)
    try:
        assert r.version == 2 and r.marker["shard_count"] == 12
        names = sorted(p.name for p in dest.glob("shard-*"))
        assert names == [f"shard-{i:08d}" for i in range(12)]
        assert "shard-00000010" in names and "shard-00000011" in names
        for path, content in _v1_contents().items():
            assert r.read(path) == content, path
    finally:
        r.close()


def test_doc_reader_reads_a_zstd_bundle(tmp_path: Path) -> None:
    dest = tmp_path / "z.bundle"
    src = build_v1_tree(tmp_path / "src")
    pack(str(src), str(dest), PackOptions(compression="zstd:5", record_size=4096, block_size=512))
    r = DocReader(dest)
    try:
        assert r.config["compression"] == 2
        assert any(v[20] == 0 for _k, v in r.items(b"records"))  # some records are zstd frames
        for path, content in _v1_contents().items():
            assert r.read(path) == content, path
    finally:
        r.close()

"""The format's numbers: versions, file and database names, magics, limits, codes and flags.

docs/format.md §1–§3 in constants; every other room of ``bundlefs.core.format`` reads them.

May import: the standard library.
"""

from __future__ import annotations

import stat as statmod

FORMAT_VERSION = 6  # what the packer writes
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6)  # what readers read (docs/format.md §7: what each added)

MARKER_NAME = "COMPLETE"

# Extended attributes a mount serves (docs/format.md, "Extended attributes").
XATTR_CRC = b"user.bundlefs.crc32c"
XATTR_USER_DATA = b"user.bundlefs.user_data"
XATTR_STATS = b"user.bundlefs.stats"  # on the root only: the daemon's counters as JSON
XATTR_BUNDLE = b"user.bundlefs.bundle"  # on the root only: the served bundle (info --json)
XATTR_CONTENT_TYPE = b"user.bundlefs.content_type"  # files with a content type (version 2)
XATTR_DIGEST = b"user.bundlefs.digest"  # files with a digest (version 5): hex
XATTR_TREE = b"user.bundlefs.tree"  # directories (version 5): their stored totals as JSON
INDEX_DIR = "index"
INDEX_FILE = "data.mdb"
SHARD_PREFIX = "shard-"

MARKER_MAGIC = b"BNDLDONE"
CONFIG_MAGIC = b"BUNDLEFS"
SHARD_MAGIC = b"BNDLSHRD"

DB_CONFIG = b"config"
DB_ENTRIES = b"entries"
DB_RECORDS = b"records"
DB_SHARDS = b"shards"
DB_OWNERS = b"owners"
DB_TYPES = b"types"  # version 2
DB_META = b"meta"  # version 2
DB_TOTALS = b"totals"  # version 5
DB_SOURCES = b"sources"  # version 6, optional: a directory source's (ctime_ns, st_ino) per file
DB_BASES = b"bases"  # version 6: the bundles whose directories hold some of the shards
V1_DBS = (DB_CONFIG, DB_ENTRIES, DB_RECORDS, DB_SHARDS, DB_OWNERS)
V2_DBS = (*V1_DBS, DB_TYPES, DB_META)
V5_DBS = (*V2_DBS, DB_TOTALS)
V6_DBS = (*V5_DBS, DB_BASES)
ALL_DBS = (*V6_DBS, DB_SOURCES)  # what a writer of this version makes (max_dbs: one more)
FIRST_V5_VERSION = 5  # the first format version with directory totals and file digests
FIRST_V6_VERSION = 6  # the first with an (optional) sources database and shards in bases
FIRST_BASES_VERSION = FIRST_V6_VERSION


def databases(version: int, *, optional: bool = False) -> tuple[bytes, ...]:
    """The named databases a bundle of ``version`` has; ``optional``: those it may lack
    instead (a reader opens each if present)."""
    if optional:
        return (DB_SOURCES,) if version >= FIRST_V6_VERSION else ()
    if version == 1:
        return V1_DBS
    if version >= FIRST_V6_VERSION:
        return V6_DBS
    return V5_DBS if version >= FIRST_V5_VERSION else V2_DBS


CONFIG_KEY = b"config"

ROOT_INO = 1

DEFAULT_BLOCK_SIZE = 4096
DEFAULT_RECORD_SIZE = 256 * 1024
DEFAULT_LARGE_FILE_THRESHOLD = 1024 * 1024
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 512, 1024 * 1024
MIN_RECORD_SIZE, MAX_RECORD_SIZE = 4096, 16 * 1024 * 1024

COMPRESSION_NONE = 0
COMPRESSION_LZ4 = 1
COMPRESSION_ZSTD = 2  # version 2
COMPRESSION_NAMES = {"none": COMPRESSION_NONE, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}
_COMPRESSIONS_OF_VERSION = {
    1: (COMPRESSION_NONE, COMPRESSION_LZ4),
    2: tuple(COMPRESSION_NAMES.values()),
    3: tuple(COMPRESSION_NAMES.values()),
    4: tuple(COMPRESSION_NAMES.values()),
    5: tuple(COMPRESSION_NAMES.values()),
    6: tuple(COMPRESSION_NAMES.values()),
}
_COMPRESSION_BY_CODE = {code: name for name, code in COMPRESSION_NAMES.items()}

MAX_ENTRIES = 2**32 - 1
MAX_SHARDS = 2**16
MAX_SHARD_STREAM = 2**48 - 1
MAX_NAME = 255
MAX_SYMLINK_TARGET = 4095
MAX_USER_DATA = 4096
MAX_OWNERS = 2**16
MAX_CONTENT_TYPES = 2**16 - 1  # the config counts them in a u16
MAX_CONTENT_TYPE = 127
MAX_META_KEYS = 1024
MAX_META_KEY = 255
MAX_META_VALUE = 65536

# Entry flags.
FLAG_LINK = 0x01
FLAG_USER_DATA = 0x02
FLAG_NLINK = 0x04
FLAG_CONTENT_TYPE = 0x08  # version 2
FLAG_DIGEST = 0x10  # version 5: the content's digest (DIGEST_NAME), DIGEST_SIZE bytes
_KNOWN_ENTRY_FLAGS = FLAG_LINK | FLAG_USER_DATA | FLAG_NLINK | FLAG_CONTENT_TYPE | FLAG_DIGEST
DIGEST_SIZE = 16
DIGEST_NAME = "sha256-128"  # hashlib.sha256(content).digest()[:16]: docs/format.md §3.3
NO_CONTENT_TYPE = -1

# Record flags.
RECORD_ZEROS = 0x01
RECORD_RAW = 0x02

# Entry kinds: the file type bits of an entry's mode.
KIND_FILE = statmod.S_IFREG
KIND_DIR = statmod.S_IFDIR
KIND_SYMLINK = statmod.S_IFLNK
# Special files (version 4, docs/format.md §3.3.2): no content; a device also has a number.
KIND_FIFO = statmod.S_IFIFO
KIND_SOCKET = statmod.S_IFSOCK
KIND_CHAR_DEVICE = statmod.S_IFCHR
KIND_BLOCK_DEVICE = statmod.S_IFBLK
DEVICE_KINDS = (KIND_CHAR_DEVICE, KIND_BLOCK_DEVICE)
SPECIAL_KINDS = (KIND_FIFO, KIND_SOCKET, *DEVICE_KINDS)
FIRST_SPECIAL_VERSION = 4  # the first format version that holds special files

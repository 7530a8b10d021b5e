# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The daemon's hottest read steps in C: a plain file's entry decode (versions 3 to 6) and a
listing's attributes of plain files, a binary search of a directory's names, a record lookup,
and lz4 decompression into a buffer of ours (straight into the bytes returned or a reply, or only
up to a prefix); and the two loops of a pack on a base that cost most per unchanged file (its
base's values parsed, its lstat compared). Compiled by setup.py as ``bundlefs.storage._native``
and reached only through ``bundlefs.storage.native``, which checks that this build matches this
source (the build defines ``BUNDLEFS_NATIVE_SHA256``, the SHA-256 of this file).

Every function here is a fast path with a way out: it returns a result only where every check the
pure-Python decoders make passes, and ``None`` otherwise, so the caller runs the Python decoder,
which raises the same ``FormatError`` it always did (or decodes what this does not: directories,
LINK entries, symlinks, special files, versions 1 and 2). The checks mirror
``bundlefs.core.format.entry``/``entry_v3``/``records``; tests/library/test_native.py compares both
paths on real bundles and on damaged values.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.string cimport memchr, memcmp

cdef extern from *:
    const char *BUNDLEFS_NATIVE_SHA256

SOURCE_SHA256 = (<bytes>BUNDLEFS_NATIVE_SHA256).decode("ascii")

# The format's constants (bundlefs/core/format/constants.py, entry.py, entry_v3.py, records.py).
cdef enum:
    KIND_MASK = 0o170000
    KIND_FILE = 0o100000
    KIND_DIR = 0o040000
    FLAG_LINK = 0x01
    FLAG_USER_DATA = 0x02
    FLAG_NLINK = 0x04
    FLAG_CONTENT_TYPE = 0x08
    FLAG_DIGEST = 0x10
    KNOWN_FLAGS = 0x1F
    LAYOUT_SIZE_WIDTH = 0x03
    LAYOUT_MTIME_NS = 0x04
    LAYOUT_OWNER = 0x08
    LAYOUT_WIDE_SHARD = 0x10
    LAYOUT_WIDE_OFFSET = 0x20
    KNOWN_LAYOUT = 0x3F
    FIRST_V3_VERSION = 3
    FIRST_V5_VERSION = 5
    DIGEST_SIZE = 16
    MAX_NAME = 255
    MAX_USER_DATA = 4096
    RECORD_ZEROS = 0x01
    RECORD_RAW = 0x02
    RECORD_VALUE_SIZE = 21
    RECORD_KEY_SIZE = 12  # >IQ

cdef uint64_t MAX_SHARD_STREAM = 0xFFFFFFFFFFFF  # 2**48 - 1

cdef inline uint64_t _be(const uint8_t *p, int width) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(width):
        v = (v << 8) | p[i]
    return v


cdef inline int _file_fixed(uint8_t layout) noexcept nogil:
    """Bytes of a plain file's fixed fields after the 4-byte prefix, for ``layout``."""
    cdef int n = (1 << (layout & LAYOUT_SIZE_WIDTH))
    n += 8 if layout & LAYOUT_MTIME_NS else 4
    n += 2 if layout & LAYOUT_OWNER else 0
    n += 2 if layout & LAYOUT_WIDE_SHARD else 1
    n += 8 if layout & LAYOUT_WIDE_OFFSET else 4
    return n + 4  # crc32c


cdef inline bint _valid_name(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    if n < 1 or n > MAX_NAME:
        return False
    if memchr(p, b'/', n) != NULL or memchr(p, 0, n) != NULL:
        return False
    if p[0] == b'.' and (n == 1 or (n == 2 and p[1] == b'.')):
        return False
    return True


cdef struct FileFields:
    uint16_t mode
    uint8_t flags
    uint64_t size, shard, offset, crc, nlink
    int64_t mtime_ns
    long owner, content_type
    Py_ssize_t user_at, user_length, digest_at, name_at


cdef bint _file_fields(const uint8_t *p, Py_ssize_t n, int version, FileFields *f) noexcept nogil:
    """Decode a plain regular file's value in the layout of versions 3 to 6 into ``f``, every
    check of ``decode_entry`` passed (the name's too); False for anything else."""
    cdef Py_ssize_t pos
    cdef uint8_t layout
    cdef int width
    if version < FIRST_V3_VERSION or n < 4:
        return False
    f.mode = p[0] << 8 | p[1]
    f.flags, layout = p[2], p[3]
    if f.mode & KIND_MASK != KIND_FILE or f.flags & ~KNOWN_FLAGS or f.flags & FLAG_LINK:
        return False
    if f.flags & FLAG_DIGEST and version < FIRST_V5_VERSION:
        return False
    if layout & ~KNOWN_LAYOUT or n < 4 + _file_fixed(layout):
        return False
    pos = 4
    width = (1 << (layout & LAYOUT_SIZE_WIDTH))
    f.size = _be(p + pos, width)
    pos += width
    if layout & LAYOUT_MTIME_NS:
        f.mtime_ns = <int64_t>_be(p + pos, 8)
        pos += 8
    else:
        f.mtime_ns = <int64_t>_be(p + pos, 4) * 1_000_000_000
        pos += 4
    f.owner = 0
    if layout & LAYOUT_OWNER:
        f.owner = <long>_be(p + pos, 2)
        pos += 2
    width = 2 if layout & LAYOUT_WIDE_SHARD else 1
    f.shard = _be(p + pos, width)
    pos += width
    width = 8 if layout & LAYOUT_WIDE_OFFSET else 4
    f.offset = _be(p + pos, width)
    pos += width
    f.crc = _be(p + pos, 4)
    pos += 4
    # offset + size > MAX_SHARD_STREAM, without overflowing 64 bits
    if f.offset > MAX_SHARD_STREAM or f.size > MAX_SHARD_STREAM - f.offset:
        return False
    f.nlink = 1
    if f.flags & FLAG_NLINK:
        if pos + 4 > n:
            return False
        f.nlink = _be(p + pos, 4)
        pos += 4
        if f.nlink < 1:
            return False
    f.content_type = -1
    if f.flags & FLAG_CONTENT_TYPE:
        if pos + 2 > n:
            return False
        f.content_type = <long>_be(p + pos, 2)
        pos += 2
    f.user_at = f.user_length = 0
    if f.flags & FLAG_USER_DATA:
        if pos + 2 > n:
            return False
        f.user_length = <Py_ssize_t>_be(p + pos, 2)
        pos += 2
        if f.user_length < 1 or f.user_length > MAX_USER_DATA or pos + f.user_length > n:
            return False
        f.user_at = pos
        pos += f.user_length
    f.digest_at = 0
    if f.flags & FLAG_DIGEST:
        if pos + DIGEST_SIZE > n:
            return False
        f.digest_at = pos
        pos += DIGEST_SIZE
    if not _valid_name(p + pos, n - pos):
        return False
    f.name_at = pos
    return True


def decode_file(entry_type, unsigned long long ino, bytes data, int version):
    """Entry ``ino`` (an ``entry_type``, i.e. ``Entry``) of a plain regular file's value in the
    layout of versions 3 to 6, every check of ``decode_entry`` passed; None for anything else."""
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef FileFields f
    if ino <= 1 or not _file_fields(p, n, version, &f):
        return None
    user_data = b""
    if f.user_length:
        user_data = PyBytes_FromStringAndSize(<const char *>p + f.user_at, f.user_length)
    digest = b""
    if f.flags & FLAG_DIGEST:
        digest = PyBytes_FromStringAndSize(<const char *>p + f.digest_at, DIGEST_SIZE)
    name = PyBytes_FromStringAndSize(<const char *>p + f.name_at, n - f.name_at)
    return entry_type(
        ino, f.mode, f.owner, f.mtime_ns, f.size, name, f.flags, f.shard, f.offset, f.crc,
        f.nlink, 0, 0, 0, b"", user_data, f.content_type, 0, digest,
    )


def file_stats(
    list values, unsigned long long first, int version, list owners, Py_ssize_t content_types
):
    """A listing's names and ``Stat`` tuples (ino, mode, nlink, uid, gid, size, mtime_ns, rdev)
    of children ``first …`` from their entry values: each plain regular file's where
    ``decode_file`` would decode it, its owner is one of ``owners`` ((uid, gid) pairs) and its
    content type one of the ``content_types`` (``IndexReader.entry``'s checks), else ``b""``
    and None, with its position in ``rest`` (the caller decodes those in full).
    (names, stats, rest)."""
    cdef Py_ssize_t count = len(values), i, n
    cdef const uint8_t *p
    cdef FileFields f
    cdef Py_ssize_t owner_count = len(owners)
    names = [b""] * count
    stats = [None] * count
    rest = []
    for i in range(count):
        value = values[i]
        if type(value) is not bytes:
            rest.append(i)
            continue
        p = <const uint8_t *>PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
        if (
            first + i <= 1
            or not _file_fields(p, n, version, &f)
            or f.owner >= owner_count
            or f.content_type >= content_types
        ):
            rest.append(i)
            continue
        uid, gid = owners[f.owner]
        names[i] = PyBytes_FromStringAndSize(<const char *>p + f.name_at, n - f.name_at)
        stats[i] = (first + i, f.mode, f.nlink, uid, gid, f.size, f.mtime_ns, 0)
    return names, stats, rest


cdef Py_ssize_t _name_at(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    """Where the name of a v3 value starts, where its prefix alone fixes that (a file, LINK
    entry, directory or special file with known flags and layout, no user data): what
    ``_entry_name_v3`` computes; -1 for anything else (then the caller asks it)."""
    cdef uint16_t kind
    cdef uint8_t flags, layout
    cdef Py_ssize_t pos
    if n < 4:
        return -1
    kind = (p[0] << 8 | p[1]) & KIND_MASK
    flags, layout = p[2], p[3]
    if flags & ~KNOWN_FLAGS or flags & FLAG_USER_DATA or layout & ~KNOWN_LAYOUT:
        return -1
    pos = 4 + (1 << (layout & LAYOUT_SIZE_WIDTH))
    pos += 8 if layout & LAYOUT_MTIME_NS else 4
    pos += 2 if layout & LAYOUT_OWNER else 0
    if kind == KIND_FILE and not flags & FLAG_LINK:
        pos += 2 if layout & LAYOUT_WIDE_SHARD else 1
        pos += 12 if layout & LAYOUT_WIDE_OFFSET else 8
        pos += 4 if flags & FLAG_NLINK else 0
        pos += 2 if flags & FLAG_CONTENT_TYPE else 0
    elif kind == KIND_FILE:
        pos += 4  # target
    elif kind == KIND_DIR:
        pos += 12  # parent, first child, nlink
    elif kind == 0o020000 or kind == 0o060000:  # character and block devices
        pos += 8
    elif kind != 0o010000 and kind != 0o140000:  # FIFO, socket: nothing; others: ask Python
        return -1
    if flags & FLAG_DIGEST:
        pos += DIGEST_SIZE
    return pos if pos <= n else -1


def decode_record(
    record_type, unsigned int shard, unsigned long long offset, bytes data,
    unsigned long long record_size, unsigned long long block_size, bint compressed_allowed,
):
    """The ``Record`` of ``data`` where every check of ``records.decode_record`` passes (with
    ``compressed_allowed``: the shard's codec is not "none"), else None."""
    cdef const uint8_t *p
    cdef uint64_t stored_offset, stored_length, length, crc
    cdef uint8_t flags
    if PyBytes_GET_SIZE(data) != RECORD_VALUE_SIZE:
        return None
    p = <const uint8_t *>PyBytes_AS_STRING(data)
    stored_offset = _be(p, 8)
    stored_length = _be(p + 8, 4)
    length = _be(p + 12, 4)
    crc = _be(p + 16, 4)
    flags = p[20]
    if flags & ~(RECORD_ZEROS | RECORD_RAW) or flags == (RECORD_ZEROS | RECORD_RAW):
        return None
    if not 1 <= length <= record_size:
        return None
    if block_size == 0 or stored_offset < block_size or stored_offset % block_size:
        return None
    if flags & RECORD_ZEROS and stored_length:
        return None
    if flags & RECORD_RAW and stored_length != length:
        return None
    if not flags and not (0 < stored_length < length):
        return None
    if not flags and not compressed_allowed:
        return None
    return record_type(shard, offset, stored_offset, stored_length, length, crc, flags)


def record_key(unsigned int shard, unsigned long long offset):
    """``keys.record_key``: the big-endian u16 shard and u64 offset."""
    cdef char buf[RECORD_KEY_SIZE]
    cdef int i
    for i in range(4):
        buf[i] = <char>((shard >> (24 - 8 * i)) & 0xFF)
    for i in range(8):
        buf[4 + i] = <char>((offset >> (56 - 8 * i)) & 0xFF)
    return PyBytes_FromStringAndSize(buf, RECORD_KEY_SIZE)


def find_record(cursor, bytes key, unsigned int shard, unsigned long long offset):
    """(value) of the record of ``shard`` holding ``offset``, positioned with ``cursor`` as
    ``IndexReader.record_at`` does, or None where that path would fail (it then reports it)."""
    cdef const uint8_t *p
    cdef unsigned int rec_shard
    cdef unsigned long long rec_offset
    if not cursor.set_range(key):
        positioned = cursor.last()
    else:
        found = cursor.key()
        positioned = True if found == key else cursor.prev()
    if not positioned:
        return None
    found = cursor.key()
    if type(found) is not bytes or PyBytes_GET_SIZE(found) != RECORD_KEY_SIZE:
        return None
    p = <const uint8_t *>PyBytes_AS_STRING(found)
    rec_shard = <unsigned int>_be(p, 4)
    rec_offset = _be(p + 4, 8)
    if rec_shard != shard or rec_offset > offset:
        return None
    return rec_offset, cursor.value()


cdef inline uint64_t _le(const uint8_t *p, int width) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(width - 1, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef enum:
    PAGE_HEADER = 16
    NODE_HEADER = 8
    P_BRANCH = 0x01
    P_LEAF = 0x02
    F_BIGDATA = 0x01
    F_SUBDATA = 0x02
    MAX_KEY = 511


def tree_page(page_type, bytes page, unsigned long long pgno, unsigned long long last_pg):
    """``pages.tree_page(page, pgno, last_pg)`` of a page outside the main database (a
    ``page_type``, i.e. ``TreePage``) where every check passes, else None."""
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(page)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(page)
    cdef unsigned int flags, lower, upper, count, i, ptr, lo, hi, nflags, ksize
    cdef Py_ssize_t start, at, dsize
    cdef unsigned long long child
    cdef bint leaf
    if size < PAGE_HEADER:
        return None
    if _le(p, 8) != pgno:
        return None
    flags, lower, upper = <unsigned int>_le(p + 10, 2), <unsigned int>_le(p + 12, 2), <unsigned int>_le(p + 14, 2)
    if flags != P_BRANCH and flags != P_LEAF:
        return None
    if lower < PAGE_HEADER or lower > upper or upper > size or lower % 2:
        return None
    leaf = flags == P_LEAF
    count = (lower - PAGE_HEADER) // 2
    if count < (1 if leaf else 2):
        return None
    keys = []
    children = []
    overflow = []
    for i in range(count):
        ptr = <unsigned int>_le(p + PAGE_HEADER + 2 * i, 2)
        if ptr < upper or ptr % 2 or ptr + NODE_HEADER > size:
            return None
        lo, hi = <unsigned int>_le(p + ptr, 2), <unsigned int>_le(p + ptr + 2, 2)
        nflags, ksize = <unsigned int>_le(p + ptr + 4, 2), <unsigned int>_le(p + ptr + 6, 2)
        start = ptr + NODE_HEADER
        if start + ksize > size or ksize > MAX_KEY or (ksize == 0 and (leaf or i > 0)):
            return None
        key = PyBytes_FromStringAndSize(<const char *>p + start, ksize)
        if i > (0 if leaf else 1) and not keys[i - 1] < key:
            return None  # out of order (a branch's first key is never compared)
        keys.append(key)
        if not leaf:
            child = lo | (<unsigned long long>hi) << 16 | (<unsigned long long>nflags) << 32
            if child < 2 or child > last_pg:
                return None
            children.append(child)
            continue
        # A leaf node's value (outside the main database: no F_SUBDATA).
        if nflags & ~(F_BIGDATA | F_SUBDATA) or nflags & F_SUBDATA:
            return None
        at = start + ksize
        dsize = lo | hi << 16
        if nflags & F_BIGDATA:
            if at + 8 > size:
                return None
            overflow.append((_le(p + at, 8), dsize))
        elif at + dsize > size:
            return None
    return page_type(leaf, keys, children, overflow, [])


cdef class CheckedPaths:
    """Whether LMDB's search for a key passes only pages ``IndexPageGuard`` has checked
    (storage/index_guard.py): LMDB's own descent from a database's root, over the index file
    mapped, through pages whose bit is set in the guard's ``sound`` bitmap. A page is sound once
    its CRC, layout and key bounds passed and it has one parent, so the descent trusts what it
    reads there; it stops at the first page that is not sound (the guard then checks the path).
    ~0.3 µs where remembering the checked key ranges cost a bisect and memory per leaf."""
    cdef object _map
    cdef const uint8_t[::1] _data
    cdef const uint8_t[::1] _sound
    cdef Py_ssize_t _page_size
    cdef unsigned long long _pages

    def __init__(self, data, bytearray sound not None, Py_ssize_t page_size):
        self._map = data
        self._data = data
        self._sound = sound
        self._page_size = page_size
        self._pages = min(<unsigned long long>(len(data) // page_size), 8 * len(sound))

    cdef bint _checked(
        self, unsigned long long pgno, int depth, const uint8_t *key, Py_ssize_t size
    ) noexcept:
        cdef const uint8_t *p
        cdef unsigned int lower, count, ptr, ksize, lo, hi, mid, at, i
        cdef Py_ssize_t common
        cdef int level, order
        for level in range(depth):
            if pgno >= self._pages or not self._sound[pgno >> 3] & (1 << (pgno & 7)):
                return False
            if level == depth - 1:
                return True  # the leaf: sound
            p = &self._data[0] + pgno * self._page_size
            lower = <unsigned int>_le(p + 12, 2)
            if _le(p + 10, 2) != P_BRANCH or lower < PAGE_HEADER + 4 or lower > self._page_size:
                return False  # checked as a branch: never here, but no read past the page
            count = (lower - PAGE_HEADER) // 2
            # The last node from the second whose key is not above ``key``, else the first:
            # mdb_node_search's choice in a branch (the first node's key is never compared).
            lo, hi, at = 1, count - 1, 0
            while lo <= hi:
                mid = (lo + hi) // 2
                ptr = <unsigned int>_le(p + PAGE_HEADER + 2 * mid, 2)
                if ptr < lower or ptr + NODE_HEADER > self._page_size:
                    return False
                ksize = <unsigned int>_le(p + ptr + 6, 2)
                if ptr + NODE_HEADER + ksize > self._page_size:
                    return False
                common = size if size < ksize else ksize
                order = memcmp(key, p + ptr + NODE_HEADER, common)
                if order == 0:
                    order = (size > ksize) - (size < ksize)
                if order >= 0:
                    at, lo = mid, mid + 1
                else:
                    hi = mid - 1
            ptr = <unsigned int>_le(p + PAGE_HEADER + 2 * at, 2)
            if ptr < lower or ptr + NODE_HEADER > self._page_size:
                return False
            pgno = _le(p + ptr, 2) | _le(p + ptr + 2, 2) << 16 | _le(p + ptr + 4, 2) << 32
        return False

    def checked(self, unsigned long long root, int depth, bytes key not None) -> bool:
        """Whether every page of LMDB's search for ``key`` from ``root`` is sound."""
        return self._checked(
            root, depth, <const uint8_t *>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key)
        )


def find_child(
    get, key_check, CheckedPaths paths, unsigned long long root, int depth, db,
    unsigned long long first, unsigned long long count, bytes name, entry_name, int version,
):
    """The inode among ``first … first+count−1`` (a directory's children, in name order) whose
    entry is named ``name``, or 0: the binary search of ``TreeModel.lookup``. ``get(key, db=db)``
    reads a value (None: missing); ``key_check(db, key)``, the page guard's check, runs before it
    unless ``paths`` shows LMDB's search for the key from ``root`` (``depth`` levels) passes only
    checked pages, never where ``key_check`` is None (nothing to check); ``entry_name(value,
    version)`` names a value whose name this cannot place itself. Returns None where a value is
    missing (the caller's path reports it)."""
    cdef long long lo = first, hi = first + count - 1, mid
    cdef const uint8_t *p
    cdef Py_ssize_t n, at
    cdef char keybuf[4]
    if version < FIRST_V3_VERSION:
        return None
    while lo <= hi:
        mid = (lo + hi) // 2
        keybuf[0] = <char>((mid >> 24) & 0xFF)
        keybuf[1] = <char>((mid >> 16) & 0xFF)
        keybuf[2] = <char>((mid >> 8) & 0xFF)
        keybuf[3] = <char>(mid & 0xFF)
        key = PyBytes_FromStringAndSize(keybuf, 4)
        if key_check is not None and (
            paths is None or not paths._checked(root, depth, <const uint8_t *>keybuf, 4)
        ):
            key_check(db, key)
        value = get(key, db=db)
        if value is None or type(value) is not bytes:
            return None
        p = <const uint8_t *>PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
        at = _name_at(p, n)
        if at < 0:
            candidate = entry_name(value, version)
        else:
            candidate = PyBytes_FromStringAndSize(<const char *>p + at, n - at)
        if candidate == name:
            return mid
        if candidate < name:
            lo = mid + 1
        else:
            hi = mid - 1
    return 0



# -- lz4 into a buffer of ours ---------------------------------------------------------------------
# python-lz4 decompresses into a scratch buffer and copies it into the bytes it returns, and it
# cannot stop at a prefix. The lz4 it carries exports the library's stable block API, so the
# functions are taken from the very module python-lz4 loaded (bind_lz4), not linked at build
# time: no lz4 headers or library are needed to build this, and both lz4 calls read the same lz4.

cdef extern from "<dlfcn.h>" nogil:
    void *dlopen(const char *filename, int flags)
    void *dlsym(void *handle, const char *symbol)
    int RTLD_NOW
    int RTLD_NOLOAD

ctypedef int (*lz4_safe_t)(const char *src, char *dst, int src_size, int dst_capacity) noexcept nogil
ctypedef int (*lz4_partial_t)(const char *src, char *dst, int src_size, int target_size,
                              int dst_capacity) noexcept nogil

ctypedef int (*lz4_version_t)() noexcept nogil

cdef lz4_safe_t _lz4_safe = NULL
cdef lz4_partial_t _lz4_partial = NULL


def bind_lz4(bytes library):
    """Take lz4's ``LZ4_decompress_safe`` and ``LZ4_decompress_safe_partial`` from ``library``
    (python-lz4's compiled module, already loaded); whether both were found."""
    global _lz4_safe, _lz4_partial
    cdef void *handle = dlopen(PyBytes_AS_STRING(library), RTLD_NOW | RTLD_NOLOAD)
    if handle == NULL:
        return False
    cdef void *safe = dlsym(handle, b"LZ4_decompress_safe")
    cdef void *partial = dlsym(handle, b"LZ4_decompress_safe_partial")
    cdef void *version = dlsym(handle, b"LZ4_versionNumber")
    if safe == NULL or partial == NULL or version == NULL:
        return False
    # lz4 before 1.9.2 could read out of bounds in a partial decode (its changelog): the whole
    # record always, then, a prefix never (a system lz4 a python-lz4 build links to may be old).
    if (<lz4_version_t>version)() < 10902:
        partial = NULL
    _lz4_safe, _lz4_partial = <lz4_safe_t>safe, <lz4_partial_t>partial
    return True


def lz4_decompress(bytes stored not None, Py_ssize_t length, Py_ssize_t upto):
    """The lz4 block ``stored`` of ``length`` bytes decompressed, as new bytes: all of it
    (checked to be exactly ``length``) when ``upto >= length`` or the lz4 is older than 1.9.2,
    else exactly its first ``upto`` bytes, decoding no further; None where lz4 finds the block malformed or shorter than that
    (the caller reports the record)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(stored)
    cdef const char *src = PyBytes_AS_STRING(stored)
    cdef int n
    if _lz4_safe == NULL or length <= 0 or length > 0x7FFFFFFF or size > 0x7FFFFFFF or upto <= 0:
        return None
    cdef Py_ssize_t want = length if upto >= length or _lz4_partial == NULL else upto
    out = PyBytes_FromStringAndSize(NULL, want)
    cdef char *dst = PyBytes_AS_STRING(out)
    if want == length:
        with nogil:
            n = _lz4_safe(src, dst, <int>size, <int>length)
    else:
        # A destination of exactly ``want`` bytes: lz4 (1.9 and later) stops there, and no
        # version writes past it (the "safe" guarantee); one that cannot stop there fails, and
        # the caller decompresses the whole record instead.
        with nogil:
            n = _lz4_partial(src, dst, <int>size, <int>want, <int>want)
    return out if n == want else None


def lz4_decompress_into(bytes stored not None, unsigned char[::1] view not None):
    """Decompress the lz4 block ``stored`` into ``view``, which it must fill exactly; whether it
    did (False: malformed, or another length)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(stored)
    cdef const char *src = PyBytes_AS_STRING(stored)
    cdef Py_ssize_t length = view.shape[0]
    cdef int n
    if _lz4_safe == NULL or length <= 0 or length > 0x7FFFFFFF or size > 0x7FFFFFFF:
        return False
    with nogil:
        n = _lz4_safe(src, <char *>&view[0], <int>size, <int>length)
    return n == length


# -- a pack on a base ------------------------------------------------------------------------------
# A pack on a base with nothing changed spends most of its time on two loops per file: parsing
# the base's entry values (``fmt.reusable_file``) and lstat'ing each source file beside them
# (``DirectorySource.probed_known``); py-spy put ~19 % and ~35 % of such a pack of 100,000
# files in them, Python's share of each several times the work done.

from posix.stat cimport struct_stat, S_ISREG
from libc.stdlib cimport malloc, free

cdef extern from "<fcntl.h>" nogil:
    int fstatat(int dirfd, const char *pathname, struct_stat *buf, int flags)
    int AT_SYMLINK_NOFOLLOW

cdef enum:
    COPYABLE_FLAGS = FLAG_CONTENT_TYPE | FLAG_DIGEST

cdef uint64_t U32_END = 0x100000000
cdef int64_t WHOLE_SECONDS_END = <int64_t>U32_END * 1000000000  # entry_v3's


cdef inline int _width_code(uint64_t n) noexcept nogil:
    """``entry_v3._width_code``: the narrowest of the four widths that holds ``n``."""
    return 0 if n < 0x100 else 1 if n < 0x10000 else 2 if n < U32_END else 3


cdef bint _narrowest(const uint8_t *p, FileFields *f) noexcept nogil:
    """Whether the fields ``_file_fields`` decoded from ``p`` are what ``_encode_entry_v3``
    writes back byte for byte: flags only CONTENT_TYPE and DIGEST, every width the narrowest
    (``entry_v3.reusable_file``'s checks)."""
    cdef uint8_t layout = p[3]
    if f.flags & ~COPYABLE_FLAGS or _width_code(f.size) != layout & LAYOUT_SIZE_WIDTH:
        return False
    if layout & LAYOUT_MTIME_NS:
        if f.mtime_ns % 1000000000 == 0 and 0 <= f.mtime_ns < WHOLE_SECONDS_END:
            return False  # the encoder writes whole seconds in range as a u32
    if layout & LAYOUT_OWNER and f.owner == 0:
        return False
    if layout & LAYOUT_WIDE_SHARD and f.shard <= 0xFF:
        return False
    if layout & LAYOUT_WIDE_OFFSET and f.offset < U32_END:
        return False
    return True


def base_files(
    list values, unsigned long long first, int version, long long settled_before,
    unsigned long long shard_count, list types, long owner_count, dict old, dict copyable,
):
    """``packing.delta.DeltaSource._old_children``'s loop over a directory's entry ``values``
    (inodes ``first …``): each plain file's value that ``fmt.reusable_file`` accepts put in
    ``old`` by name as (inode, value), and where it is settled before ``settled_before`` and its
    indexes are in range, in ``copyable`` as ((mode, size, mtime_ns), (value, owner,
    content_type, media_type, shard)); the positions of the others returned (the caller names
    them with ``fmt.entry_name``). Stricter than ``reusable_file`` where a value is damaged (its
    name is checked too): such a value goes to the caller."""
    cdef Py_ssize_t count = len(values), i, n
    cdef Py_ssize_t type_count = len(types)
    cdef const uint8_t *p
    cdef FileFields f
    rest = []
    for i in range(count):
        value = values[i]
        if type(value) is not bytes:
            rest.append(i)
            continue
        p = <const uint8_t *>PyBytes_AS_STRING(value)
        n = PyBytes_GET_SIZE(value)
        if not _file_fields(p, n, version, &f) or not _narrowest(p, &f):
            rest.append(i)
            continue
        name = PyBytes_FromStringAndSize(<const char *>p + f.name_at, n - f.name_at)
        old[name] = (first + i, value)
        if (
            f.size
            and f.mtime_ns < settled_before
            and f.shard < shard_count
            and f.content_type < type_count
            and f.owner < owner_count
        ):
            media_type = None if f.content_type < 0 else types[f.content_type]
            copyable[name] = (
                (f.mode, f.size, f.mtime_ns), (value, f.owner, f.content_type, media_type, f.shard)
            )
    return rest


cdef class FileStat:
    """An lstat's fields under ``os.stat_result``'s names (what the packer's ``Stat`` reads,
    and the ctime a source record keeps), made by ``known_files``."""

    cdef readonly long long st_mode, st_nlink, st_uid, st_gid, st_size, st_rdev
    cdef readonly unsigned long long st_ino, st_dev
    cdef readonly long long st_atime_ns, st_mtime_ns, st_ctime_ns

    @property
    def st_mtime(self):
        return self.st_mtime_ns / 1e9

    def __repr__(self):
        return (
            f"FileStat(st_mode={self.st_mode:o}, st_ino={self.st_ino}, st_size={self.st_size}, "
            f"st_mtime_ns={self.st_mtime_ns})"
        )


cdef inline int64_t _ns(long long sec, long nsec) noexcept nogil:
    return sec * 1000000000 + nsec


def known_files(int dir_fd, list children, known):
    """``DirectorySource.probed_known``'s lstat loop over ``children`` ((name, rel) pairs of the
    directory open at ``dir_fd``): each child ``known`` (a mapping) holds as ((mode, size,
    mtime_ns), reuse) is lstat'ed by name, the GIL released, and when its lstat is a regular
    file with that mode, size and mtime and one link, it goes to ``quick`` as (rel, name,
    FileStat, reuse); the others, those that could not be lstat'ed too, to ``rest`` as (name,
    rel), each list in the order of ``children``. (quick, rest)."""
    cdef Py_ssize_t count = len(children), i
    cdef const char **names = <const char **>malloc(max(count, 1) * sizeof(char *))
    cdef struct_stat *stats = <struct_stat *>malloc(max(count, 1) * sizeof(struct_stat))
    cdef int64_t *expect = <int64_t *>malloc(max(count, 1) * 3 * sizeof(int64_t))
    cdef char *matched = <char *>malloc(max(count, 1))
    cdef struct_stat *st
    cdef FileStat out
    found_at = [None] * count
    quick, rest = [], []
    if names == NULL or stats == NULL or expect == NULL or matched == NULL:
        free(names); free(stats); free(expect); free(matched)
        raise MemoryError()
    try:
        for i in range(count):
            name = children[i][0]
            found = known.get(name)
            matched[i] = 0
            names[i] = NULL
            if found is None or type(name) is not bytes:
                continue
            if memchr(PyBytes_AS_STRING(name), 0, PyBytes_GET_SIZE(name)) != NULL:
                continue  # no file's name: the C string would name another (probed: refused)
            mode, size, mtime_ns = found[0]
            if not (0 <= mode < 2**32 and 0 <= size < 2**63 and -2**63 <= mtime_ns < 2**63):
                continue
            names[i] = PyBytes_AS_STRING(name)  # children holds the name: alive till the end
            expect[3 * i], expect[3 * i + 1], expect[3 * i + 2] = mode, size, mtime_ns
            found_at[i] = found
        with nogil:
            for i in range(count):
                if names[i] == NULL:
                    continue
                st = &stats[i]
                if fstatat(dir_fd, names[i], st, AT_SYMLINK_NOFOLLOW) != 0:
                    continue
                matched[i] = (
                    S_ISREG(st.st_mode)
                    and st.st_nlink == 1
                    and st.st_mode == expect[3 * i]
                    and st.st_size == expect[3 * i + 1]
                    and _ns(st.st_mtim.tv_sec, st.st_mtim.tv_nsec) == expect[3 * i + 2]
                )
        for i in range(count):
            child = children[i]
            if not matched[i]:
                rest.append(child)
                continue
            st = &stats[i]
            out = FileStat.__new__(FileStat)
            out.st_mode, out.st_nlink, out.st_uid, out.st_gid = (
                st.st_mode, st.st_nlink, st.st_uid, st.st_gid
            )
            out.st_size, out.st_rdev, out.st_ino, out.st_dev = (
                st.st_size, st.st_rdev, st.st_ino, st.st_dev
            )
            out.st_atime_ns = _ns(st.st_atim.tv_sec, st.st_atim.tv_nsec)
            out.st_mtime_ns = _ns(st.st_mtim.tv_sec, st.st_mtim.tv_nsec)
            out.st_ctime_ns = _ns(st.st_ctim.tv_sec, st.st_ctim.tv_nsec)
            quick.append((child[1], child[0], out, found_at[i][1]))
    finally:
        free(names); free(stats); free(expect); free(matched)
    return quick, rest

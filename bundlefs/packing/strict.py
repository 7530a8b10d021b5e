"""``pack --base OLD --check strict``: a source file's stat against the source record OLD keeps
of it (format version 6, the ``sources`` database: the ctime and inode number its pack saw).

A file is trusted only when both agree and that ctime lies before OLD's racy window as its mtime
does; a file OLD has no record of (an earlier version, another writer, a source other than a
directory), or one whose record cannot be read, is not: it is compared by content, never trusted.

May import: ``bundlefs.core``, ``bundlefs.errors``, ``bundlefs.storage``.
"""

from __future__ import annotations

from bundlefs.core import format as fmt
from bundlefs.errors import BundleError
from bundlefs.storage.index import IndexReader
from bundlefs.storage.source_records import source_record


def same_source(reader: IndexReader, ino: int, st: object, racy_limit: int) -> bool:
    """Whether ``st`` has the ctime and inode number OLD (``reader``) recorded for its file
    ``ino``, that ctime before ``racy_limit``. Only a directory's ``os.stat_result`` has a ctime:
    any other status never matches."""
    try:
        recorded = source_record(reader, ino)
    except BundleError:
        return False
    if recorded is None:
        return False
    here = (getattr(st, "st_ctime_ns", None), getattr(st, "st_ino", None))
    return here == recorded and recorded[0] < racy_limit


def unrecorded(reader: IndexReader, entry: fmt.Entry) -> bool:
    """Whether OLD has no (readable) source record of ``entry``."""
    try:
        return source_record(reader, entry.ino) is None
    except BundleError:
        return True

"""The SQLite tables a ``SyntheticTree`` keeps its entries in (``synthetic``), and their
statements: ``node`` (an entry by its parent directory's number and its name; a directory's own
number, a file's content number, the status of anything else) and ``content`` (where a file's
bytes went, its status, what its first bytes say, and how many names it has now).

A private temporary database: SQLite's own file (in ``SQLITE_TMPDIR``, ``TMPDIR`` or
``/var/tmp``), removed as it is opened, so a killed pack leaves none; no journal, no sync, one
transaction: pages beyond the cache (``CACHE_KIB``) spill to the file. SQLite's failures (a full
disk) are ``PackError``.

May import: ``bundlefs.errors``.
"""

from __future__ import annotations

import contextlib
import sqlite3

from bundlefs.errors import PackError

CACHE_KIB = 8192  # SQLite's page cache: what the tree costs in memory, however large it grows
DIR, FILE, SYMLINK, SPECIAL = 0, 1, 2, 3  # the node table's kinds

_SCHEMA = (
    """CREATE TABLE node (
        parent INTEGER NOT NULL,  -- the number of the directory holding it
        name BLOB NOT NULL,
        kind INTEGER NOT NULL,    -- DIR, FILE, SYMLINK, SPECIAL
        ref INTEGER,              -- a directory's own number, a file's content number
        mode INTEGER, uid INTEGER, gid INTEGER, mtime INTEGER, size INTEGER, rdev INTEGER,
        target BLOB,              -- a symlink's
        PRIMARY KEY (parent, name)
    ) WITHOUT ROWID""",
    """CREATE TABLE content (
        id INTEGER PRIMARY KEY,
        names INTEGER NOT NULL,   -- the names it has in the tree now
        shard INTEGER, pos INTEGER, size INTEGER, crc INTEGER, digest BLOB, ctype TEXT,
        sniffed TEXT, text INTEGER,  -- content_types.HeadFacts of its first bytes
        mode INTEGER, uid INTEGER, gid INTEGER, mtime INTEGER
    )""",
)
FIND = "SELECT kind, ref FROM node WHERE parent = ? AND name = ?"
ANY_CHILD = "SELECT 1 FROM node WHERE parent = ? LIMIT 1"
PUT = "INSERT OR REPLACE INTO node VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
REDESCRIBE = (
    "UPDATE node SET mode = ?, uid = ?, gid = ?, mtime = ?, size = ? WHERE parent = ? AND name = ?"
)
STORED = "INSERT INTO content VALUES (NULL, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
NAMES = "UPDATE content SET names = names + ? WHERE id = ?"
NODE = (
    "SELECT kind, ref, mode, uid, gid, mtime, size, rdev, target FROM node "
    "WHERE parent = ? AND name = ?"
)
LIST = (
    "SELECT n.name, n.kind, n.ref, n.mode, n.uid, n.gid, n.mtime, n.size, n.rdev, n.target, "
    "c.names, c.shard, c.pos, c.size, c.crc, c.digest, c.ctype, c.sniffed, c.text, "
    "c.mode, c.uid, c.gid, c.mtime "
    "FROM node AS n LEFT JOIN content AS c ON n.kind = 1 AND c.id = n.ref "
    "WHERE n.parent = ? ORDER BY n.name"
)


class TreeTable:
    """The tree's two SQLite tables in a private temporary file; SQLite's failure (a full disk)
    is a ``PackError``."""

    def __init__(self) -> None:
        try:
            # "": a private temporary database.
            self._db = sqlite3.connect("", isolation_level=None, check_same_thread=False)
            for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = -{CACHE_KIB}"):
                self._db.execute(f"PRAGMA {pragma}")
            for statement in _SCHEMA:
                self._db.execute(statement)
            self._db.execute("BEGIN")  # one transaction: pages beyond the cache spill to the file
        except sqlite3.Error as e:
            raise PackError(f"cannot keep the source's tree in a temporary file: {e}") from e

    def run(self, sql: str, args: tuple[object, ...]) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as e:
            raise PackError(f"cannot keep the source's tree in a temporary file: {e}") from e

    def one(self, sql: str, args: tuple[object, ...]) -> tuple | None:
        return self.run(sql, args).fetchone()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

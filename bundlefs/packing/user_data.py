"""Per-file user metadata from a JSON Lines file: ``bundlefs pack --user-data FILE.jsonl``.

Each line is a JSON object naming a file by its path below the source root — under ``file_name``,
as Hugging Face's ``metadata.jsonl`` does, or ``path`` — and everything else on the line is that
file's metadata, stored in the entry's USER_DATA as compact JSON with sorted keys (so the same
input packs to the same bytes). The whole file is read before packing starts: every line is
checked up front, and a mistake names its line instead of failing halfway through a pack.

May import: the standard library, ``bundlefs.core``, ``bundlefs.errors``.
"""

from __future__ import annotations

import json
import os

from bundlefs.core import format as fmt
from bundlefs.errors import PackError

PATH_KEYS = ("file_name", "path")


class UserDataFile:
    """Path -> encoded metadata, callable as the packer's ``user_data`` hook."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.by_path: dict[bytes, bytes] = {}
        self.used: set[bytes] = set()
        try:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        self._add(number, line)
        except OSError as e:
            raise PackError(f"cannot read the user data file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise PackError(f"the user data file {path} is not UTF-8 text") from None

    def _add(self, number: int, line: str) -> None:
        where = f"{self.path}, line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise PackError(f"{where} is not JSON: {e.msg}") from None
        if not isinstance(item, dict):
            raise PackError(f"{where} is not a JSON object")
        keys = [k for k in PATH_KEYS if k in item]
        if len(keys) != 1 or not isinstance(item[keys[0]], str) or not item[keys[0]]:
            raise PackError(f"{where} must name its file in exactly one of: file_name, path")
        rel = os.fsencode(item.pop(keys[0]).strip("/"))
        if rel in self.by_path:
            raise PackError(f"{where} names {os.fsdecode(rel)!r} a second time")
        data = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        encoded = data.encode()
        if len(encoded) > fmt.MAX_USER_DATA:
            raise PackError(
                f"{where}: the metadata is {len(encoded)} bytes as JSON, over the "
                f"{fmt.MAX_USER_DATA} a file can hold"
            )
        if item:
            self.by_path[rel] = encoded

    def __call__(self, rel: bytes, _st: object) -> bytes | None:
        data = self.by_path.get(rel)
        if data is not None:
            self.used.add(rel)
        return data

    def unused(self) -> list[str]:
        """Paths the file named that the pack did not meet (typos, excluded or skipped files)."""
        return sorted(os.fsdecode(p) for p in self.by_path.keys() - self.used)

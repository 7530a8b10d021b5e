"""Building damaged and hostile bundles, and probing them in a disposable subprocess.

Two kinds of bad bundle:
- *damaged*: bytes of a shard, the index or the marker changed in place (bit rot, truncation).
  The index checksum in ``COMPLETE`` catches any change to ``index/data.mdb``.
- *hostile*: index values rewritten through LMDB itself and the marker re-sealed with the new
  index size and CRC (``forge``), as someone making a bundle on purpose would. The LMDB file is
  well formed and its checksum matches, so the forged values reach the value validators.

A ``Prober`` runs every read of a bundle — ``Bundle`` open/walk/lookup/read/readlink, ``verify``,
``extract`` — in a worker subprocess with an address-space limit and a time limit per case, so a
signal (SIGBUS, SIGSEGV), a hang or an unbounded allocation is reported as a failure of that case
instead of killing pytest. The worker reports *violations*: an exception that is not a
``BundleError``, wrong bytes, an extract that wrote outside DEST, or a ``verify`` that calls a
bundle intact although reading it failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import lmdb

from bundlefs.core import format as fmt
from bundlefs.core.checksum import crc32c
from bundlefs.core.format import pages

# --- byte-level damage ----------------------------------------------------------------------------


def damage(path: str | os.PathLike, op: str, offset: int, length: int = 1, byte: int = 0) -> None:
    """Damage a file in place: ``flip`` bits, ``overwrite`` with a byte, ``truncate``, ``extend``.

    ``offset`` is taken modulo the file size (so any integer names a position in the file).
    """
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if op == "truncate":
            f.truncate(offset % (size + 1) if size else 0)
            return
        if op == "extend":
            f.seek(0, os.SEEK_END)
            f.write(bytes([byte]) * length)
            return
        if not size:
            return
        start = offset % size
        f.seek(start)
        old = f.read(length)
        new = bytes(b ^ (byte or 0xFF) for b in old) if op == "flip" else bytes([byte]) * len(old)
        f.seek(start)
        f.write(new)


# --- hostile rewrites of index values -------------------------------------------------------------


def read_values(bundle: str | os.PathLike, db: bytes) -> dict[bytes, bytes]:
    """Every key → value of one index database (through LMDB, no validation)."""
    env = lmdb.open(os.path.join(bundle, fmt.INDEX_DIR), readonly=True, lock=False, max_dbs=10)
    try:
        with env.begin() as txn:
            return dict(txn.cursor(db=env.open_db(db, txn=txn, create=False)))
    finally:
        env.close()


def reseal(bundle: str | os.PathLike) -> None:
    """Rewrite ``COMPLETE`` so it vouches for the index as it is now (size and CRC), and from
    version 6 the page table (docs/format.md §3.10) too."""
    marker_path = os.path.join(bundle, fmt.MARKER_NAME)
    with open(marker_path, "rb") as f:
        old = fmt.decode_marker(f.read(), crc32c)
    with open(os.path.join(bundle, fmt.INDEX_DIR, fmt.INDEX_FILE), "rb") as f:
        index = f.read()
    marker = fmt.Marker(
        old.bundle_id, len(index), crc32c(index), old.shard_count, old.format_version
    )
    with open(marker_path, "wb") as f:
        f.write(fmt.encode_marker(marker, crc32c))
    if old.format_version >= pages.FIRST_PAGE_CHECK_VERSION:
        page_size = pages.lmdb_page_size(index)
        if not 512 <= page_size <= 65536 or page_size & (page_size - 1):
            page_size = 4096  # a damaged meta page: the table cannot agree with it anyway
        table = pages.encode_page_table(
            page_size, old.bundle_id, pages.page_crcs(index, page_size, crc32c), crc32c
        )
        with open(os.path.join(bundle, fmt.INDEX_DIR, pages.PAGES_FILE), "wb") as f:
            f.write(table)


def forge(
    bundle: str | os.PathLike,
    puts: dict[tuple[bytes, bytes], bytes] | None = None,
    deletes: list[tuple[bytes, bytes]] = (),
) -> None:
    """Write ``puts`` {(db, key): value} and ``deletes`` [(db, key)] into the index, then reseal.

    The index is rewritten by LMDB itself, so it stays a well-formed LMDB file: only the values
    are hostile. Any ``lock.mdb`` LMDB leaves behind is removed (readers ignore it anyway).
    """
    index_dir = os.path.join(bundle, fmt.INDEX_DIR)
    env = lmdb.open(index_dir, lock=False, max_dbs=16, map_size=1 << 30)
    try:
        with env.begin(write=True) as txn:
            for db, key in deletes:
                txn.delete(key, db=env.open_db(db, txn=txn, create=False))
            for (db, key), value in (puts or {}).items():
                txn.put(key, value, db=env.open_db(db, txn=txn, create=False))
        env.sync(True)
    finally:
        env.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(index_dir, "lock.mdb"))
    reseal(bundle)


def version_of(bundle: str | os.PathLike) -> int:
    """The format version ``COMPLETE`` says the bundle has: how its values are laid out."""
    with open(os.path.join(bundle, fmt.MARKER_NAME), "rb") as f:
        return fmt.decode_marker(f.read(), crc32c).format_version


def entry_of(bundle: str | os.PathLike, ino: int) -> fmt.Entry:
    value = read_values(bundle, fmt.DB_ENTRIES)[fmt.entry_key(ino)]
    return fmt.decode_entry(ino, value, version_of(bundle))


def find_entry(bundle: str | os.PathLike, predicate: Callable[[fmt.Entry], bool]) -> fmt.Entry:
    """The first entry (by inode number) that satisfies ``predicate``."""
    version = version_of(bundle)
    for key, value in sorted(read_values(bundle, fmt.DB_ENTRIES).items()):
        entry = fmt.decode_entry(fmt.decode_entry_key(key), value, version)
        if predicate(entry):
            return entry
    raise LookupError("no such entry in the bundle")


def entry_put(
    entry: fmt.Entry, *, version: int = fmt.FORMAT_VERSION, **changes
) -> dict[tuple[bytes, bytes], bytes]:
    """A ``forge`` put replacing ``entry`` with ``changes`` applied (fields of ``fmt.Entry``),
    encoded in ``version``'s layout: the bundle's (``version_of``)."""
    forged = dataclasses.replace(entry, **changes)
    return {(fmt.DB_ENTRIES, fmt.entry_key(entry.ino)): fmt.encode_entry(forged, version)}


def raw_entry_put(ino: int, value: bytes) -> dict[tuple[bytes, bytes], bytes]:
    return {(fmt.DB_ENTRIES, fmt.entry_key(ino)): value}


def patch(value: bytes, offset: int, data: bytes) -> bytes:
    return value[:offset] + data + value[offset + len(data) :]


def optional_parts_at(entry: fmt.Entry, version: int) -> int:
    """Where the optional parts (NLINK, CONTENT_TYPE, USER_DATA) begin in ``entry``'s value:
    after its header and its kind's fixed part (docs/format.md §3.3)."""
    bare = dataclasses.replace(
        entry,
        name=b"",
        flags=entry.flags & fmt.FLAG_LINK,
        content_type=fmt.NO_CONTENT_TYPE,
        user_data=b"",
    )
    return len(fmt.encode_entry(bare, version))


def entry_with_size(value: bytes, size: int, version: int, width: int | None = None) -> bytes:
    """An entry value whose size field says ``size``, nothing else changed: the u64 at offset 14
    in versions 1 and 2; in version 3 a field of ``width`` bytes (default: the narrowest that
    holds ``size``) and the layout byte saying so (§3.3.1)."""
    if version < 3:
        return patch(value, 14, struct.pack(">Q", size))
    widths = (1, 2, 4, 8)
    old = widths[value[3] & fmt.LAYOUT_SIZE_WIDTH]
    if width is None:
        width = next(w for w in widths if size < 2 ** (8 * w))
    layout = value[3] & ~fmt.LAYOUT_SIZE_WIDTH | widths.index(width)
    return value[:3] + bytes([layout]) + size.to_bytes(width, "big") + value[4 + old :]


def config_of(bundle: str | os.PathLike) -> fmt.Config:
    return fmt.decode_config(read_values(bundle, fmt.DB_CONFIG)[fmt.CONFIG_KEY])


def config_put(value: bytes) -> dict[tuple[bytes, bytes], bytes]:
    return {(fmt.DB_CONFIG, fmt.CONFIG_KEY): value}


def shard_info_of(bundle: str | os.PathLike, shard: int) -> fmt.ShardInfo:
    """Shard ``shard``'s descriptor, as the bundle's version lays it out."""
    value = read_values(bundle, fmt.DB_SHARDS)[fmt.shard_key(shard)]
    return fmt.decode_shard_info(value, version_of(bundle), shard, config_of(bundle))


def shard_put(bundle: str | os.PathLike, shard: int, **changes) -> dict[tuple[bytes, bytes], bytes]:
    """A ``forge`` put replacing shard ``shard``'s descriptor with ``changes`` applied (fields of
    ``fmt.ShardInfo``), in the bundle's version's layout."""
    forged = dataclasses.replace(shard_info_of(bundle, shard), **changes)
    value = fmt.encode_shard_info(forged, version_of(bundle), shard)
    return {(fmt.DB_SHARDS, fmt.shard_key(shard)): value}


def records_of(bundle: str | os.PathLike) -> list[fmt.Record]:
    config = config_of(bundle)
    codecs: dict[int, int] = {}
    out = []
    for key, value in sorted(read_values(bundle, fmt.DB_RECORDS).items()):
        shard, offset = fmt.decode_record_key(key)
        if shard not in codecs:
            codecs[shard] = shard_info_of(bundle, shard).codec
        out.append(fmt.decode_record(shard, offset, value, config, codecs[shard]))
    return out


def record_put(record: fmt.Record, **changes) -> dict[tuple[bytes, bytes], bytes]:
    forged = dataclasses.replace(record, **changes)
    key = fmt.record_key(record.shard, record.offset)
    return {(fmt.DB_RECORDS, key): fmt.encode_record(forged)}


U32 = struct.Struct(">I")


# --- the probe: every reader, in a disposable worker process --------------------------------------

WORKER_MEMORY_LIMIT = (
    1024 * 1024 * 1024
)  # address space; far above what reading a test bundle needs
CASE_TIMEOUT = 30.0


def _probe(bundle_path: str, source: str, work: str, strict: bool | str, seed: int) -> dict:
    """Read everything every way; returns {"violations": [...], "outcomes": {...}}."""
    from bundlefs import Bundle
    from bundlefs.errors import BundleError, CorruptDataError
    from bundlefs.read.extract import extract
    from bundlefs.read.verify import verify

    violations: list[str] = []
    outcomes: dict[str, str] = {}
    rng = random.Random(seed)
    src = os.fsencode(source)

    def expected(rel: bytes) -> bytes | None:
        path = os.path.join(src, rel)
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    def guarded(what: str, fn, *args, **kwargs):
        """Run one read; a BundleError is a documented failure, anything else a violation."""
        try:
            return True, fn(*args, **kwargs)
        except BundleError as e:
            outcomes[what] = type(e).__name__
            return False, e
        except BaseException as e:  # noqa: BLE001 - anything else is what we are looking for
            violations.append(f"{what}: unexpected {type(e).__name__}: {e}\n" + _tb())
            return False, e

    read_failed: list[str] = []
    corrupt: list[str] = []
    ok, bundle = guarded("open", Bundle, bundle_path)
    if ok:
        with bundle:
            files: list[bytes] = []
            ok, tree = guarded("walk", lambda: list(bundle.walk(b"")))
            if ok:
                for top, _dirs, names in tree:
                    for name in names:
                        files.append(os.path.join(top, name) if top else name)
            guarded("listings", _listings_agree, bundle.tree, violations)
            # Every source file by path (binary-search lookups), then what the walk found.
            wanted = sorted(set(_source_files(src)) | set(files))
            for rel in wanted:
                ok, entry = guarded(f"lookup {rel!r}", bundle.resolve, rel, follow_symlinks=False)
                if not ok:
                    continue
                if entry.is_symlink:
                    guarded(f"readlink {rel!r}", bundle.readlink, rel)
                    guarded(f"follow {rel!r}", bundle.stat, rel)  # dangling: EntryNotFound
                    continue
                guarded(f"stat {rel!r}", bundle.lstat, rel)
                if not entry.is_file:
                    continue
                want = expected(rel)
                ok, data = guarded(f"read {rel!r}", bundle.read, rel)
                if not ok:
                    read_failed.append(os.fsdecode(rel))
                    if isinstance(data, CorruptDataError):
                        corrupt.append(os.fsdecode(rel))
                    continue
                whole_ok = want is not None and data == want
                if want is not None and not whole_ok and strict in (True, "whole"):
                    violations.append(f"wrong bytes reading {rel!r} ({len(data)} bytes)")
                # Partial reads are checked by record CRCs, not the file CRC: compare them too.
                for _ in range(3):
                    if not entry.size:
                        break
                    off = rng.randrange(entry.size)
                    n = rng.randint(1, 40_000)
                    ok, part = guarded(f"read_at {rel!r}", bundle.content.read_at, entry, off, n)
                    checked = (
                        ok
                        and want is not None
                        and (strict is True or strict == "whole" and whole_ok)
                    )
                    if checked and part != want[off : off + n]:
                        violations.append(f"wrong bytes reading {rel!r} at {off}+{n}")
    else:
        read_failed.append("<open>")

    ok, report = guarded("verify", verify, bundle_path)
    if ok:
        outcomes["verify"] = "ok" if report.ok else f"{len(report.problems)} problems"
        if report.ok and read_failed:
            violations.append(f"verify says intact but these failed to read: {read_failed[:5]}")
        # A file that failed its checksum must be named, unless the damage stopped the scan
        # before the files (an unreadable index or descriptor).
        stopped = any(p.kind in ("index", "config") for p in report.problems)
        missing = [p for p in corrupt if p not in report.damaged_files]
        if strict is True and missing and not stopped:
            violations.append(f"verify does not name damaged files {missing[:5]}")

    dest = os.path.join(work, "dest")
    before = set(os.listdir(work))
    ok, bundle = guarded("extract-open", Bundle, bundle_path)
    if ok:
        with bundle:
            ok, summary = guarded("extract", extract, bundle, dest)
        if os.path.isdir(dest):
            violations += _check_extracted(dest, expected, strict)
    if set(os.listdir(work)) - before - {"dest"}:
        violations.append("extract wrote outside DEST")
    shutil.rmtree(dest, ignore_errors=True)
    return {"violations": violations, "outcomes": outcomes}


def _listings_agree(tree, violations: list[str]) -> None:
    """A plain listing (``TreeModel.dirents``, which reads names and modes without decoding
    whole entries) must give what ``children`` gives wherever both answer, and never crash."""
    from bundlefs.errors import BundleError

    stack, seen = [tree.root], 0
    while stack and seen < 200:  # a forged cycle must not loop
        directory = stack.pop()
        seen += 1
        try:
            kids = list(tree.children(directory))
        except BundleError:
            kids = None
        try:
            got = tree.dirents(directory, 0, directory.size)
        except BundleError:
            got = None
        if kids is None:
            continue
        if got is not None:
            want = ([n for n, _ in kids], [e.ino for _, e in kids], [e.mode for _, e in kids])
            if tuple(got) != tuple(want):
                violations.append(f"the plain listing of directory {directory.ino} is wrong")
        try:
            names, stats = tree.dirent_stats(directory, 0, directory.size)
        except BundleError:
            names = None
        if names is not None:
            want_stats = [
                (e.ino, e.mode, e.nlink, *tree.owner(e), e.size, e.mtime_ns, e.rdev)
                for _, e in kids
            ]
            if names != [n for n, _ in kids] or stats != want_stats:
                violations.append(f"the attributes listed in directory {directory.ino} are wrong")
        stack += [entry for _name, entry in kids if entry.is_dir]


def _check_extracted(dest: str, expected: Callable[[bytes], bytes | None], strict: bool) -> list:
    out = []
    root = os.fsencode(dest)
    for top, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(top, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # a symlink, or a special file a forged entry made (it has no bytes)
            rel = os.path.relpath(path, root)
            want = expected(rel)
            with open(path, "rb") as f:
                got = f.read()
            if want is not None and got != want and strict in (True, "whole"):
                out.append(f"extract wrote wrong bytes to {rel!r}")
    return out


def _source_files(src: bytes) -> list[bytes]:
    out = []
    for top, _dirs, names in os.walk(src):
        for name in names:
            out.append(os.path.relpath(os.path.join(top, name), src))
    return out


def _tb() -> str:
    return "".join(traceback.format_exc(limit=-6))


def worker_main() -> None:
    """The worker: one JSON case per stdin line, one JSON result per stdout line."""
    limit = int(os.environ.get("HOSTILE_MEMORY_LIMIT", WORKER_MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    for line in sys.stdin:
        case = json.loads(line)
        result = _probe(**case)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result["peak_rss"] = peak
        out.write(json.dumps(result) + "\n")
        out.flush()


class Prober:
    """A restartable worker subprocess that probes one bundle per call, each within a time limit."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self._log_dir = Path(log_dir)
        self._process: subprocess.Popen | None = None
        self.cases = 0
        self.failures = 0
        self.peak_rss = 0
        self.refused = 0  # cases where the bundle did not open (a BundleError at open)
        self.read_errors = 0  # cases that opened but where some read raised a BundleError
        self.clean = 0  # cases that read back completely and correctly
        self.last_outcomes: dict[str, str] = {}  # what each failing read of the last case raised

    def _start(self) -> subprocess.Popen:
        repo = str(Path(__file__).resolve().parents[2])
        self._stderr_path = self._log_dir / f"worker-{time.monotonic_ns()}.log"
        stderr = open(self._stderr_path, "wb")  # noqa: SIM115 - handed to the worker
        process = subprocess.Popen(
            [sys.executable, "-c", "from tests.support import hostile; hostile.worker_main()"],
            cwd=repo,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        stderr.close()
        return process

    def probe(
        self,
        bundle: str | os.PathLike,
        source: str | os.PathLike,
        *,
        strict: bool | str,
        seed: int = 0,
    ) -> list[str]:
        """Violations found reading ``bundle`` (whose original tree is ``source``); [] is good.

        ``strict``: True — every byte read must be the original's; ``"whole"`` — whole-file reads
        must be (a hostile index may point a partial read elsewhere; the file CRC catches it only
        for whole reads); ``"none"`` — names may be forged too, so paths may hold other files.
        """
        self.last_outcomes = {}
        if self._process is None or self._process.poll() is not None:
            self._process = self._start()
        work = tempfile.mkdtemp(prefix="probe-", dir=self._log_dir)
        case = dict(
            bundle_path=os.fspath(bundle),
            source=os.fspath(source),
            work=work,
            strict=strict,
            seed=seed,
        )
        self.cases += 1
        try:
            violations = self._exchange(case)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if violations:
            self.failures += 1
        return violations

    def _exchange(self, case: dict) -> list[str]:
        process = self._process
        process.stdin.write(json.dumps(case) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], CASE_TIMEOUT)
        line = process.stdout.readline() if ready else ""
        if line:
            result = json.loads(line)
            self.peak_rss = max(self.peak_rss, result["peak_rss"])
            outcomes = self.last_outcomes = result["outcomes"]
            if "open" in outcomes:
                self.refused += 1
            elif any(k != "verify" and not k.startswith("follow") for k in outcomes):
                self.read_errors += 1
            else:
                self.clean += 1
            return result["violations"]
        # No answer: the worker hung, died of a signal, or ran out of memory.
        if ready:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)  # end of file: it is exiting
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            what = f"hang: no answer within {CASE_TIMEOUT:.0f} s"
        elif process.returncode < 0:
            what = f"worker killed by {signal.Signals(-process.returncode).name}"
        else:
            what = f"worker exited with status {process.returncode}"
        self._process = None
        tail = self._stderr_path.read_text(errors="replace")[-3000:]
        return [f"{what}\n{tail}"]

    def summary(self) -> str:
        return (
            f"{self.cases} cases: {self.refused} refused at open, {self.read_errors} opened with "
            f"failing reads, {self.clean} read back intact; {self.failures} failures; worker "
            f"peak RSS {self.peak_rss / 2**20:.0f} MiB"
        )

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._process = None


def report_line(request, text: str) -> None:
    """Print a figure past pytest's output capture, so ``make fuzz``/``make soak`` show it."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("\n" + text)

"""Credentials off the command line: storage options given there are moved into a pipe.

Every user can read every process's ``/proc/PID/cmdline`` (``ps``) for as long as the process
lives: weeks for a mount daemon, hours for a pack. So when ``cli.app.main`` finds
``--storage-option`` pairs (or fstab's ``-o storage_option=``) on its own command line, it calls
``reexec_without_storage_options``, which re-executes the same interpreter with the same flags
(same PID: systemd's main process and a parent's ``wait`` see nothing change) with those pairs
taken out and ``--storage-options-file /dev/fd/N`` put in, N the read end of a pipe holding them
as one JSON object. Not the environment (children inherit it), not argv: the new process reads
the pipe like any options file (a pipe is mode 0600, owned by its creator) and closes it, so the
mount daemon it forks keeps no copy anywhere but in memory. A pipe is filled before the exec, so
what it carries is bounded by its 64 KiB buffer; more than that belongs in a file.

The rewrite is textual, so it is checked: the new command line must parse to the same command
with no pair left, else the command stops with one sentence rather than run with a secret in
``ps``.

May import: ``bundlefs.storage.location``, ``bundlefs.errors``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

from bundlefs.errors import StorageOptionsError
from bundlefs.storage.location import parse_storage_options

_FLAG = "--storage-option"
_FILE_FLAG = "--storage-options-file"
_PIPE_LIMIT = 65536  # the default pipe buffer: filled before the exec, it must not block
_SEPARATE = {"storage_option", "storage_options_file", "options"}  # what the rewrite may change


def _o_key(item: str) -> str:
    return item.partition("=")[0].replace("-", "_")


def _split_o(group: str, pairs: list[str], files: list[str]) -> str:
    """One ``-o`` group without its ``storage_option=`` (into ``pairs``) and
    ``storage_options_file=`` (into ``files``, to keep their order after the flags')."""
    kept = []
    for item in group.split(","):
        key, value = _o_key(item), item.partition("=")[2]
        if key == "storage_option" and value:
            pairs.append(value)
        elif key == "storage_options_file" and value:
            files.append(value)
        else:
            kept.append(item)
    return ",".join(kept)


def split_command_line(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``argv`` without its storage option pairs; the pairs of ``--storage-option`` and those of
    ``-o storage_option=``, in order. ``-o storage_options_file=`` items become
    ``--storage-options-file`` flags at the end, so files keep their order before the pipe."""
    clean: list[str] = []
    flag_pairs: list[str] = []
    o_pairs: list[str] = []
    o_files: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            break
        if token == _FLAG and i + 1 < len(argv):
            flag_pairs.append(argv[i + 1])
            i += 2
            continue
        if token.startswith(_FLAG + "="):
            flag_pairs.append(token.partition("=")[2])
        elif token == "-o" and i + 1 < len(argv):
            if kept := _split_o(argv[i + 1], o_pairs, o_files):
                clean += ["-o", kept]
            i += 2
            continue
        elif token.startswith("-o") and len(token) > 2:
            if kept := _split_o(token[2:], o_pairs, o_files):
                clean.append("-o" + kept)
        else:
            clean.append(token)
        i += 1
    for path in o_files:
        clean += [_FILE_FLAG, path]
    return clean + argv[i:], flag_pairs, o_pairs


def _o_pairs(args: argparse.Namespace) -> list[str]:
    return [
        item.partition("=")[2]
        for group in getattr(args, "options", None) or []
        for item in group.split(",")
        if _o_key(item) == "storage_option" and item.partition("=")[2]
    ]


def has_storage_options(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "storage_option", None)) or bool(_o_pairs(args))


def _same_command(before: argparse.Namespace, after: argparse.Namespace) -> bool:
    def rest(ns: argparse.Namespace) -> dict[str, object]:
        return {k: v for k, v in vars(ns).items() if k not in _SEPARATE}

    def o_rest(ns: argparse.Namespace) -> list[str]:
        return [
            item
            for group in getattr(ns, "options", None) or []
            for item in group.split(",")
            if _o_key(item) not in ("storage_option", "storage_options_file")
        ]

    return rest(before) == rest(after) and o_rest(before) == o_rest(after)


def _interpreter_argv() -> list[str]:
    """How this process was started, up to its own arguments: the interpreter, its flags and
    the script or ``-m bundlefs``; argv[0] is ``sys.executable`` so a venv stays a venv."""
    orig = list(getattr(sys, "orig_argv", []))
    given = len(sys.argv) - 1
    if orig and len(orig) > given and orig[len(orig) - given :] == sys.argv[1:]:
        return [sys.executable, *orig[1 : len(orig) - given]]
    return [sys.executable, "-m", "bundlefs"]


def reexec_without_storage_options(
    argv: list[str], args: argparse.Namespace, parser: argparse.ArgumentParser
) -> None:
    """Re-execute this command with its storage option pairs in a pipe (see the module
    docstring); returns, doing nothing, when the command line holds none."""
    if not has_storage_options(args):
        return
    clean, flag_pairs, o_pairs = split_command_line(argv)
    # A rewritten line that does not parse must not print usage for the user's (valid) one.
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            after: argparse.Namespace | None = parser.parse_args(clean)
        except SystemExit:
            after = None
    if (
        after is None
        or has_storage_options(after)
        or flag_pairs != list(getattr(args, "storage_option", None) or [])
        or o_pairs != _o_pairs(args)
        or not _same_command(args, after)
    ):
        raise StorageOptionsError(
            "cannot take the storage options off this command line (they would stay visible "
            "in ps); give them with --storage-options-file FILE instead"
        )
    data = json.dumps(parse_storage_options([*flag_pairs, *o_pairs])).encode()
    if len(data) > _PIPE_LIMIT:
        raise StorageOptionsError(
            "the storage options on the command line are over 64 KiB; put them in a file and "
            "give it with --storage-options-file FILE"
        )
    read_end, write_end = os.pipe()
    view = memoryview(data)
    while view:
        view = view[os.write(write_end, view) :]
    os.close(write_end)
    os.set_inheritable(read_end, True)
    marker = clean.index("--") if "--" in clean else len(clean)
    clean[marker:marker] = [_FILE_FLAG, f"/dev/fd/{read_end}"]
    sys.stdout.flush()
    sys.stderr.flush()
    command = [*_interpreter_argv(), *clean]
    os.execv(command[0], command)

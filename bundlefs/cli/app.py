"""The ``bundlefs`` command line: the subcommand table, the parser, and the error policy.

It owns how things look to a user, and nothing else: every subcommand is a thin wrapper around a
library call (``pack``, ``Bundle``, ``verify``, ``extract``, the mount daemon), one module per
family — ``pack``, ``info``, ``browse`` (ls, cat), ``extract``, ``verify``, ``mount`` (mount,
umount) — and they all write through ``output``. Policy, in one place (``main``):
- every ``BundleError``, and every ``OSError`` on a user's path, becomes ONE sentence on stderr
  (``bundlefs: error: …``) and exit status 1 (2 for ``diff``, whose 1 means "they differ");
  usage errors exit 2 — argparse's, and every
  ``UsageError`` (a malformed size, number, choice, ``KEY=VALUE`` or time, an unknown ``-o``
  option, wherever it is given); Ctrl-C, SIGTERM and SIGHUP run the same clean-up, say in one
  line what it removed and exit 128 + the signal (130, 143, 129); never a traceback;
- log warnings (the packer's skipped and changed files) appear as ``bundlefs: warning: …``;
- progress lines go to stderr, only when it is a terminal, and never with ``--quiet``;
- storage options on the process's own command line are moved off it before anything runs
  (``scrub``: no credential stays in ``ps``).

Heavy modules are imported inside the subcommands that use them: building the parser imports
neither the packer nor the mount daemon, and nothing here imports pyfuse3 or trio. ``COMMANDS``
is the one place a subcommand is added.

May import: every layer below, and the other ``bundlefs.cli`` modules.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bundlefs.cli import scrub
from bundlefs.cli.options import DISK_CACHE, PARENTS, STORAGE, HelpFormatter
from bundlefs.cli.output import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    error,
    setup_logging,
    status,
)
from bundlefs.errors import BundleError, Interrupted, UsageError, cleanups


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    # The module (``bundlefs.cli.NAME``) and its two functions: imported only for the command
    # that runs (or for a parser of every command: ``completion``), so that a mount's start and
    # ``bundlefs --help`` do not load the packer's, the lister's and the verifier's modules.
    module: str
    add: str = "add_arguments"
    run: str = "run"
    # Shared option groups (cli/options.py): STORAGE where a bundle is named (it may be a URL),
    # DISK_CACHE where one is read.
    options: tuple[str, ...] = ()
    # The mount daemon handles its signals itself (it unmounts on SIGTERM).
    own_signals: bool = False
    # The exit status of a failure (a BundleError, an OSError): 1, but 2 for diff, whose 1 says
    # that the bundles differ (as diff(1) and cmp(1) do).
    failure_status: int = EXIT_FAILURE

    def function(self, name: str) -> Callable[..., object]:
        module = importlib.import_module(f"bundlefs.cli.{self.module}")
        return getattr(module, name)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.function(self.add)(parser)

    def run_with(self, args: argparse.Namespace) -> int:
        status = self.function(self.run)(args)
        assert isinstance(status, int)
        return status


_READS = (STORAGE, DISK_CACHE)


def add_completion_arguments(p: argparse.ArgumentParser) -> None:
    from bundlefs.cli.completion import SHELLS

    p.add_argument(
        "shell",
        metavar="SHELL",
        choices=SHELLS,
        help='bash, zsh or fish; e.g. eval "$(bundlefs completion bash)" in ~/.bashrc',
    )


def run_completion(args: argparse.Namespace) -> int:
    from bundlefs.cli.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("pack", "pack a directory or archives into a new bundle", "pack", options=(STORAGE,)),
    Command("merge", "merge bundles into one without copying their data", "merge",
            options=(STORAGE,)),
    Command("compact", "rewrite a bundle without the stored bytes no file uses", "compact",
            options=(STORAGE,)),
    Command("export", "write a bundle's tree as a tar", "export", options=_READS),
    Command("info", "show what a bundle holds", "info", options=_READS),
    Command("ls", "list directories in a bundle", "browse", "add_ls_arguments", "run_ls",
            options=_READS),
    Command("du", "show the files and bytes below directories of a bundle", "du",
            options=_READS),
    Command("cat", "write files from a bundle to stdout", "browse", "add_cat_arguments",
            "run_cat", options=_READS),
    Command("extract", "restore a bundle (or parts) to a directory", "extract", options=_READS),
    Command("diff", "list what changed between two bundles, from their indexes", "diff",
            options=_READS, failure_status=EXIT_USAGE),
    Command("verify", "check every checksum and structure of a bundle", "verify",
            options=_READS),
    Command("mount", "mount a bundle read-only", "mount", "add_mount_arguments", "run_mount",
            options=_READS, own_signals=True),
    Command("umount", "unmount a bundle", "mount", "add_umount_arguments", "run_umount"),
    Command("gc", "remove what killed packs left in a directory", "gc"),
    Command("rm", "remove a bundle (refused while others use its shards)", "rm",
            options=(STORAGE,)),
    Command("completion", "print a shell completion script (bash, zsh, fish)", "app",
            "add_completion_arguments", "run_completion"),
]  # fmt: skip


def _mount_helper_form(argv: list[str]) -> list[str]:
    """mount.fuse3 (``mount -t fuse.bundlefs``, fstab) runs ``bundlefs BUNDLE MNT -o OPTS``."""
    names = {c.name for c in COMMANDS}
    if len(argv) >= 2 and argv[0] not in names and not argv[0].startswith("-"):
        # ``bundlefs unmount MNT`` is a mistyped command, not a bundle named "unmount".
        import difflib  # here: every command's start pays its imports

        close = difflib.get_close_matches(argv[0], sorted(names), n=1, cutoff=0.75)
        if close and not os.path.lexists(argv[0]):
            raise UsageError(f"unknown command {argv[0]!r}; did you mean {close[0]!r}?")
        return ["mount", *argv]
    return argv


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with ``only`` one that knows every command's name but
    the arguments of that one only (what ``main`` runs: the other commands' modules stay
    unimported)."""
    from bundlefs import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Pack many small files into one immutable, compressed, seekable bundle.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        parents = [PARENTS[name] for name in command.options]
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            parents=parents,
            formatter_class=HelpFormatter,
        )
        if only is None or command.name == only:
            command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The command ``argv`` runs, when its first word names one (else None: every command's
    arguments are built, for argparse's own message)."""
    names = {c.name for c in COMMANDS}
    return argv[0] if argv and argv[0] in names else None


def _os_error(e: OSError) -> str:
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"{os.fsdecode(e.filename)}: {what}"
    return what


# What a terminal (Ctrl-C), a service manager (systemctl stop) or a batch scheduler (a job's time
# limit, a closed session) sends to stop a command.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP interrupt a command as Ctrl-C does: an exception in the main thread
    (``Interrupted``), so the same clean-up runs for each. Once one has arrived the others are
    only noted, so that the clean-up itself is not cut short. A signal the command was started
    with ignored (``nohup``, a background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def after_the_first(signum: int, frame: object) -> None:
        pass

    def interrupt(signum: int, frame: object) -> None:
        for s in installed:
            signal.signal(s, after_the_first)
        raise Interrupted(signum, signal.Signals(signum).name)

    previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    installed = [s for s, h in previous.items() if h != signal.SIG_IGN]
    for s in installed:
        signal.signal(s, interrupt)
    try:
        yield
    finally:
        for s in installed:
            signal.signal(s, previous[s])


def _interrupted(e: KeyboardInterrupt) -> int:
    """The one line of an interruption, with what the clean-up removed; 128 + the signal."""
    signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
    said = f"interrupted by {signal.Signals(signum).name}"
    done = cleanups(e)
    if done:
        said += "; " + "; ".join(done)
    error(said)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script passes it to ``sys.exit``)."""
    failure = EXIT_FAILURE
    try:
        own_command_line = argv is None
        argv = _mount_helper_form(sys.argv[1:] if argv is None else list(argv))
        parser = build_parser(_command_named(argv))
        args = parser.parse_args(argv)
        if own_command_line:  # credentials on it would stay in ps: re-executes without them
            scrub.reexec_without_storage_options(argv, args, parser)
        command: Command = args._command
        failure = command.failure_status
        setup_logging()
        status.enabled = sys.stderr.isatty() and not getattr(args, "quiet", False)
        if command.own_signals:
            return command.run_with(args)
        with _stop_signals_interrupt():
            return command.run_with(args)
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except BrokenPipeError:
        # The reader of our stdout went away (``bundlefs cat … | head``): not worth a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except UsageError as e:  # what argparse cannot check: -o options, KEY=VALUE forms, times
        error(str(e))
        return EXIT_USAGE
    except BundleError as e:
        error(str(e))
        return failure
    except OSError as e:
        error(_os_error(e))
        return failure
    finally:
        status.clear()

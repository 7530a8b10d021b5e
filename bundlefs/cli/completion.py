"""``bundlefs completion SHELL``: a shell completion script for bash, zsh or fish, on stdout.

The script is generated from the parser itself (``cli.app.build_parser``), so it offers exactly
the subcommands, options and choices the command line has, and never goes stale: subcommand
names, each subcommand's options, the choices of an option that has them (``--compression``,
``--on-clash``, ``--owner``…) and file names everywhere else. zsh runs the bash script through
``bashcompinit``. No third-party package, nothing run at completion time but the shell.

May import: the standard library (the parser is handed in by ``cli.app``).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

SHELLS = ("bash", "zsh", "fish")

# Choices worth offering where argparse has none (the value is free text for argparse).
_EXTRA_CHOICES = {"--compression": ("lz4", "zstd", "zstd:3", "zstd:19", "none")}


@dataclass(frozen=True)
class _Option:
    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class _Command:
    name: str
    help: str
    options: tuple[_Option, ...]
    words: tuple[str, ...]  # the choices of its positional arguments (completion's SHELL)


def _commands(parser: argparse.ArgumentParser) -> list[_Command]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    commands = []
    for name, p in sub.choices.items():
        options = []
        words: list[str] = []
        for action in p._actions:
            if not action.option_strings:
                words += [str(c) for c in action.choices or ()]
                continue
            flags = tuple(action.option_strings)
            choices = tuple(str(c) for c in action.choices or ())
            choices = choices or next((_EXTRA_CHOICES[f] for f in flags if f in _EXTRA_CHOICES), ())
            options.append(_Option(flags, action.nargs != 0, choices, action.help or ""))
        commands.append(_Command(name, helps.get(name, ""), tuple(options), tuple(words)))
    return commands


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of ``SHELLS``)."""
    commands = _commands(parser)
    if shell == "fish":
        return _fish(commands)
    text = _bash(commands)
    if shell == "zsh":
        return (
            '# bundlefs completion for zsh: eval "$(bundlefs completion zsh)" in ~/.zshrc\n'
            "autoload -U +X compinit && compinit\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + text
        )
    return text


def _bash(commands: list[_Command]) -> str:
    names = " ".join(c.name for c in commands)
    cases = []
    for c in commands:
        valued = [f for o in c.options if o.takes_value and not o.choices for f in o.flags]
        chosen = [
            f"            {'|'.join(o.flags)}) COMPREPLY=($(compgen -W "
            f'{shlex.quote(" ".join(o.choices))} -- "$cur")); return ;;'
            for o in c.options
            if o.choices
        ]
        flags = " ".join(f for o in c.options for f in o.flags)
        lines = [f"        {c.name})", '            case "$prev" in']
        lines += ["    " + line for line in chosen]
        if valued:
            # A value of these is free (a size, a path): the shell's own completion.
            lines.append(f"                {'|'.join(valued)}) return ;;")
        lines += [
            "            esac",
            f'            [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W {shlex.quote(flags)} '
            '-- "$cur"))',
        ]
        if c.words:
            lines.append(
                f'            [[ "$cur" != -* ]] && COMPREPLY=($(compgen -W '
                f'{shlex.quote(" ".join(c.words))} -- "$cur"))'
            )
        lines.append("            ;;")
        cases.append("\n".join(lines))
    return (
        '# bundlefs completion for bash: eval "$(bundlefs completion bash)" in ~/.bashrc, or\n'
        "# save it as ~/.local/share/bash-completion/completions/bundlefs\n"
        "_bundlefs() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
        '    local cmd="" i\n'
        "    COMPREPLY=()\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac\n'
        "    done\n"
        '    if [[ -z "$cmd" ]]; then\n'
        f'        COMPREPLY=($(compgen -W {shlex.quote(names + " --help --version")} -- "$cur"))\n'
        "        return\n"
        "    fi\n"
        '    case "$cmd" in\n' + "\n".join(cases) + "\n    esac\n"
        "}\n"
        "complete -o default -o bashdefault -F _bundlefs bundlefs\n"
    )


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(commands: list[_Command]) -> str:
    lines = [
        "# bundlefs completion for fish: bundlefs completion fish > "
        "~/.config/fish/completions/bundlefs.fish",
        "complete -c bundlefs -f -n __fish_use_subcommand -l version -d 'print the version'",
    ]
    for c in commands:
        lines.append(
            f"complete -c bundlefs -f -n __fish_use_subcommand -a {c.name} -d {_fish_quote(c.help)}"
        )
    for c in commands:
        if c.words:
            lines.append(
                f"complete -c bundlefs -f -n '__fish_seen_subcommand_from {c.name}' "
                f"-a {_fish_quote(' '.join(c.words))}"
            )
        for o in c.options:
            parts = [f"complete -c bundlefs -n '__fish_seen_subcommand_from {c.name}'"]
            for flag in o.flags:
                if flag.startswith("--"):
                    parts.append(f"-l {flag[2:]}")
                elif len(flag) == 2:
                    parts.append(f"-s {flag[1]}")
            if o.choices:
                parts.append(f"-x -a {_fish_quote(' '.join(o.choices))}")
            elif o.takes_value:
                parts.append("-r")
            summary = o.help.split(";")[0].split(" (")[0][:60]
            parts.append(f"-d {_fish_quote(summary)}")
            lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"

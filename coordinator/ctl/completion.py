"""``gptrmctl completion bash|zsh``: shell completion generated from gptrmctl's own argument parser.

Commands and each command's flags are completed from the parser, so they never drift from
it; ``-o`` completes its formats, and the TASK / NODE arguments of ``tasks``, ``cancel``,
``pause``, ``resume``, ``logs``, ``nodes``, ``drain``, ``cordon`` and ``uncordon`` are completed with
the ids the coordinator knows (``gptrmctl completion ids tasks|nodes``, which prints nothing
when no coordinator answers). The global options are offered after a command too, for a word
that starts with ``-``, and ``--coordinator`` is used for the ids wherever it stands.
zsh uses the same function through ``bashcompinit``.

Install::

    gptrmctl completion bash > ~/.local/share/bash-completion/completions/gptrmctl
    gptrmctl completion zsh > "${fpath[1]}/_gptrmctl"
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

from coordinator.ctl.pages import all_nodes, all_tasks
from coordinator.ctl.transport import Transport

__all__ = ["ID_COMMANDS", "completion_script", "list_ids"]

ID_COMMANDS = {"tasks": "tasks", "cancel": "tasks", "pause": "tasks", "resume": "tasks", "logs": "tasks",
               "nodes": "nodes", "drain": "nodes", "cordon": "nodes", "uncordon": "nodes"}
"""Commands whose positional argument is a task or node id."""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser, leave_out: frozenset[str] = frozenset()) -> list[str]:
    """Its flags but ``leave_out``, and the choices of its positional arguments (``bash zsh`` for ``completion``)."""
    words = [o for a in parser._actions for o in a.option_strings
             if (o.startswith("--") or len(o) == 2) and o not in leave_out]
    for a in parser._actions:
        if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction):
            words += [str(c) for c in a.choices]
    return words


def _valued(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Flags that take a value (their next word is not a command)."""
    for a in parser._actions:
        if a.option_strings and a.nargs != 0:
            yield from a.option_strings


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``)."""
    commands = _subparsers(parser)
    # The global options, which every command also takes: after a command they are offered only for a word
    # that starts with "-", so a command's own flags and ids are not buried under them.
    globals_ = [o for a in parser._actions if not isinstance(a, argparse._HelpAction) for o in a.option_strings]
    cases = []
    for name, sub in sorted(commands.items()):
        words = _flags(sub, frozenset(globals_)) + sorted(_subparsers(sub))
        ids = ID_COMMANDS.get(name, "")
        cases.append(f"    {name}) opts={shlex.quote(' '.join(words))}; ids={ids} ;;")
    valued = "|".join(sorted(set(_valued(parser))))
    body = f"""_gptrmctl() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  local cmd="" coord="" i opts="" ids=""
  for ((i=1; i<COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      --coordinator) coord="${{COMP_WORDS[i+1]}}"; ((i++)) ;;
      {valued}) ((i++)) ;;
      -*) ;;
      *) [[ -z "$cmd" ]] && cmd="${{COMP_WORDS[i]}}" ;;
    esac
  done
  case "$prev" in
    -o|--output) COMPREPLY=($(compgen -W "table wide json" -- "$cur")); return 0 ;;
  esac
  if [[ -z "$cmd" ]]; then
    COMPREPLY=($(compgen -W {shlex.quote(' '.join(_flags(parser) + sorted(commands)))} -- "$cur"))
    return 0
  fi
  case "$cmd" in
{chr(10).join(cases)}
  esac
  if [[ "$cur" == -* ]]; then
    opts="$opts {' '.join(globals_)}"
  fi
  if [[ -n "$ids" && "$cur" != -* ]]; then
    local found
    found=$(gptrmctl ${{coord:+--coordinator "$coord"}} --timeout 2 completion ids "$ids" 2>/dev/null)
    opts="$opts $found"
  fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  return 0
}}
"""
    if shell == "bash":
        return f"# bash completion for gptrmctl\n{body}complete -F _gptrmctl gptrmctl\n"
    return (f"#compdef gptrmctl\n# zsh completion for gptrmctl (the bash function through bashcompinit)\n"
            f"autoload -U +X bashcompinit && bashcompinit\n{body}complete -F _gptrmctl gptrmctl\n")


def list_ids(t: Transport, what: str) -> list[str]:
    """Task or node ids for completion."""
    if what == "tasks":
        return [x.id for x in all_tasks(t)[0]]
    return [v.record.inventory.node_id for v in all_nodes(t)[0]]

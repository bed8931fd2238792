"""The ``gen-mixin`` command.

::

    gen-mixin SPEC...            write generated/<target>/<stem>.py for both targets
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
import sys
from pathlib import Path

from generator import __version__
from generator.diagnostics import SpecError
from generator.naming import TARGETS

EXIT_OK, EXIT_STALE, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with usage, as argparse does
        self.print_usage(sys.stderr)
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n")


def _generate_parser() -> argparse.ArgumentParser:
    p = _Parser(
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
        help="which module(s) to generate (default: all)",
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


def _targets(choice: str) -> tuple[str, ...]:
    return TARGETS if choice == "all" else (choice,)


def _print_spec_error(err: SpecError) -> None:
    for diag in err.diagnostics:
        print(diag, file=sys.stderr)
    count = len(err.diagnostics)
    print(
        f"gen-mixin: {count} problem{'s' if count != 1 else ''} found", file=sys.stderr
    )


def _covers_folder(specs: list[Path]) -> bool:
    """True when the given specs are every *.yaml of their (single) folder."""
    folders = {s.resolve().parent for s in specs}
    if len(folders) != 1:
        return False
    folder = folders.pop()
    return {s.resolve() for s in specs} == {p.resolve() for p in folder.glob("*.yaml")}


def generate_main(argv: list[str]) -> int:
    from generator.emit import check, render_spec, write_atomically
    from generator.render import RenderError

    args = _generate_parser().parse_args(argv)
    targets = _targets(args.target)
    rendered = []
    failed = False
    stems: dict[str, Path] = {}
    for spec in args.specs:
        if spec.stem in stems:
            print(
                f"{spec}:1:1: two specs named {spec.stem!r} (also {stems[spec.stem]})",
                file=sys.stderr,
            )
            failed = True
            continue
        stems[spec.stem] = spec
        try:
            rendered.extend(render_spec(spec, targets, args.out))
        except SpecError as err:
            _print_spec_error(err)
            failed = True
        except RenderError as err:
            print(
                f"gen-mixin: internal error while rendering {spec}: {err}",
                file=sys.stderr,
            )
            return EXIT_INTERNAL
    if failed:
        # Nothing is written when any spec is invalid.
        return EXIT_INVALID
    if args.stdout:
        for item in rendered:
            sys.stdout.write(item.source)
        return EXIT_OK
    if args.check:
        result = check(rendered, args.out, targets, _covers_folder(args.specs))
        for path, diff in result.stale:
            print(f"stale: {path}", file=sys.stderr)
            sys.stdout.write(diff)
        for path in result.orphaned:
            print(
                f"orphaned: {path} (no spec generates it: delete it, or restore its spec)",
                file=sys.stderr,
            )
        if result.stale:
            print(
                "gen-mixin: generated files are out of date; run "
                f"`gen-mixin {' '.join(str(s) for s in args.specs)}` and commit",
                file=sys.stderr,
            )
        if result.stale or result.orphaned:
            return EXIT_STALE
        print(f"gen-mixin: {len(rendered)} file(s) up to date")
        return EXIT_OK
    for item in rendered:
        written = write_atomically(item.path, item.source)
        print(f"{'wrote' if written else 'unchanged'} {item.path}")
    return EXIT_OK


def schema_main(argv: list[str]) -> int:
    p = _Parser(
        prog="gen-mixin schema", description="Print the spec format's JSON Schema."
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

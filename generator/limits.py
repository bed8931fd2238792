"""The caps that keep gen-mixin's cost bounded on hostile input.

A spec is untrusted: whatever it holds, gen-mixin answers within these caps
(tests/codegen/test_gen_hostile_input.py measures the time and memory) or
refuses it with exit 2.
"""

from __future__ import annotations

#: A spec file larger than this is refused before it is parsed. The
#: project's specs are 3-6 KiB. Parsing YAML in pure Python costs about 5 us a
#: byte, and a hostile spec can hold one problem (with its message and "did
#: you mean") every 7 bytes.
MAX_SPEC_BYTES = 64 * 1024

#: A module whose unformatted source would be larger than this is refused
#: before black formats it (about 10 us a byte, for each target). The
#: project's largest generated module has 19 KiB; a spec can declare many
#: buffers, each printed several times.
MAX_GENERATED_BYTES = 48 * 1024

#: The largest magnitude of any integer gen-mixin accepts or computes (a
#: spec's numbers and formula literals, command-line numbers, every value of
#: a formula evaluated by the static checks and ``plan``): int64, what a
#: tensor size, offset or count holds. It also keeps every arithmetic step
#: cheap.
MAX_INTEGER = 2**63 - 1

#: A ``plan --traffic`` file larger than this is refused before it is
#: parsed: a sample of a deployment's encoder batches (the benchmark tunes on
#: 400, about 30 KiB) needs far less.
MAX_TRAFFIC_BYTES = 4 * 1024 * 1024

#: An existing output file is read up to this many bytes to compare it with
#: the module rendered for its place (generated modules are 15-40 KiB).
MAX_EXISTING_OUTPUT_BYTES = 4 * 1024 * 1024

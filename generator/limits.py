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

#: Combinations of the capture axes' keys (one graph per budget and
#: combination; one axis' keys count alone) a spec may declare: refused as
#: the spec is read, before the static checks run once per combination
#: (each a full round, up to a second for formulas at the operator cap).
#: The project's specs have 4 or 5.
MAX_CAPTURE_AXIS_KEYS = 16

#: Dummy units of a unit capture (``capture.units`` with ``unit_dummy``) at
#: any budget the static checks sample: each unit's dims are evaluated per
#: sampled budget, so ``units: 65536`` took seconds. The project's unit
#: captures have at most a few hundred units at the largest budget.
MAX_DUMMY_UNITS = 4096

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

#: Items of a ``plan --traffic`` file (all batches together), counted on
#: the parsed JSON before any item is checked or priced with the spec's
#: formulas (a few microseconds each).
MAX_TRAFFIC_ITEMS = 50_000

#: Distinct batches of a ``plan --traffic`` file (equal batches merge into
#: one, their counts added), and their items: the tuner packs each distinct
#: batch on every candidate ladder (1,000 batches of 32 items took 2.6 s).
#: The benchmark tunes on 400 batches.
MAX_DISTINCT_TRAFFIC_BATCHES = 1_000
MAX_DISTINCT_TRAFFIC_ITEMS = 8_000

#: Problems of a ``plan --traffic`` file reported before the check stops
#: (a file of 420,000 unknown keys took 96 s and 1 GB to report each, most
#: of it in a second, position-keeping parse; the problems are now located
#: by a walk that skips what leads to none).
MAX_TRAFFIC_PROBLEMS = 50

#: ``tuning.max_budget``'s largest value in a traffic file (16 Mi tokens):
#: far above any encoder budget, and low enough that no spec's buffer
#: formulas leave int64 at it.
MAX_TUNED_BUDGET = 2**24

#: An existing output file is read up to this many bytes to compare it with
#: the module rendered for its place (generated modules are 15-40 KiB).
MAX_EXISTING_OUTPUT_BYTES = 4 * 1024 * 1024

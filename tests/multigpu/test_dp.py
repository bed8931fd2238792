"""The manager's data-parallel mode over a real ``torch.distributed`` group.

Each run launches ``tests/multigpu/dp_worker.py`` on two ranks with torchrun
and checks the per-rank JSON it writes:

* ``cpu-gloo``: CPU, gloo, tiny towers in fp32, ``EagerReplayGraphBackend``.
  A normal test (runs in CI; skipped without torch.distributed/gloo).
* ``cuda-nccl``: one GPU per rank, NCCL, ``CudaGraphBackend``, bf16 towers
  (``tiny`` unless ``GEN_MIXIN_DP_SIZE=full``). Marked ``multigpu``; skipped
  without two CUDA devices::

      PYTHONPATH=. python -m pytest -m multigpu tests/multigpu

``GEN_MIXIN_DP_OUT=DIR`` keeps each run's rank JSON and log under
``DIR/<run>/``.
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dp_worker
import pytest
import torch
import torch.distributed as dist

from encoder_cudagraph_runtime.dp_sharding import pad_local_output
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.load_balance import get_load_balance_assignment
from reference_towers.registry import REFERENCE_TOWERS

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dp_worker.py")
NPROC = 2
STEMS = dp_worker.discover_stems()

# The machine's NVLink multicast must stay off (see bench/run_dp.sh).
NVLINK_MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def _gloo_ready() -> bool:
    return (
        dist.is_available()
        and dist.is_gloo_available()
        and importlib.util.find_spec("torch.distributed.run") is not None
    )


def _two_gpus() -> bool:
    return (
        dist.is_available()
        and dist.is_nccl_available()
        and torch.cuda.is_available()
        and torch.cuda.device_count() >= NPROC
    )


@dataclass(frozen=True)
class RunSpec:
    args: tuple[str, ...]
    timeout_s: int


RUNS = {
    # A short collective timeout: a rank that skips the gather fails fast.
    "cpu-gloo": RunSpec(
        ("--device", "cpu", "--backend", "gloo", "--timeout-s", "60"), 120
    ),
    "cuda-nccl": RunSpec(
        (
            "--device",
            "cuda",
            "--backend",
            "nccl",
            "--graph-backend",
            "cuda",
            "--size",
            os.environ.get("GEN_MIXIN_DP_SIZE", "tiny"),
        ),
        280,
    ),
}


@dataclass
class DPRun:
    name: str
    returncode: int
    log: str
    ranks: list[dict[str, Any] | None]

    def rank_reports(self) -> list[dict[str, Any]]:
        missing = [r for r, rep in enumerate(self.ranks) if rep is None]
        assert not missing, f"ranks {missing} wrote no report\n{self.log_tail()}"
        return [rep for rep in self.ranks if rep is not None]

    def stem(self, stem: str) -> list[dict[str, Any]]:
        """Every rank's report of ``stem`` (xfail for a known setup bug)."""
        reports = [rep["stems"].get(stem) for rep in self.rank_reports()]
        assert all(r is not None for r in reports), f"{stem} missing on a rank"
        errors = {r.get("setup_error") for r in reports if r.get("setup_error")}
        if errors:
            shadowed = protocol_shadowed_host_methods(stem)
            if shadowed:
                pytest.xfail(
                    f"known bug outside these tests: {stem}: host method(s) "
                    f"{shadowed} resolve to the SupportsEncoderCudaGraph stubs "
                    "(the mixin derives from the protocol and precedes the "
                    f"host in the MRO): {sorted(errors)}"
                )
            pytest.fail(f"{stem} could not be set up: {sorted(errors)}")
        assert all(r["batches"] for r in reports), f"{stem}: no batches ran"
        return reports  # type: ignore[return-value]

    def log_tail(self, chars: int = 6000) -> str:
        return self.log[-chars:]


def protocol_shadowed_host_methods(stem: str) -> list[str]:
    """Host methods that the mixed class takes from the protocol's stubs."""
    tower = REFERENCE_TOWERS[stem]
    mixed = tower.host_class(dp_worker.load_mixin(stem))
    stubs = vars(SupportsEncoderCudaGraph)
    names = set()
    for klass in tower.host_cls.__mro__:
        if klass.__module__.startswith("torch"):
            break
        names.update(n for n, v in vars(klass).items() if callable(v))
    return sorted(
        name
        for name in names
        if name in stubs
        and getattr(mixed, name) is getattr(SupportsEncoderCudaGraph, name)
    )


def launch(name: str, out_dir: Path) -> DPRun:
    spec = RUNS[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={NPROC}",
        str(WORKER),
        *spec.args,
        "--out",
        str(out_dir),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if name.startswith("cuda"):
        env.update(NVLINK_MULTICAST_OFF)
    elif sys.platform.startswith("linux") and Path("/sys/class/net/lo").exists():
        # Gloo binds to the interface of the host name, which containers
        # do not always route; both ranks are local.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        proc = subprocess.run(
            cmd,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=spec.timeout_s,
            check=False,
        )
        returncode, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        err = exc.stderr or b""
        text = (out.decode() if isinstance(out, bytes) else out) + (
            err.decode() if isinstance(err, bytes) else err
        )
        returncode, log = -1, f"TIMEOUT after {spec.timeout_s} s\n{text}"
    (out_dir / "torchrun.log").write_text(" ".join(cmd) + "\n" + log)
    ranks: list[dict[str, Any] | None] = []
    for rank in range(NPROC):
        path = out_dir / f"rank{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    return DPRun(name, returncode, log, ranks)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(
            "cpu-gloo",
            marks=pytest.mark.skipif(
                not _gloo_ready(), reason="needs torch.distributed with gloo"
            ),
        ),
        pytest.param(
            "cuda-nccl",
            marks=[
                pytest.mark.multigpu,
                pytest.mark.skipif(
                    not _two_gpus(), reason=f"needs {NPROC} CUDA devices and NCCL"
                ),
            ],
        ),
    ],
)
def dp_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> DPRun:
    keep = os.environ.get("GEN_MIXIN_DP_OUT")
    base = Path(keep) if keep else tmp_path_factory.mktemp("dp")
    return launch(request.param, base / request.param)


def lpt_reference(
    sizes: list[int], num_gpus: int
) -> tuple[list[int], list[int], list[int]]:
    """Independent greedy LPT (vLLM's ``get_load_balance_assignment``): the
    largest item first (ties by index) to the least-loaded, lowest rank."""
    if not sizes:
        return [], [0] * num_gpus, [0] * num_gpus
    heap = [(0, rank) for rank in range(num_gpus)]
    per_rank: list[list[int]] = [[] for _ in range(num_gpus)]
    loads = [0] * num_gpus
    for _, idx in sorted((-size, idx) for idx, size in enumerate(sizes)):
        load, rank = heapq.heappop(heap)
        per_rank[rank].append(idx)
        loads[rank] = load + sizes[idx]
        heapq.heappush(heap, (loads[rank], rank))
    return [i for r in per_rank for i in r], [len(r) for r in per_rank], loads


def _batches(reports: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The batches rank by rank zipped: one list of per-rank records each."""
    counts = {len(r["batches"]) for r in reports}
    assert len(counts) == 1, f"ranks ran different numbers of batches: {counts}"
    return [list(per_rank) for per_rank in zip(*(r["batches"] for r in reports))]


# ---------------------------------------------------------------------------
# Tests over the torchrun runs
# ---------------------------------------------------------------------------


def test_every_rank_finished(dp_run: DPRun) -> None:
    reports = dp_run.rank_reports()
    failures = [f for rep in reports for f in rep["failures"]]
    assert dp_run.returncode == 0 and not failures, (
        f"torchrun rc={dp_run.returncode}; failures: {failures[:10]}\n"
        f"{dp_run.log_tail()}"
    )
    assert [rep["rank"] for rep in reports] == list(range(NPROC))
    assert all(rep["world_size"] == NPROC for rep in reports)
    assert all(rep["stem_list"] == STEMS for rep in reports)


@pytest.mark.parametrize("stem", STEMS)
def test_dp_outputs_match_single_process_eager(dp_run: DPRun, stem: str) -> None:
    """Every rank's ``execute`` gives every item's per-image eager result
    (2-D, manager dtype, within tolerance): the worker compared them."""
    reports = dp_run.stem(stem)
    for rank, report in enumerate(reports):
        tol = report["tolerance"]
        for batch in report["batches"]:
            assert not batch["failures"], f"rank {rank}: {batch['failures']}"
            assert batch["max_err"] <= tol, (rank, batch["kind"], batch["max_err"])
    kinds = {b["kind"] for b in reports[0]["batches"]}
    assert {"one_image", "random", "many", "eager_mixed"} <= kinds


@pytest.mark.parametrize("stem", STEMS)
def test_assignment_balances_by_input_size(dp_run: DPRun, stem: str) -> None:
    """Every rank agrees on the plan, which is vLLM's greedy LPT over
    ``input_size``; each rank ran exactly its own share."""
    for per_rank in _batches(dp_run.stem(stem)):
        first = per_rank[0]
        sizes = first["input_sizes"]
        tokens = first["output_tokens"]
        for record in per_rank[1:]:
            for key in ("assignment", "items_per_rank", "max_output_tokens_per_rank"):
                assert record[key] == first[key], (first["kind"], key)
        assignment, counts, loads = lpt_reference(sizes, NPROC)
        assert (assignment, counts) == (first["assignment"], first["items_per_rank"])
        assert get_load_balance_assignment(sizes, NPROC) == (
            assignment,
            counts,
            loads,
        )
        if sizes:
            # LPT's bound: no rank exceeds another by more than one item.
            assert max(loads) - min(loads) <= max(sizes)
        offsets = [0]
        for count in counts:
            offsets.append(offsets[-1] + count)
        seen: list[int] = []
        for rank, record in enumerate(per_rank):
            share = assignment[offsets[rank] : offsets[rank + 1]]
            assert record["local_items"] == share
            if record["executed_items"] is not None:
                assert record["executed_items"] == len(share), first["kind"]
            seen.extend(share)
        assert sorted(seen) == list(range(len(sizes)))
        rank_tokens = [
            sum(tokens[i] for i in assignment[a:b])
            for a, b in itertools.pairwise(offsets)
        ]
        assert first["max_output_tokens_per_rank"] == max(rank_tokens, default=0)


@pytest.mark.parametrize("stem", STEMS)
def test_idle_rank_joins_the_gather(dp_run: DPRun, stem: str) -> None:
    """Batches with fewer items than ranks leave a rank idle; it still sends
    its padding in the one all-gather, and still gets every item right."""
    idle_seen = 0
    for per_rank in _batches(dp_run.stem(stem)):
        gathers = [record["gathers"] for record in per_rank]
        assert all(len(g) == 1 for g in gathers), (per_rank[0]["kind"], gathers)
        shapes = {tuple(g[0]["shape"]) for g in gathers}
        dtypes = {g[0]["dtype"] for g in gathers}
        assert len(shapes) == 1 and len(dtypes) == 1, (shapes, dtypes)
        (shape,) = shapes
        assert shape[0] == per_rank[0]["max_output_tokens_per_rank"]
        for record in per_rank:
            if record["idle"] and record["n_items"] > 0:
                idle_seen += 1
                assert not record["failures"], record["failures"]
                assert record["executed_items"] in (0, None)
    assert idle_seen > 0, "no batch left a rank idle"


def test_deepseek_eager_dp_path(dp_run: DPRun) -> None:
    """``run_dp_sharded_vision_tower`` and the host's DP eager path equal
    per-image eager on every rank."""
    stem = "deepseek_v41"
    if stem not in STEMS:
        pytest.skip("no deepseek_v41 spec")
    for rank, report in enumerate(dp_run.stem(stem)):
        for batch in report["batches"]:
            eager = batch.get("eager_dp")
            assert eager is not None, (rank, batch["kind"])
            assert not eager["failures"], (rank, eager["failures"])
            assert eager["max_err_rows"] <= report["tolerance"]
            assert eager["max_err_spans"] <= report["tolerance"]


# ---------------------------------------------------------------------------
# What each rank sends (no process group needed)
# ---------------------------------------------------------------------------


class TestPadLocalOutput:
    def test_idle_rank_sends_padding_in_manager_dtype(self) -> None:
        out = pad_local_output([], 5, 3, "cpu", torch.bfloat16)
        assert out.shape == (5, 3) and out.dtype == torch.bfloat16

    def test_other_dtype_is_cast(self) -> None:
        local = [torch.ones(2, 3), torch.full((1, 3), 2.0)]
        out = pad_local_output(local, 4, 3, "cpu", torch.bfloat16)
        assert out.shape == (4, 3) and out.dtype == torch.bfloat16
        assert out[:3].float().tolist() == [[1.0] * 3, [1.0] * 3, [2.0] * 3]
        exact = pad_local_output(local, 3, 3, "cpu", torch.bfloat16)
        assert exact.dtype == torch.bfloat16 and exact.shape == (3, 3)

    def test_rejects_what_would_desync_the_gather(self) -> None:
        with pytest.raises(ValueError, match="2-D"):
            pad_local_output([torch.ones(2, 1, 3)], 4, 3, "cpu", torch.float32)
        with pytest.raises(ValueError, match="2-D"):
            pad_local_output([torch.ones(2, 4)], 4, 3, "cpu", torch.float32)
        with pytest.raises(ValueError, match="more than"):
            pad_local_output([torch.ones(5, 3)], 4, 3, "cpu", torch.float32)

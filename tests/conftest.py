from __future__ import annotations

import functools
import gzip
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

try:  # the lab (recording, training, the torch reference): its tests run where it is installed (pip install -e lab/)
    import bottleneck_oracle_lab  # noqa: F401
except ImportError:
    collect_ignore = ["lab"]

DATA = Path(__file__).parent / "data"
PUBLIC = DATA / "public-gpu"
SAMPLE = DATA / "gloo_ddp_2rank"

# every Kineto trace among the public fixtures (the ET file and HTA's overlay are not inputs)
KINETO_FIXTURES = sorted(p for p in PUBLIC.glob("*.json.gz") if "pytorch_et" not in p.name and "overlay" not in p.name) + [
    PUBLIC / "sampled_128rank"
]
REAL = DATA / "real-gpu"
# real GPU training traces recorded by other people (tests/data/real-gpu/README.md says what is true in each)
REAL_FIXTURES = sorted(REAL.glob("*.json.gz")) + [REAL / "dlrm_v100_8rank"]
OWN_GPU = DATA / "own-gpu"
# our own DDP job recorded on a GPU (tests/data/own-gpu/README.md says what is true in each)
OWN_GPU_FIXTURES = sorted(p for p in OWN_GPU.iterdir() if p.is_dir())
MORE = DATA / "more-gpu"
# inference scripts, graph capture and another accelerator, recorded by other people (more-gpu/README.md)
MORE_FIXTURES = sorted(MORE.glob("*.json.gz"))
# every trace input among the fixtures: public and real GPU traces, our own gloo run and GPU runs
# our own torch.compile'd loop on the CPU (tests/data/own-cpu/README.md)
OWN_CPU_FIXTURES = sorted((DATA / "own-cpu").glob("*.json.gz")) + [
    DATA / "own-cpu" / "alltoall_uneven",
    DATA / "own-cpu" / "periodic_eval",
    DATA / "own-cpu" / "fsdp_gloo",
    DATA / "own-cpu" / "dataloader_starved",
    DATA / "own-cpu" / "tensor_parallel_gloo",
    DATA / "own-cpu" / "async_allreduce_gloo",
    DATA / "own-cpu" / "fsdp_tp_gloo",
    DATA / "own-cpu" / "pipeline_dp_gloo",
    DATA / "own-cpu" / "pipeline_interleaved_gloo",
    DATA / "own-cpu" / "grad_accum_gloo",
    DATA / "own-cpu" / "two_profilers_gloo",
    DATA / "own-cpu" / "tensorboard_windows",
    DATA / "own-cpu" / "rank0_metrics_gloo",
    DATA / "own-cpu" / "uneven_batch_gloo",
    DATA / "own-cpu" / "pipelining_gpipe_gloo",
    DATA / "own-cpu" / "ddp_with_stack_gloo",
    DATA / "own-cpu" / "broadcast_batch_gloo",
    DATA / "own-cpu" / "alternating_steps_gloo",
    DATA / "own-cpu" / "slowing_rank_gloo",
    DATA / "own-cpu" / "zero_uneven_gloo",
]
ALL_FIXTURES = KINETO_FIXTURES + REAL_FIXTURES + MORE_FIXTURES + [SAMPLE] + OWN_GPU_FIXTURES + OWN_CPU_FIXTURES


@pytest.fixture(scope="session")
def recorded_ddp(tmp_path_factory) -> Path:
    """A 2-rank gloo DDP run recorded now; rank 1 sleeps 25 ms in each forward pass.
    The model fits one gradient bucket, so each step has one all-reduce to wait at."""
    pytest.importorskip("bottleneck_oracle_lab", reason="recording is the lab's (pip install -e lab/)")
    from bottleneck_oracle_lab.systems.ddp import DDPRun, record

    out = tmp_path_factory.mktemp("ddp")
    return record(DDPRun(out=str(out), world=2, steps=9, straggler=1, delay_ms=25.0, hidden=256, bucket_mb=25.0))


@pytest.fixture(autouse=True)
def _quiet_oracle_warnings():
    from bottleneck_oracle.errors import OracleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OracleWarning)
        yield


class Hung(Exception):
    """A command that gave no answer within its time limit (reading a FIFO, a stalled server)."""


def _hung(signum, frame):
    raise Hung("no answer within the time limit")


def run_cli(args: list[str], capsys, seconds: int = 0) -> tuple[int, str, str]:
    """Run ``bottleneck-oracle ARGS`` in this process: (exit code, stdout, stderr). With
    ``seconds``, a hang raises Hung instead of stalling the test run."""
    import signal
    import sys

    from bottleneck_oracle import cli

    old = sys.argv
    sys.argv = ["bottleneck-oracle", *args]
    previous = signal.signal(signal.SIGALRM, _hung) if seconds else None
    if seconds:
        signal.alarm(seconds)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        if seconds:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        sys.argv = old
    out, err = capsys.readouterr()
    return code, out, err


def job_step_us(g, first: bool) -> float:
    """A step's time as its ProfilerStep spans give it, the oracle of the graph's: in the trace's
    first step the slowest rank's span; in a later one from the last rank's start (when the last
    of them finished the step before) to the last rank's end."""
    if first or len(g.ranks) < 2:
        return max(g.measured.values())
    return max(g.rank_start(k) + g.measured[k] for k in g.ranks) - max(g.rank_start(k) for k in g.ranks)


@functools.cache
def cached_analyses(path: Path) -> tuple:
    """Every step of a fixture, built and analysed with the default configuration (shared, read-only)."""
    from bottleneck_oracle.analysis.summary import StepAnalysis
    from bottleneck_oracle.api import graphs

    return tuple(StepAnalysis.of(g) for g in graphs(cached_load(path)))


@functools.cache
def cached_load(path: Path):
    """Event tables are read-only after loading, so tests share them."""
    from bottleneck_oracle.api import load

    return load(path)


@pytest.fixture(scope="session")
def generated_grid(tmp_path_factory) -> tuple[Path, object]:
    """The CI grid (tests/data/grid-tiny.yaml: one DP and one PP-1F1B launch), generated once."""
    pytest.importorskip("bottleneck_oracle_lab", reason="recording is the lab's (pip install -e lab/)")
    from bottleneck_oracle.config import load_config
    from bottleneck_oracle_lab.systems.generate import generate

    grid = load_config(DATA / "grid-tiny.yaml").grid
    out = tmp_path_factory.mktemp("grid")
    generate(grid, out)
    return out, grid


def loopback_server(respond) -> tuple:
    """A loopback HTTP server whose POSTs ``respond(handler)`` answers: (server, its base URL).
    The tests' stand-in for an OpenAI-compatible LLM server, spoken to over real HTTP."""
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            respond(self)

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            # a client that hangs up on a reply it refuses (the 3 MB one) is expected here; printed, the
            # server thread's traceback landed in the next case's captured stderr as if the CLI had raised
            if not issubclass(sys.exc_info()[0] or Exception, ConnectionError):
                super().handle_error(request, client_address)

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def json_headers(handler, data: bytes, status: int = 200, kind: str = "application/json") -> None:
    """A reply's status and headers, for a body of ``data``."""
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()


def edited_run(src: Path, out: Path, change: Callable[[str, dict], None]) -> Path:
    """A copy of the recorded run in ``src`` (its ``rank-*.json.gz``) in ``out``, as plain JSON,
    each rank's document passed through ``change(file name, document)`` on the way."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("rank-*.json.gz")):
        doc = json.loads(gzip.open(f).read())
        change(f.name, doc)
        (out / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
    return out


def raw_optimizer_steps(doc: dict) -> dict[tuple, list[tuple[float, float]]]:
    """From a trace's raw events, per (pid, tid): the steps a loop without ProfilerStep markers is
    cut into, as its optimizer's steps end (the outermost ``Optimizer.step#`` annotations of the
    optimizer that steps last; step 1 from the process's first host event), in time order."""
    spans: dict[tuple, list[tuple[float, float, str]]] = {}
    first: dict = {}
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in ("cpu_op", "user_annotation", "python_function", "Operator"):
            continue
        first[e["pid"]] = min(first.get(e["pid"], e["ts"]), e["ts"])
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Optimizer.step#"):
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    out = {}
    for key, got in spans.items():
        outer: list[tuple[float, float, str]] = []
        for s in sorted(got, key=lambda x: (x[0], -x[1])):
            if not outer or s[0] >= outer[-1][1]:
                outer.append(s)
        last = max({n for _, _, n in outer}, key=lambda n: next(e for _, e, m in outer if m == n))
        ends = [e for _, e, n in outer if n == last]
        out[key] = list(zip([first[key[0]], *ends[:-1]], ends))
    return out

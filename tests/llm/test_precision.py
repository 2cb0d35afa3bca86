"""The precision a step's kernels run in (facts.kernel_precision), and the reduced-precision recipes
offered only to a step that is not in 16 bits already: on real bf16 traces the advisor used to tell
the user to "train in bf16"."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from tests.conftest import cached_load
from tests.synthetic_ranks import _x

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.llm.graphrag import advise, full_precision_share
from bottleneck_oracle.llm.retrieve import load_recipes

DATA = Path(__file__).parent.parent / "data"
PRECISION_RECIPES = {"matmul-precision", "gpu-mixed-precision"}

# (CPU op, its "Input type" or None, the op nested in it and its input type, kernel name, kernel µs, counts as 16-bit)
CASES = [
    ("aten::mm", ["c10::BFloat16", "c10::BFloat16"], None, "gemm_a", 30.0, True),  # the op says bf16
    ("aten::mm", ["float", "float"], None, "gemm_b", 40.0, False),  # the op says fp32
    ("aten::mm", ["float", "float"], None, "ampere_bf16_gemm", 25.0, False),  # the op's type wins over the name
    ("aten::mm", None, None, "cutlass_80_tensorop_f16_s16816gemm", 20.0, True),  # no type: the name says f16
    ("aten::mm", None, None, "my_kernel", 15.0, False),  # neither says: not known to be 16-bit
    ("aten::linear", ["float", "float"], ("aten::addmm", ["", "Half", "Half"]), "x", 10.0, True),  # the innermost op
    ("aten::add", None, None, "ncclDevKernel_AllReduce_Sum_f32", 50.0, None),  # a collective's kernel: left out
]


def _trace(path: Path) -> tuple[float, float]:
    """A one-step GPU trace of CASES; (compute kernel µs, of it 16-bit µs) by construction."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1000, 1, 1)]
    kernel = low = 0.0
    for i, (op, types, inner, kname, kdur, is_low) in enumerate(CASES):
        t = 10.0 + 120.0 * i
        ev.append(_x(op, "cpu_op", t, 60, 1, 1, **({"Input type": types} if types else {})))
        call_at = t + 5
        if inner:
            ev.append(_x(inner[0], "cpu_op", t + 2, 50, 1, 1, **{"Input type": inner[1]}))
            call_at = t + 10
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", call_at, 10, 1, 1, correlation=100 + i))
        ev.append(_x(kname, "kernel", call_at + 20, kdur, 7, 0, correlation=100 + i, stream=7, device=0))
        if is_low is not None:
            kernel += kdur
            low += kdur if is_low else 0.0
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    return kernel, low


def test_each_kernel_runs_in_the_precision_of_its_op_else_of_its_name(tmp_path):
    kernel, low = _trace(tmp_path / "t.json.gz")
    (g,) = graphs(load(tmp_path / "t.json.gz"))
    facts = g.info.facts
    assert facts is not None
    (f,) = facts.ranks
    assert f.kernel_us == pytest.approx(kernel) and f.low_precision_us == pytest.approx(low)
    assert full_precision_share(StepAnalysis.of(g)) == pytest.approx(1 - low / kernel)


def _raw_types(path: Path) -> set[str]:
    """The first floating-point input type of every matmul, convolution and attention op in the raw JSON."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    seen = set()
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and re.match(r"aten::(mm|addmm|bmm|linear|matmul|conv\w*|_?convolution\w*)$", e.get("name", "")):
            types = [t for t in (e.get("args") or {}).get("Input type", []) if re.search(r"(?i)float|half|double", t)]
            if types:
                seen.add(types[0])
    return seen


def _advice_ids(path: Path) -> tuple[set[str], float]:
    table = cached_load(path)
    gs = graphs(table)
    a = StepAnalysis.of(gs[-1])
    adv = advise(a, None, None, table)
    return {s.source for s in adv.suggestions} | {r.source for r in adv.rejected}, full_precision_share(a)


def test_a_bf16_job_is_not_told_to_use_bf16():
    path = DATA / "more-gpu" / "timesformer_h100_1step.json.gz"
    assert _raw_types(path) == {"c10::BFloat16"}  # the raw events: every matmul, conv, linear in bf16
    offered, full = _advice_ids(path)
    assert full < 0.1  # its kernels: 98% of their time in bf16 kernels (cutlass bf16 gemms, bf16 softmax)
    assert not offered & PRECISION_RECIPES  # was "GPU-bound step in full precision", 15.9%


def test_an_fp32_job_is_still_offered_reduced_precision():
    path = DATA / "public-gpu" / "train_1rank_5steps.json.gz"
    with gzip.open(path, "rt") as f:
        raw = f.read()
    assert not re.search(r"BFloat16|Half|bf16|fp16", raw)  # nothing in the raw trace says 16 bits
    offered, full = _advice_ids(path)
    assert full == 1.0 and "gpu-mixed-precision" in offered


def test_another_vendors_accelerator_gets_no_cuda_recipe():
    path = DATA / "more-gpu" / "mtia_inference_rank0.json.gz"
    with gzip.open(path, "rt") as f:
        cats = {e.get("cat") for e in json.load(f)["traceEvents"] if e.get("ph") == "X"}
    assert "mtia_runtime" in cats and not cats & {"cuda_runtime", "cuda_driver", "kernel"}  # the raw events: MTIA's runtime, no CUDA
    offered, _ = _advice_ids(path)
    cuda_only = {r.id for r in load_recipes() if "gpu_present" in r.when}
    assert cuda_only and not offered & cuda_only  # was "GPU-bound step in full precision: torch.autocast('cuda')"


def _conv_step(path: Path, kernel: str) -> None:
    """A device-bound step of ten convolutions (aten::cudnn_convolution, 20 µs of host each) whose
    kernels (150 µs each, back to back) are named ``kernel``."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 260, 1, 1)]  # the host runs ahead: the device bounds the step
    for i in range(10):
        t = 10.0 + 25.0 * i
        ev.append(_x("aten::cudnn_convolution", "cpu_op", t, 20, 1, 1))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", t + 5, 10, 1, 1, correlation=100 + i))
        ev.append(_x(kernel, "kernel", 50.0 + 150.0 * i, 150, 7, 0, correlation=100 + i, stream=7, device=0))
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


@pytest.mark.parametrize(
    "kernel, offered",
    [
        ("cudnn_sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32", False),  # channels last
        ("cudnn_sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw_tilesize128x128x32", True),  # NCHW out
        ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", True),  # the name does not say: as before
    ],
)
def test_the_layout_recipe_is_for_convolutions_not_channels_last_already(tmp_path, kernel, offered):
    _conv_step(tmp_path / "c.json.gz", kernel)
    table = load(tmp_path / "c.json.gz")
    (g,) = graphs(table)
    (f,) = g.info.facts.ranks
    assert f.conv_kernel_us == pytest.approx(1500.0)  # every kernel launched inside a convolution
    assert f.nhwc_kernel_us == pytest.approx(0.0 if offered else 1500.0)
    adv = advise(StepAnalysis.of(g), None, None, table)
    assert ("conv-channels-last" in {s.source for s in adv.suggestions} | {r.source for r in adv.rejected}) == offered


def _cpu_matmul_step(path: Path, dtype: str) -> None:
    """A CPU step of five linear layers (aten::linear around aten::addmm, 300 µs each) whose inputs
    are ``dtype``, with 20 µs of other ops between them."""
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 1700, 1, 1)]
    for i in range(5):
        t = 10.0 + 330.0 * i
        ev.append(_x("aten::linear", "cpu_op", t, 300, 1, 1, **{"Input type": [dtype, dtype, dtype]}))
        ev.append(_x("aten::addmm", "cpu_op", t + 5, 290, 1, 1, **{"Input type": [dtype, dtype, dtype, "Scalar", "Scalar"]}))
        ev.append(_x("aten::relu", "cpu_op", t + 305, 20, 1, 1))
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


@pytest.mark.parametrize("dtype, offered", [("c10::BFloat16", False), ("float", True)])
def test_the_cpu_bf16_recipe_is_for_a_step_in_fp32(tmp_path, dtype, offered):
    _cpu_matmul_step(tmp_path / "m.json.gz", dtype)
    table = load(tmp_path / "m.json.gz")
    (g,) = graphs(table)
    (f,) = g.info.facts.ranks
    assert f.host_matmul_us == pytest.approx(1500.0)  # the five linears' spans (their addmm inside)
    assert f.host_low_precision_us == pytest.approx(0.0 if offered else 1500.0)
    adv = advise(StepAnalysis.of(g), None, None, table)
    assert ("cpu-matmul-bf16" in {s.source for s in adv.suggestions} | {r.source for r in adv.rejected}) == offered

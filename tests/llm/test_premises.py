"""A recipe is offered to a step the trace shows it applies to: "checkpoint selectively" is for a
step that recomputes activations. diff_test's backward is over half of its critical path, as a
backward twice its forward is without checkpointing; the advisor told it to checkpoint less."""

from __future__ import annotations

import gzip
import json

from tests.conftest import MORE, OWN_GPU, PUBLIC, REAL

from bottleneck_oracle.analysis.phases import node_phases
from bottleneck_oracle.api import analyze
from bottleneck_oracle.llm.graphrag import advise, symptoms

RECIPE = "backward-compute-bound"


def _raw_names(path) -> set[str]:
    with gzip.open(path, "rt") as f:
        return {str(e.get("name", "")) for e in json.load(f)["traceEvents"]}


def _offered(path) -> tuple[list[float], list[float], int]:
    table, analyses = analyze(path)
    shares, present, offered = [], [], 0
    for a in analyses:
        phases, _ = node_phases(table, a.graph)
        m, _ = symptoms(a, None, phases)
        shares.append(m.get("backward_share", 0.0))
        present.append(m.get("recompute_present", float("nan")))
        adv = advise(a, None, phases, table)
        offered += RECIPE in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected}
    return shares, present, offered


def test_checkpointing_advice_needs_a_step_that_recomputes(tmp_path):
    path = PUBLIC / "diff_test_rank1of2.json.gz"
    assert not any("checkpoint" in n.lower() or "recompute" in n.lower() for n in _raw_names(path))  # (read from the raw JSON)
    shares, present, offered = _offered(path)
    assert min(shares) >= 0.5 and offered == 0
    assert present == [0.0] * len(shares)
    # the same trace with one frame of torch.utils.checkpoint's in it: offered in every step
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    step = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    frame = {**step, "cat": "python_function", "name": "torch/utils/checkpoint.py(1111): unpack_hook", "ts": step["ts"] + 1, "dur": 1}
    frame["args"] = {}
    doc["traceEvents"].append(frame)
    out = tmp_path / "with_checkpoint.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    shares, present, offered = _offered(out)
    assert present == [1.0] * len(shares) and offered == len(shares)


def test_a_checkpointed_job_shows_its_recomputation():
    """The MI300 ResNet runs with activation checkpointing (its raw JSON holds torch.utils.checkpoint's frames)."""
    from bottleneck_oracle.llm.graphrag import RECOMPUTE_NAME

    path = REAL / "mi300_resnet_actckpt_rank0of8.json.gz"
    assert any(RECOMPUTE_NAME.search(n) for n in _raw_names(path))
    _, present, _ = _offered(path)
    assert present and set(present) == {1.0}


def _zero_grad_spans(path) -> tuple[dict[int, float], int]:
    """From the raw JSON: per ProfilerStep, the time its host spent in ``Optimizer.zero_grad#...``;
    and how many zero_/fill_ ops ran inside such a range (on its thread)."""
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
    ranges = [e for e in ev if str(e.get("name", "")).startswith("Optimizer.zero_grad#")]
    spans: dict[int, float] = {}
    for z in ranges:
        for lo, hi, n in steps:
            if lo <= z["ts"] < hi:
                spans[n] = spans.get(n, 0.0) + z["dur"]
    writes = sum(
        1
        for e in ev
        if e["name"] in ("aten::zero_", "aten::fill_")
        and any(e["tid"] == z["tid"] and z["ts"] <= e["ts"] < z["ts"] + z["dur"] for z in ranges)
    )
    return spans, writes


def test_set_to_none_advice_needs_a_zero_grad_that_writes_and_saves_what_it_took():
    """ddp_v100's SGD zeroes its gradients by writing (zero_/fill_ inside Optimizer.zero_grad, in
    the raw JSON): the recipe is offered in every step, and restoring set_to_none saves about the
    time zero_grad took (its edit selects what runs inside it; the old one scaled every zero_ and
    fill_ and predicted 57-62% of it). DLRM's Adagrad sets them to None: its zero_grad writes
    nothing, and the zero_/fill_ elsewhere in its step are not this recipe's."""
    recipe = "zero-grad-set-to-none"
    path = REAL / "ddp_v100_rank1of2_5steps.json.gz"
    spans, writes = _zero_grad_spans(path)
    assert writes > 100
    table, analyses = analyze(path)
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        adv = advise(a, None, phases, table, mb=mb)
        (s,) = [x for x in adv.suggestions if x.source == recipe]
        assert 0.8 * spans[a.graph.step] <= s.replay_saving_us <= spans[a.graph.step], (a.graph.step, s.replay_saving_us, spans)
    path = REAL / "dlrm_v100_8rank" / "worker2_step_12.1694128201554.pt.trace.json.gz"
    spans, writes = _zero_grad_spans(path)
    assert spans and writes == 0
    table, analyses = analyze(path)
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        adv = advise(a, None, phases, table, mb=mb)
        assert recipe not in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected}


def test_the_hotspot_recipe_does_not_name_a_collective():
    """The MI300 ResNet is rank 0 of 8: its all-reduce kernel holds 15.4-15.9 ms of each ~19 ms step
    (raw JSON), most of it waiting for ranks not in the input. "Look at that op first: a better
    kernel" was offered for it, with a what-if making the NCCL kernel 30% faster; a collective's
    wait is for the communication recipes, not a hotspot's."""
    path = REAL / "mi300_resnet_actckpt_rank0of8.json.gz"
    with gzip.open(path, "rt") as f:
        collectives = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()}
    assert collectives
    table, analyses = analyze(path)
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        adv = advise(a, None, phases, table, mb=mb)
        for x in list(adv.suggestions) + list(adv.rejected):
            if getattr(x, "source", None) == "top-op-hotspot":
                assert not any(name in edit for edit in (x.edits or []) for name in collectives), x.edits


def test_an_exposed_all_reduce_in_bf16_is_offered_overlap_not_compression():
    """The MI300 ResNet's path is mostly its all-reduce, in NCCL's generic kernel whose args say
    "allreduce" and "BFloat16" (raw JSON). The all-reduce recipes selected it by a name it does not
    have and were never offered; the overlap recipe now is (its edit selects those kernels), saying
    that the input holds 1 of the job's 8 ranks, and the bf16 compression hook is not: its
    all-reduces move bf16 already."""
    path = REAL / "mi300_resnet_actckpt_rank0of8.json.gz"
    with gzip.open(path, "rt") as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_Generic")]
    reduces = [e for e in kernels if e["args"].get("Collective name") == "allreduce"]
    assert reduces and {e["args"]["dtype"] for e in reduces} == {"BFloat16"}
    table, analyses = analyze(path)
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        adv = advise(a, None, phases, table, mb=mb)
        offered = {x.source: x for x in adv.suggestions}
        overlap = offered.get("dp-allreduce-overlap")
        assert overlap is not None and overlap.edits == ["coll=all_reduce,scale=0.5"] and overlap.replay_saving_us > 0
        # rank 0 of a world of 8 (distributedInfo): the all-reduce's time includes the wait for the 7 not here
        assert "holds 1 of the job's 8 ranks" in overlap.explanation
        assert "dp-gradient-compression" not in offered | {x.source: x for x in adv.rejected if x.source}


def test_a_complete_job_gets_no_missing_ranks_caveat():
    """Our 2-rank gloo job with a delayed all-reduce on rank 1 holds both ranks: the all-reduce
    recipe is offered without saying that ranks are missing."""
    from tests.conftest import DATA

    table, analyses = analyze(DATA / "gloo_ddp_8steps_straggler")
    said = []
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        said += [x.explanation for x in advise(a, None, phases, table, mb=mb).suggestions if x.source == "dp-allreduce-overlap"]
    assert said and not any("ranks that are not here" in x for x in said)


COMPILE_RECIPES = {"small-ops-fusion", "elementwise-fusion", "gpu-compile"}


def _advice(path) -> list:
    table, analyses = analyze(path)
    out = []
    for a in analyses:
        phases, mb = node_phases(table, a.graph)
        out.append(advise(a, None, phases, table, mb=mb))
    return out


def test_a_compiled_and_graphed_step_is_not_told_to_compile_or_capture_graphs():
    """xdit's Flux runs under torch.compile with its CUDA-graph trees (ROCm): in the raw JSON,
    Inductor's kernels (``triton_...``) and the kernels replayed by ``hipGraphLaunch`` (they carry
    its correlation id). The CPU-overhead recipe told it to "Compile the model (torch.compile)"."""
    path = MORE / "xdit_flux_hipgraph_mi300.json.gz"
    with gzip.open(path, "rt") as f:
        ev = json.load(f)["traceEvents"]
    graph_calls = {e["args"]["correlation"] for e in ev if e.get("name") == "hipGraphLaunch"}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert sum(e["name"].startswith("triton_") for e in kernels) >= 400
    assert sum(e["args"].get("correlation") in graph_calls for e in kernels) >= 900
    for adv in _advice(path):
        offered = list(adv.suggestions) + [x for x in adv.rejected if x.source]
        assert not COMPILE_RECIPES & {x.source for x in offered}
        assert "launch-bound-cuda-graphs" not in {x.source for x in offered}
        for x in adv.suggestions:
            assert "Compile the model" not in x.remedy and "CUDA graph" not in x.remedy, (x.source, x.remedy)
            assert "runs compiled already" in x.remedy or x.source != "cpu-framework-overhead"


def _as_compiled(src, out) -> int:
    """``src`` as torch.compile (Inductor) would have run it: AOTAutograd's ``CompiledFunction``
    and Inductor's ``## Call CompiledFxGraph ##`` ranges over each step's forward range, a
    ``CompiledFunctionBackward`` and another graph call over the autograd thread's work in each
    backward range, and every kernel launched inside either named as one of Inductor's. How many
    kernels."""
    import collections

    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    ranges = {name: [e for e in ev if e.get("cat") == "user_annotation" and e.get("name") == name] for name in ("forward", "backward")}
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in ranges["forward"] + ranges["backward"]]
    graph = {"cat": "user_annotation", "name": "## Call CompiledFxGraph fabc123 ##", "args": {}}
    add = [{**e, "cat": "cpu_op", "name": "CompiledFunction", "args": {}} for e in ranges["forward"]]
    add += [{**e, **graph} for e in ranges["forward"]]
    for e in ranges["backward"]:
        ops = [x for x in ev if x.get("cat") == "cpu_op" and x["tid"] != e["tid"] and e["ts"] <= x["ts"] < e["ts"] + e["dur"]]
        tid = collections.Counter(x["tid"] for x in ops).most_common(1)[0][0]  # the autograd engine's thread
        ops = [x for x in ops if x["tid"] == tid]
        lo, hi = min(x["ts"] for x in ops), max(x["ts"] + x["dur"] for x in ops)
        add.append({**ops[0], "name": "CompiledFunctionBackward", "ts": lo, "dur": hi - lo, "args": {}})
        add.append({**ops[0], **graph, "ts": lo, "dur": hi - lo})
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    renamed = 0
    for e in ev:
        call = calls.get(e.get("args", {}).get("correlation")) if e.get("cat") == "kernel" else None
        if call is not None and any(lo <= call["ts"] < hi for lo, hi in spans):
            e["name"] = f"triton_poi_fused_{renamed % 40}"
            renamed += 1
    ev.extend(add)
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    return renamed


def test_the_same_job_compiled_is_not_told_to_compile(tmp_path):
    """Our eager DDP job on a GPU (rank 1): CPU-bound, its path full of short ops; the compile
    recipes are offered and the CPU-overhead one says to compile the model. The same trace
    rewritten as torch.compile runs its forward and backward (compiled ranges around them, Inductor's
    kernels): none of the compile recipes, and the CPU-overhead recipe says that the step runs
    compiled already and that its next step is a CUDA graph (none is replayed)."""
    src = OWN_GPU / "gloo_cuda_ddp_tiny_clean" / "rank-1.json.gz"
    before = _advice(src)
    assert sum(bool(COMPILE_RECIPES & {x.source for x in adv.suggestions}) for adv in before) >= 4
    cpu = [x for adv in before for x in adv.suggestions if x.source == "cpu-framework-overhead"]
    assert cpu and all(x.remedy.startswith("Compile the model") for x in cpu)
    out = tmp_path / "compiled.json.gz"
    assert _as_compiled(src, out) > 500
    after = _advice(out)
    assert len(after) == len(before)
    for adv in after:
        assert not COMPILE_RECIPES & ({x.source for x in adv.suggestions} | {x.source for x in adv.rejected if x.source})
    cpu = [x for adv in after for x in adv.suggestions if x.source == "cpu-framework-overhead"]
    assert cpu and all("runs compiled already" in x.remedy and "CUDA graph" in x.remedy for x in cpu)


def test_a_step_compiled_without_fusion_is_told_which_backend_fuses():
    """ddp_v100 runs under torch.compile (AOTAutograd's CompiledFunction and CompiledFunctionBackward
    in every step, in the raw JSON) with a backend that does not fuse: the ops inside are the
    model's own aten ops and kernels, and the trace holds no Inductor graph or kernel. The compile
    recipes apply and say why; the CPU-overhead one names Inductor, not "compile the model"."""
    path = REAL / "ddp_v100_rank1of2_5steps.json.gz"
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    forward = [e for e in ev if e["name"] == "CompiledFunction"]
    assert len(forward) == 5 and sum(e["name"] == "CompiledFunctionBackward" for e in ev) == 5
    assert not any(e["name"].startswith("triton_") or "CompiledFxGraph" in e["name"] or "_inductor" in e["name"] for e in ev)
    f0 = forward[0]
    inside = {e["name"] for e in ev if e["tid"] == f0["tid"] and f0["ts"] <= e["ts"] < f0["ts"] + f0["dur"]}
    assert {"aten::addmm", "aten::add", "aten::relu"} <= inside  # (eager ops, run one by one)
    advice = _advice(path)
    for adv in advice:
        offered = {x.source: x for x in adv.suggestions}
        assert "small-ops-fusion" in offered and "backend that runs its ops one by one" in offered["small-ops-fusion"].explanation
        assert offered["cpu-framework-overhead"].remedy.startswith("Compile with Inductor, torch.compile's default backend")


def _raw_ops_us(path, pattern: str) -> dict[int, float]:
    """From the raw JSON: per ProfilerStep, the summed time of the complete events whose names match."""
    import re

    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in ev
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"  # (not its copy on the device)
    ]
    out = {n: 0.0 for _, _, n in steps}
    for e in ev:
        if re.search(pattern, str(e["name"])):
            for lo, hi, n in steps:
                out[n] += e["dur"] if lo <= e["ts"] < hi else 0.0
    return out


def test_attention_advice_is_for_attention_written_as_matmul_and_softmax():
    """Our attention block on the CPU, recorded twice (benchmarks/record_attention.py): as matmul and
    softmax, the SDPA recipe is shown; through scaled_dot_product_attention (its host op holds half
    of each step, in the raw JSON) it was offered too, the op's name holding "attention"."""
    own = OWN_GPU.parent / "own-cpu"
    eager, sdpa = own / "attention_eager.json.gz", own / "attention_sdpa.json.gz"
    assert all(v > 0 for v in _raw_ops_us(eager, r"^aten::_?softmax$").values())
    fused = _raw_ops_us(sdpa, r"^aten::_scaled_dot_product_flash_attention_for_cpu$")
    assert fused and all(v > 0 for v in fused.values()) and not any(_raw_ops_us(sdpa, r"(?i)softmax|bmm").values())
    assert all("attention-sdpa" in {x.source for x in adv.suggestions} for adv in _advice(eager))
    for adv in _advice(sdpa):
        assert "attention-sdpa" not in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected if x.source}


def test_a_linear_layer_is_no_elementwise_chain():
    """The SDPA twin's path is its attention and its two Linear layers (``aten::addmm``); its
    elementwise arithmetic (aten::add, mul, div, sub in the raw JSON) is under 1% of each step.
    The elementwise recipe counted ``aten::addmm`` as an ``aten::add`` and offered to fuse it."""
    path = OWN_GPU.parent / "own-cpu" / "attention_sdpa.json.gz"
    spans = _raw_ops_us(path, r"^ProfilerStep#")
    arithmetic = _raw_ops_us(path, r"^aten::(add|mul|div|sub)_?$")
    assert all(arithmetic[n] < 0.01 * spans[n] for n in spans) and all(v > 0 for v in _raw_ops_us(path, r"^aten::addmm$").values())
    for adv in _advice(path):
        assert "elementwise-fusion" not in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected if x.source}


def test_a_recipes_edits_select_what_its_symptom_counted():
    """owlv2's attention softmax runs in ``cunn_SoftMaxForward`` kernels (raw JSON: 2.4 ms each,
    most of a second in all): the SDPA recipe counted them ("softmax" in any case) and its edit
    ``name~=softmax`` did not select them (case), so its replay predicted 170 µs and the recipe
    was dropped. ``name~=`` matches in any case: the recipe is shown, saving about half of them."""
    path = MORE / "owlv2_h100_1step.json.gz"
    softmax = sum(_raw_ops_us(path, r"cunn_SoftMaxForward").values())
    assert softmax > 200_000
    (adv,) = _advice(path)
    (s,) = [x for x in adv.suggestions if x.source == "attention-sdpa"]
    assert 0.4 * softmax / 2 <= s.replay_saving_us <= softmax / 2 * 1.1, (s.replay_saving_us, softmax)


def test_the_optimizer_recipe_is_for_an_optimizer_that_is_not_fused():
    """AdamW as a Python loop, as foreach, fused (our recordings: its step over half of each step
    in the first two, a fifth to a quarter fused, in the raw JSON). PyTorch's own
    ``Optimizer.step#AdamW.step`` range is the optimizer phase: the recipe read no optimizer time
    in any of them and was never offered. Now: the loop is told to go foreach or fused, foreach
    to go fused (it is foreach already), the fused step nothing."""
    own = OWN_GPU.parent / "own-cpu"
    for mode in ("for_loop", "foreach", "fused"):
        path = own / f"adamw_{mode}.json.gz"
        spans, opt = _raw_ops_us(path, r"^ProfilerStep#"), _raw_ops_us(path, r"^Optimizer\.step#AdamW\.step$")
        share = min(opt[n] / spans[n] for n in spans)
        foreach, fused = sum(_raw_ops_us(path, r"^aten::_foreach_").values()), sum(_raw_ops_us(path, r"^aten::_fused_adamw_$").values())
        shown = [x for adv in _advice(path) for x in adv.suggestions if x.source == "optimizer-foreach-fused"]
        if mode == "fused":
            assert fused > 0 and share > 0.15 and not shown
            continue
        assert share > 0.5 and fused == 0 and (foreach > 0) == (mode == "foreach")
        assert len(shown) == 3 and all(x.replay_saving_us > 0.1 * min(opt.values()) for x in shown)
        said = {x.remedy for x in shown}
        assert all(("foreach one already" in r) == (mode == "foreach") for r in said), said


def _raw_host_code_us(path) -> float:
    """From the raw JSON: the time of the step's thread in Python frames that call no op (no
    cpu_op and no runtime call inside them on that thread), outside PyTorch's own files: the union
    of the outermost ones."""
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in ev if str(e["name"]).startswith("ProfilerStep#"))
    mine = [e for e in ev if e["tid"] == step["tid"] and e["pid"] == step["pid"]]
    ops = sorted(e["ts"] for e in mine if e.get("cat") in ("cpu_op", "cuda_runtime"))
    import bisect

    free = [
        e
        for e in mine
        if e.get("cat") == "python_function"
        and "torch/" not in e["name"]
        and bisect.bisect_left(ops, e["ts"]) == bisect.bisect_left(ops, e["ts"] + e["dur"])
    ]
    total, reach = 0.0, -1.0
    for e in sorted(free, key=lambda e: (e["ts"], -e["dur"])):
        lo, hi = max(e["ts"], reach), e["ts"] + e["dur"]
        total += max(0.0, hi - lo)
        reach = max(reach, hi)
    return total


def test_preprocessing_on_the_host_is_not_framework_overhead():
    """timesformer's step decodes and normalises its video on the host (numpy, PyAV: Python frames
    that call no PyTorch op, 217 ms of its 382 ms step in the raw JSON) before the model runs.
    The CPU-overhead recipe told it to "Compile the model"; that leaves this time as it is. The
    host-code recipe names it and moves it off the step's thread."""
    path = MORE / "timesformer_h100_1step.json.gz"
    raw = _raw_host_code_us(path)
    assert raw > 150_000
    (adv,) = _advice(path)
    assert not any("Compile the model" in x.remedy for x in adv.suggestions)
    (s,) = [x for x in adv.suggestions if x.source == "host-code-on-path"]
    assert "transformers/" in s.explanation and 0.5 * raw <= s.replay_saving_us <= raw


def test_a_pipelines_data_loader_holds_its_preprocessing():
    """owlv2's Hugging Face pipeline preprocesses its image inside the DataLoader it iterates
    (five ``enumerate(DataLoader)#...__next__`` of 122-128 ms hold 619 ms of the 1211 ms step in the
    raw JSON, scipy's zoom among it). The data-loading recipe counted only the range's own time and its edit selected
    ops named DataLoader: a 12 µs saving, dropped; the CPU-overhead one said "Compile the model".
    Now the loader's whole time is its, and its edit the work inside it."""
    path = MORE / "owlv2_h100_1step.json.gz"
    loader = sum(_raw_ops_us(path, r"^enumerate\(DataLoader\)#").values())
    assert loader > 500_000
    (adv,) = _advice(path)
    assert not any("Compile the model" in x.remedy for x in adv.suggestions)
    (s,) = [x for x in adv.suggestions if x.source == "dataloader-stall"]
    assert 0.5 * loader <= s.replay_saving_us <= loader, (s.replay_saving_us, loader)


def test_the_host_copy_recipe_is_for_copies_between_host_and_device():
    """diff_test's copies (raw JSON): 4,645 device-to-device (its CUDA graphs' static inputs, 93 ms)
    and 151 host-to-device from pinned memory. The copy recipe counted every copy and told it, in
    every step, to "Pin host memory": a device-to-device copy has no host memory, and its host
    copies are pinned already."""
    path = PUBLIC / "diff_test_rank1of2.json.gz"
    with gzip.open(path, "rt") as f:
        copies = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert copies.count("Memcpy DtoD (Device -> Device)") > 4000
    assert {c for c in copies if "HtoD" in c} == {"Memcpy HtoD (Pinned -> Device)"}
    for adv in _advice(path):
        assert not any("Pin host memory" in x.remedy for x in adv.suggestions)


def test_an_all_to_all_in_nccls_sendrecv_kernel_is_no_pipeline_send(tmp_path):
    """diff_test runs its embeddings' all-to-alls in NCCL's ``ncclKernel_SendRecv_*`` (raw JSON:
    every one whose launch is traced launched inside an ``nccl:all_to_all`` range). The advisor
    counted them as sends by their name and offered the pipeline recipe ("overlap sends with the
    next micro-batch") to a job with no pipeline. The same trace with every op and range named for
    an all-to-all renamed ``nccl:send`` (a pipeline's transfers, run in the same kernel) is offered
    it again."""
    import bisect

    path = PUBLIC / "diff_test_rank1of2.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "nccl:all_to_all")
    kernels = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_SendRecv")]
    launched = [k for k in kernels if k["args"]["correlation"] in calls]  # (one was queued before the trace began)
    assert len(launched) > 40
    for k in launched:
        call = calls[k["args"]["correlation"]]
        i = bisect.bisect_right(ranges, (call["ts"], float("inf"))) - 1
        assert i >= 0 and ranges[i][0] <= call["ts"] <= ranges[i][1]

    def offered(p) -> list[bool]:
        return [
            "pp-p2p-latency" in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected if x.source} for adv in _advice(p)
        ]

    assert not any(offered(path))
    import re

    for e in doc["traceEvents"]:  # (the ops and the job's own ranges: "## alltoall_fwd_single ##")
        if e.get("ph") == "X" and re.search(r"(?i)all_?(to|2)_?all", str(e.get("name", ""))):
            e["name"] = "nccl:send"
    out = tmp_path / "sends.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    assert all(offered(out))


def test_the_hotspot_recipe_does_not_name_a_python_call():
    """owlv2's largest op on its path is ``<built-in function zoom_shift>`` (scipy, a
    ``python_function`` event in the raw JSON, inside its pipeline's DataLoader): "look at that op
    first: a better kernel, a fused replacement" named it. Host code is the data-loading and
    host-code recipes' (here data loading, shown); the hotspot recipe names ops."""
    path = MORE / "owlv2_h100_1step.json.gz"
    with gzip.open(path, "rt") as f:
        cats = {e.get("cat") for e in json.load(f)["traceEvents"] if e.get("name") == "<built-in function zoom_shift>"}
    assert cats == {"python_function"}
    (adv,) = _advice(path)
    for x in list(adv.suggestions) + [r for r in adv.rejected if r.source]:
        assert not any("zoom_shift" in edit for edit in (x.edits or [])), (x.source, x.edits)
    assert "dataloader-stall" in {x.source for x in adv.suggestions}

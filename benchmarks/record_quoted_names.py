"""Record a small training loop on the CPU, profiled with ``with_stack=True``, whose loss is a
function generated from a template and compiled under a file name that holds double quotes (a
code generator naming its code by its configuration, ``compile(src, json.dumps(cfg), "exec")``,
as dynamo's generated frames and ``exec``'d ``<module>`` sources do). PyTorch's profiler writes
each Python frame's name as ``<file name>(<line>): <function>`` into its Chrome trace without
escaping the quotes (pytorch/pytorch#146900; still so in PyTorch 2.13), so the file it writes is
not valid JSON. The trace behind tests/data/own-cpu/quoted_names_stack.json.gz
(tests/graph_pipeline/test_quoted_names.py: such a trace is read, its names as written).

    python benchmarks/record_quoted_names.py tests/data/own-cpu
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from record_compiled import export_gzipped, out_folder  # (benchmarks/, beside this script)

LOSS_CONFIG = {"reduction": "mean", "label_smoothing": 0.1}
LOSS_SOURCE = """\
def loss_fn(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, reduction={reduction!r}, label_smoothing={label_smoothing!r})
"""
FILE_NAME = json.dumps(LOSS_CONFIG)
"""The generated code's file name: the profiler names its frame ``{FILE_NAME}(1): loss_fn``."""


def generated_loss() -> object:
    scope: dict[str, object] = {"torch": torch}
    exec(compile(LOSS_SOURCE.format(**LOSS_CONFIG), FILE_NAME, "exec"), scope)
    return scope["loss_fn"]


def record(out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loss_fn = generated_loss()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5), with_stack=True) as prof:
        for _ in range(7):
            loss_fn(model(x), y).backward()  # type: ignore[operator]
            opt.step()
            opt.zero_grad()
            prof.step()
    export_gzipped(prof, out / "quoted_names_stack.json.gz")


if __name__ == "__main__":
    record(out_folder(__doc__))

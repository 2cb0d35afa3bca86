"""Record a one-process training loop that writes a checkpoint every fourth step (work the profiler records no op for).

Each of 12 profiled steps: a 200,000-row embedding table (64 wide, sparse gradients: the state a
recommendation model checkpoints is mostly its tables) feeding a 64 -> 256 -> 64 MLP with GELU,
batch 32, forward, backward, SGD.
After every fourth iteration (profiled steps 5, 9 and 13) the loop writes the model's and the
optimizer's state with ``torch.save`` to a temporary file before ``prof.step()``, as a training
script checkpoints every N steps. No ``record_function`` marks it: pickling the state and writing
the file run no op the profiler records, so the trace shows those steps' spans running on past
their last op. The last profiled step is one of them: its span ends long after its rank's last event.

    python benchmarks/record_checkpoint.py tests/data/own-cpu/checkpoint_every4.json.gz
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import export_gzipped  # noqa: E402

STEPS = 12  # profiled steps
WAIT, WARMUP = 1, 1
EVERY = 4  # a checkpoint after every EVERY-th profiled step


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    out: Path = ap.parse_args().out
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Embedding(200_000, 64, sparse=True), torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = schedule(wait=WAIT, warmup=WARMUP, active=STEPS)
    with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched) as prof:
        for i in range(WAIT + WARMUP + STEPS):
            x = torch.randint(0, 200_000, (32,))
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= WAIT + WARMUP and (i - WAIT - WARMUP + 1) % EVERY == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, Path(tmp) / "checkpoint.pt")
            prof.step()
    export_gzipped(prof, out)


if __name__ == "__main__":
    main()

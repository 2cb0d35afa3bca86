"""Record a small training loop on the CPU whose main thread blocks in Python calls, profiled
with ``with_stack=True`` (the profiler's Python tracer names each call): a DataLoader with two
worker processes (the main thread reads each batch from their pipe), a tqdm bar (its monitor
thread sleeps beside the loop), a ``time.sleep`` every other step (a logging pause), and in the
other steps a wait on a helper thread's queue (``queue.get``: a lock's ``acquire``) while the
helper computes. The trace behind tests/data/own-cpu/host_waits_stack.json.gz
(tests/analysis/test_unseen.py: a blocked thread is waiting, not working).

    python benchmarks/record_host_waits.py tests/data/own-cpu
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from record_compiled import export_gzipped, out_folder  # (benchmarks/, beside this script)

SLEEP_S = 0.005


def _helper(jobs: queue.Queue, done: queue.Queue) -> None:
    """Computes a summary of each batch it is handed (a stand-in for a metrics or EMA thread)."""
    w = torch.randn(512, 512)
    while (x := jobs.get()) is not None:
        y = x
        for _ in range(20):
            y = torch.tanh(y @ w[: y.shape[1], :256] if y.shape[1] != 256 else y @ w[:256, :256])
        done.put(float(y.sum()))


def record(out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(1024, 256), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=64, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    jobs: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    helper = threading.Thread(target=_helper, args=(jobs, done), name="helper", daemon=True)
    helper.start()
    plan = schedule(wait=1, warmup=1, active=4)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, with_stack=True) as prof:
        for i, (x, y) in enumerate(tqdm(loader, total=6, mininterval=0.001)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i % 2 == 0:
                time.sleep(SLEEP_S)  # a logging pause
            else:
                jobs.put(x.detach())
                done.get()  # waits for the helper thread's summary
            prof.step()
            if i == 5:
                break
    jobs.put(None)
    export_gzipped(prof, out)


def main() -> None:
    out = out_folder(__doc__)
    record(out / "host_waits_stack.json.gz")


if __name__ == "__main__":
    main()

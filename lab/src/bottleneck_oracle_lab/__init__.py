"""BottleneckOracle's lab: what records the runs, builds the datasets and trains and evaluates the
models the product ships (``bottleneck_oracle``). It is not needed to analyse a trace.

- ``systems``: the profiler hook, delay injection, the reference workloads (DP, TP, PP), the
  grid of recorded runs and the paired conditions (``bottleneck-oracle generate``);
- ``training``: the dataset (``build-dataset``), ``train``, ``eval``, the re-run scoring and
  the corrections' training;
- ``models``: the PyTorch Geometric HeteroGAT, the baselines, the ``.pt`` checkpoints and the
  torch reference of the product's numpy inference.

Install beside the product: ``pip install -e . -e lab/`` (``make venv`` does).
"""

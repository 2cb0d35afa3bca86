"""BottleneckOracle: critical path, slack and bottlenecks of (distributed) training steps."""

__version__ = "0.1.0"

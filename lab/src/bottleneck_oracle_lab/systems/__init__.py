"""Recording: the profiler hook, delay injection, the reference workloads, the grid and the paired conditions."""

"""The simulated clock: workloads, the cost model and the SimPy engine."""

"""Calibration: time this machine's kernels and fit a device profile's rooflines
(`edgefl devices calibrate`)."""

"""GPU sources (NVML, DCGM, simulated) behind one narrow interface, polled in the background."""

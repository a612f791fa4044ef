"""GPU sources (NVML, simulated) behind one narrow interface, polled in the background."""

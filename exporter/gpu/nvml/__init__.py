"""The NVML GPU source, over ``pynvml`` (nvidia-ml-py).

``source`` is the ``GpuSource`` the poller calls; it reads each device through
``device`` (clocks, memory, power, utilisation, ECC), which uses ``gpm`` for SM
occupancy where GPM exists and ``pcie`` for byte counters; ``events`` watches XID
events, ``processes`` lists the processes on each device, and ``errors`` sorts
NVML's exceptions into what the exporter does about them (skip a field, drop a
device, give up). Only this package imports ``pynvml``.
"""

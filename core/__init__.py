"""gpuscope: request phases and GPU counters on one time axis."""

__version__ = "0.1.0"

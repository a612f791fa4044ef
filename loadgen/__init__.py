"""Load generation (``gpuscope loadgen``), tuning sweeps (``gpuscope tune``) and the demo."""

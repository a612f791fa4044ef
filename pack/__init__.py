"""What the rule builder (``alerts/``), the board builder (``dashboards/``) and the
Kubernetes builder (``deploy/kubernetes/``) share, and nothing else: the one settings
table (``settings.py``: job selectors, thresholds, windows, objectives, and its
Kubernetes section ``KubeSettings``), the contract with gpuscope (``contract.py``:
metric and label names, phases), the engines each source maps (``engines/``, one
module per engine), the PCIe capacity table (``pcie.py``), the names of the recorded
series that boards read and rules write (``recorded.py``) and the YAML the builders
write (``documents.py``: the dump, the PrometheusRule). ``build.py`` writes every
generated file of the pack at once.

A package of the checkout, importable from the repository root, never installed. The
builders import this package, gpuscope's contract and their own third-party packages,
never each other nor the rest of gpuscope; this package imports none of them but in
``build.py`` (``tests/dashboards/test_dashboards_pack_layout.py`` holds that).
"""

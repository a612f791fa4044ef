"""What the rule builder (``alerts/``) and the board builder (``dashboards/``) share,
and nothing else: the one settings table (``settings.py``: job selectors, thresholds,
windows, objectives), the contract with gpuscope (``contract.py``: metric and label
names, phases), the engines each source maps (``engines.py``), the PCIe capacity table
(``pcie.py``) and the names of the recorded series that boards read and rules write
(``recorded.py``). ``build.py`` writes every generated file of the pack at once.

A package of the checkout, importable from the repository root, never installed. The
two builders import this package and gpuscope, never each other
(``tests/dashboards/test_dashboards_pack_layout.py`` holds that).
"""

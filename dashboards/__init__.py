"""Builders of the Grafana dashboards (``json/``, written by ``build.py``); not shipped.

A package of the checkout, importable from the repository root (``pytest`` and
``mypy`` run there), never installed: ``python dashboards/build.py`` or ``make
dashboards`` regenerates the committed JSON. Metric names, label names and phases
come from gpuscope itself (``contract.py``); ``engines.py`` and ``pcie.py`` are
shared with the rules of ``alerts``.
"""

"""Builders of the Grafana dashboards (``json/``, written by ``build.py``); not shipped.

A package of the checkout, importable from the repository root (``pytest`` and
``mypy`` run there), never installed: ``python dashboards/build.py`` or ``make
dashboards`` regenerates the committed JSON. Metric names, label names and phases
come from gpuscope itself (``pack/contract.py``), the recorded series' names and the
settings from the pack (``pack/``), which the rules of ``alerts`` read too; this
package never imports ``alerts``.
"""

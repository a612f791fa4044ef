"""Builders of the Prometheus recording and alerting rules (``rules/``, written by
``build.py`` from the pack's one table, ``pack/settings.py``); not shipped.

A package of the checkout, importable from the repository root (``pytest`` and
``mypy`` run there), never installed: ``python alerts/build.py`` or ``make rules``
regenerates the committed YAML. Metric names, label names and phases come from
gpuscope itself through ``pack.contract``; this package never imports ``dashboards``.
"""

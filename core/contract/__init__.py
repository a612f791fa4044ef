"""The contract: what gpuscope serves and answers, named once.

A leaf: these modules import nothing of the project but one another, and no
third-party package (a test walks their imports), so every side reads them alike: the
exporter and the worker, which build their families and collectors from the rows; the
middleware, which sends to the default endpoint (it may import ``gpuscope.contract.http``
on its hot path: nothing but the standard library comes with it); the pack's rule and
board builders (``pack/contract.py``); the load generator. Outside these modules no
``gpuscope_*`` metric name, HTTP path or default port is written as a string (a test
checks: tests/core/test_core_contract.py).

- ``rows``: ``MetricDef``, one row per metric family (name, type, help, labels,
  buckets), and ``label_values`` / ``label_order``, which build a row's label tuple by
  label name;
- ``labels``: the label names;
- ``exporter``: the exporter's request and self-metric rows;
- ``gpu``: the exporter's GPU rows;
- ``worker``: the reference worker's rows;
- ``http``: the HTTP paths and the default port.

Phases, compute stages and the span attribute keys are ``gpuscope.spans``, the span
contract between middleware and exporter, a leaf of the same kind (the same test holds
it to the same rule). This ``__init__`` imports nothing, so that the middleware's import
of ``gpuscope.contract.http`` costs that module alone.
"""

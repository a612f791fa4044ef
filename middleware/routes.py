"""Route templates (``/v1/items/{id}``) for span names, never raw paths.

FastAPI puts the matched route object in ``scope["route"]``. Plain Starlette only
leaves ``scope["endpoint"]`` and ``scope["router"]``, so the endpoint is looked up
in a table built once per router from its routes (mounts included). An endpoint
served under two templates is ambiguous and yields no route rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuscope.middleware.types import Scope

_AMBIGUOUS = ""


def _template(route: Any) -> str | None:
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    return template if isinstance(template, str) else None


def _walk(routes: Iterable[Any], prefix: str, table: dict[Any, str]) -> None:
    for route in routes:
        template = _template(route)
        if template is None:
            continue
        children = getattr(route, "routes", None)
        if children and not hasattr(route, "endpoint"):  # a Mount
            _walk(children, prefix + template, table)
            continue
        endpoint = getattr(route, "endpoint", None)
        if endpoint is None:
            continue
        full = prefix + template
        try:
            known = table.get(endpoint)
        except TypeError:  # an unhashable endpoint: cannot be looked up, skip it
            continue
        table[endpoint] = full if known in (None, full) else _AMBIGUOUS


class RouteResolver:
    """Finds the route template of a finished request from its ASGI scope."""

    def __init__(self) -> None:
        # id(router) -> (number of routes when built, endpoint -> template)
        self._tables: dict[int, tuple[int, dict[Any, str]]] = {}

    def resolve(self, scope: Scope, root_path: str) -> str | None:
        """The template, prefixed by any mount the request went through."""
        route = scope.get("route")
        if route is not None:
            template = _template(route)
            if template is not None:
                mount_prefix: str = scope.get("root_path", "")[len(root_path) :]
                return mount_prefix + template
        endpoint = scope.get("endpoint")
        router = scope.get("router")
        if endpoint is None or router is None:
            return None
        return self._lookup(router, endpoint)

    def _lookup(self, router: Any, endpoint: Any) -> str | None:
        routes = getattr(router, "routes", ())
        cached = self._tables.get(id(router))
        try:
            if cached is not None and (endpoint in cached[1] or cached[0] == len(routes)):
                template: str | None = cached[1].get(endpoint)
                return template or None
            table: dict[Any, str] = {}
            _walk(routes, "", table)
            self._tables[id(router)] = (len(routes), table)
            return table.get(endpoint) or None
        except TypeError:  # an unhashable endpoint
            return None

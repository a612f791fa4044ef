"""gpuscope: request phases and GPU counters on one time axis."""

import os as _os

__version__ = "0.1.0"

# In a source checkout the subpackages live in sibling folders (middleware/,
# exporter/, ...) that the installed package maps into gpuscope.*. When Python
# imports this package straight from the checkout (``python -m`` from the repository
# root puts the root first on sys.path), let it find those folders too.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "middleware", "__init__.py")):
    __path__.append(_checkout)

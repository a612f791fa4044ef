"""Write every generated file of the pack at once: the rules (``alerts/rules/``), the
boards (``dashboards/json/``) and the Kubernetes manifests that carry both
(``deploy/kubernetes/``), in that order, from the one table ``pack/settings.py``::

    python pack/build.py            # or: make pack
    python pack/build.py --check    # exit 1, naming them, if committed files are stale

Each builder also runs alone (``alerts/build.py``, ``dashboards/build.py``,
``deploy/kubernetes/build.py``), with flags of its own for test variants.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file, Python puts this folder first on sys.path; the builders are
    # packages of the repository root, which takes its place.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from alerts import build as rules
from dashboards import build as boards
from deploy.kubernetes import build as kubernetes

# Each builder, the folder it writes (from the repository root) and its entry. The
# manifests carry the rules and the boards, so they are built last.
BUILDERS: tuple[tuple[str, str, Callable[[list[str]], int]], ...] = (
    ("rules", "alerts/rules/", rules.main),
    ("dashboards", "dashboards/json/", boards.main),
    ("kubernetes", "deploy/kubernetes/", kubernetes.main),
)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if any generated file is stale")
    args = parser.parse_args(argv)
    flags = ["--check"] if args.check else []
    # each builder names its stale files (under its folder) as it checks
    failed = [f"{name} ({folder})" for name, folder, build in BUILDERS if build(list(flags)) != 0]
    if failed:
        print(f"pack: stale: {', '.join(failed)}; run 'make pack'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

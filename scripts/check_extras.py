"""Install each extra of gpuscope alone in a fresh venv and smoke-test it (part of ``make test``).

    python scripts/check_extras.py              # base exporter worker loadgen all
    python scripts/check_extras.py torch        # also PyTorch (a large download)

Builds the wheel once, then per install: a venv without pip, ``pip --python <venv>
install --no-compile 'gpuscope-*.whl[extra]'`` (non-editable, from pip's usual
indexes and cache) and ``extras_smoke.py <extra>`` run by the venv's own Python.
Installs run two at a time; the report gives each one's install and smoke time, and
the whole.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = Path(__file__).resolve().parent / "extras_smoke.py"
DEFAULT = ("base", "exporter", "worker", "loadgen", "all")
KNOWN = (*DEFAULT, "torch")
PARALLEL = 2
TIMEOUT_S = 600


@dataclass
class Outcome:
    extra: str
    install_s: float = 0.0
    smoke_s: float = 0.0
    failure: str = ""


def pip(*args: str) -> list[str]:
    # -qq: the machine's extra indexes print harmless warnings at -q
    return [sys.executable, "-m", "pip", "-qq", *args]


def build_wheel(into: Path, source: Path) -> Path:
    subprocess.run(pip("wheel", "--no-deps", "-w", str(into), str(source)), check=True)
    (wheel,) = into.glob("gpuscope-*.whl")
    return wheel


def checkout_copy(into: Path) -> Path:
    """The files git would commit (tracked, and new ones not ignored), copied to
    ``into``: a build in the checkout itself reuses setuptools' ``build/lib``, which
    keeps a module deleted since and would ship it; a fresh clone has none. Without
    git (an unpacked sdist), the checkout as it is."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return ROOT
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if path.is_file():  # a file deleted but not yet committed is listed too
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into / name)
    return into


def step(command: list[str], cwd: Path) -> str:
    """Run ``command``; its output when it fails, else empty."""
    try:
        result = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{command[:3]} took more than {TIMEOUT_S} s"
    if result.returncode == 0:
        return ""
    return f"exit {result.returncode}\n{result.stdout}{result.stderr}"


def check(extra: str, wheel: Path, workdir: Path) -> Outcome:
    outcome = Outcome(extra)
    venv = workdir / f"venv-{extra}"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    target = str(wheel) if extra == "base" else f"{wheel}[{extra}]"
    # --no-compile: byte-compiling every installed file doubles the install time;
    # the smoke test compiles what it imports
    install = pip("--python", str(python), "install", "--no-compile", target)
    outcome.failure = step(install, workdir)
    outcome.install_s = time.monotonic() - started
    if not outcome.failure:
        started = time.monotonic()
        outcome.failure = step([str(python), str(SMOKE), extra], workdir)
        outcome.smoke_s = time.monotonic() - started
    return outcome


def main(argv: list[str]) -> int:
    extras = tuple(argv) or DEFAULT
    unknown = [extra for extra in extras if extra not in KNOWN]
    if unknown:
        print(f"check_extras: unknown {unknown}; known: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuscope-extras-") as tmp:
        workdir = Path(tmp)
        wheel = build_wheel(workdir / "dist", checkout_copy(workdir / "source"))
        with ThreadPoolExecutor(PARALLEL) as pool:
            outcomes = list(pool.map(lambda extra: check(extra, wheel, workdir), extras))
    for outcome in outcomes:
        report(outcome)
    failed = sum(1 for outcome in outcomes if outcome.failure)
    print(f"all installs checked in {time.monotonic() - started:.0f} s")
    print(f"extras: {len(outcomes) - failed} passed, {failed} failed")
    return 1 if failed else 0


def report(outcome: Outcome) -> None:
    status = "FAIL" if outcome.failure else "ok  "
    name = "gpuscope" if outcome.extra == "base" else f"gpuscope[{outcome.extra}]"
    times = f"install {outcome.install_s:5.1f} s  smoke {outcome.smoke_s:5.1f} s"
    print(f"{status} {name:<20} {times}")
    if outcome.failure:
        print("     " + outcome.failure.replace("\n", "\n     "))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

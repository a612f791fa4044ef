"""Building the C fake ``libnvidia-ml.so.1`` and the environment that makes the real
pynvml load it.

The library is compiled once per source hash and driver branch into
``build/cnvml/<hash>/r<branch>/`` with the system C compiler, against the vendored
``include/nvml.h`` (so every signature and struct is NVIDIA's). pynvml opens
``libnvidia-ml.so.1`` through the dynamic loader, so ``LD_LIBRARY_PATH`` picks the
fake; it keeps the library for the process's life, hence one subprocess per scenario.

Without a compiler the tests that need the library skip with the reason, except in CI
(``CI`` set), where they fail: a broken build must not hide behind skips.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SOURCE = HERE / "fake_nvml.c"
HEADER = HERE / "include" / "nvml.h"
BUILD = ROOT / "build" / "cnvml"
# The branches whose entry points differ for gpuscope (see fake_nvml.c's #if blocks)
BRANCHES = (535, 550, 555, 580)
NEWEST_BRANCH = 580
# nvidia-ml-py releases the GPU tests run: the floor pyproject.toml declares and the
# newest; the Makefile's pynvml-versions target installs each as a single-module copy
PYNVML_FLOOR, PYNVML_NEWEST = "12.535.77", "13.615.71"
PYNVML_DIR = ROOT / ".venv" / "pynvml"


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def library_dir(branch: int = NEWEST_BRANCH) -> Path:
    """The folder holding ``libnvidia-ml.so.1`` of driver branch ``branch`` (built now
    if it is not there yet)."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        _unavailable("no C compiler (gcc or cc) to build the fake libnvidia-ml.so.1")
        raise AssertionError("unreachable")
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes()).hexdigest()[:16]
    folder = BUILD / digest / f"r{branch}"
    library = folder / "libnvidia-ml.so.1"
    if library.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".libnvidia-ml.so.1.{os.getpid()}"
    command = [
        compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror",
        f"-DFAKE_NVML_BRANCH={branch}", f"-I{HEADER.parent}",
        "-o", str(partial), str(SOURCE), "-lm", "-lpthread",
    ]  # fmt: skip
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"building the fake NVML failed:\n{built.stderr}")
    partial.replace(library)  # atomic: parallel sessions never load a half-written file
    return folder


def pynvml_path(version: str) -> Path:
    """The folder of a single-module nvidia-ml-py ``version`` (``make pynvml-versions``)."""
    folder = PYNVML_DIR / version
    if not (folder / "pynvml.py").exists():
        _unavailable(
            f"nvidia-ml-py {version} is not installed in {folder}: run 'make pynvml-versions'"
        )
    return folder


def environment(
    profile: Path,
    *,
    branch: int = NEWEST_BRANCH,
    pynvml: str | None = None,
    knobs: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a subprocess whose pynvml loads the fake with ``profile``:
    ``pynvml`` picks a nvidia-ml-py release (default: the venv's), ``knobs`` sets
    ``FAKE_NVML_<NAME>`` fault knobs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(library_dir(branch)), os.environ.get("LD_LIBRARY_PATH", "")])
    )
    env["FAKE_NVML_PROFILE"] = str(profile)
    if pynvml is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(pynvml_path(pynvml)), os.environ.get("PYTHONPATH", "")])
        )
    for name, value in (knobs or {}).items():
        env[f"FAKE_NVML_{name}"] = value
    return env


def run_python(
    code: str, env: Mapping[str, str], timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (its own pynvml, its own copy of the library)."""
    return subprocess.run(
        [sys.executable, "-c", code], env=dict(env), capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip

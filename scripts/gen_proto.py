"""Generate the Python bindings for the wire contracts in ``proto/``.

Run through ``make proto``. Each wire package has a target package of ours:

- ``proto/bigfleet/v1alpha1/`` -> ``bigfleet/v1alpha1/`` (imports as
  ``bigfleet.v1alpha1.<name>_pb2``, the proto path itself);
- ``proto/compute_scaling/client/v1/`` -> ``nanook/v1/``: the Nanook scaling
  service keeps its published proto package (``compute_scaling.client.v1``)
  on the wire, and the generated modules' imports of each other are rewritten
  to ``nanook.v1`` so no foreign top-level package is installed.

With ``--check`` the bindings are generated into a scratch directory and
compared with the committed ones; the exit status is 1 when they differ
(stale bindings).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


@dataclass(frozen=True)
class WirePackage:
    """One directory of ``.proto`` files and the package of ours its bindings go to."""

    source: Path  # under proto/, also the proto import path
    target: Path  # under the repository root
    doc: str

    @property
    def source_module(self) -> str:
        return ".".join(self.source.parts)

    @property
    def target_module(self) -> str:
        return ".".join(self.target.parts)


PACKAGES = (
    WirePackage(
        Path("bigfleet") / "v1alpha1",
        Path("bigfleet") / "v1alpha1",
        "Generated bindings for the bigfleet.v1alpha1 wire contracts (``make proto``).",
    ),
    WirePackage(
        Path("compute_scaling") / "client" / "v1",
        Path("nanook") / "v1",
        "Generated bindings for the compute_scaling.client.v1 scaling service (``make proto``).",
    ),
)


def _protoc(out: Path, sources: list[str]) -> None:
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    # protoc finds the mypy plugins on PATH; they live beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def _rehome(text: str, package: WirePackage) -> str:
    """Point the generated modules' imports of each other at our package.

    Only import statements and the module name handed to the descriptor
    builder change; service and message names (the wire) keep the proto
    package.
    """
    src, dst = package.source_module, package.target_module
    lines = []
    for line in text.splitlines(keepends=True):
        if line.startswith(f"from {src} import"):
            line = line.replace(f"from {src} import", f"from {dst} import", 1)
        elif line.startswith(f"import {src}."):
            line = line.replace(f"import {src}.", f"import {dst}.", 1)
        elif line.startswith("_builder.BuildTopDescriptorsAndMessages("):
            line = line.replace(f"'{src}.", f"'{dst}.", 1)
        lines.append(line)
    return "".join(lines)


def generate(out: Path) -> list[Path]:
    """Run protoc for every wire package and return the files written under ``out``."""
    written: list[Path] = []
    for package in PACKAGES:
        sources = sorted(
            str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / package.source).glob("*.proto")
        )
        if not sources:
            raise SystemExit(f"no .proto files under {PROTO_ROOT / package.source}")
        if package.source == package.target:
            (out / package.target).mkdir(parents=True, exist_ok=True)
            _protoc(out, sources)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                _protoc(Path(tmp), sources)
                (out / package.target).mkdir(parents=True, exist_ok=True)
                for made in sorted((Path(tmp) / package.source).iterdir()):
                    if made.is_file():
                        text = _rehome(made.read_text(), package)
                        (out / package.target / made.name).write_text(text)
        (out / package.target / "__init__.py").write_text(f'"""{package.doc}"""\n')
        written += sorted(p for p in (out / package.target).iterdir() if p.is_file())
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed bindings are stale")
    ns = parser.parse_args()
    if not ns.check:
        for path in generate(ROOT):
            print(path.relative_to(ROOT))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            relative = path.relative_to(tmp)
            committed = ROOT / relative
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(relative))
        if stale:
            print("stale generated bindings: " + ", ".join(stale) + " (run `make proto`)")
            return 1
    print("generated bindings are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

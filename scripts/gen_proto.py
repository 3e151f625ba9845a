"""Generate the Python bindings for the wire contracts in ``proto/``.

Run through ``make proto``. Output goes to ``bigfleet/v1alpha1/`` so the
generated modules import as ``bigfleet.v1alpha1.<name>_pb2``. With ``--check``
the bindings are generated into a scratch directory and compared with the
committed ones; the exit status is 1 when they differ (stale bindings).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = Path("bigfleet") / "v1alpha1"
INIT_TEXT = '"""Generated bindings for the bigfleet.v1alpha1 wire contracts (``make proto``)."""\n'


def generate(out: Path) -> list[Path]:
    """Run protoc for every ``.proto`` under ``proto/`` and return the files written."""
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    # protoc finds the mypy plugins on PATH; they live beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).glob("*.proto"))
    if not sources:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE}")
    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
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
    (out / PACKAGE / "__init__.py").write_text(INIT_TEXT)
    return sorted((out / PACKAGE).iterdir())


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
            if not path.is_file():
                continue
            committed = ROOT / PACKAGE / path.name
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(path.name)
        if stale:
            print("stale generated bindings: " + ", ".join(stale) + " (run `make proto`)")
            return 1
    print("generated bindings are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

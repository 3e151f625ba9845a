"""Catalogs of machine shapes, and what Kubernetes will see of each shape.

A catalog is a JSON file under ``providers/catalogs/`` (or one given with
``--catalog``). Its schema is shown by the two shipped catalogs; this module
parses it into frozen dataclasses and computes allocatable resources.

Allocatable is capacity minus what the kubelet and system daemons reserve,
using the tiered reservation most managed Kubernetes offerings publish: CPU
6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of the
rest; memory 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6%
of the next 112, 2% above 128 GiB, plus a 100 MiB eviction threshold;
ephemeral storage keeps 10% back for eviction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The shipped catalogs (package data).
CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
_DEFAULT_FILES = {"sim-cloud": "sim_cloud.json", "bare-metal": "bare_metal.json"}


@dataclass(frozen=True, slots=True)
class Shape:
    """Hardware of one instance type or server model."""

    vcpu: int
    memory_gib: float
    disk_gib: float
    gpus: int = 0
    gpu_product: str = ""
    gpu_memory_gib: float = 0.0
    arch: str = "amd64"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Shape:
        """Parse the shape fields of a catalog entry."""
        return cls(
            vcpu=int(raw["vcpu"]),
            memory_gib=float(raw["memory_gib"]),
            disk_gib=float(raw["disk_gib"]),
            gpus=int(raw.get("gpus", 0)),
            gpu_product=str(raw.get("gpu_product", "")),
            gpu_memory_gib=float(raw.get("gpu_memory_gib", 0.0)),
            arch=str(raw.get("arch", "amd64")),
        )

    def allocatable(self) -> dict[str, str]:
        """Kubernetes allocatable as quantity strings."""
        out = {
            "cpu": f"{self.vcpu * 1000 - _cpu_reserved_millis(self.vcpu)}m",
            "memory": f"{_memory_allocatable_mib(self.memory_gib)}Mi",
            "ephemeral-storage": f"{math.floor(self.disk_gib * 0.9)}Gi",
        }
        if self.gpus:
            out["nvidia.com/gpu"] = str(self.gpus)
        return out

    def labels(self) -> dict[str, str]:
        """Hardware labels Kubernetes nodes of this shape carry."""
        out = {"kubernetes.io/arch": self.arch, "kubernetes.io/os": "linux"}
        if self.gpus:
            out["nvidia.com/gpu.product"] = self.gpu_product
            out["nvidia.com/gpu.count"] = str(self.gpus)
            out["nvidia.com/gpu.memory"] = str(int(self.gpu_memory_gib * 1024))
        return out


def _cpu_reserved_millis(cores: int) -> int:
    tiers = ((1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025))
    return _tiered(cores * 1000, [(n * 1000, f) for n, f in tiers])


def _memory_allocatable_mib(gib: float) -> int:
    total = int(gib * 1024)
    tiers = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (math.inf, 0.02))
    reserved = _tiered(total, [(n * 1024, f) for n, f in tiers])
    return max(total - reserved - 100, 0)


def _tiered(amount: float, tiers: list[tuple[float, float]]) -> int:
    reserved = 0.0
    remaining = amount
    for size, fraction in tiers:
        take = min(remaining, size)
        reserved += take * fraction
        remaining -= take
        if remaining <= 0:
            break
    return math.ceil(reserved)


def scaled(count: int, scale: float) -> int:
    """A quota count scaled for a small demo, rounded half up."""
    return math.floor(count * scale + 0.5)


def load_catalog(kind: str, path: Path | None = None) -> dict[str, Any]:
    """Read the catalog at ``path``, or the one shipped for ``kind``."""
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = (CATALOG_DIR / _DEFAULT_FILES[kind]).read_text(encoding="utf-8")
    catalog: dict[str, Any] = json.loads(text)
    if catalog.get("kind") != kind:
        raise ValueError(f"catalog is for {catalog.get('kind')!r}, not {kind!r}")
    return catalog


__all__ = ["Shape", "load_catalog", "scaled"]

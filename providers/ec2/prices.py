"""On-demand prices from a shipped file, and how to refresh that file.

EC2 has no cheap per-call price API for on-demand instances (the Price List
API answers from us-east-1 with large product documents), so the provider
reads ``prices.json`` at start: region -> instance type -> USD per hour.
Spot prices are live (DescribeSpotPriceHistory, see `providers.ec2.cloud`).

Refreshing the file::

    python -m providers.ec2.prices --region us-east-1 --types m6i.large c6i.xlarge \\
        > providers/ec2/prices.json

reads the AWS Price List API (``pricing:GetProducts``, credentials from the
default chain) for Linux, shared-tenancy, no pre-installed software, and
prints the file with those regions and types.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The price file shipped with the provider.
SHIPPED = Path(__file__).resolve().parent / "prices.json"


class PriceTable:
    """Region -> instance type -> on-demand USD per hour."""

    def __init__(self, regions: Mapping[str, Mapping[str, float]]) -> None:
        self._regions = {r: dict(types) for r, types in regions.items()}

    @classmethod
    def load(cls, path: str | Path = "") -> PriceTable:
        """Read a price file (the shipped one by default). Raises ValueError
        naming the entry that is not a finite price >= 0."""
        source = Path(path) if path else SHIPPED
        raw = json.loads(source.read_text(encoding="utf-8"))
        regions = raw.get("regions")
        if not isinstance(regions, Mapping):
            raise ValueError(f"{source}: 'regions' must map regions to instance types")
        for region, types in regions.items():
            for name, price in types.items():
                if not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
                    raise ValueError(
                        f"{source}: regions.{region}.{name} must be a price >= 0, not {price!r}"
                    )
        return cls(regions)

    def on_demand(self, region: str, instance_type: str) -> float | None:
        """The hourly on-demand price, or None when the file has none."""
        return self._regions.get(region, {}).get(instance_type)


#: The Price List API's location names of the regions it is asked about.
_LOCATIONS = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
}


def fetch(regions: list[str], types: list[str]) -> dict[str, dict[str, float]]:
    """Hourly on-demand prices from the AWS Price List API."""
    import boto3  # only the refresh needs credentials for the pricing API

    pricing = boto3.client("pricing", region_name="us-east-1")
    out: dict[str, dict[str, float]] = {}
    for region in regions:
        for name in types:
            filters = {
                "instanceType": name,
                "location": _LOCATIONS.get(region, region),
                "operatingSystem": "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "capacitystatus": "Used",
            }
            answer: dict[str, Any] = pricing.get_products(
                ServiceCode="AmazonEC2",
                Filters=[
                    {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()
                ],
                MaxResults=1,
            )
            for document in answer.get("PriceList", []):
                product = json.loads(document)
                for term in product["terms"]["OnDemand"].values():
                    for dimension in term["priceDimensions"].values():
                        out.setdefault(region, {})[name] = float(dimension["pricePerUnit"]["USD"])
    return out


def main() -> None:
    """Print a fresh price file for the regions and types asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", action="append", required=True)
    parser.add_argument("--types", nargs="+", required=True)
    args = parser.parse_args()
    body = {
        "description": "EC2 on-demand list prices, USD per hour, Linux, shared tenancy.",
        "regions": fetch(args.region, args.types),
    }
    print(json.dumps(body, indent=2))


if __name__ == "__main__":
    main()


__all__ = ["SHIPPED", "PriceTable", "fetch"]

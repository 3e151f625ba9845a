"""Shadow mode's report: BigFleet's would-be decisions against the incumbent's node record.

    decision log (mode=shadow rows) --report.compare--> per cluster: machine-hours and
    incumbent JSON lines / CSV      --------------->    cost by shape, and who covered
    (incumbent.from_kubectl_watch converts an export)   each unmet interval first

A shard in shadow mode (``BIGFLEET_MODE=shadow``) decides and records, and
never acts; this package only reads what it recorded.
"""

from bigfleet.shadow.incumbent import (
    IncumbentError,
    NodeEvent,
    NodeEventKind,
    from_kubectl_watch,
    parse_incumbent,
    to_json_lines,
)
from bigfleet.shadow.report import ClusterReport, CoverageRace, ShadowReport, ShapeUsage, compare

__all__ = [
    "ClusterReport",
    "CoverageRace",
    "IncumbentError",
    "NodeEvent",
    "NodeEventKind",
    "ShadowReport",
    "ShapeUsage",
    "compare",
    "from_kubectl_watch",
    "parse_incumbent",
    "to_json_lines",
]

"""One colour and one legend label per phase, for every figure (edgefl.report.figures' breakdown,
edgefl.report.timeline's Gantt chart) and the HTML page: compute is the same green everywhere.

The phases are a client-round's (edgefl.sim.engine PHASES, then wait), the breakdown's `comm`
(download + upload, drawn in download's blue; upload is a lighter blue beside it on the timeline)
and the server's aggregation. Hex colours, so that the page's CSS can use them too.
"""

from __future__ import annotations

PHASE_COLOURS = {"download": "#1f77b4", "data_access": "#ff7f0e", "compute": "#2ca02c", "upload": "#8fbbd9",
                 "comm": "#1f77b4", "wait": "#c7c7c7", "server": "#9467bd"}
PHASE_LABELS = {"download": "download", "data_access": "data access (swap, data)", "compute": "compute",
                "upload": "upload", "comm": "communication", "wait": "waiting", "server": "server"}

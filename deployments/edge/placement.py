"""The placement a request asks for: its ``X-Text-Placement`` header, else the graph's.

``auto`` is then decided per request (``routing/text_placement.py``), and the response
says the choice in ``X-Text-Placement`` and why in ``X-Text-Placement-Auto``.
"""

from __future__ import annotations

from typing import get_args

from deployments.config.graph_config import GraphConfig, TextPlacement
from deployments.edge.errors import Refusal, bad_request

PLACEMENT_HEADER = "X-Text-Placement"
AUTO_REASON_HEADER = "X-Text-Placement-Auto"
PLACEMENTS: tuple[str, ...] = get_args(TextPlacement)


def requested_placement(header: str | None, config: GraphConfig) -> str:
    """The placement a request asks for (its header, else the graph's); 400 if unknown."""
    placement = (header or config.text_placement).lower()
    if placement not in PLACEMENTS:
        raise Refusal(
            bad_request(
                f"{PLACEMENT_HEADER} must be 'inline', 'tier' or 'auto', got {placement!r}",
                param=PLACEMENT_HEADER,
            )
        )
    if placement == "inline" and config.tokens_only:
        raise Refusal(
            bad_request(
                "inline text needs a tokenizer on Generate, but this graph runs tokens_only",
                param=PLACEMENT_HEADER,
            )
        )
    return placement

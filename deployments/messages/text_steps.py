"""An inline text stream's progress, as it crosses between Generate and the Ingress.

Inline text is made next to the engine: the stream derenderer that turns token ids
into OpenAI chunks lives in the Generate replica. For the stream to outlive that
replica (``transport/migration.py``), its caller, the Ingress, keeps what it needs to
rebuild the derenderer elsewhere: the token ids of every engine output whose text
it passed on, in the engine's own steps, and how many events it passed on. A
Generate replica that continues the stream replays those steps into a fresh
derenderer, drops the events the client already has, and goes on from the engine.

Plain values: the Ingress imports no vLLM (``replies.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TextSteps:
    """Items of an inline text stream that can move: SSE ``text`` (``events`` of them,
    joined), and the token ids of each engine output derendered since the last item.
    ``finished``: the engine ended the stream's choice (nothing is left to move)."""

    text: str
    events: int
    steps: list[list[int]]
    finished: bool = False

    @staticmethod
    def joined(items: list[TextSteps]) -> TextSteps:
        """Consecutive items as one (``transport/coalesce.py``)."""
        if len(items) == 1:
            return items[0]
        return TextSteps(
            "".join(item.text for item in items),
            sum(item.events for item in items),
            [step for item in items for step in item.steps],
            items[-1].finished,
        )


@dataclass(slots=True)
class TextResume:
    """Where a moved inline stream goes on from: the engine steps whose text the client
    has, and how many events it got from them (what a replay of them makes beyond
    that count was lost on the way and is sent again)."""

    steps: list[list[int]] = field(default_factory=list)
    events: int = 0

    @property
    def token_ids(self) -> list[int]:
        return [token for step in self.steps for token in step]

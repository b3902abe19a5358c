"""Stop strings in derendered text, cut as vLLM's engine detokenizer cuts them.

In ``tokens`` mode the engine still matches stop strings and ends the stream
on the token that completes one (``stop_reason`` is the string), but token ids
carry no cut: text decoded from them ends with the stop string, and a stream
may already have sent its first characters. vLLM's coupled path holds back
``max(len(stop)) - 1`` characters until it knows, and drops the stop string
unless ``include_stop_str_in_output``. This does the same per choice.
"""

from __future__ import annotations


def ended_on_stop_string(
    finish_reason: str | None, stop_reason: int | str | None, include_stop_str: bool
) -> bool:
    return finish_reason == "stop" and isinstance(stop_reason, str) and not include_stop_str


def ended_on_stop_token(
    finish_reason: str | None, stop_reason: int | str | None, include_stop_str: bool
) -> bool:
    """Ended on EOS or a stop token id, whose text the engine's detokenizer drops."""
    return finish_reason == "stop" and not isinstance(stop_reason, str) and not include_stop_str


def cut_at_stop(text: str, stop: str) -> str:
    """The text before the stop string's first occurrence (all of it if absent)."""
    at = text.find(stop)
    return text if at < 0 else text[:at]


class StopStringHoldback:
    """Releases streamed text only once no stop string can still be forming in it."""

    def __init__(self, stop: list[str] | None, include_stop_str: bool) -> None:
        self._include = include_stop_str
        self._hold = 0 if include_stop_str or not stop else max(len(s) for s in stop) - 1
        self._pending = ""

    def push(self, text: str, finish_reason: str | None, stop_reason: int | str | None) -> str:
        """New text in; the text safe to send out now."""
        if self._hold == 0 and not isinstance(stop_reason, str):
            return text
        self._pending += text
        if finish_reason is not None:
            out, self._pending = self._pending, ""
            if ended_on_stop_string(finish_reason, stop_reason, self._include):
                assert isinstance(stop_reason, str)
                out = cut_at_stop(out, stop_reason)
            return out
        if len(self._pending) <= self._hold:
            return ""
        cut = len(self._pending) - self._hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

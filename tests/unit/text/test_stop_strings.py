"""Stop-string hold-back: the text a stream sends equals the cut whole text."""

from __future__ import annotations

import pytest

from deployments.text.stop_strings import StopStringHoldback, cut_at_stop


@pytest.mark.parametrize(
    ("pieces", "stop", "want"),
    [
        (["The capital ", "is R", "ome."], "Rome", "The capital is "),
        (["ab", "c", "Ro", "m", "e"], "Rome", "abc"),
        (["no stop here"], "Rome", "no stop here"),
    ],
)
def test_streamed_text_is_cut_at_the_stop_string(pieces: list[str], stop: str, want: str) -> None:
    holdback = StopStringHoldback([stop, "xy"], include_stop_str=False)
    out = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        ended = want != "".join(pieces)
        out.append(holdback.push(piece, "stop" if last else None, stop if last and ended else None))
    assert "".join(out) == want
    # Nothing is sent that would later need taking back.
    assert all(stop not in "".join(out[: i + 1]) for i in range(len(out)))


def test_include_stop_str_keeps_it_and_holds_nothing() -> None:
    holdback = StopStringHoldback(["Rome"], include_stop_str=True)
    assert holdback.push("is Ro", None, None) == "is Ro"
    assert holdback.push("me", "stop", "Rome") == "me"


def test_no_stop_strings_pass_through() -> None:
    holdback = StopStringHoldback(None, include_stop_str=False)
    assert holdback.push("abc", None, None) == "abc"
    assert holdback.push("", "length", None) == ""


def test_cut_at_stop() -> None:
    assert cut_at_stop("a Rome b", "Rome") == "a "
    assert cut_at_stop("abc", "Rome") == "abc"

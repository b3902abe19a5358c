"""The request fuzzer: what it draws, and what it accepts as an answer."""

from __future__ import annotations

import json

from tests.support.request_fuzz import ENGINE_ENDED, KNOBS, ROUTES, Case, cases, verdict

COUNT = 180  # the integration test's default


def test_cases_cover_every_route_knob_and_stream_mode_and_repeat_by_seed() -> None:
    drawn = cases(20261130, COUNT, api_key="k", tokens_only_prefix="/t")
    assert {c.route for c in drawn} == set(ROUTES)
    assert {k for c in drawn for k in c.knobs} == set(KNOBS)
    assert {(c.route, c.stream) for c in drawn} == {(r, s) for r in ROUTES for s in (True, False)}
    assert all(c.path.startswith("/t/") == c.route.startswith("tokens-only") for c in drawn)
    assert [c.body for c in drawn] == [c.body for c in cases(20261130, COUNT, "k", "/t")]
    assert [c.body for c in drawn] != [c.body for c in cases(1, COUNT, "k", "/t")]


def case(stream: bool, knobs: tuple[str, ...] = ()) -> Case:
    return Case(0, "chat-inline", "/v1/chat/completions", {"stream": stream}, knobs)


def error(code: int, message: str = "bad", kind: str = "BadRequestError") -> str:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def test_clear_answers_pass_and_unclear_ones_fail() -> None:
    assert verdict(case(False), 200, '{"choices": []}').ok
    assert verdict(case(False), 400, error(400)).ok
    assert verdict(case(True), 200, 'data: {"a": 1}\n\ndata: [DONE]\n\n').ok
    assert verdict(case(True), 200, f"data: {error(400)}\n\ndata: [DONE]\n\n").ok

    assert not verdict(case(False), 503, error(503)).ok
    assert not verdict(case(False), 400, "Bad Request").ok, "not vLLM's error shape"
    assert not verdict(case(False), 400, error(422)).ok, "code differs from the status"
    assert not verdict(case(False), 400, error(400, message="")).ok
    assert not verdict(case(False), 200, "{cut").ok
    assert not verdict(case(True), 200, 'data: {"a": 1}\n\n').ok, "no [DONE]"
    assert not verdict(case(True), 200, f"data: {error(503)}\n\ndata: [DONE]\n\n").ok


def test_vllms_engine_ended_answer_passes_only_where_vllm_gives_it() -> None:
    ended = json.dumps({"error": {**ENGINE_ENDED, "param": None}})
    structured = case(False, ("regex",))
    assert verdict(structured, 500, ended).ok and verdict(structured, 500, ended).engine_ended
    streamed = verdict(case(True, ("choice",)), 200, f"data: {ended}\n\ndata: [DONE]\n\n")
    assert streamed.ok and streamed.engine_ended
    assert not verdict(case(False, ("seed",)), 500, ended).ok
    assert not verdict(structured, 500, error(500, "boom", "InternalServerError")).ok

"""A stream moved to another Generate replica: the request it continues with, its
events rewritten as the original call's, and when it does not move.

The calls are stand-ins (the pure logic); a real engine killed under a real
graph's streams is ``tests/integration/test_stream_migration.py``.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

from deployments.transport.migration import (
    Delivered,
    continuation,
    continued_event,
    migrating,
)
from deployments.transport.replica_loss import (
    EngineLostError,
    ReplicaLeavingError,
    callee_lost,
    lost_engine_replica,
)
from deployments.transport.step_channel import ChannelClosedError


def _request(**params: Any) -> GenerateRequest:
    return GenerateRequest.model_validate(
        {
            "request_id": "req-1",
            "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 10, "min_tokens": 4, **params},
            "stream": True,
        }
    )


def _event(token_ids: list[int], finish: str | None = None) -> str:
    choice = {"index": 0, "token_ids": token_ids, "finish_reason": finish}
    return f"data: {json.dumps({'request_id': 'req-1', 'choices': [choice]})}\n\n"


def _usage(prompt: int, completion: int) -> str:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"


def test_the_continuation_is_the_prompt_and_what_was_delivered_with_less_to_go() -> None:
    request = _request(prompt_logprobs=1)
    resumed = continuation(request, [7, 8, 9])
    assert resumed is not None
    assert resumed.token_ids == [1, 2, 3, 7, 8, 9]
    assert resumed.request_id == "req-1"
    params = resumed.sampling_params
    assert (params.max_tokens, params.min_tokens, params.prompt_logprobs) == (7, 1, None)
    # The original request is left as it was.
    assert request.token_ids == [1, 2, 3] and request.sampling_params.max_tokens == 10


def test_a_generate_body_continues_as_a_request_does() -> None:
    """The Ingress moves ``/inference/v1/generate`` streams by their body as sent."""
    body = {
        "request_id": "req-2",
        "token_ids": [1, 2, 3],
        "sampling_params": {"max_tokens": 10, "min_tokens": 4, "prompt_logprobs": 1},
        "stream": True,
    }
    resumed = continuation(body, [7, 8])
    assert resumed == {
        "request_id": "req-2",
        "token_ids": [1, 2, 3, 7, 8],
        "sampling_params": {"max_tokens": 8, "min_tokens": 2},
        "stream": True,
    }
    assert body["token_ids"] == [1, 2, 3] and body["sampling_params"]["max_tokens"] == 10
    assert continuation({**body, "sampling_params": {"n": 2}}, [7]) is None
    assert continuation({**body, "sampling_params": {"max_tokens": 2}}, [7, 8]) is None


def test_a_call_that_delivered_nothing_is_made_again_unchanged() -> None:
    request = _request(n=2)
    assert continuation(request, []) is request


def test_streams_whose_state_is_more_than_their_prompt_do_not_move() -> None:
    assert continuation(_request(n=2), [7]) is None
    assert continuation(_request(structured_outputs={"regex": "[ab]+"}), [7]) is None
    # Nothing left to generate: the finish was lost with the replica.
    assert continuation(_request(), list(range(10))) is None


def test_delivered_reads_choice_zero_tokens_and_the_finish_across_joined_events() -> None:
    delivered = Delivered([_event([5]) + _event([6, 7]), _event([8], "length")])
    assert delivered.read() == ([5, 6, 7, 8], True)
    assert Delivered([_event([5])]).read() == ([5], False)


def test_a_continued_event_counts_usage_against_the_original_prompt() -> None:
    text = _event([9]) + _usage(prompt=6, completion=2)
    rewritten = [json.loads(p[6:]) for p in continued_event(text, 3, 3).split("\n\n") if p]
    assert rewritten[0]["choices"][0]["token_ids"] == [9]
    assert rewritten[1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    first = 'data: {"prompt_token_ids":[1,2,3,7],"choices":[]}\n\n'
    assert "prompt_token_ids" not in continued_event(first, 3, 1)
    assert continued_event(_event([1]), 3, 1) == _event([1])


avoided: list[tuple[str, ...]] = []


def _calls(*scripts: list[Any]) -> tuple[list[GenerateRequest], Any]:
    """A stand-in Generate: each call plays the next script (events, then an
    exception to raise or nothing); the replicas each call avoided go to ``avoided``."""
    avoided.clear()
    seen: list[GenerateRequest] = []
    remaining = list(scripts)

    async def call(request: GenerateRequest, avoid: tuple[str, ...]) -> AsyncGenerator[Any, None]:
        seen.append(request)
        avoided.append(avoid)
        for item in remaining.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item

    return seen, call


async def _all(items: AsyncGenerator[Any, None]) -> list[Any]:
    return [item async for item in items]


def test_a_stream_whose_engine_died_goes_on_where_it_was() -> None:
    seen, call = _calls(
        [_event([5]), _event([6]), EngineLostError("replica-a")],
        [_event([7], "length"), _usage(prompt=5, completion=1), "data: [DONE]\n\n"],
    )
    events = asyncio.run(_all(migrating(call, _request(max_tokens=3, min_tokens=0), limit=3)))
    assert [r.token_ids for r in seen] == [[1, 2, 3], [1, 2, 3, 5, 6]]
    assert seen[1].sampling_params.max_tokens == 1
    # The router is told to keep away from the replica whose engine died.
    assert avoided == [(), ("replica-a",)]
    assert Delivered(events).read() == ([5, 6, 7], True)
    usage = json.loads(events[3][6:])["usage"]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_moves_are_bounded_and_only_for_a_lost_callee() -> None:
    lost = [_event([5]), EngineLostError("replica-a")]
    _, call = _calls(lost, lost)
    with pytest.raises(EngineLostError):
        asyncio.run(_all(migrating(call, _request(), limit=1)))
    # migration_limit 0: as before, the failure ends the stream.
    seen, call = _calls(lost)
    with pytest.raises(EngineLostError):
        asyncio.run(_all(migrating(call, _request(), limit=0)))
    assert len(seen) == 1
    # An error of the request itself is not a lost replica.
    seen, call = _calls([_event([5]), ValueError("bad")])
    with pytest.raises(ValueError):
        asyncio.run(_all(migrating(call, _request(), limit=3)))
    assert len(seen) == 1


def test_a_stream_whose_replica_is_being_stopped_moves_and_keeps_away_from_it() -> None:
    # A scale-in or redeploy: Generate hands the stream back as it stops.
    seen, call = _calls(
        [_event([5]), ReplicaLeavingError("replica-a")],
        [_event([6], "length"), "data: [DONE]\n\n"],
    )
    events = asyncio.run(_all(migrating(call, _request(max_tokens=2, min_tokens=0), limit=3)))
    assert [r.token_ids for r in seen] == [[1, 2, 3], [1, 2, 3, 5]]
    assert avoided == [(), ("replica-a",)]
    assert Delivered(events).read() == ([5, 6], True)


def test_what_counts_as_a_lost_callee() -> None:
    assert callee_lost(EngineLostError("replica-a"))
    leaving = pickle.loads(pickle.dumps(ReplicaLeavingError("b")))
    assert type(leaving) is ReplicaLeavingError and callee_lost(leaving)
    assert lost_engine_replica(leaving) == "b"
    assert lost_engine_replica(pickle.loads(pickle.dumps(EngineLostError("a")))) == "a"
    assert callee_lost(ChannelClosedError("the step channel ended"))
    assert not callee_lost(ValueError("bad input"))
    assert not callee_lost(asyncio.CancelledError())


def test_a_call_made_again_has_a_channel_key_of_its_own_in_the_same_text_call() -> None:
    """The lost call's last events travel on its channel apart from its error, and may
    arrive after the stream moved: routed by the old key, they would reach the new
    call (a token twice). An abort of the text call must still reach the new one."""
    from deployments.messages.tier import moved_key, prompt_key, text_call_key

    assert moved_key("k", 0) == "k"
    keys = {moved_key("k", move) for move in range(3)} | {
        moved_key(prompt_key("k", 1), move) for move in range(3)
    }
    assert len(keys) == 6
    assert {text_call_key(key) for key in keys} == {"k"}

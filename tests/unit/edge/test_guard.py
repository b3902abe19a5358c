"""API-key guard: what is protected, and how keys compare."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from ray.serve.exceptions import BackPressureError

from deployments.edge.guard import GuardSettings, install_guard, is_protected, key_matches
from deployments.edge.tier_calls import failure_error


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("/v1/chat/completions", True),
        ("/v1/models", True),
        ("/v1", True),
        ("/inference/v1/generate", True),
        ("/inference/v1/abort_requests", True),
        ("/health", False),
        ("/metrics", False),
        ("/abort_requests", False),
        ("/v10/x", False),
    ],
)
def test_protected_paths(path: str, protected: bool) -> None:
    assert is_protected(path) is protected


def test_key_comparison() -> None:
    assert key_matches("Bearer sk-1", "sk-1")
    assert key_matches("bearer sk-1", "sk-1")
    assert not key_matches("Bearer sk-2", "sk-1")
    assert not key_matches("sk-1", "sk-1")
    assert not key_matches(None, "sk-1")
    assert not key_matches("Basic sk-1", "sk-1")


def test_overload_maps_to_503() -> None:
    error = failure_error(BackPressureError(num_queued_requests=3, max_queued_requests=2))
    assert error.status == error.body["error"]["code"] == 503
    assert error.body["error"]["type"] == "ServiceUnavailableError"
    assert failure_error(RuntimeError("boom")).status == 503


def guarded_app(api_key: str | None, max_body_bytes: int) -> FastAPI:
    app = FastAPI()
    app.state.guard = GuardSettings(api_key=api_key, max_body_bytes=max_body_bytes)

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    install_guard(app)
    return app


async def _post(app: Any, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post("/v1/echo", content=body, headers=headers)


def _chunked(size: int, chunk: int = 1000) -> Any:
    async def chunks() -> Any:
        for start in range(0, size, chunk):
            yield b"x" * min(chunk, size - start)

    return chunks()


def test_401_is_what_vllms_own_middleware_answers() -> None:
    """The same app behind vLLM's AuthenticationMiddleware is the oracle."""
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    ours = guarded_app("sk-1", 2**20)
    theirs = guarded_app(None, 2**20)
    theirs.add_middleware(AuthenticationMiddleware, tokens=["sk-1"])
    for headers in ({}, {"Authorization": "Bearer sk-2"}, {"Authorization": "sk-1"}):
        got = asyncio.run(_post(ours, b"{}", headers))
        want = asyncio.run(_post(theirs, b"{}", headers))
        assert (
            (got.status_code, got.json())
            == (want.status_code, want.json())
            == (
                401,
                {"error": "Unauthorized"},
            )
        )
    assert asyncio.run(_post(ours, b"{}", {"Authorization": "Bearer sk-1"})).status_code == 200


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_413_however_it_is_sent(chunked: bool) -> None:
    app = guarded_app(None, 5000)
    over = _chunked(5001) if chunked else b"x" * 5001
    response = asyncio.run(_post(app, over))
    assert response.status_code == 413, response.text
    assert response.json()["error"]["type"] == "RequestEntityTooLarge"
    # At the limit, the whole body reaches the route.
    at = _chunked(5000) if chunked else b"x" * 5000
    response = asyncio.run(_post(app, at))
    assert (response.status_code, response.json()) == (200, {"bytes": 5000})


def _scope(path: str, headers: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("t", 80),
        "client": ("c", 1),
    }


async def _call(app: Any, path: str, headers: dict[str, str], receive: Any) -> tuple[int, bytes]:
    """One request through the whole app; its status and body."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = _scope(path, headers)
    scope["app"] = app
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


def _never_finishing() -> Any:
    """A client that sends one byte of its body, then nothing."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"{", "more_body": True}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return receive


def _whole(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def slow_app(**settings: Any) -> FastAPI:
    app = FastAPI()
    app.state.guard = GuardSettings(**{"api_key": "k", "max_body_bytes": 1 << 20, **settings})

    @app.post("/tokenize")
    async def open_route(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    install_guard(app)
    return app


def test_a_body_not_sent_in_time_is_408() -> None:
    app = slow_app(body_timeout_s=0.2)
    status, body = asyncio.run(
        _call(app, "/tokenize", {"content-length": "64"}, _never_finishing())
    )
    assert status == 408, body
    assert b"not sent within 0.2 s" in body


def test_slow_clients_without_the_key_hold_few_reads_and_keyed_ones_still_pass() -> None:
    """Past the cap of slow keyless bodies, another slow one is refused once its grace is
    over; a keyless body that is in, and a keyed one, are read and served."""
    app = slow_app(body_timeout_s=30, max_body_reads_without_key=3, slow_body_s=0.05)

    async def run() -> list[int]:
        slow = [
            asyncio.create_task(
                _call(app, "/tokenize", {"content-length": "64"}, _never_finishing())
            )
            for _ in range(3)
        ]
        await asyncio.sleep(0.2)  # past their grace: the three hold every slow read
        refused, _ = await _call(app, "/tokenize", {"content-length": "64"}, _never_finishing())
        whole, _ = await _call(app, "/tokenize", {"content-length": "2"}, _whole(b"{}"))
        keyed, _ = await _call(
            app, "/tokenize", {"content-length": "2", "authorization": "Bearer k"}, _whole(b"{}")
        )
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        # Cancelled readers give their reads back.
        again, _ = await _call(app, "/tokenize", {"content-length": "2"}, _whole(b"{}"))
        return [refused, whole, keyed, again]

    assert asyncio.run(run()) == [503, 200, 200, 200]


def test_a_burst_of_keyless_bodies_that_are_in_is_served_however_many() -> None:
    """A hundred keyless requests at once, each body in but late to be read (a replica
    short of CPU), are all served: none is slow, so none counts against the cap of 3."""
    app = slow_app(max_body_reads_without_key=3, slow_body_s=0.5)

    def late(body: bytes) -> Any:
        async def receive() -> dict[str, Any]:
            await asyncio.sleep(0.01)
            return {"type": "http.request", "body": body, "more_body": False}

        return receive

    async def run() -> list[int]:
        calls = [_call(app, "/tokenize", {"content-length": "2"}, late(b"{}")) for _ in range(100)]
        return [status for status, _ in await asyncio.gather(*calls)]

    assert asyncio.run(run()) == [200] * 100


def test_a_client_gone_before_its_body_reaches_no_route() -> None:
    app = slow_app()
    reached: list[str] = []

    @app.post("/v1/x")
    async def route(request: Request) -> dict[str, str]:
        reached.append("route")
        return {}

    messages = iter(
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
    )

    async def receive() -> dict[str, Any]:
        return next(messages)

    headers = {"content-length": "64", "authorization": "Bearer k"}
    status, _ = asyncio.run(_call(app, "/v1/x", headers, receive))
    assert status == 499 and reached == []

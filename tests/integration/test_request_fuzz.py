"""No request kills an engine: a bounded, seeded fuzzer over the sampling surface.

Cases come from ``tests/support/request_fuzz.py`` (every route and output path,
every sampling knob at least once, values at the edges). The default app's
are sent four at a time, so that they share engine batches; the tokens-only
app's one at a time, as a client of its one-deep Generate queue would,
retrying after ``Retry-After`` when told it is overloaded. Each answer must be
a 2xx that parses or a clear 4xx in vLLM's shape (or, where vLLM's own engine
ends a request with an error, the 500 vLLM's server gives:
``request_fuzz.engine_ended_ok``); afterwards no Generate replica has been
replaced (0 engine deaths), no engine holds a request, and ``/health`` is 200.

``SCALEOUT_FUZZ_CASES`` and ``SCALEOUT_FUZZ_SEED`` change the run; a failure
names the case (its number, route and knobs) to replay it.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.engine_death import replica_processes
from bench.harness.servers import Server
from tests.integration.conftest import API_KEY, MODEL, TOKENS_ONLY_PREFIX
from tests.integration.test_failure_semantics import HANG_GUARD_S, wait_idle
from tests.support.request_fuzz import Case, cases, verdict

CASES = int(os.environ.get("SCALEOUT_FUZZ_CASES", "180"))
SEED = int(os.environ.get("SCALEOUT_FUZZ_SEED", "20261130"))
CONCURRENCY = 4
OVERLOAD_RETRIES = 20
# A guard against a hang, far above the slowest case (a ~4k-token prompt with
# prompt logprobs and a ~4k-token answer on a loaded 2-core host).
CASE_TIMEOUT_S = 180.0
DEATH_LOG_LINE = "died: exiting so Serve replaces it"
APPS = ("default", "tokens-only")


def _send(client: httpx.Client, case: Case) -> tuple[Case, int, str]:
    body = case.body if "token_ids" in case.body else {"model": MODEL, **case.body}
    for _ in range(OVERLOAD_RETRIES):
        answer = client.post(case.path, json=body, headers=case.headers, timeout=CASE_TIMEOUT_S)
        if answer.status_code != 503 or "overloaded" not in answer.text:
            break
        time.sleep(float(answer.headers["Retry-After"]))
    return case, answer.status_code, answer.text


def _generate_pids() -> set[int]:
    return {p.pid for app in APPS for p in replica_processes(app, "Generate")}


def test_no_request_kills_an_engine(
    graph: Server, client: httpx.Client, record_property: pytest.RecordProperty
) -> None:
    generate = _generate_pids()
    assert len(generate) == 3, generate
    deaths_before = graph.log_path.read_text(errors="replace").count(DEATH_LOG_LINE)

    drawn = cases(SEED, CASES, api_key=API_KEY, tokens_only_prefix=TOKENS_ONLY_PREFIX)
    shared = [c for c in drawn if not c.route.startswith("tokens-only")]
    one_deep = [c for c in drawn if c.route.startswith("tokens-only")]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(lambda c: _send(client, c), shared))
    results += [_send(client, case) for case in one_deep]

    failures = []
    statuses: Counter[str] = Counter()
    engine_ended = 0
    for case, status, body in results:
        judged = verdict(case, status, body)
        statuses[f"{case.route} {status}"] += 1
        engine_ended += judged.engine_ended
        if not judged.ok:
            failures.append(f"{case.describe()}: {judged.why}\n  {json.dumps(case.body)[:400]}")
    summary = (
        f"{len(results)} cases (seed {SEED}), {engine_ended} ended by vLLM's engine: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
    )
    record_property("fuzz_summary", summary)
    print(summary)
    assert not failures, "\n".join(failures)

    assert _generate_pids() == generate, "a Generate replica was replaced"
    assert graph.log_path.read_text(errors="replace").count(DEATH_LOG_LINE) == deaths_before
    for prefix in ("", TOKENS_ONLY_PREFIX):
        wait_idle(client, HANG_GUARD_S, prefix)
        assert client.get(f"{prefix}/health").status_code == 200

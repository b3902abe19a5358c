"""bench.requests.profile: py-spy's collapsed stacks read and attributed to stages."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.requests.profile import attribute, stacks

RAW = (
    "Thread.run (threading.py:982);Ingress.chat_completions (deployments/ingress.py:120);"
    "validate (deployments/edge/validation.py:40);BaseModel.model_validate (pydantic/main.py:7) 3\n"
    "Thread.run (threading.py:982);AsyncioRouter.assign_request (ray/serve/_private/router.py:9);"
    "dumps (ray/cloudpickle/cloudpickle.py:1) 5\n"
    "Thread.run (threading.py:982);Logger._log (logging/__init__.py:1) 2\n"
    "not a stack line\n"
)


def test_stacks_read_frames_root_first_with_their_counts(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    read = stacks(raw)
    assert [count for _, count in read] == [3, 5, 2]
    assert read[0][0][0].startswith("Thread.run") and read[0][0][-1].startswith("BaseModel")


def test_stages_count_a_frame_anywhere_in_the_stack_and_overlap(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    shares, top = attribute(stacks(raw), top=2)
    assert shares["  body parsed and validated (pydantic)"] == pytest.approx(0.3)
    # the pickling under a handle call counts for both stages
    assert shares["Serve: routing and sending a handle call"] == pytest.approx(0.5)
    assert shares["pickling between tiers (both ways)"] == pytest.approx(0.5)
    assert shares["logging"] == pytest.approx(0.2)
    assert shares["vLLM: engine client (AsyncLLM)"] == 0
    assert top == [
        ("dumps (ray/cloudpickle/cloudpickle.py)", 0.5),
        ("BaseModel.model_validate (pydantic/main.py)", 0.3),
    ]


def test_serves_side_of_a_call_leaves_out_the_code_the_call_runs(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "Replica.handle_request_with_rejection (ray/serve/_private/replica.py:1);"
        "Replica._wrap_request (ray/serve/_private/replica.py:2) 4\n"
        "Replica.handle_request_with_rejection (ray/serve/_private/replica.py:1);"
        "Render.render_chat (deployments/render.py:3);"
        "ServingRender.render_chat_request (vllm/entrypoints/scale_out/render/serving.py:4) 6\n"
    )
    shares, _ = attribute(stacks(raw), top=1)
    assert shares["Serve: a call taken in by the replica, less the code it runs"] == 0.4
    assert shares["vLLM: rendering (chat template, tokens)"] == 0.6

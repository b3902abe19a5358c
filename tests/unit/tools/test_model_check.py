"""The model check fails loudly, naming what differs, and only beyond its tolerances."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from bench.harness.servers import TINY_MODEL
from scripts import model_check
from scripts.model_check import (
    MAX_ABS_DIFF,
    MIN_GREEDY_MARGIN,
    file_differences,
    greedy_report,
    tensor_diffs,
    weight_differences,
)


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(TINY_MODEL, a)
    shutil.copytree(TINY_MODEL, b)
    return a, b


def test_identical_folders_have_no_differences(copies: tuple[Path, Path]) -> None:
    assert file_differences(*copies) == []
    problems, diffs = model_check.weight_problems(*copies)
    assert problems == []
    assert diffs and all(d.max_abs == 0 and d.rel_l2 == 0 for d in diffs)


def test_a_changed_byte_in_the_tokenizer_is_named(copies: tuple[Path, Path]) -> None:
    shipped, rebuilt = copies
    tokenizer = rebuilt / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes().replace(b"<think>", b"<thonk>", 1))
    assert file_differences(shipped, rebuilt) == ["tokenizer.json differs byte for byte"]


def test_missing_and_extra_files_are_named(copies: tuple[Path, Path]) -> None:
    shipped, rebuilt = copies
    (rebuilt / "chat_template.jinja").unlink()
    (rebuilt / "vocab.txt").write_text("x")
    assert file_differences(shipped, rebuilt) == [
        "rebuilt has no chat_template.jinja",
        "rebuilt has an unexpected file vocab.txt",
    ]


def test_weights_within_tolerance_pass_and_beyond_it_are_named() -> None:
    base = torch.linspace(-1, 1, 1000).reshape(10, 100)
    near = {"w": base + MAX_ABS_DIFF / 100}
    far = {"w": base.clone()}
    far["w"][3, 7] += 10 * MAX_ABS_DIFF
    (ok,) = weight_differences({"w": base}, near)
    assert ok.within_tolerance()
    (bad,) = weight_differences({"w": base}, far)
    assert not bad.within_tolerance()
    assert bad.max_abs == pytest.approx(10 * MAX_ABS_DIFF, rel=1e-3)
    assert bad.rel_l2 == pytest.approx(10 * MAX_ABS_DIFF / float(base.double().norm()), rel=1e-3)
    # Small everywhere but large for its tensor: relative L2 catches it.
    small = torch.full((100,), MAX_ABS_DIFF)
    (drifted,) = weight_differences({"w": small}, {"w": small * 1.5})
    assert drifted.max_abs < MAX_ABS_DIFF and drifted.rel_l2 == pytest.approx(0.5)
    assert not drifted.within_tolerance()


def test_structural_weight_differences_are_named() -> None:
    shipped = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}
    rebuilt = {
        "a": torch.zeros(3, 2),
        "b": torch.zeros(4, dtype=torch.float16),
        "d": torch.zeros(1),
    }
    assert tensor_diffs(shipped, rebuilt) == [
        "weights: c only in the shipped model",
        "weights: d only in the rebuild",
        "weights: a is (2, 3) torch.float32 shipped, (3, 2) torch.float32 rebuilt",
        "weights: b is (4,) torch.float32 shipped, (4,) torch.float16 rebuilt",
    ]


def test_greedy_report_scores_reply_positions_only() -> None:
    # Two rows of 4 positions over a vocabulary of 3; -100 marks the prompt.
    target = torch.tensor([[-100, 1, 2, -100], [-100, -100, 0, 0]])
    logits = torch.zeros(2, 4, 3)
    logits[0, 0, 1], logits[0, 1, 2] = 5.0, 4.0  # row 0: both reply tokens lead by 4+
    logits[1, 1, 0], logits[1, 2, 0] = 3.0, 2.0  # row 1: leads by 2
    logits[0, 3, 0] = 99.0  # predicts past the end: never scored
    report = greedy_report(logits, target)
    assert (report.reproduced, report.total, report.min_margin) == (2, 2, 2.0)
    assert report.problems("x") == []

    logits[1, 2, 0], logits[1, 2, 1] = 1.0, 1.2  # row 1's last token loses by 0.2
    report = greedy_report(logits, target)
    assert (report.reproduced, report.min_margin) == (1, pytest.approx(-0.2))
    assert report.problems("rebuilt") == [
        "rebuilt: greedy replies reproduced 1/2",
        f"rebuilt: smallest greedy margin -0.200 < {MIN_GREEDY_MARGIN}",
    ]


def test_logit_drift_counts_reply_positions_only() -> None:
    target = torch.tensor([[-100, -100, 1, 2]])
    a = torch.zeros(1, 4, 3)
    b = a.clone()
    b[0, 0, 0] = 50.0  # predicts a prompt token: not a reply position
    b[0, 3, 1] = 50.0  # predicts past the end
    assert model_check.reply_logit_drift(a, b, target) == 0.0
    b[0, 2, 2] = -0.75  # predicts the reply's second token
    assert model_check.reply_logit_drift(a, b, target) == 0.75

"""The engine tier catches each planted engine bug (infer_ref.conformance.engines.mutants), and the
same tests pass on the unbroken engine (the control), on llama-tiny (gemma3-tiny for a bug that
needs a sliding window).

Each mutant runs the tier's tests that guard its bug class in a pytest subprocess (the tier's
plugin options are per run); the run must fail, and fail in one of those tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.conformance.engines.blame_hits import row, run_planted
from infer_ref.conformance.engines.mutants import (
    ENGINE_BUG_CLASSES,
    ENGINE_MUTANTS,
    LONG_CONTEXT_MUTANTS,
    PlantedBug,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "checkpoints"

pytestmark = pytest.mark.slow


def _tier(engine: str, tests: tuple[str, ...], checkpoint: str = "llama-tiny", *, long_context: bool = False) -> subprocess.CompletedProcess[str]:
    folder = _long_folder(checkpoint) if long_context else FIXTURES / checkpoint
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "--pyargs",
           "infer_ref.conformance.engines.tests", f"--ir-engine={engine}", f"--ir-model-dir={folder}",
           "-k", " or ".join(tests), *(["--ir-long-context"] if long_context else [])]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def _long_folder(name: str) -> Path:
    from infer_ref.conformance.engines.workloads.folders import default_model_dirs

    return next(d for d in default_model_dirs(long_context=True) if d.name.startswith(name))


def test_every_engine_bug_class_has_a_mutant() -> None:
    assert {m.bug_class for m in ENGINE_MUTANTS} == set(ENGINE_BUG_CLASSES)


@pytest.mark.parametrize("checkpoint", sorted({m.checkpoint for m in ENGINE_MUTANTS}))
def test_control_passes_the_guarding_tests(checkpoint: str) -> None:
    tests = tuple(sorted({t for m in ENGINE_MUTANTS if m.checkpoint == checkpoint for t in m.caught_by}))
    done = _tier("infer_ref", tests, checkpoint)
    assert done.returncode == 0, done.stdout[-3000:]


# The three prompt-chunk classes fail the same tests of the default workload on one checkpoint (a chunk
# after the first is a forward over cached positions, whichever of the three it gets wrong): the blame
# names one of them and calls the others as likely; the first in its table is named.
NOT_SEPARATED = {"chunk_kv_unwritten", "chunk_window_from_chunk_start"}


@pytest.mark.parametrize("mutant", ENGINE_MUTANTS, ids=[m.name for m in ENGINE_MUTANTS])
def test_mutant_is_caught_and_blamed_on_its_class(mutant: PlantedBug, tmp_path: Path) -> None:
    """The default workload on the bug's checkpoint, through ``infer-ref conformance`` from outside the
    checkout: the run fails, in a test built for the bug, and the report names the planted class (or,
    for a class the tier's tests do not separate from another, calls it as likely as the one named)."""
    run = run_planted(mutant, tmp_path)
    assert run.returncode == 1, f"{mutant.name} ({mutant.bug_class}) was not caught:\n{run.output[-3000:]}"
    assert any(t in failed for failed in run.failed for t in mutant.caught_by), (run.failed, run.output[-3000:])
    named = run.hit or (mutant.name in NOT_SEPARATED and run.tied)
    assert named, f"{mutant.name}: the report names {run.named!r}, planted {mutant.bug_class!r}\n{row(run)}"


@pytest.mark.parametrize("mutant", LONG_CONTEXT_MUTANTS, ids=[m.name for m in LONG_CONTEXT_MUTANTS])
def test_long_context_mutant_is_caught_there_and_only_there(mutant: PlantedBug) -> None:
    """A bug of released sizes: the long-context workload catches it, its guarding test passes on the
    unbroken engine, and the default workload (pools of 64 blocks, positions below 256) cannot see it."""
    engine = f"infer_ref.conformance.engines.mutants:{mutant.name}"
    done = _tier(engine, mutant.caught_by, mutant.checkpoint, long_context=True)
    assert done.returncode == 1, f"{mutant.name} ({mutant.bug_class}) was not caught:\n{done.stdout[-3000:]}"
    assert any(t in line for line in done.stdout.splitlines() if line.startswith("FAILED") for t in mutant.caught_by), done.stdout[-3000:]
    control = _tier("infer_ref", mutant.caught_by, mutant.checkpoint, long_context=True)
    assert control.returncode == 0, control.stdout[-3000:]
    default = _tier(engine, ("test_generated_logprobs_agree_with_oracle", "test_batch_matches_alone"))
    assert default.returncode == 0, f"the default workload saw {mutant.name}:\n{default.stdout[-3000:]}"


BF16_CHECKPOINT = FIXTURES / "gemma3-tiny"


def _bf16_agreement(engine: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "--pyargs", "infer_ref.conformance.engines.tests",
           f"--ir-engine={engine}", f"--ir-model-dir={BF16_CHECKPOINT}", "--ir-engine-dtype=bfloat16", "-k", "agree_with_oracle"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_bfloat16_verdict_passes_the_unbroken_engine() -> None:
    """The calibrated thresholds hold on a fresh run of a correct engine (no false alarm)."""
    done = _bf16_agreement("infer_ref")
    assert done.returncode == 0, done.stdout[-3000:]


def test_bfloat16_verdict_catches_a_window_off_by_one() -> None:
    """The distribution verdict fails a kit bug planted inside the Engine, naming the statistic."""
    done = _bf16_agreement("infer_ref.conformance.engines.kit_bugs:engine_window_off_by_one")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "distribution departs from the oracle's in bfloat16" in done.stdout and "worst positions: request" in done.stdout, done.stdout[-3000:]


def _recipe_verdict(engine: str, dtype: str, *, long_context: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "--pyargs",
           "infer_ref.conformance.engines.tests.test_recipe_errors", f"--ir-engine={engine}", f"--ir-engine-dtype={dtype}",
           *(["--ir-long-context"] if long_context else [])]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("planted", "fails_on"),
    [
        ("infer_ref", ()),
        ("engine_embed_scale_unrounded", ()),  # Gemma's normaliser in float32: llama.cpp's recipe, not a bug
        ("engine_gemma_one_plus_w_low_precision", ("gemma3-numerics-one-plus-w",)),
        ("engine_rms_norm_low_precision", ("gemma3-numerics-one-plus-w",)),
        ("engine_softmax_sum_low_precision", ("llama3-numerics-softmax-sink",)),
        ("engine_rms_variance_sequential_low_precision", ("llama3-numerics-softmax-sink",)),
        ("engine_fused_add_norm_truncated", ("llama3-numerics-softmax-sink",)),
    ],
)
def test_recipe_verdict_fails_recipe_errors_and_passes_correct_recipes(planted: str, fails_on: tuple[str, ...], dtype: str) -> None:
    """On the numerics checkpoints the signed statistics fail a recipe error planted in the Engine (on
    the coherent-norm checkpoint, whose norms all round one way; on the sink checkpoint, whose softmax
    sums all lose the same terms and whose constant query channel dwarfs the others in every mean
    square and every stream), and pass the unbroken Engine and Gemma's normaliser kept in float32
    (docs/low-precision.md, "Recipe errors")."""
    _assert_recipe_verdict(planted, dtype, fails_on)


@pytest.mark.parametrize(("dtype", "fails_on"), [("bfloat16", ()), ("float16", ("gemma3-numerics-hidden304",))])
def test_recipe_verdict_fails_a_bfloat16_normaliser_in_float16_only(dtype: str, fails_on: tuple[str, ...]) -> None:
    """Gemma's normaliser rounded to bfloat16 whatever the dtype: in float16 a recipe error on the
    hidden-304 checkpoint (sqrt(304) is 17.375 in bfloat16, 17.4375 in float16), in bfloat16 the
    canonical recipe itself, which passes."""
    _assert_recipe_verdict("engine_embed_normaliser_bf16", dtype, fails_on)


def _assert_recipe_verdict(planted: str, dtype: str, fails_on: tuple[str, ...]) -> None:
    engine = planted if planted == "infer_ref" else f"infer_ref.conformance.engines.kit_bugs:{planted}"
    done = _recipe_verdict(engine, dtype)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert done.returncode == (1 if fails_on else 0), done.stdout[-3000:]
    assert all(any(f in line for line in failed) for f in fails_on), done.stdout[-3000:]
    assert not fails_on or "spreads" in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("planted", ["infer_ref", "engine_rope_inv_freq_low_precision"])
def test_long_recipe_verdict_fails_rope_frequencies_in_the_low_dtype(planted: str, dtype: str) -> None:
    """At ~1000 positions on the RoPE numerics checkpoint, inverse frequencies rounded to the dtype
    fail the long-context recipe test; the unbroken Engine passes it."""
    engine = planted if planted == "infer_ref" else f"infer_ref.conformance.engines.kit_bugs:{planted}"
    done = _recipe_verdict(engine, dtype, long_context=True)
    assert done.returncode == (0 if planted == "infer_ref" else 1), done.stdout[-3000:]
    assert planted == "infer_ref" or "llama3-numerics-rope-long" in done.stdout, done.stdout[-3000:]

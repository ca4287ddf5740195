"""Old import paths (the kit's ``infer_ref.testing`` and ``infer_ref.golden``, the kernels, the fast
decoder, the block manager, the command-line modules) keep working for one release: each warns with a DeprecationWarning naming the new path and yields the same objects.

Each check runs in a fresh interpreter, where no old name has been imported (or warned about) yet.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The paths users were told to write (README, docs, .ci/run, examples) and where they live now,
# spelled out here rather than read from the alias table, so a wrong entry there fails.
USER_PATHS = {
    "infer_ref.testing.adapters:INFER_REF": "infer_ref.conformance.adapters.reference:INFER_REF",
    "infer_ref.testing.adapters:INFER_REF_PAGED": "infer_ref.conformance.adapters.reference:INFER_REF_PAGED",
    "infer_ref.testing.adapters_transformers:STATIC_SDPA": "infer_ref.conformance.adapters.transformers:STATIC_SDPA",
    "infer_ref.testing.mutants:MUTANTS": "infer_ref.conformance.mutants:MUTANTS",
    "infer_ref.testing.adapter:Adapter": "infer_ref.conformance.interface.adapter:Adapter",
    "infer_ref.testing.adapter:CacheSpec": "infer_ref.conformance.interface.adapter:CacheSpec",
    "infer_ref.testing.contract:CacheContract": "infer_ref.conformance.interface.contract:CacheContract",
    "infer_ref.testing.contract:Unsupported": "infer_ref.conformance.interface.contract:Unsupported",
    "infer_ref.testing.allocator:PoolModel": "infer_ref.conformance.oracles.allocator:PoolModel",
    "infer_ref.testing.oracle:naive_attention": "infer_ref.conformance.oracles.definitions:naive_attention",
    "infer_ref.testing.oracle:transformers_logits": "infer_ref.conformance.oracles.transformers_fp64:transformers_logits",
    "infer_ref.testing.synthetic:tiny_config": "infer_ref.conformance.checkpoints.snapshots:tiny_config",
    "infer_ref.testing.checkpoints:load": "infer_ref.conformance.case_models:load",
    "infer_ref.testing.plugin:current_impl_spec": "infer_ref.conformance.plugin:current_impl_spec",
    "infer_ref.golden:verify_file": "infer_ref.conformance.oracles.golden:verify_file",
    "infer_ref.golden:TOLERANCES": "infer_ref.conformance.oracles.golden:TOLERANCES",
    "infer_ref.golden:GoldenMismatch": "infer_ref.conformance.oracles.golden.results:GoldenMismatch",
    "infer_ref.golden.errors:GoldenMismatch": "infer_ref.conformance.oracles.golden.results:GoldenMismatch",
    "infer_ref.golden.report:VerifyReport": "infer_ref.conformance.oracles.golden.results:VerifyReport",
    "infer_ref.golden.synthetic:synthetic_state_dict": "infer_ref.conformance.checkpoints.golden_models:synthetic_state_dict",
    "infer_ref.golden.verification:sessions_for": "infer_ref.conformance.oracles.golden.implementations:sessions_for",
    "infer_ref.kernels:store_kvcache": "infer_ref.fast.kernels:store_kvcache",
    "infer_ref.kernels.norm:rms_norm": "infer_ref.norm:rms_norm",
    "infer_ref.kernels.rotary:apply_rope": "infer_ref.rotary:apply_rope",
    "infer_ref.engine.fast_decode:FastDecoder": "infer_ref.engine.fast_decoder:FastDecoder",
    "infer_ref.fast.decoder:FastDecoder": "infer_ref.engine.fast_decoder:FastDecoder",
    "infer_ref.fast.decoder:sliced_argmax": "infer_ref.engine.capture:sliced_argmax",
    "infer_ref.fast.decoder:READBACK_EVERY": "infer_ref.engine.readback:READBACK_EVERY",
    "infer_ref.fast:FastDecoder": "infer_ref.engine:FastDecoder",
    "infer_ref.cache.prefix:BlockManager": "infer_ref.engine.block_manager:BlockManager",
    "infer_ref.golden_cli:main": "infer_ref.cli.golden:main",
    "infer_ref.engine.sampling:SamplingParams": "infer_ref.sampling:SamplingParams",
    "infer_ref.engine.result:GenerationResult": "infer_ref.results:GenerationResult",
}


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.kit_run
def test_every_old_module_warns_naming_its_new_home_and_yields_the_same_objects() -> None:
    run = _python(
        """
        import importlib, sys, types, warnings
        import infer_ref._moved_modules as moved

        for old, homes in moved.MOVED.items():
            if old.endswith(".__main__"):
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            mine = [w for w in caught if issubclass(w.category, DeprecationWarning) and old + " has moved" in str(w.message)]
            assert len(mine) == 1, (old, [str(w.message) for w in caught])
            assert all(home in str(mine[0].message) for home in homes), (old, str(mine[0].message))
            news = [importlib.import_module(home) for home in homes]
            if len(homes) == 1 and old not in moved._OLD_PACKAGES:
                assert module is news[0], (old, module)
            for new in news:
                for name in dir(new):
                    value = getattr(new, name)
                    if name.startswith("_") or isinstance(value, types.ModuleType):
                        continue
                    assert getattr(module, name) is value or any(
                        getattr(other, name, None) is getattr(module, name) for other in news
                    ), (old, name)
        print("checked", len(moved.MOVED))
        """
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "checked" in run.stdout


@pytest.mark.kit_run
def test_the_documented_old_paths_load_the_same_objects() -> None:
    pairs = repr(USER_PATHS)
    run = _python(
        f"""
        import warnings
        from infer_ref.conformance.interface.adapter import load_adapter
        import importlib

        def resolve(spec):
            module, name = spec.split(":")
            return getattr(importlib.import_module(module), name)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for old, new in {pairs}.items():
                assert resolve(old) is resolve(new), (old, new)
            assert load_adapter("infer_ref.testing.adapters:INFER_REF") is resolve("infer_ref.conformance.adapters.reference:INFER_REF")
            # a mutant's adapter is built on every access: the same mutant, by name
            assert load_adapter("infer_ref.testing.mutants:rope_no_offset").name == "rope_no_offset"
            from infer_ref.testing import adapters, checkpoints, strategies  # old submodules, not new packages
            import infer_ref.conformance.adapters.reference as reference
            import infer_ref.conformance.case_models as case_models
            assert adapters is reference and checkpoints is case_models, (adapters, checkpoints)
            import infer_ref.testing.mutants.caches as caches
            import infer_ref.conformance.mutants.caches as new_caches
            assert caches is new_caches
        assert all(issubclass(w.category, DeprecationWarning) for w in caught)
        print("ok")
        """
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"


@pytest.mark.kit_run
def test_python_m_old_mutants_warns_then_runs_the_new_module() -> None:
    run = _python("", "-m", "infer_ref.testing.mutants", "--help")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "usage: python -m infer_ref.conformance.mutants" in run.stdout
    assert "DeprecationWarning: infer_ref.testing.mutants has moved to infer_ref.conformance.mutants" in run.stderr


@pytest.mark.kit_run
def test_old_plugin_pyargs_and_impl_paths_run_the_conformance_tests(tmp_path: Path) -> None:
    """``pytest -p infer_ref.testing.plugin --pyargs infer_ref.testing.conformance
    --ir-impl=infer_ref.testing.adapters:INFER_REF``, as a checkout without the entry point runs it."""
    run = subprocess.run(
        [sys.executable, "-W", "default::DeprecationWarning", "-m", "pytest", "-p", "infer_ref.testing.plugin", "--pyargs", "infer_ref.testing.conformance",
         "--ir-impl=infer_ref.testing.adapters:INFER_REF", "-k", "test_boundary_cases", "-p", "no:cacheprovider", "-q"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert re.search(r"\b10 passed", out), out[-3000:]  # the ten boundary cases of test_masks.py
    for old, new in [("infer_ref.testing.plugin", "infer_ref.conformance.plugin"),
                     ("infer_ref.testing.conformance", "infer_ref.conformance.tests"),
                     ("infer_ref.testing.adapters", "infer_ref.conformance.adapters.reference")]:
        assert f"{old} has moved to {new}" in out, (old, out[-3000:])


@pytest.mark.kit_run
def test_a_name_that_left_the_fast_package_warns_once_at_the_importing_line() -> None:
    """``from infer_ref.fast import FastDecoder`` (the package stays; the name moved to the runtime)."""
    run = _python(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from infer_ref.fast import FastDecoder
            from infer_ref.fast import FastDecoder as again
        from infer_ref.engine.fast_decoder import FastDecoder as new
        assert FastDecoder is again is new
        moved = "infer_ref.fast.FastDecoder has moved to infer_ref.engine.fast_decoder.FastDecoder"
        mine = [w for w in caught if moved in str(w.message)]
        assert len(mine) == 1 and mine[0].category is DeprecationWarning, [str(w.message) for w in caught]
        assert (mine[0].filename, mine[0].lineno) == ("<string>", 5), (mine[0].filename, mine[0].lineno)
        import infer_ref.fast
        try:
            infer_ref.fast.NoSuchName
        except AttributeError as error:
            assert "NoSuchName" in str(error)
        else:
            raise AssertionError("an unknown name resolved")
        print("ok")
        """
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"

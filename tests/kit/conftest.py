"""The kit's self-tests run tiny models too: the same one-thread setting as the conformance tier."""

from infer_ref.conformance.tests.conftest import _one_thread  # noqa: F401  (autouse fixture)

"""Model weights made up for tests: seeded random snapshots and the golden files' synthetic models."""

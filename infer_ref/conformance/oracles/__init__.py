"""Expected values: definitions in float64 and stated arithmetic, transformers, golden files."""

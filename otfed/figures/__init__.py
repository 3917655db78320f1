"""matplotlib figures of each stage's report (pure functions: data in, figure out)."""

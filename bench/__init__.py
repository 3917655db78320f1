"""Benchmarks: what otfed's code costs in time, memory and scaling (``python -m bench.<name>``, ``make bench``);
reports in ``reports/bench/``. Research studies are in ``studies/``, the GPU-session tooling in ``gpu/``."""

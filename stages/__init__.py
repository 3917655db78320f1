"""One module per DVC stage, every one the same shape (see stages/stage.py); stages/params.py finds them."""
from otfed.cpu_kernels import use_portable_kernels

use_portable_kernels()  # `python -m stages.<name>`: before any stage module imports numpy or torch

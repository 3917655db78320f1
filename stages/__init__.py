"""One module per DVC stage, every one the same shape (see stages/stage.py); stages/params.py finds them."""

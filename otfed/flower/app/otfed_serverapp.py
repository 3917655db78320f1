"""The ServerApp: runs the session described by the JSON file its run config names (``session``) and writes the
result there (``result``, an ``.npz``, written to a temporary name and renamed), or the one-line reason it failed
(``<result>.error``) — never a partial result."""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from otfed.flower.fedbary import result_arrays, run_session
from otfed.flower.fedwad import fedwad_result_arrays, run_fedwad_session
from otfed.flower.workers import FlowerWorkers

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    session = json.loads(Path(str(context.run_config["session"])).read_text(encoding="utf-8"))
    result_path = Path(session["result"])
    try:
        workers = FlowerWorkers(grid, timeout=float(session["timeout"]))
        if session["protocol"] == "fedwad":
            arrays = fedwad_result_arrays(run_fedwad_session(workers, session["config"], int(session["seed"])))
        else:
            arrays = result_arrays(run_session(workers, session["config"], int(session["seed"]),
                                               int(session["clients"]), datum_values=bool(session["datum_values"])))
        arrays["wire_bytes"] = np.array(workers.wire_bytes)
        partial = result_path.with_name(result_path.name + ".partial.npz")
        np.savez(partial, **arrays)
        os.replace(partial, result_path)
    except Exception as exc:
        result_path.with_name(result_path.name + ".error").write_text(
            f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}", encoding="utf-8")
        raise

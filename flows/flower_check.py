"""``python -m flows.flower_check``: one FedBary session (three clients) and one FedWaD session (two) over a
local Flower federation (a SuperLink and a SuperNode per client on 127.0.0.1,
:class:`~flows.flower_federation.LocalFederation`, over TLS with a CA made for the run unless ``--insecure``) and the
same sessions in process (:func:`~otfed.federation.fedbary.federated_valuation`,
:func:`~otfed.federation.fedwad.federated_wasserstein`, same seed), compared bit for bit: FedBary's distances,
contributions, history, final barycenter and every client's datum values; FedWaD's upper and lower bounds,
history, ξ^(K) and its support sizes.

Prints one line per protocol and exits 0 when every number is equal, 1 otherwise (2 when a federation could not
run). Federated OTDD is not covered yet.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np

from otfed.federation.fedbary import FedBaryConfig, FedBaryResult, federated_valuation
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from otfed.flower.fedbary import result_arrays
from otfed.flower.fedwad import fedwad_result_arrays
from flows.flower_federation import LocalFederation
from otfed.ot.otdd import LabelledData

CHECK_CONFIG = FedBaryConfig(support_size=12, iterations=4)
#: FedWaD between the first two check clients (S = n = 30: the support rule holds), with its history monitored
CHECK_FEDWAD = FedWaDConfig(support_size=30, iterations=5, record_history=True)


def check_clients(seed: int = 0) -> list[LabelledData]:
    """Three small labelled clients (2-D, two classes, 30 rows each; the third shifted)."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], 15)
    return [LabelledData(f"client_{i}", rng.normal(size=(30, 2)) + 3.0 * y[:, None] + shift, y)
            for i, shift in enumerate([0.0, 0.0, 2.0])]


def differences(flower: dict[str, np.ndarray], inprocess: dict[str, np.ndarray]) -> list[str]:
    """Which arrays differ between the two runs (bitwise: same shape, dtype and bytes); [] when none. The
    transport-only counters (bytes on the wire) are not compared."""
    out = []
    for key in sorted(set(flower) | set(inprocess)):
        if key == "wire_bytes":
            continue
        a, b = flower.get(key), inprocess.get(key)
        if a is None or b is None:
            out.append(f"{key}: only in the {'in-process' if a is None else 'Flower'} run")
        elif a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            diff = (float(np.max(np.abs(a.astype(float) - b.astype(float))))
                    if a.shape == b.shape and a.dtype.kind == "f" else None)
            out.append(f"{key}: differs" + (f" (max |Δ| = {diff:.3g})" if diff is not None else ""))
    return out


def _line(protocol: str, flower: dict[str, np.ndarray], reference: dict[str, np.ndarray], summary: str,
          flower_s: float, inprocess_s: float) -> tuple[bool, str]:
    wrong = differences(flower, reference)
    timing = f"Flower {flower_s:.1f} s, federation start included, vs in process {inprocess_s:.2f} s"
    if wrong:
        return False, f"{protocol}: DIFFERENT over Flower — {'; '.join(wrong)} ({timing})"
    return True, f"{protocol}: identical over Flower, bit for bit — {summary} ({timing})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.flower_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on every wait, seconds")
    parser.add_argument("--insecure", action="store_true", help="plain HTTP instead of TLS with a CA made for the run")
    args = parser.parse_args(argv)
    clients = check_clients(args.seed)
    transport = "HTTP" if args.insecure else "TLS"
    ok = True
    try:
        # FedBary: three clients
        started = time.perf_counter()
        reference: FedBaryResult = federated_valuation(clients, CHECK_CONFIG, seed=args.seed, datum_values=True)
        inprocess_s = time.perf_counter() - started
        started = time.perf_counter()
        with LocalFederation(clients, timeout=args.timeout, tls=not args.insecure) as federation:
            flower = federation.run_fedbary(CHECK_CONFIG, seed=args.seed)
        equal, line = _line("fedbary", flower, result_arrays(reference),
                            f"{transport}, {len(clients)} clients, seed {args.seed}: distances "
                            f"{np.array2string(flower['distances'], precision=6)}, contributions "
                            f"{np.array2string(flower['contributions'], precision=4)} %, datum values; "
                            f"{int(flower['wire_bytes'])} array bytes on the wire, ledger {int(flower['ledger_bytes'])}",
                            time.perf_counter() - started, inprocess_s)
        print(line)
        ok &= equal
        # FedWaD: the first two clients' samples
        pair = clients[:2]
        started = time.perf_counter()
        wad = federated_wasserstein(pair[0].x, pair[1].x, CHECK_FEDWAD, seed=args.seed,
                                    names=(pair[0].name, pair[1].name))
        inprocess_s = time.perf_counter() - started
        started = time.perf_counter()
        with LocalFederation(pair, timeout=args.timeout, tls=not args.insecure) as federation:
            flower = federation.run_fedwad(CHECK_FEDWAD, seed=args.seed)
        equal, line = _line("fedwad", flower, fedwad_result_arrays(wad),
                            f"{transport}, {pair[0].name} vs {pair[1].name}, seed {args.seed}: W2 in "
                            f"[{float(flower['lower']):.6f}, {float(flower['upper']):.6f}], history of "
                            f"{len(flower['history'])}", time.perf_counter() - started, inprocess_s)
        print(line)
        ok &= equal
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"the Flower federation failed: {exc}")
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

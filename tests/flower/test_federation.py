"""Over a real local Flower federation (a SuperLink and three SuperNodes as processes on 127.0.0.1, from
``.venv-flower``): a FedBary session over TLS and a FedWaD session equal the in-process runs for the same seed bit
for bit, and no process is left behind — also when a node's data cannot be read or a SuperNode is killed mid-session. Also the packet ↔ RecordDict round trip in that environment. Skipped when ``.venv-flower`` is absent
(``make flower-setup``). Waits are bounded by ceilings (tests/ceilings.py); nothing is decided by a clock."""
from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest

from otfed.federation.fedbary import federated_valuation
from otfed.federation.fedwad import federated_wasserstein
from flows.flower_check import CHECK_CONFIG, CHECK_FEDWAD, check_clients, differences
from otfed.flower.fedbary import result_arrays
from otfed.flower.fedwad import fedwad_result_arrays
from flows.flower_federation import LocalFederation, flower_venv
from tests.ceilings import ceiling, completed, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not (flower_venv() / "bin" / "flower-superlink").exists(),
                                 reason="no .venv-flower (make flower-setup)")]


def processes_of(workdir: Path) -> list[str]:
    """Processes still running that belong to the federation in ``workdir``: their command line names a file in
    it, or their environment its Flower home."""
    home, found = str(workdir / "flwr-home"), []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            env = p.environ() if p.pid != psutil.Process().pid else {}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if str(workdir) in cmdline or env.get("FLWR_HOME") == home:
            found.append(f"{p.pid}: {cmdline}")
    return found


def test_fedbary_over_flower_with_tls_equals_the_in_process_run_and_leaves_no_process(tmp_path: Path) -> None:
    data = check_clients(0)
    federation = LocalFederation(data, workdir=tmp_path, timeout=ceiling(600), tls=True)
    with federation:
        assert len(federation.processes) == 1 + len(data)  # a SuperLink and one SuperNode per client
        assert not [p.role for p in federation.processes if p.process.poll() is not None]
        # the SuperLink speaks TLS with a certificate of the CA made for this federation, for 127.0.0.1
        context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.pem"))
        with socket.create_connection(("127.0.0.1", federation.port), timeout=ceiling(30)) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert dict(x[0] for x in tls.getpeercert()["subject"])["commonName"] == "127.0.0.1"
        flower = federation.run_fedbary(CHECK_CONFIG, seed=0)
    in_process = result_arrays(federated_valuation(data, CHECK_CONFIG, seed=0, datum_values=True))
    assert differences(flower, in_process) == []
    assert np.isclose(flower["contributions"].sum(), 100.0)
    # each SuperNode held only its own client's file
    for i, d in enumerate(data):
        with np.load(tmp_path / f"client_{i}.npz") as npz:
            assert str(npz["name"]) == d.name and npz["x"].tobytes() == d.x.tobytes()
    assert all(p.process.poll() is not None for p in federation.processes)
    assert processes_of(tmp_path) == []


def test_fedwad_over_flower_equals_the_in_process_run(tmp_path: Path) -> None:
    """FedWaD between two SuperNodes (plain HTTP here; TLS above): upper and lower bound, the monitored history,
    ξ^(K) — every number as :func:`federated_wasserstein` gives it in process."""
    pair = check_clients(0)[:2]
    with LocalFederation(pair, workdir=tmp_path, timeout=ceiling(900)) as federation:
        flower = federation.run_fedwad(CHECK_FEDWAD, seed=1)
    in_process = federated_wasserstein(pair[0].x, pair[1].x, CHECK_FEDWAD, seed=1, names=(pair[0].name, pair[1].name))
    assert differences(flower, fedwad_result_arrays(in_process)) == []
    assert float(flower["lower"]) <= float(flower["upper"])
    assert processes_of(tmp_path) == []


def test_a_failed_start_leaves_no_process(tmp_path: Path) -> None:
    """A SuperNode whose partition cannot be read fails the session with the client's error, and every process
    still stops."""
    data = check_clients(0)
    federation = LocalFederation(data, workdir=tmp_path, timeout=ceiling(600))
    with pytest.raises(RuntimeError, match="the fedbary run failed: RuntimeError: node .* failed at 'enrol'"):
        with federation:
            (tmp_path / "client_1.npz").write_bytes(b"not an npz file")
            federation.run_fedbary(CHECK_CONFIG, seed=0)
    assert not (tmp_path / "fedbary-seed0.npz").exists()
    assert processes_of(tmp_path) == []


def test_a_packet_survives_flowers_records_and_a_stray_record_is_refused() -> None:
    script = textwrap.dedent("""
        import numpy as np
        from flwr.app import ConfigRecord
        from otfed.federation.messages import DistanceMessage, MeasureMessage
        from otfed.flower.records import MessageRefused, Packet, WireArray, message_to_wire
        from otfed.flower.transport import packet_from_recorddict, packet_to_recorddict
        from otfed.ot import Measure
        rng = np.random.default_rng(0)
        m = MeasureMessage("gamma", "a", "server", measure=Measure.uniform(rng.normal(size=(5, 3))))
        d = DistanceMessage("client_distance", "a", "server", value=0.3)
        sent = Packet({"version": "v", "n": 3, "ok": True}, [message_to_wire(m), message_to_wire(d)],
                      {"values": WireArray.of(rng.normal(size=7))})
        content = packet_to_recorddict(sent)
        got = packet_from_recorddict(content, "node 1")
        assert dict(got.head) == dict(sent.head)
        assert [dict(w.meta) for w in got.messages] == [dict(w.meta) for w in sent.messages]
        assert [dict(w.arrays) for w in got.messages] == [dict(w.arrays) for w in sent.messages]
        assert dict(got.arrays) == dict(sent.arrays)
        content["samples"] = ConfigRecord({"x": 1.0})
        try:
            packet_from_recorddict(content, "node 1")
        except MessageRefused as exc:
            print(exc)
        else:
            raise SystemExit("a stray record passed")
    """)
    done = completed([str(flower_venv() / "bin" / "python"), "-c", script], "the round trip in .venv-flower", 120,
                     cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "node 1: refused a message: unexpected record 'samples'"


def test_the_flower_environment_is_the_lock() -> None:
    """.venv-flower holds flwr 1.42.0 and otfed's core at requirements-flower.lock's versions."""
    lock = Path(__file__).resolve().parents[2] / "requirements-flower.lock"
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if line and not line.startswith("#"))
    assert pins["flwr"] == "1.42.0"
    probe = subprocess.run([str(flower_venv() / "bin" / "python"), "-c",
                            "import importlib.metadata as m; print(*(m.version(p) for p in "
                            "('flwr', 'numpy', 'scipy', 'POT', 'pydantic')))"], capture_output=True, text=True,
                           timeout=ceiling(120))
    assert probe.stdout.split() == [pins[p] for p in ("flwr", "numpy", "scipy", "POT", "pydantic")]


def test_a_supernode_killed_mid_session_ends_it_naming_the_node(tmp_path: Path) -> None:
    """SuperNode 1 is killed once it has received its first ``report``: the session ends with one line naming
    that node's client and writes no result; every other process stops. (The call's wait is bounded; a dead
    node never answers, so the outcome does not depend on how fast anything ran.)"""
    data = check_clients(0)
    federation = LocalFederation(data, workdir=tmp_path, timeout=ceiling(900), call_timeout=ceiling(120))
    outcome: dict[str, BaseException] = {}

    def session() -> None:
        try:
            federation.run_fedbary(CHECK_CONFIG, seed=0)
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    with federation:
        victim = next(p for p in federation.processes if p.role == "supernode-1")
        runner = threading.Thread(target=session)
        runner.start()
        wait_until(lambda: "query.report" in victim.log.read_text(errors="replace"), "SuperNode 1's first report",
                   600, details=lambda: LocalFederation.tail(victim.log))
        os.killpg(victim.process.pid, signal.SIGKILL)
        runner.join(ceiling(1200))
        assert not runner.is_alive(), "the session did not end after its node was killed"
    error = outcome.get("error")
    assert isinstance(error, RuntimeError), error
    assert re.search(r"node \d+ \(client_1\) (sent no reply to|failed at) '(report|update)'", str(error)), str(error)
    assert not (tmp_path / "fedbary-seed0.npz").exists()
    assert processes_of(tmp_path) == []


def other_interface() -> str | None:
    """An IPv4 address of this machine other than loopback, or None."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


@pytest.mark.skipif(other_interface() is None, reason="this machine has no IPv4 address besides loopback")
def test_a_superlink_reached_at_another_address_with_its_certificate(tmp_path: Path) -> None:
    """The multi-host recipe (docs/scaling.md) on one machine: the SuperLink listens on a non-loopback address, its
    certificate names that address, the SuperNodes and ``flwr run`` reach it there over TLS — and the numbers are
    the in-process ones."""
    host = other_interface()
    data = check_clients(0)
    with LocalFederation(data, workdir=tmp_path, timeout=ceiling(600), tls=True, link_host=host) as federation:
        context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.pem"))
        with socket.create_connection((host, federation.port), timeout=ceiling(30)) as raw:
            with context.wrap_socket(raw, server_hostname=host) as tls:  # verifies the certificate names the host
                assert tls.version() is not None
        with pytest.raises(ConnectionRefusedError):  # not on loopback: the nodes cannot have used it
            socket.create_connection(("127.0.0.1", federation.port), timeout=ceiling(30)).close()
        flower = federation.run_fedbary(CHECK_CONFIG, seed=0)
    in_process = result_arrays(federated_valuation(data, CHECK_CONFIG, seed=0, datum_values=True))
    assert differences(flower, in_process) == []
    assert processes_of(tmp_path) == []

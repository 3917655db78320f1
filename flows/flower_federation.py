"""A local Flower federation: a SuperLink and one SuperNode per client as separate processes on 127.0.0.1 (the
Deployment Engine), each SuperNode given only its own client's partition file, and FedBary or FedWaD sessions
submitted to it with ``flwr run``.

Everything runs from the Flower environment (``.venv-flower``, ``make flower-setup``; another with
``OTFED_FLOWER_VENV``) under a private Flower home in the federation's work directory, with runtime dependency
installation off: no step needs the network. Every process is started in its own process group and
:meth:`LocalFederation.stop` (also on failure, and on leaving the ``with`` block) ends each group — SIGTERM,
then SIGKILL after a grace period — so nothing is left running; every signal goes through
:meth:`flows.caller.Process.signal`, to processes named by pid and start time (never a recycled pid). ``tls=True``: HTTPS everywhere, with a certificate
authority made for the federation (:func:`make_certificates`); otherwise plain HTTP, on 127.0.0.1 only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import psutil

from flows import caller
from otfed.federation.fedbary import FedBaryConfig
from otfed.federation.fedwad import FedWaDConfig
from otfed.flower.fedbary import write_partition
from otfed.ot.otdd import LabelledData
from otfed.schema import as_config

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "otfed" / "flower" / "app"
VENV_ENV = "OTFED_FLOWER_VENV"


def _create_time(pid: int) -> float:
    """The start time of ``pid`` (a zombie has one too); now, when even that is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return time.time()


def flower_venv() -> Path:
    """The Flower environment: ``$OTFED_FLOWER_VENV`` or the checkout's ``.venv-flower``."""
    return Path(os.environ.get(VENV_ENV) or REPO / ".venv-flower")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def make_certificates(folder: Path, days: int = 2, hosts: Sequence[str] = ()) -> dict[str, Path]:
    """A throw-away certificate authority and, signed by it, a certificate for 127.0.0.1 / localhost and the IP
    addresses in ``hosts`` (EC P-256, valid ``days``): ``ca`` (the CA's certificate, what clients trust), ``cert``
    and ``key`` (the servers'). The keys are written readable by the owner only. Needs ``cryptography`` (in both
    environments)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(hours=1), not_valid_after=now + datetime.timedelta(days=days))

    def builder(subject: x509.Name, issuer: x509.Name, key: Any) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(valid["not_valid_before"])
                .not_valid_after(valid["not_valid_after"]))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otfed local federation CA")])
    ca = (builder(ca_name, ca_name, ca_key).add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    cert = (builder(name, ca_name, key)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(h)) for h in dict.fromkeys(["127.0.0.1", *hosts])]
                + [x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].touch(mode=0o600)
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


@dataclass
class Started:
    """A process this federation started: its role, its Popen and its log file."""

    role: str
    process: subprocess.Popen
    log: Path
    identity: caller.Process  # the process by pid and start time, taken at start (flows.caller)
    seen: list[caller.Process] = field(default_factory=list)  # its group and descendants, as last found


class LocalFederation:
    """A SuperLink and ``len(datasets)`` SuperNodes on 127.0.0.1; SuperNode i holds only ``datasets[i]`` (its
    ``.npz`` in the work directory) and ``partition-id = i``. Use as a context manager; ``timeout`` bounds every
    wait (the SuperLink's port, the run, its result file), ``call_timeout`` (default: ``timeout``) the ServerApp's
    wait for the replies to one protocol call: a node that does not answer within it ends the session, named.
    ``link_host``: the address the SuperLink listens on and the SuperNodes and ``flwr run`` reach it at (with TLS,
    its certificate names it) — another interface of this machine plays a SuperLink on another host; the
    SuperNodes' own runtime APIs, which only their ClientApps use, stay on 127.0.0.1."""

    def __init__(self, datasets: Sequence[LabelledData], workdir: str | Path | None = None,
                 timeout: float = 600.0, venv: str | Path | None = None, call_timeout: float | None = None,
                 tls: bool = False, link_host: str = "127.0.0.1") -> None:
        self.datasets = list(datasets)
        self.tls = tls
        self.link_host = link_host
        self.timeout = float(timeout)
        self.call_timeout = self.timeout if call_timeout is None else float(call_timeout)
        self.venv = Path(venv) if venv is not None else flower_venv()
        if not (self.venv / "bin" / "flower-superlink").exists():
            raise FileNotFoundError(f"no Flower environment at {self.venv} (make flower-setup builds it)")
        self._own_dir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="otfed-flower-")) if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home = self.workdir / "flwr-home"
        self.processes: list[Started] = []
        self.port = 0

    # -------------------------------------------------------------------------------------------- processes
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        env.update(FLWR_HOME=str(self.home), PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONUNBUFFERED="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        # each SuperNode's SuperExec asks for a task to start every second by default: a tenth of that
        env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        return env

    def _start(self, role: str, argv: list[str]) -> Started:
        log = self.workdir / f"{role}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=self.workdir, env=self._env(), start_new_session=True)
        identity = caller.Process.of(process.pid) or caller.Process(process.pid, _create_time(process.pid), role)
        started = Started(role, process, log, identity)
        self.processes.append(started)
        return started

    def _check_alive(self) -> None:
        for p in self.processes:
            if p.process.poll() is not None:
                raise RuntimeError(f"{p.role} exited with status {p.process.returncode}: {self.tail(p.log)}")

    @staticmethod
    def tail(log: Path, lines: int = 15) -> str:
        """The last ``lines`` lines of a log."""
        text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> "LocalFederation":
        """Write the partitions and the Flower home, start the SuperLink, wait for its port, start the
        SuperNodes."""
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self.port = free_port(self.link_host)
            if self.tls:
                certs = make_certificates(self.workdir / "certs", hosts=[self.link_host])
                security = f"root-certificates = {json.dumps(str(certs['ca']))}\n"
                link_tls = ["--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]),
                            "--ssl-ca-certfile", str(certs["ca"])]
                node_tls = ["--root-certificates", str(certs["ca"]), *link_tls]
            else:
                security, link_tls, node_tls = "insecure = true\n", ["--insecure"], ["--insecure"]
            (self.home / "config.toml").write_text(
                f'[superlink]\ndefault = "otfed"\n\n[superlink.otfed]\naddress = "{self.link_host}:{self.port}"\n'
                + security, encoding="utf-8")
            bin_ = self.venv / "bin"
            self._start("superlink", [str(bin_ / "flower-superlink"), *link_tls, "--host", self.link_host,
                                      "--port", str(self.port), "--disable-runtime-dependency-installation",
                                      "--database", str(self.workdir / "superlink.db")])
            deadline = time.monotonic() + self.timeout
            while not _listening(self.port, self.link_host):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink did not listen on {self.link_host}:{self.port} within "
                                       f"{self.timeout:g} s")
                time.sleep(0.2)
            for i, data in enumerate(self.datasets):
                path = write_partition(self.workdir / f"client_{i}.npz", data)
                self._start(f"supernode-{i}", [
                    str(bin_ / "flower-supernode"), *node_tls, "--superlink", f"{self.link_host}:{self.port}",
                    "--host", "127.0.0.1", "--port", str(free_port()),
                    "--node-config", f"partition-id={i} data={json.dumps(str(path))}"])
            return self
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        """End every process group this federation started: SIGTERM, then SIGKILL after ``grace`` seconds; then
        every process left with this federation's Flower home (:meth:`stragglers`), within another ``grace``."""
        for p in reversed(self.processes):
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in reversed(self.processes):
            try:
                p.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)  # the group's other members (a ClientApp, a ServerApp)
            p.process.wait()
        # Flower's helpers (flwr-serverapp, flower-superexec, flwr-clientapp) may run in sessions of their own and
        # outlive their parent until they notice; they carry this federation's private Flower home
        deadline = time.monotonic() + grace
        while (left := self.stragglers()) and time.monotonic() < deadline:
            for process in left:
                process.signal(signal.SIGKILL)
            time.sleep(0.2)

    def stragglers(self) -> list[caller.Process]:
        """Live processes, other than this one, whose environment names this federation's private Flower home
        (``FLWR_HOME``, a fresh folder: no other process has it), by pid and start time."""
        home, out = str(self.home), []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and proc.environ().get("FLWR_HOME") == home:
                    found = caller.Process.of(proc.pid)
                    if found is not None:
                        out.append(found)
            except psutil.Error:
                continue
        return out

    def __enter__(self) -> "LocalFederation":
        return self.start()

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        """Stop every process; remove a work directory this federation made itself, unless leaving on an
        error (its logs then stay for the post-mortem)."""
        self.stop()
        if self._own_dir and exc_type is None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -------------------------------------------------------------------------------------------- a session
    def run_fedbary(self, config: FedBaryConfig | Mapping[str, Any], seed: int = 0,
                    datum_values: bool = True) -> dict[str, np.ndarray]:
        """One FedBary session over this federation's SuperNodes (:func:`otfed.flower.fedbary.run_session` in the
        ServerApp): its numbers (:func:`~otfed.flower.fedbary.result_arrays`)."""
        return self._run("fedbary", as_config(config, FedBaryConfig), seed, datum_values)

    def run_fedwad(self, config: FedWaDConfig | Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
        """One FedWaD session between this federation's two SuperNodes (:func:`otfed.flower.fedwad.run_fedwad_session`
        in the ServerApp): its numbers (:func:`~otfed.flower.fedwad.fedwad_result_arrays`)."""
        if len(self.datasets) != 2:
            raise ValueError(f"FedWaD runs between two clients; this federation has {len(self.datasets)}")
        return self._run("fedwad", as_config(config, FedWaDConfig), seed, False)

    def _run(self, protocol: str, config: Any, seed: int, datum_values: bool) -> dict[str, np.ndarray]:
        """Submit one session with ``flwr run`` and wait for its result file. RuntimeError with the ServerApp's
        one-line reason, or the run's output, when it failed; nothing is returned half-written."""
        result = self.workdir / f"{protocol}-seed{seed}.npz"
        error = result.with_name(result.name + ".error")
        for stale in (result, error):
            stale.unlink(missing_ok=True)
        session = self.workdir / f"{protocol}-seed{seed}.json"
        session.write_text(json.dumps({"protocol": protocol, "config": config.model_dump(mode="json"),
                                       "seed": int(seed), "clients": len(self.datasets), "result": str(result),
                                       "timeout": self.call_timeout, "datum_values": bool(datum_values)}),
                           encoding="utf-8")
        run = self._start(f"flwr-run-{protocol}", [str(self.venv / "bin" / "flwr"), "run", str(APP), "otfed",
                                                   "--stream", "--run-config", f"session={json.dumps(str(session))}"])
        try:
            run.process.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the {protocol} run did not finish within {self.timeout:g} s (logs: {self.workdir}): "
                               f"{self.tail(run.log)}") from None
        deadline = time.monotonic() + self.timeout
        while not (result.exists() or error.exists()):  # `flwr run --stream` may return before the file lands
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {protocol} run wrote no result within {self.timeout:g} s (flwr run exited "
                                   f"{run.process.returncode}; logs: {self.workdir}): {self.tail(run.log)}")
            time.sleep(0.2)
        if error.exists():
            raise RuntimeError(f"the {protocol} run failed: " + error.read_text(encoding="utf-8").splitlines()[0])
        with np.load(result, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}


def _group_members(leader: caller.Process) -> list[caller.Process]:
    """The live processes of the group ``leader`` led (started with ``start_new_session``: the group id is its pid)
    and, while the leader runs, its descendants (a SuperLink starts its ServerApp in a session of its own), each
    named by pid and start time for :meth:`flows.caller.Process.signal`. Linux does not give a pid to a new process
    while it is still some group's id, so processes with that group id are this federation's — unless the group
    emptied and the pid went to another process since: then that pid names a process with another start time, and
    nothing is returned. Members started before the leader are not its."""
    holder = caller.Process.of(leader.pid)
    if holder is not None and abs(holder.started - leader.started) >= caller.SAME_START_S:
        return []  # the pid is another process's now: this group is gone
    pids = set()
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == leader.pid and proc.create_time() >= leader.started - caller.SAME_START_S:
                pids.add(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    if holder is not None:  # the leader itself, checked above: its descendants are its own
        try:
            pids.update(child.pid for child in psutil.Process(leader.pid).children(recursive=True))
        except psutil.Error:
            pass
    return [m for m in (caller.Process.of(pid) for pid in sorted(pids)) if m is not None]


def _signal_group(started: Started, sig: int) -> None:
    """``sig`` to every member of the process group ``started`` leads and to its descendants — those found now and
    those found at an earlier signal (a ServerApp outlives its SuperLink until it notices) — each through
    :meth:`flows.caller.Process.signal`, which checks pid and start time right before the signal: a process that
    is gone, or a pid recycled since, is left alone."""
    known = {(m.pid, m.started) for m in started.seen}
    started.seen += [m for m in _group_members(started.identity) if (m.pid, m.started) not in known]
    for member in started.seen:
        member.signal(sig)

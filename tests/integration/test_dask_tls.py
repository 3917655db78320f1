"""The README's encrypted multi-host setup, on loopback: a Dask scheduler and worker speaking TLS with
certificates made here, a stage run against ``tls://`` with the client certificate given through Dask's
configuration variables, and a stage without them failing in one line that says what to set.

Certificates: one self-signed ECDSA certificate for 127.0.0.1 / localhost, generated in the test with
``cryptography``, serves as the CA, the scheduler's, the worker's and the client's (Dask checks the peer
against the CA; ``--tls-ca-file`` / ``--tls-cert`` / ``--tls-key`` on the command line,
``DASK_DISTRIBUTED__COMM__TLS__*`` for the stage).
"""
from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ceilings import completed, tail, wait_until
from tests.integration.support import stop_processes, BIN, REPO, clean_env
from tests.stages.conftest import tiny_params

pytestmark = pytest.mark.integration

STAGE_S = 480
CLUSTER_START_S = 240


def _certificate(folder: Path) -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otfed test cluster")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    paths = {"cert": folder / "node.pem", "key": folder / "node.key"}
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def _tls_args(paths: dict[str, Path]) -> list[str]:
    return ["--tls-ca-file", str(paths["cert"]), "--tls-cert", str(paths["cert"]), "--tls-key", str(paths["key"])]


def _client_tls(paths: dict[str, Path]) -> dict[str, str]:
    """What the README tells a stage's machine to export: the CA and this client's certificate and key."""
    return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(paths["cert"]),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(paths["cert"]),
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(paths["key"]),
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A project and a TLS-only Dask scheduler with one single-threaded worker, on 127.0.0.1."""
    if shutil.which("dask", path=str(BIN)) is None:
        pytest.skip("needs the dask command (distributed)")
    root = tmp_path_factory.mktemp("tls_project")
    paths = _certificate(root)
    env = clean_env(OTFED_HOME=str(root), PYTHONPATH=str(REPO))
    scheduler_file = root / "scheduler.json"
    logs = {name: root / f"{name}.log" for name in ("scheduler", "worker")}
    procs = []
    try:
        with open(logs["scheduler"], "wb") as log:
            procs.append(subprocess.Popen([str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                                           "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file),
                                           *_tls_args(paths)], cwd=root, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        wait_until(lambda: scheduler_file.exists() or procs[0].poll() is not None,
                   "the Dask scheduler to write its scheduler file", CLUSTER_START_S, poll=0.2)
        assert procs[0].poll() is None, tail(logs["scheduler"].read_text())
        address = yaml.safe_load(scheduler_file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        with open(logs["worker"], "wb") as log:
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", address, "--nthreads", "1",
                                           "--no-dashboard", "--host", "127.0.0.1", *_tls_args(paths)],
                                          cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT))
        wait_until(lambda: "Registered to" in logs["worker"].read_text() or procs[1].poll() is not None,
                   "the worker to join the scheduler over TLS", CLUSTER_START_S, poll=0.2)
        assert procs[1].poll() is None, tail(logs["worker"].read_text())
        yield root, address, paths
    finally:
        stop_processes(procs)


def _run_partition(root: Path, address: str, **env: str) -> subprocess.CompletedProcess:
    params = tiny_params(root)
    params["run"].update(task_runner="dask", max_workers=1, dask_address=address)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return completed([sys.executable, "-m", "flows.stage", "partition"], "the stage partition to exit", STAGE_S,
                     cwd=root,
                     env=clean_env(OTFED_HOME=str(root), PYTHONPATH=str(REPO), **env))


def test_a_stage_runs_on_a_tls_cluster_with_the_client_certificate(tls_cluster) -> None:
    root, address, paths = tls_cluster
    done = _run_partition(root, address, **_client_tls(paths))
    assert done.returncode == 0, done.stderr
    assert f"tasks on dask at {address}" in done.stderr
    assert (root / "reports" / "partition" / "metrics.json").exists()


def test_without_the_client_certificate_the_stage_says_what_to_set(tls_cluster) -> None:
    root, address, _ = tls_cluster
    before = sorted(p.relative_to(root).as_posix() for p in (root / "reports").rglob("*")) \
        if (root / "reports").exists() else []
    done = _run_partition(root, address)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: params.yaml: run.dask_address: cannot connect to {address!r} over TLS"), lines
    assert "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT" in lines[0]
    after = sorted(p.relative_to(root).as_posix() for p in (root / "reports").rglob("*")) \
        if (root / "reports").exists() else []
    assert after == before

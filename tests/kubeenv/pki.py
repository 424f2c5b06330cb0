"""Throw-away certificates for a test control plane, made with the machine's ``openssl`` CLI.

ECDSA P-256 keys everywhere: they take milliseconds to generate, and kube-apiserver
accepts them for serving, for client certificates and for ServiceAccount token
signing (ES256).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "PkiError", "make_pki"]

CA_DAYS = 2
_CURVE = "prime256v1"


class PkiError(RuntimeError):
    """openssl is missing or refused to make a certificate."""


@dataclass(frozen=True)
class Pki:
    """Paths of the files a test control plane needs."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    controller_manager_cert: Path
    controller_manager_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PkiError("the openssl command is not on PATH (apt-get install openssl)")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()[-2000:]}")


def _key(path: Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        f"ec_paramgen_curve:{_CURVE}",
        "-out",
        str(path),
        cwd=path.parent,
    )
    path.chmod(0o600)


def _signed_cert(
    d: Path, name: str, subject: str, extensions: str, ca_cert: Path, ca_key: Path
) -> tuple[Path, Path]:
    key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    _key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=d)
    # SKI/AKI: Python >= 3.13 verifies with VERIFY_X509_STRICT, which wants them.
    ext.write_text(extensions + "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        str(CA_DAYS),
        "-sha256",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
        cwd=d,
    )
    csr.unlink()
    ext.unlink()
    return crt, key


def make_pki(
    d: Path, *, san_ips: tuple[str, ...] = ("127.0.0.1",), san_dns: tuple[str, ...] = ("localhost",)
) -> Pki:
    """Create a CA, a serving certificate, client certificates and a ServiceAccount key pair in *d*."""
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = d / "ca.key", d / "ca.crt"
    _key(ca_key)
    cnf = d / "ca.cnf"
    cnf.write_text(
        "[req]\ndistinguished_name=dn\n[dn]\n[v3_ca]\nbasicConstraints=critical,CA:TRUE\n"
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature\nsubjectKeyIdentifier=hash\n"
    )
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(ca_key),
        "-subj",
        "/CN=gpuhc-test-ca",
        "-days",
        str(CA_DAYS),
        "-sha256",
        "-config",
        str(cnf),
        "-extensions",
        "v3_ca",
        "-out",
        str(ca_cert),
        cwd=d,
    )
    cnf.unlink()

    sans = ",".join([*(f"IP:{ip}" for ip in san_ips), *(f"DNS:{n}" for n in san_dns)])
    serving_cert, serving_key = _signed_cert(
        d,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        ca_cert,
        ca_key,
    )
    client_ext = (
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n"
    )
    admin_cert, admin_key = _signed_cert(
        d, "admin", "/O=system:masters/CN=gpuhc-test-admin", client_ext, ca_cert, ca_key
    )
    kcm_cert, kcm_key = _signed_cert(
        d, "kube-controller-manager", "/CN=system:kube-controller-manager", client_ext, ca_cert, ca_key
    )
    sa_key, sa_pub = d / "sa.key", d / "sa.pub"
    _key(sa_key)
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub), cwd=d)
    return Pki(
        dir=d,
        ca_cert=ca_cert,
        ca_key=ca_key,
        serving_cert=serving_cert,
        serving_key=serving_key,
        admin_cert=admin_cert,
        admin_key=admin_key,
        controller_manager_cert=kcm_cert,
        controller_manager_key=kcm_key,
        sa_key=sa_key,
        sa_pub=sa_pub,
    )

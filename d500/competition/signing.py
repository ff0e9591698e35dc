"""ed25519 keys and signatures for submission packages, through the `cryptography` library.

    generate(keyfile) -> public key hex   # KEYFILE: PEM PKCS#8 private key, mode 0600 (not
                                          # encrypted: keep it like an SSH key); KEYFILE.pub: PEM
    sign(data, keyfile) -> {"algorithm": "ed25519", "public_key": hex32, "signature": hex64}
    verify(data, public_key_hex, signature_hex) -> None when valid, else why not
    public_key(path) -> hex32             # of a .pub (PEM or 64 hex digits) or a private key

A package's signature covers the exact bytes of its manifest.json, which holds the sha256 of every
other member, so it covers the whole package. ed25519 signatures are deterministic: the same key
and manifest give the same signature (and so the same package bytes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from d500.errors import ConfigError, UsageError

ALGORITHM = "ed25519"


def generate(keyfile: str | Path) -> str:
    """Write a new private key to KEYFILE (refusing to overwrite one) and its public key to
    KEYFILE.pub; returns the public key as hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from d500.paths import output_file
    keyfile = output_file(keyfile, "me.key", "the private key's file name", option="KEYFILE")
    pub = pub_path(keyfile)
    for path in (keyfile, pub):
        if path.exists():
            raise UsageError(f"{path}: already exists; not overwriting a key")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        keyfile.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        pub.write_bytes(public)
    except OSError as err:
        from d500.paths import unwritable
        raise UsageError(f"{keyfile}: cannot write the key ({unwritable(keyfile, err)})") from None
    return _raw_hex(key.public_key())


def pub_path(keyfile: str | Path) -> Path:
    keyfile = Path(keyfile)
    return keyfile.with_name(keyfile.name + ".pub")


def sign(data: bytes, keyfile: str | Path) -> dict[str, str]:
    """The signature record of `data` with the private key in KEYFILE."""
    key = _private(keyfile)
    return {"algorithm": ALGORITHM, "public_key": _raw_hex(key.public_key()),
            "signature": key.sign(data).hex()}


def verify(data: bytes, public_key: Any, signature: Any) -> str | None:
    """None when `signature` (hex) is a valid ed25519 signature of `data` by `public_key`
    (hex), else one line saying why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
    except (TypeError, ValueError):
        return "the public key is not 32 bytes of hex"
    try:
        sig = bytes.fromhex(signature)
    except (TypeError, ValueError):
        return "the signature is not hex"
    try:
        key.verify(sig, data)
    except InvalidSignature:
        return "the signature does not match the manifest (changed after signing, or "\
               "another key)"
    return None


def public_key(path: str | Path) -> str:
    """The hex public key in a file: a PEM public key, 64 hex digits, or a PEM private key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    path = Path(path)
    data = _read(path)
    text = data.strip()
    if len(text) == 64:
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(text.decode("ascii")))
            return text.decode("ascii").lower()
        except (UnicodeDecodeError, ValueError):
            pass
    try:
        found: Any = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            found = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError):
            raise ConfigError(f"{path}: not an ed25519 public key (PEM or 64 hex digits) "
                              "nor a private key") from None
    if not isinstance(found, Ed25519PublicKey):
        if isinstance(found, Ed25519PrivateKey):
            found = found.public_key()
        else:
            raise ConfigError(f"{path}: a {type(found).__name__}, not an ed25519 key")
    return _raw_hex(found)


def _private(keyfile: str | Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keyfile = Path(keyfile)
    try:
        key = serialization.load_pem_private_key(_read(keyfile), password=None)
    except TypeError:
        raise ConfigError(f"{keyfile}: an encrypted private key; d500 signs with an "
                          "unencrypted one (d500 keygen)") from None
    except ValueError:
        raise ConfigError(f"{keyfile}: not a PEM private key (make one with d500 keygen "
                          "KEYFILE)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{keyfile}: a {type(key).__name__}, not an ed25519 private key")
    return key


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        from d500.paths import looked_in
        raise UsageError(f"{path}: no such key file{looked_in(path)}") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read it ({err.strerror})") from None


def _raw_hex(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()

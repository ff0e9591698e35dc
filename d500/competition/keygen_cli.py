"""`d500 keygen KEYFILE`: a new ed25519 key to sign packages with: the private key in KEYFILE
(PEM, mode 0600, unencrypted: keep it like an SSH key) and the public key in KEYFILE.pub, which
the organiser trusts (`d500 check --trust KEYFILE.pub`)."""

from __future__ import annotations

from d500.cli import ArgumentParser
from d500.paths import non_empty


def main(argv: list[str], prog: str = "d500 keygen") -> int:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("keyfile", metavar="KEYFILE", type=non_empty("a file name (me.key)"),
                   help="where to write the private key")
    args = p.parse_args(argv)
    from d500.competition import signing

    public = signing.generate(args.keyfile)
    print(f"private key: {args.keyfile} (mode 0600; keep it secret)")
    print(f"public key:  {signing.pub_path(args.keyfile)} (give it to the organiser)")
    print(f"ed25519 {public}")
    return 0

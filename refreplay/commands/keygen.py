HELP = (
    "make an auditor's key pair: NAME.key (private, mode 0600) and NAME.pub.pem (public, to register "
    "before the beacon is published)"
)


def add_arguments(p):
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="writes PATH.key and PATH.pub.pem (PATH: a directory and a name, e.g. keys/alice)",
    )
    p.add_argument("--bits", type=int, default=None, metavar="N", help="RSA modulus size (default 3072; 2048-8192)")


def run(args) -> int:
    from pathlib import Path

    from .. import files
    from ..errors import InputError
    from ..verify import keys

    base = Path(args.out)
    private, public = base.with_name(base.name + ".key"), base.with_name(base.name + ".pub.pem")
    if not base.name or base.name in (".", ".."):
        raise InputError(f"--out must end in a name, got {args.out!r}")
    if not base.parent.is_dir():
        raise InputError(f"--out: the directory {base.parent} does not exist")
    for p in (private, public):
        if p.exists() or p.is_symlink():
            raise InputError(f"{p} exists; refusing to replace a key (choose another --out)")
    key = keys.generate(keys.DEFAULT_BITS if args.bits is None else args.bits)
    files.write_atomic(private, key.pem(), mode=0o600)  # [step.audit.key.c1]
    files.write_atomic(public, key.public.pem())
    print(f"private key {private} (keep it; mode 0600)")
    print(f"public key  {public}")
    print(f"fingerprint {key.public.fingerprint}")
    print(f"public key (hex DER) {key.public.der.hex()}")
    print("register the public key (or its fingerprint) with the run's audit before its beacon is published")
    return 0

HELP = (
    "check that this process can produce conformant bits (no FTZ/DAZ, no SVML, supported versions, cache) "
    "and print the platform fingerprint and the devices --device can use"
)


def add_arguments(p):
    p.add_argument("--json", action="store_true", help="print {fit, checks, fingerprint} as JSON instead of text")


def run(args) -> int:
    import json

    from .. import doctor
    from ..training import backend

    findings = doctor.run_checks()
    fp = doctor.fingerprint()
    devices = backend.availability()
    fit = all(f.ok for f in findings)
    if args.json:
        print(
            json.dumps(
                {
                    "fit": fit,
                    "checks": [{"check": f.check, "ok": f.ok, "detail": f.detail} for f in findings],
                    "fingerprint": fp,
                    "devices": devices,
                },
                indent=2,
            )
        )
    else:
        print("platform")
        for key, value in fp.items():
            shown = " ".join(value) if isinstance(value, list) else value
            print(f"  {key:<15} {shown}")
        print("devices (--device)")
        for name, state in devices.items():
            print(f"  {name:<15} {state}")
        print("checks")
        for f in findings:
            print(f"  [{'ok' if f.ok else 'FAIL'}] {f.check}: {f.detail}")
        print(
            "fit: this process produces conformant bits"
            if fit
            else "NOT FIT: failed " + "; ".join(f.check for f in findings if not f.ok)
        )
    return 0 if fit else 1

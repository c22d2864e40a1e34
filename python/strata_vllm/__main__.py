"""Command line: ``python -m strata_vllm doctor --socket PATH``."""

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata_vllm")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser(
        "doctor",
        help="check that vLLM can use the node service",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d.add_argument("--socket", default="/run/strata/strata.sock", help="strata serve's socket")
    d.add_argument("--timeout", type=float, default=5.0, help="seconds per check")
    args = p.parse_args(argv)
    from .doctor import doctor

    return doctor(args.socket, args.timeout)


if __name__ == "__main__":
    sys.exit(main())

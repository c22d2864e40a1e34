"""Command line: ``python -m strata_vllm doctor --socket PATH``."""

import sys

from strata_client.doctor import main as _main


def main(argv=None) -> int:
    from .doctor import doctor

    return _main("python -m strata_vllm", "vLLM", doctor, argv)


if __name__ == "__main__":
    sys.exit(main())

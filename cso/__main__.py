"""Command line: ``python -m cso bench|calibrate|explain [options]``."""

import sys

USAGE = """usage: python -m cso bench [--model resnet50|vgg16] [--batch N] [--threads T] ...
       python -m cso calibrate [--quick] [--output PATH] [--no-save]
       python -m cso explain --input N,C,H,W --weight K,C,R,S [--stride S] [--padding P]
                             [--l1 32K --l2 1M --l3 4M --line 64] ...
Run any with --help for all options."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv[0] == "calibrate":
        from .calibrate.cli import main as calibrate_main

        return calibrate_main(argv[1:])
    if argv[0] == "explain":
        from .explain_cli import main as explain_main

        return explain_main(argv[1:])
    print(f"unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m cso bench [options]``."""

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m cso bench [--model resnet50|vgg16] [--batch N] [--threads T] "
            "[--rounds R] [--csv FILE] [--peak GFLOPS]"
        )
        return 0 if argv else 2
    if argv[0] == "bench":
        from .bench import main as bench_main

        return bench_main(argv[1:])
    print(f"unknown command {argv[0]!r}; try: python -m cso bench", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

import sys

try:
    from ._cli import main
except KeyboardInterrupt:  # a Ctrl-C while the command line loads: the same end as any other
    print("fsjobstore: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())

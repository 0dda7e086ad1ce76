"""`python -m corral`: the command line where the console script is not on PATH."""

from corral.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

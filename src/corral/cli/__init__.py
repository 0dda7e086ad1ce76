"""The `corral` command line: locks for shell scripts, cron jobs and operators.

Each subcommand lives in its own module and registers itself with `main.py`,
so a new command is one module and one line there.
"""

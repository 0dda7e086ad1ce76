"""The experiments behind `corral lab`: plain functions that measure, then tables and plots.

Each experiment is importable and testable without the command line; the
command (`corral.cli.lab`) only parses options, shows progress and prints.
"""

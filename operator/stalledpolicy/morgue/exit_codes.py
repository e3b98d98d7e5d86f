"""The exit codes of ``stalledpolicy morgue``; ``arguments.EXIT_CODES_EPILOG``
documents them in ``--help``, so a change here is a change there too."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_ABORTED = 4
# a replay or purge call was sent and no answer came: it may have run (never resent)
EXIT_OUTCOME_UNKNOWN = 5
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2
EXIT_TERMINATED = 143  # SIGTERM: 128 + 15

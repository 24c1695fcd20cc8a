"""The exit codes of ``neuroflow`` commands, shared by the entry point and the commands that fail on their own."""

#: A command ran and failed (a wrong gradient, a backend that cannot run).
EXIT_FAILURE = 1
#: Bad arguments or a bad config, as argparse exits for its own errors.
EXIT_USAGE = 2
#: Stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130

"""What every test directory shares: the test process takes Ctrl-C as a terminal gives it."""

from __future__ import annotations

import signal

# A test run started in the background of a non-interactive shell (``make test &``) begins with SIGINT ignored, and
# every process a test starts inherits that: a training run the tests send Ctrl-C would never see it. With a handler
# here instead, the processes the tests start begin with SIGINT at its default, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

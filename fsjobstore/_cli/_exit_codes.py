"""The command line's exit codes (also listed in ``fsjobstore --help``): a module of constants alone,
so the entry point reads :data:`INTERRUPTED` without loading the argument parsers."""

OK = 0
FAILED = 1  # the operation failed: a storage error, a corrupt file, verify found the mount unsafe
USAGE = 2  # bad arguments or input: nothing was changed
NOT_FOUND = 3  # no such job, or no store at that directory
REFUSED = 4  # the store refused: the id is taken, the job is in the wrong state, the lease was lost
TIMED_OUT = 5  # wait gave up before the job ended
INTERRUPTED = 130  # Ctrl-C

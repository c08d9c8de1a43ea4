"""Process exit codes of `python -m trainer_backend train` (documented in the README)."""
OK = 0              # training finished, outputs written
ERROR = 1           # unexpected failure (an `error` event names it)
BAD_CONFIG = 2      # bad config or input: one line on stderr naming the key or file
STOPPED_SAVED = 75  # stopped by a signal or the GUI; a checkpoint was saved (resume with resume="auto")

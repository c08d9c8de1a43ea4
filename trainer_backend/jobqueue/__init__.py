"""The job queue: every long-running job (training; caption jobs and LoRA tools as commands) waits
in one SQLite file and runs on a free GPU set, in its own process group, surviving a studio restart.
No torch here: the studio's process imports this package (docs/queue.md)."""
from .service import ConfigProblems, JobQueue, QueueSettings
from .store import FINISHED, LIVE, STATUSES, Job, QueueFileError, QueueStore

__all__ = ["ConfigProblems", "FINISHED", "Job", "JobQueue", "LIVE", "QueueFileError", "QueueSettings", "QueueStore",
           "STATUSES"]

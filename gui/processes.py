"""The trainer as an OS process: spawn, record, signal. The code lives in
trainer_backend/jobqueue/processes.py, shared with the queue's worker; the GUI's modules import it
from here."""
from trainer_backend.jobqueue.processes import (CONSOLE_LOG, CONTROL, EXIT_FILE, LAUNCHER_WORDS,  # noqa: F401
                                                PROCESS_FILE, SAMPLE_MARK, SAVE_MARK, STOP_MARK, STOP_TIME,
                                                clear_control, hard_kill, is_alive, on_other_host,
                                                read_exit, read_process_record, request_stop, select_trainer_pids,
                                                spawn, stop_requested_at, touch_control, trainer_pids, write_exit,
                                                write_process_record)

"""bench/gpu.py's parts: bundle (prepare), cases (the plan), commands, models, observe, runner, report."""

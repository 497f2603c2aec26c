"""`mapstream run` over many inputs: one folder an input, on Ray (many GPUs, many machines)
or one after another in this process. See docs/FLEET.md.

    summary = run_many(["data/*/rgb"], RunOptions(input=None, out=Path("runs/job"), model="tiny"), workers=2, ray=True)
"""
from .inputs import JOB_RECORD, JobInput, expand_inputs
from .job import JobSummary, run_many
from .options import JobOptions
from .worker import InputResult

__all__ = ["JOB_RECORD", "InputResult", "JobInput", "JobOptions", "JobSummary", "expand_inputs", "run_many"]

"""The run pipeline behind `mapstream run`: sources -> session -> frame store -> exporters."""
from .frame_store import FrameStore
from .run import RunOptions, RunSummary, check_input, check_options, run
from .run_folder import RunFolder
from .stream_plan import StreamPlan, plan_stream

__all__ = ["FrameStore", "RunFolder", "RunOptions", "RunSummary", "StreamPlan", "check_input", "check_options", "plan_stream",
           "run"]

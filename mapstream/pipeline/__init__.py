"""The run pipeline behind `mapstream run`: sources -> session -> frame store -> exporters."""
from .frame_store import FrameStore
from .run import RunOptions, RunSummary, check_input, check_options, run
from .run_folder import RunFolder

__all__ = ["FrameStore", "RunFolder", "RunOptions", "RunSummary", "check_input", "check_options", "run"]

"""`mapstream run` over many inputs: its flags, and the job's table (docs/FLEET.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..fleet import JobSummary

__all__ = ["FleetFlags", "format_job"]


@dataclass
class FleetFlags:
    """Many inputs: one output folder each under --out, on Ray or one after another (docs/FLEET.md)."""

    many: bool = False
    """Treat each INPUT as many: a glob's matches, a .txt file's lines are inputs of their own (on by itself for several inputs, a .txt list, --ray, --ray-address)."""
    ray: bool = False
    """Run the inputs on Ray actors (pip install 'mapstream[ray]'): a local Ray instance unless --ray-address is given."""
    ray_address: Optional[str] = None
    """Join this running Ray cluster (HOST:PORT, or auto) instead of starting a local instance."""
    ray_workers: Optional[int] = None
    """Ray actors, each holding a model (default: one per GPU of the cluster; one where it has none)."""
    ray_cpus_per_worker: int = 1
    """CPU cores each Ray actor takes (its torch threads)."""
    retries: int = 2
    """Further attempts at an input that failed, before it is reported and the job goes on."""

    def wanted(self, inputs: tuple[str, ...]) -> bool:
        """Whether the command runs a job over many inputs rather than one run."""
        from ..fleet.inputs import is_list_file

        return self.many or self.ray or self.ray_address is not None or len(inputs) > 1 or any(
            is_list_file(spec) for spec in inputs)

    def job_options(self):
        from ..fleet import JobOptions

        return JobOptions(ray=self.ray, ray_address=self.ray_address, workers=self.ray_workers,
                          cpus_per_worker=self.ray_cpus_per_worker, retries=self.retries)


def format_job(summary: JobSummary) -> str:
    """The job as a table: one row an input, then the totals."""
    rows = [("input", "status", "frames", "attempts", "seconds", "error")]
    for r in summary.results:
        error = (r.error or "").splitlines()[0][:80] if r.error else ""
        rows.append((r.name, r.status, str(r.frames), str(r.attempts), f"{r.seconds:.1f}", error))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
    totals = summary.to_dict()
    where = "nothing left to run" if summary.backend == "none" else (
        f"{summary.workers} {summary.backend} worker{'' if summary.workers == 1 else 's'}")
    frames = (f"{totals['frames']} frames ({totals['new_frames']} new) in {totals['seconds']:.1f} s "
              f"({totals['fps']:.2f} FPS)" if totals["new_frames"] else f"{totals['frames']} frames, none new")
    lines.append(
        f"{totals['inputs']} inputs: {totals['done']} run, {totals['finished_before']} finished before, "
        f"{totals['failed']} failed; {frames}; {where}"
    )
    return "\n".join(line.rstrip() for line in lines)

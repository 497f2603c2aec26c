"""A server's GPU memory with all its sessions streaming, against the estimate it plans with.

    python3 benchmarks/serve_memory.py --gpu-memory 40GB --sessions 8 --batch 8 --frames 100
    python3 benchmarks/serve_memory.py --device cpu --preset tiny --size 56x42 --sessions 2 --frames 6  (mechanism)

Builds the official architecture with rule weights (or `--preset`), fits the sessions'
settings to `--gpu-memory` and prepares the model as `mapstream serve --gpu-memory` does
(`serve.memory.prepare_served_model`; without a budget the server's default settings) and
serves it on 127.0.0.1 in this process. `--sessions` clients, each on a thread of its own, open a session
and send `--frames` random frames of `--size` (raw pixels, keeping to the server's queue).
The server steps up to `--batch` sessions' frames together. Reported: PyTorch's peak allocated
and reserved GPU memory over the run (the weights included) beside the plan's estimate,
stream-frames/s over the answers from `--steady-from` on, and every session that ended in an
error (one that ran out of memory is one).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time

import numpy as np
import torch

import mapstream
from mapstream.bench import BenchConfig, write_result
from mapstream.checkpoint import model_image_size
from mapstream.client import Client, Event, Result
from mapstream.config import StreamConfig
from mapstream.gpu_memory import allocator_limit, estimate_memory, format_bytes
from mapstream.serve import BackgroundServer, ServeConfig, Server
from mapstream.serve.memory import prepare_served_model

PROTOCOL = BenchConfig()


def _client(url: str, frames: np.ndarray, scale: int, arrivals: list, errors: list, name: str) -> None:
    """Stream `frames` [F, H, W, 3] uint8 through one session whose scale phase takes `scale`
    frames; record (index, arrival time) of every final answer as it arrives, and the
    session's error if it ends in one."""

    def keep(answers) -> None:
        now = time.perf_counter()
        for answer in answers:
            if isinstance(answer, Result) and not answer.provisional:
                arrivals.append((answer.index, now))
            elif isinstance(answer, Event) and answer.type == "error":
                errors.append(f"{name}: {answer.data}")

    try:
        session = Client(url).open_session()
        try:
            for frame in frames:
                session.send(frame, encoding="raw")
                keep(session.poll())
            # Each answer timed as it comes (a scale phase longer than the frames ends at close).
            while len(frames) >= scale and session.unanswered and session.ended is None:
                keep([session.receive(600.0)])
        except BaseException:
            session.abort()
            raise
        keep(session.close(timeout=600.0))
    except Exception as err:  # noqa: BLE001 - reported with the figures
        errors.append(f"{name}: {type(err).__name__}: {err}")


def _rate(arrivals: list, steady_from: int) -> float | None:
    """Answers per second from the first answer of frame `steady_from` on, over all sessions."""
    times = sorted(t for index, t in arrivals if index >= steady_from)
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu-memory", default=None, help="the budget the sessions are fitted to (e.g. 40GB)")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="the server's --max-batch")
    ap.add_argument("--frames", type=int, default=100, help="frames each session sends")
    ap.add_argument("--steady-from", type=int, default=None,
                    help="first frame index counted in the rate (default: the scale phase and 4 frames after)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PROTOCOL.preset)
    ap.add_argument("--size", default=f"{PROTOCOL.width}x{PROTOCOL.height}", help="WxH of the frames sent")
    ap.add_argument("--scale-frames", type=int, default=StreamConfig().num_scale_frames)
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = ap.parse_args(argv)
    if min(args.sessions, args.batch, args.frames) < 1:
        ap.error("--sessions, --batch and --frames must be at least 1")
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    precision = "bf16" if device.type == "cuda" else "fp32"
    steady_from = args.scale_frames + 4 if args.steady_from is None else args.steady_from

    model = mapstream.fill_synthetic_(mapstream.build_model(args.preset)).to(device).eval()
    config = ServeConfig(host="127.0.0.1", port=0, no_auth=True, max_sessions=args.sessions, max_batch=args.batch,
                         max_fps=10_000.0, idle_timeout=600.0, shutdown_timeout=60.0)
    stream, plan = prepare_served_model(model, StreamConfig(num_scale_frames=args.scale_frames, precision=precision),
                                        config, device, gpu_memory=args.gpu_memory, mode="streaming")
    side = model_image_size(model)
    estimate = plan.estimate if plan is not None else estimate_memory(
        model, (side, side), stream, precision=precision, streams=args.sessions, batch=args.batch)
    result: dict = {"sessions": args.sessions, "batch": args.batch, "frames": args.frames, "size": [width, height],
                    "preset": args.preset, "device": str(device), "steady_from": steady_from,
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                    "plan": plan.describe() if plan is not None else None,
                    "estimate_bytes": estimate.total, "estimate": estimate.describe()}

    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (args.frames, height, width, 3), dtype=np.uint8) for _ in range(args.sessions)]
    arrivals: list = []
    errors: list = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    held = allocator_limit(plan.budget, device) if plan is not None else contextlib.nullcontext()
    start = time.perf_counter()
    with held, BackgroundServer(Server(model, config, stream, mode="streaming", environ={})) as running:
        clients = [threading.Thread(target=_client, args=(running.url, clip, stream.num_scale_frames, arrivals, errors,
                                                            f"session {i}"))
                   for i, clip in enumerate(clips)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    result["seconds"] = time.perf_counter() - start
    result["answers"] = len(arrivals)
    result["errors"] = errors
    result["stream_frames_per_s"] = _rate(arrivals, steady_from)
    if device.type == "cuda":
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        result.update(peak_allocated_bytes=peak, peak_reserved_bytes=reserved,
                      peak_over_estimate=peak / estimate.total,
                      summary=f"peak {format_bytes(peak)} allocated, {format_bytes(reserved)} reserved; "
                              f"estimated {estimate.describe()}")
    print(json.dumps(result), flush=True)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()

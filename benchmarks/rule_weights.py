"""The official architecture's weights filled by the golden data's rule, as a safetensors file.

    python3 benchmarks/rule_weights.py /tmp/mapstream_official/model.safetensors

Throughput does not depend on the weights' values, and the official checkpoint cannot be
fetched on the GPU machine: the device scripts run `mapstream run --model FILE` on this file.
Writes it (atomically) unless it exists, and prints its path.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> Path:
    if len(argv) != 1:
        raise SystemExit("usage: rule_weights.py FILE.safetensors")
    path = Path(argv[0])
    if not path.is_file():
        import mapstream
        from mapstream.train.checkpointing import export_weights

        path.parent.mkdir(parents=True, exist_ok=True)
        model = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map"))
        export_weights(model.state_dict(), path, {"format": "pt", "weights": "golden fill rule"})
    return path


if __name__ == "__main__":
    print(main(sys.argv[1:]))

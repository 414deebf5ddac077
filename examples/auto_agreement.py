"""Does measured "auto" agree with itself across fresh processes, idle and loaded?

    python examples/auto_agreement.py [--runs=5] [--busy]

Runs `--runs` fresh Python processes one after another; each measures "auto"
from an empty cache directory (what `enable("auto")` does on a CPU-only host)
and prints one JSON line: the policy, the median per-round ratio and its
interquartile spread for mixed_bfloat16, whether the measurement would be
cached, the 1-minute load average before it, and the wall time. With `--busy`
one more process spins on a core for the whole run (started and stopped here)
to show the decision under load. The summary line says whether every run chose
the same policy.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = """
import json, os, time
from tf_mixed.policy import autotune
from tf_mixed.policy import hardware
info = hardware.detect()
load = os.getloadavg()[0]
start = time.perf_counter()
choice = autotune.measured_choice(info, directory=os.environ["TF_MIXED_CACHE_DIR"])
d = choice.decision
print(json.dumps({
    "policy": choice.policy,
    "bf16_median": round(d.speedups.get("mixed_bfloat16", 0.0), 3),
    "bf16_iqr": [round(v, 3) for v in d.spreads.get("mixed_bfloat16", (0, 0))],
    "rounds": d.rounds.get("mixed_bfloat16", 0),
    "cached": bool(choice.cache_path),
    "unsettled": d.unsettled,
    "load_before": round(load, 2),
    "seconds": round(time.perf_counter() - start, 2),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", action="store_true", help="keep one core busy meanwhile")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spinner = None
    if args.busy:
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    policies = []
    try:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "3",
                       "TF_MIXED_CACHE_DIR": cache}
                env.pop("TF_MIXED_AUTO_MEASURE", None)
                out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True,
                                     capture_output=True, text=True).stdout
            line = out.strip().splitlines()[-1]
            print(line, flush=True)
            policies.append(json.loads(line)["policy"])
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    agreed = len(set(policies)) == 1
    print(f"{'busy core' if args.busy else 'no extra load'}: {len(policies)} runs, "
          f"policies {policies}: {'all agree' if agreed else 'DISAGREE'}")


if __name__ == "__main__":
    main()

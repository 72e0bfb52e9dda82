"""Malformed traces: `diagnose` on real traces damaged at random, where anything but a result or a one-line
TrainperfError is a bug (a traceback a user would see).

Each case takes one real trace folder (HTA's test traces, the H200 fault traces), damages 1-3 rounds of each rank's
events (or all but one rank's) with one mutation a round, writes the ranks to a temporary folder and diagnoses it.
The mutations are what broken exporters, copies and hand edits leave: events dropped, shuffled or duplicated, args
removed, durations zero, negative, NaN or missing, timestamps as strings, shifted, far in the future or fractional,
correlation ids removed, a stream id as text, names null or odd (accents, CJK, NUL, 50 times long), spans turned
into instants or other phases, flow arrows with no other end, a whole category dropped, the file's metadata
(distributedInfo, deviceProperties) removed. Deterministic for a seed; a case that fails keeps its folder and prints
its traceback.

    python benchmarks/fuzz_diagnose.py [--cases 300] [--seed 0] [--hta DIR] [--h200 DIR]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import random
import shutil
import tempfile
import traceback
import warnings
from collections import Counter
from pathlib import Path

from rich.progress import Progress

from trainperf.diagnose.api import diagnose
from trainperf.errors import TrainperfError

ROOT = Path(__file__).resolve().parents[1]
HTA_FOLDERS = ("amd_trace", "df_index_resolver", "nccl_parser_config", "negative_queue_length_values_check",
               "ns_resolution_trace", "trace_filter", "triton_example", "with_gpu_user_annotation",
               "mtia_trace_single_rank", "critical_path/cuda_event_sync")
MUTATIONS = ("drop", "shuffle", "dup", "noargs", "zero_dur", "neg_dur", "str_ts", "drop_category", "shift",
             "drop_corr", "far_ts", "float_ts", "no_dur", "drop_meta", "nan_dur", "stream_text", "name_null",
             "instant", "stray_flow", "odd_name", "odd_phase")


def _events(path: Path) -> dict | list:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _one_event(op: str, e: dict, rng: random.Random) -> None:
    """Damage one event in place by mutation op (the per-event mutations)."""
    args = e.get("args") if isinstance(e.get("args"), dict) else None
    ts = e.get("ts")
    number = isinstance(ts, (int, float))
    if op == "noargs":
        e.pop("args", None)
    elif op in ("zero_dur", "neg_dur", "nan_dur") and "dur" in e:
        e["dur"] = {"zero_dur": 0, "neg_dur": -abs(e["dur"] or 1) - 1, "nan_dur": float("nan")}[op]
    elif op == "no_dur":
        e.pop("dur", None)
    elif op == "str_ts" and number:
        e["ts"] = str(ts)
    elif op == "shift" and number:
        e["ts"] = ts + rng.uniform(-5000, 5000)
    elif op == "far_ts" and number:
        e["ts"] = ts + 1e12
    elif op == "float_ts" and number:
        e["ts"] = float(ts) + 0.123
    elif op == "drop_corr" and args is not None:
        args.pop("correlation", None)
        args.pop("External id", None)
    elif op == "stream_text" and args is not None and "stream" in args:
        args["stream"] = "x"
    elif op == "name_null":
        e["name"] = None
    elif op == "instant":  # a span written as an instant event (no duration)
        e["ph"] = "i"
        e.pop("dur", None)
    elif op == "odd_name":
        e["name"] = f"{e.get('name')}\u00e9\u4e2d\x00 " * rng.choice([1, 50])
    elif op == "odd_phase":
        e["ph"] = rng.choice(["B", "E", "C", "M", "?", None])


def mutate(doc: dict | list, rng: random.Random) -> str:
    """Damage one trace document in place with one mutation (MUTATIONS); return what was done."""
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    op = rng.choice(MUTATIONS)
    picked = rng.sample(range(len(evs)), k=max(1, len(evs) // rng.choice([2, 5, 20, 100]))) if evs else []
    if op == "drop":
        gone = set(picked)
        evs[:] = [e for i, e in enumerate(evs) if i not in gone]
    elif op == "shuffle":
        rng.shuffle(evs)
    elif op == "dup":
        evs.extend(copy.deepcopy(evs[i]) for i in picked)
    elif op == "drop_category":
        cat = rng.choice(sorted({str(e.get("cat")) for e in evs if isinstance(e, dict)}) or ["none"])
        evs[:] = [e for e in evs if str(e.get("cat")) != cat]
        op += f":{cat}"
    elif op == "stray_flow":  # flow arrows whose other end is missing or points at no event
        for i in picked[:50]:
            e = evs[i]
            if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)):
                evs.append({"ph": rng.choice(["s", "f", "t"]), "id": rng.randrange(1 << 40), "pid": e.get("pid"),
                            "tid": e.get("tid"), "ts": e["ts"] + rng.uniform(-10, 10),
                            "cat": rng.choice(["ac2g", "fwdbwd", "forward_backward"]), "name": "", "bp": "e"})
    elif op == "drop_meta":
        if isinstance(doc, dict):
            for key in ("distributedInfo", "deviceProperties"):
                doc.pop(key, None)
    else:
        for i in picked:
            if isinstance(evs[i], dict):
                _one_event(op, evs[i], rng)
    return op


def run_case(source: Path, rng: random.Random, work: Path) -> tuple[str, str, Path]:
    """(what was done, "ok" / "error: ..." / "CRASH" + traceback, the case's folder) of one damaged copy of source."""
    files = sorted(p for p in source.iterdir() if p.name.endswith((".json", ".json.gz")))
    folder = Path(tempfile.mkdtemp(dir=work))
    done = []
    for f in files:
        doc = _events(f)
        damage = len(files) == 1 or rng.random() < 0.8
        done.append("+".join(mutate(doc, rng) for _ in range(rng.choice([1, 2, 3]))) if damage else "none")
        (folder / f.name.replace(".gz", "")).write_text(json.dumps(doc))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            diagnose(folder)
        return " ".join(done), "ok", folder
    except TrainperfError as e:
        return " ".join(done), f"error: {str(e).splitlines()[0][:100]}", folder
    except Exception:  # noqa: BLE001 - what this script looks for
        return " ".join(done), "CRASH\n" + traceback.format_exc(), folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hta", default=str(ROOT / "../shared/data/traces/hta"))
    ap.add_argument("--h200", default=str(ROOT / "tests/data/h200_faults"))
    a = ap.parse_args()
    sources = [Path(a.hta) / d for d in HTA_FOLDERS if (Path(a.hta) / d).is_dir()]
    sources += sorted(Path(a.h200).glob("*/traces"))
    if not sources:
        raise SystemExit(f"fuzz_diagnose: no trace folders under {a.hta} or {a.h200}")
    work = Path(tempfile.mkdtemp(prefix="fuzz_diagnose_"))
    outcomes: Counter = Counter()
    with Progress() as bar:
        task = bar.add_task("damaged traces diagnosed", total=a.cases)
        for i in range(a.cases):
            rng = random.Random(a.seed + i)
            source = rng.choice(sources)
            done, result, folder = run_case(source, rng, work)
            outcomes[result.split(":")[0].split("\n")[0]] += 1
            if result.startswith("CRASH"):
                bar.console.print(f"case {a.seed + i} ({source}, {done}): kept in {folder}\n{result[-1500:]}")
            else:
                if result.startswith("error"):  # a one-line refusal: what it said, to judge whether it is clear
                    bar.console.print(f"case {a.seed + i} ({source.name}, {done}): {result}", highlight=False)
                shutil.rmtree(folder)
            bar.advance(task)
    print(f"{a.cases} cases from {len(sources)} real trace folders: " +
          ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    if not outcomes["CRASH"]:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()

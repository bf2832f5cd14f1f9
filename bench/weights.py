"""Cold starts of a model with 1 GiB of weights: mapped safetensors artifacts against torch.load.

Starts `dilu up` (embedded default) and deploys the same handler (bench/functions/big_weights:
16 float32 matrices of 4096x4096, a forward pass that reads each once, run as the warm-up) five
ways, one instance each, one after another:

- ``torch.load``: the weights unpickled from a .pt file on this host (no fetch: the file is here);
- ``torch.load`` again, by a second function: the file is now in the page cache;
- ``torch.load(mmap=True)``: what a user could write instead;
- ``artifact``: `weights:` in the spec, uploaded by dilu deploy; the first instance on the host
  puts it from the store into the host's cache (``fetch``: a hard link, the store being on this
  file system) and maps it;
- ``artifact`` again, by a second function naming the same file: the host's cache has it, the
  pages are in memory;
- ``artifact, copied``: a second platform whose store is on another file system (/dev/shm, as a
  shared volume would be): the fetch copies the file and checks its digest.

Both files are in the page cache when their first instance starts (they were just written), so
torch.load is not charged a disk read the artifact is spared. Prints each start's stages as the
platform measured them (`dilu describe`), the weights' part (map + copy + load + warm-up) and the
whole cold start, and the ratios.

    python bench/weights.py [--gib 1]

Targets (issue 32): the first mapped load at least 3x faster than torch.load's; the second
instance's at least 10x faster than the first's.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import Platform  # reuses the test harness that runs `dilu up`

WEIGHT_STAGES = ("map", "copy", "load", "warmup")
SPEC = """name: {name}
handler: handler:BigWeights
{weights}model: {{source: {source}, path: "{path}"}}
warmup: {{request: {{}}, count: 1}}
resources: {{memory: 3Gi, gpu: false, sm_request: 1.0, sm_limit: 1.0}}
scaling: {{min_instances: 1, max_instances: 1, keep_alive_s: 600}}
batching: {{max_batch_size: 1}}
"""


def write_weights(folder: Path, gib: float) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    count = max(1, round(gib * 2**30 / (4096 * 4096 * 4)))
    generator = torch.Generator().manual_seed(0)
    tensors = {f"layer{i:02d}": torch.randn(4096, 4096, generator=generator) for i in range(count)}
    mapped, pickled = folder / "code" / "big.safetensors", folder / "big.pt"
    save_file(tensors, str(mapped))
    torch.save(tensors, pickled)
    return mapped, pickled


def deploy(platform: Platform, code: Path, name: str, source: str, path: str = "") -> dict:
    spec = code / f"{name}.yaml"
    weights = "weights: big.safetensors\n" if source == "artifact" else ""
    spec.write_text(SPEC.format(name=name, weights=weights, source=source, path=path))
    deployed = platform.cli("deploy", str(spec), timeout=900)
    assert deployed.returncode == 0, deployed.stderr
    loading = platform.function(name)["loading"]
    answer = platform.invoke(name, {})
    assert answer.status_code == 200, answer.text
    return {stage: entry["mean_s"] for stage, entry in loading.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the weights")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dilu-bench-"))
    workdir.chmod(0o755)   # instances run as their function's user and read big.pt from here
    code = shutil.copytree(ROOT / "bench" / "functions" / "big_weights", workdir / "code")
    mapped, pickled = write_weights(workdir, args.gib)
    (code / ".dilignore").write_text("big.safetensors\n")   # the torch.load functions do not ship it
    pickled.chmod(0o644)
    size = mapped.stat().st_size
    platform = Platform(workdir / "home")
    rows: dict[str, dict[str, float]] = {}
    shared_store = Path(tempfile.mkdtemp(prefix="dilu-bench-store-", dir="/dev/shm"))
    try:
        runs = [("torch.load", "pickled-1", "torch.load", str(pickled)),
                ("torch.load, 2nd", "pickled-2", "torch.load", str(pickled)),
                ("torch.load mmap", "pickled-mmap", "torch.load-mmap", str(pickled)),
                ("artifact", "mapped-1", "artifact", ""),
                ("artifact, 2nd", "mapped-2", "artifact", "")]
        print(f"weights: {size / 2**30:.2f} GiB in {size // (4096 * 4096 * 4)} tensors; one instance per row, "
              "seconds per stage as the platform measured them")
        stages = ("fetch", "spawn", "runtime", "imports", "map", "copy", "load", "warmup", "ready")
        print(f"{'start':<17}" + "".join(f"{s:>8}" for s in stages) + f"{'weights':>9}{'total':>8}")
        for label, name, source, path in runs:
            measured = deploy(platform, code, name, source, path)
            rows[label] = measured
            weights = sum(measured.get(s, 0.0) for s in WEIGHT_STAGES)
            print(f"{label:<17}" + "".join(f"{measured[s]:>8.3f}" if s in measured else f"{'-':>8}"
                                           for s in stages) + f"{weights:>9.3f}{sum(measured.values()):>8.3f}",
                  flush=True)
            platform.http.delete(f"/v1/functions/{name}")   # frees its memory before the next row
        platform.close()
        platform = Platform(workdir / "home-shared", env={"DILU_ARTIFACT_STORE": str(shared_store)})
        label = "artifact, copied"
        rows[label] = measured = deploy(platform, code, "mapped-copied", "artifact")
        print(f"{label:<17}" + "".join(f"{measured[s]:>8.3f}" if s in measured else f"{'-':>8}" for s in stages)
              + f"{sum(measured.get(s, 0.0) for s in WEIGHT_STAGES):>9.3f}{sum(measured.values()):>8.3f}",
              flush=True)
    finally:
        platform.close()
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(shared_store, ignore_errors=True)

    def part(label: str, fetch: bool = False) -> float:
        return sum(rows[label].get(s, 0.0) for s in WEIGHT_STAGES + (("fetch",) if fetch else ()))

    first, second, pickle = part("artifact"), part("artifact, 2nd"), part("torch.load")
    copied = part("artifact, copied", True)
    print(f"first load, weights' part: torch.load {pickle:.3f} s, mapped {first:.3f} s: {pickle / first:.1f}x "
          f"(target >= 3x); with the fetch into the host's cache {part('artifact', True):.3f} s (linked): "
          f"{pickle / part('artifact', True):.1f}x, {copied:.3f} s (copied from another file system): "
          f"{pickle / copied:.1f}x")
    print(f"second instance on the host: {second:.3f} s, {first / second:.1f}x faster than the first's "
          f"({part('artifact', True) / second:.1f}x counting the first's linked fetch, {copied / second:.1f}x its "
          f"copied one; target >= 10x); torch.load's "
          f"second {part('torch.load, 2nd'):.3f} s; torch.load(mmap=True) {part('torch.load mmap'):.3f} s")
    totals = {label: sum(row.values()) for label, row in rows.items()}
    print(f"whole cold start: torch.load {totals['torch.load']:.2f} s, artifact {totals['artifact']:.2f} s "
          f"(fetch included) / {totals['artifact'] - rows['artifact'].get('fetch', 0):.2f} s (excluded), "
          f"second artifact instance {totals['artifact, 2nd']:.2f} s")


if __name__ == "__main__":
    main()

"""Build time and size of every function's Docker image (and, with --top-level, of the bundle's
image).

Each function image is built from the function's archive, exactly what Substra's docker backend and
a node build: once with no layer cache (cold: every package downloaded and installed), once again
(warm: Docker's layer cache, as on a second run). Prints per image: the cold and warm build times,
the image size, what our Dockerfile adds on top of its base image, and the largest installed
packages (what dominates the size). A function's predict image shares every layer but the last with
its train image, so only train (and score) are built cold.

    python benchmarks/docker_images.py [--functions torch,tf,mindspore,score] [--top-level]
    [--warm-only]

Needs a Docker daemon and the base image python:3.11.7-slim-bookworm (on our machines:
.ci/docker-up).
"""
import tarfile
import tempfile
import time
from pathlib import Path

from mnist_dp.assets import ALGO_ASSETS, OBJECTIVE_ASSET, REPO
from mnist_dp.orchestration import archive
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError, run_cli

TAG = "mnist-dp-benchmark"
SITE_PACKAGES = "/usr/local/lib/python3.11/site-packages"
FUNCTIONS = {**{name: (asset, "train") for name, asset in ALGO_ASSETS.items()},
             "score": (OBJECTIVE_ASSET, "score")}


def build(client, context: Path, tag: str, nocache: bool) -> float:
    start = time.perf_counter()
    client.images.build(path=str(context), tag=tag, rm=True, nocache=nocache)
    return time.perf_counter() - start


def largest_packages(client, tag: str, count: int = 3) -> str:
    """The `count` largest folders of site-packages, e.g. 'mindspore 490 MB, scipy 113 MB, ...'."""
    output = client.containers.run(tag, ["sh", "-c",
                                         f"du -sm {SITE_PACKAGES}/* | sort -rn | head -{count}"],
                                   entrypoint=[], remove=True).decode()
    return ", ".join(f"{Path(path).name} {mb} MB" for mb,
                     path in (line.split() for line in output.splitlines()))


def own_megabytes(client, tag: str, base: str) -> float:
    """Size of the layers our Dockerfile adds on top of its FROM image."""
    return (client.images.get(tag).attrs["Size"] - client.images.get(base).attrs["Size"]) / 1e6


def measure(client, name: str, context: Path, warm_only: bool) -> dict:
    tag = f"{TAG}:{name}"
    lines = (context / "Dockerfile").read_text().splitlines()
    base = next(line.split()[1] for line in lines if line.startswith("FROM"))
    cold = None if warm_only else build(client, context, tag, nocache=True)
    warm = build(client, context, tag, nocache=False)
    size = client.images.get(tag).attrs["Size"] / 1e6
    return {"image": name, "cold": cold, "warm": warm, "size": size,
            "own": own_megabytes(client, tag, base), "largest": largest_packages(client, tag)}


def function_context(name: str, dest: Path) -> Path:
    asset, function = FUNCTIONS[name]
    tar_path = archive.build(asset, function, dest / f"{name}.tar.gz")
    with tarfile.open(tar_path) as tar:
        tar.extractall(dest / name, filter="data")
    return dest / name


def print_table(rows: list) -> None:
    def seconds(value):
        return "-" if value is None else f"{value:.0f} s"

    print(f"{'image':<16} {'cold build':>10} {'warm build':>10} {'size':>9} {'ours':>9}  largest "
          "packages")
    for row in rows:
        print(f"{row['image']:<16} {seconds(row['cold']):>10} {seconds(row['warm']):>10} "
              f"{row['size']:>6.0f} MB {row['own']:>6.0f} MB  {row['largest']}")


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--functions", type=options.names(FUNCTIONS), default=",".join(FUNCTIONS),
                        help="images to build: algo frameworks and/or score (default: %(default)s)")
    parser.add_argument("--top-level", action="store_true",
                        help="also build the bundle's own Dockerfile (every framework and the "
                             "tests)")
    parser.add_argument("--warm-only", action="store_true",
                        help="skip the cold builds (no --no-cache build)")
    args = parser.parse_args(argv)
    names = args.functions

    import docker
    from tqdm import tqdm

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise UserError(f"no Docker daemon answers ({exc}); start Docker (on our machines: bash "
                        ".ci/docker-up)") from None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in tqdm(names + ["bundle"] * args.top_level, desc="building images", unit="image"):
            context = REPO if name == "bundle" else function_context(name, Path(tmp))
            rows.append(measure(client, name, context, args.warm_only))
    print()
    print_table(rows)


if __name__ == "__main__":
    run_cli(main)

"""benchmarks/public_size.py: its table, one row per framework and declared ratio, with the move
from the data's own size."""
from mnist_dp.assets import REPO, load_asset_module

public_size = load_asset_module(REPO / "benchmarks" / "public_size.py", "public_size_benchmark")


def record(ratio, seed, accuracy, framework="torch"):
    steps = {0.9: 240, 1.0: 240, 1.1: 270}[ratio]  # 30 epochs of ceil(size / 500) steps
    return {"framework": framework, "ratio": ratio, "seed": seed, "n": 4000,
            "public_size": round(4000 * ratio), "test_accuracy": accuracy, "epsilon": 2.999,
            "sigma": 2.9, "sample_rate": 30 / steps, "steps": steps, "seconds": 1.0}


def test_the_table_gives_each_declared_ratio_its_mean_and_its_move_from_the_datas_own_size():
    text = public_size.report([record(1.0, 0, 0.96), record(1.0, 1, 0.97), record(0.9, 0, 0.955),
                               record(0.9, 1, 0.961), record(1.1, 0, 0.97)])
    assert "| torch | 1 | 0.125 | 240 | 2.999 | 2 | 96.5 |" in text
    assert "| torch | 0.9 | 0.125 | 240 | 2.999 | 2 | 95.8 | -0.7 points |" in text
    assert "| torch | 1.1 | 0.1111 | 270 | 2.999 | 1 | 97.0 | +0.5 points |" in text

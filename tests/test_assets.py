"""mnist_dp/assets.py: the asset folders hold the files each asset is made of, each framework's
capabilities, and load_asset_module imports a script as a module registered under the name
given."""
import ast
import sys

from mnist_dp.assets import (
    ALGO_ASSETS,
    CAPABILITIES,
    DATASET_ASSET,
    OBJECTIVE_ASSET,
    REPO,
    Capabilities,
    capabilities,
    load_asset_module,
)
from mnist_dp.privacy import model_file


def test_each_asset_folder_holds_its_scripts_and_each_algo_is_the_framework_it_is_listed_as():
    """Each algo's four files and Framework name as its key; the opener and metrics.py."""
    assert REPO / "assets" == DATASET_ASSET.parent == OBJECTIVE_ASSET.parent
    assert (DATASET_ASSET / "opener.py").is_file() and (OBJECTIVE_ASSET / "metrics.py").is_file()
    for framework, folder in ALGO_ASSETS.items():
        assert folder.parent == REPO / "assets"
        assert all((folder / name).is_file()
                   for name in ("algo.py", "hyperparameters.json", "Dockerfile", "description.md"))
        module = ast.parse((folder / "algo.py").read_text())
        names = [node.value.value for node in ast.walk(module) if isinstance(node, ast.Assign)
                 and [ast.unparse(target) for target in node.targets] == ["name"]]
        assert names == [framework], folder


def test_capabilities_name_frameworks_and_formats_there_are_and_default_to_no_limit():
    assert set(CAPABILITIES) <= set(ALGO_ASSETS)
    assert capabilities("torch") == Capabilities() and capabilities("a fourth") == Capabilities()
    for framework, offered in CAPABILITIES.items():
        assert set(offered.repeated_noise_formats) <= set(model_file.READABLE) - {model_file.FORMAT}
        assert bool(offered.repeated_noise_formats) == bool(offered.noise_library), framework


def test_a_script_is_imported_as_a_module_under_the_name_given(tmp_path, monkeypatch):
    """Run once per load, its module in sys.modules under `name`; two names, two modules."""
    script = tmp_path / "script.py"
    script.write_text("import sys\nLOADED = sys.modules[__name__]\nVALUE = 41 + 1\n")
    for name in ("asset_under_test_a", "asset_under_test_b"):  # removed again after the test
        monkeypatch.setitem(sys.modules, name, None)
    first = load_asset_module(script, "asset_under_test_a")
    second = load_asset_module(script, "asset_under_test_b")
    assert first.VALUE == 42 and first.__name__ == "asset_under_test_a"
    assert sys.modules["asset_under_test_a"] is first is first.LOADED
    assert sys.modules["asset_under_test_b"] is second is not first
    assert first.__file__ == str(script)

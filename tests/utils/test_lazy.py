import subprocess
import sys

import pytest

from mnist_dp.utils.lazy import lazy_import


def test_a_lazy_module_runs_at_its_first_attribute_and_only_then(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe.py").write_text("import builtins\nbuiltins.lazy_probe_ran = True\n"
                                            "VALUE = 3\n")
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.delitem(sys.modules, "lazy_probe", raising=False)
    import builtins

    module = lazy_import("lazy_probe")
    assert not hasattr(builtins, "lazy_probe_ran")
    assert module.VALUE == 3
    assert builtins.lazy_probe_ran
    del builtins.lazy_probe_ran
    assert lazy_import("lazy_probe") is sys.modules["lazy_probe"]


def test_a_missing_module_is_refused_at_once():
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        lazy_import("no_such_module_here")


def test_loading_a_model_file_does_not_load_the_accountants_libraries():
    # What a predict task imports: it computes no ε, so dp_accounting (and its scipy) stay unloaded.
    code = ("import sys; import mnist_dp.privacy.model_file, mnist_dp.learning.model_io; "
            "print(sorted(m for m in ('scipy.stats', 'scipy.optimize') if m in sys.modules), "
            "type(sys.modules['dp_accounting']).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "_LazyModule"]

"""A demo's --out folder: its own earlier run is started over, another run's folder is refused with nothing
changed, unless log.overwrite=true is given."""

from __future__ import annotations

import pytest

from grpolab.commands.demo import demo_config, own_config
from grpolab.config import ConfigError
from grpolab.runtime.demo_folder import MARK, claim, owner


def test_a_new_or_empty_folder_is_claimed(tmp_path):
    claim(tmp_path / "new", "demo", overwrite=False)
    (tmp_path / "empty").mkdir()
    claim(tmp_path / "empty", "demo --agent", overwrite=False)
    assert owner(tmp_path / "new") == "demo" and owner(tmp_path / "empty") == "demo --agent"


def test_another_run_is_refused_and_left_as_it_was(tmp_path):
    run = tmp_path / "mine"
    (run / "checkpoints" / "step_5").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 1\n")
    with pytest.raises(ConfigError, match=r"--out .*mine holds files that no `grpolab demo` wrote \(checkpoints, "
                                          r"config.yaml\); nothing was changed.*log.overwrite=true"):
        own_config(demo_config(run, "tiny"), "demo")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml"]
    claim(tmp_path / "agent", "demo --agent", overwrite=False)
    (tmp_path / "agent" / "report.md").write_text("x")
    with pytest.raises(ConfigError, match=r"holds a run of `grpolab demo --agent` \(.grpolab_demo, report.md\)"):
        claim(tmp_path / "agent", "demo", overwrite=False)


def test_its_own_run_starts_over_and_overwrite_replaces_another(tmp_path):
    own = tmp_path / "demo"
    claim(own, "demo", overwrite=False)
    (own / "checkpoints").mkdir()
    cfg = own_config(demo_config(own, "tiny"), "demo")
    assert cfg.log.overwrite  # the demo's own earlier run: started over, as `make demo` again always did
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    assert own_config(demo_config(other, "tiny", ["log.overwrite=true"]), "demo").log.overwrite
    assert (other / MARK).read_text().strip() == "demo"
    assert not demo_config(tmp_path / "x", "tiny").log.overwrite  # the packaged config no longer overwrites

"""rollout/vllm/server.py's VLLM_PLUGINS: the allowlist that admits grpolab's endpoint plugin must keep every
other vLLM plugin installed (vLLM filters every group by it, the platform plugins too)."""

from __future__ import annotations

from grpolab.rollout.vllm.server import allowed_plugins, plugin_path


def test_every_installed_vllm_plugin_stays_allowed_with_grpolabs(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    fake = tmp_path / "fake_platform-1.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-platform\nVersion: 1.0\n")
    (fake / "entry_points.txt").write_text(
        "[vllm.platform_plugins]\nfake_npu = fake_platform:register\n\n[vllm.endpoint_plugins]\nsomeone_elses = x:y\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    names = allowed_plugins().split(",")
    assert "fake_npu" in names  # an out-of-tree platform keeps loading in the server
    assert "someone_elses" not in names  # another package's HTTP routes are not switched on
    assert {"grpolab_shm", "grpolab_batch"} <= set(names)


def test_a_list_the_user_set_is_kept_with_grpolabs_added(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "theirs")
    assert allowed_plugins() == "theirs,grpolab_shm,grpolab_batch"


def test_the_metadata_folder_declares_both_plugins(tmp_path):
    text = (plugin_path(tmp_path) / "grpolab_vllm_plugin-0.dist-info" / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]\ngrpolab_shm = grpolab.rollout.vllm.shm:register" in text
    assert "[vllm.endpoint_plugins]\ngrpolab_batch = grpolab.rollout.vllm.batch:BatchEndpoint" in text

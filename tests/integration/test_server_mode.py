"""rollout.mode=server: vLLM's OpenAI server beside the trainer, weights sent by version, bounded staleness.

One server for the whole module (a start costs ~25 s of CPU): the runs point rollout.server_url at it, and
each run sends its own weights as version 0 first. The last test kills it and checks that nothing of it
is left. The proof of a sync is the logged sampler/trainer mismatch, as in test_vllm_train.py: fp32 on
both sides agrees to ~1e-6 nats, weights one update old (lr 1e-2) are off by ~1e-2 or more.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'grpolab[vllm]'; make test installs it)")

from grpolab.commands.train import train  # noqa: E402
from grpolab.config import load_config  # noqa: E402
from grpolab.rollout.vllm.client import ServerSampler  # noqa: E402
from grpolab.rollout.vllm.server import RolloutServerError  # noqa: E402
from grpolab.rollout.vllm.server_client import ServerClient  # noqa: E402
from grpolab.runtime.logging import read_metrics  # noqa: E402
from grpolab.training.logprobs import completion_logprobs  # noqa: E402

MISMATCH_KEY = "sampling/sampling_logp_difference/mean"
IS_RATIO_KEY = "sampling/importance_sampling_ratio/mean"
SYNCED = 1e-4


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir):
    return vllm_model_dir  # tests/conftest.py: the folder (and so the colocated engine) of every vLLM module


def overrides(model_dir, data, out, name: str, steps: int, *extra: str) -> list[str]:
    return [
        f"model.name_or_path={model_dir}", "model.autocast=none", f"data.path={data}", "data.max_prompt_length=16",
        "reward.functions=[{name: 'toy_rewards:digit_fraction'}]", "rollout.engine=vllm",
        "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=2",
        f"train.num_steps={steps}", "optim.lr=1e-2", "vllm.dtype=float32", "vllm.kv_cache_space_gb=0.0625",
        f"log.output_dir={out}", f"log.run_name={name}", "log.progress=false", "log.checkpoint_every=1",
        "algo.rollout_correction=tis", *extra,
    ]  # fmt: skip


class Served:
    """The module's server, started by ``grpolab serve`` (the verb under test) in a child process."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc, self.url = proc, url
        (self.pid,) = server_children(proc.pid)
        """The vLLM API server: the leader of its process group (with its engine core)."""

    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("srv")
    cmd = [
        sys.executable, "-m", "grpolab", "serve", *overrides(model_dir, "unused", out, "s", 1), "rollout.mode=server",
        "model.lora.enabled=true", "model.lora.r=4",  # LoRA on: the LoRA runs need it; the base model serves the others
        "vllm.max_model_len=256",  # the model's context: the episodes' turns are longer than a prompt of 16 + 6
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the server is healthy (or the verb failed)
        assert "vLLM server ready at " in line, proc.communicate(timeout=60)[1][-3000:]
        served = Served(proc, line.split(" ready at ")[1].split()[0])
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stderr.read()[-2000:]
    assert group_alive(served.pid) == []


def server_run(model_dir, data, out, name, steps, server, *extra):
    return [*overrides(model_dir, data, out, name, steps), "rollout.mode=server", f"rollout.server_url={server.url}", *extra]


def non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_started_server_answers_loopback_and_refuses_other_addresses(server):
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((addr, port), timeout=5).close()


@pytest.mark.parametrize("batched", [True, False], ids=["batch-route", "request-per-sample"])
def test_samples_carry_the_engine_logprobs_and_the_version(server, model_dir, batched):
    """Both ways of sampling a server: grpolab's batch route, and a seeded request per sample (a server
    without the route, such as a plain ``vllm serve``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    client = ServerClient(server.url, timeout_s=60)
    sampler = ServerSampler(client, tok, max_completion_length=6, eos_token_ids=[tok.eos_token_id], weights_from=policy)
    assert sampler.batched  # the server grpolab started has the route
    assert sampler.info["weight_transfer"] == "grpolab_shm"  # and says how it takes weights
    wrong = ServerSampler(client, tok, max_completion_length=6, eos_token_ids=[tok.eos_token_id], weights_from=policy,
                          transport="nccl")  # fmt: skip
    with pytest.raises(RolloutServerError, match="takes weights over grpolab_shm, this trainer sends them over nccl"):
        wrong.update_weights(policy)  # refused before any NCCL call
    sampler.batched = batched
    prompts = [tok.encode("1+2="), tok.encode("a")]
    for version in (0, 1):
        if version:
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            sampler.update_weights(policy)
        out = sampler.sample(prompts, num_generations=4, generator=torch.Generator().manual_seed(0))
        assert out.weight_versions == [version] * 8 and client.version() == str(version)
        assert out.prompt_ids == [p for p in prompts for _ in range(4)]
        with torch.no_grad():
            lp, _ = completion_logprobs(
                policy, out.prompt_ids, out.completion_ids, out.completion_mask, pad_id=tok.pad_token_id, temperature=1.0
            )
        torch.testing.assert_close(out.logprobs[out.completion_mask], lp[out.completion_mask], atol=1e-4, rtol=0)
    assert sampler.last_sync_bytes == sum(p.numel() * 4 for p in policy.parameters()) + policy.lm_head.weight.numel() * 4 * (
        policy.config.tie_word_embeddings
    )
    if batched:  # a prompt the engine refuses (longer than max_model_len=256) fails the samples not back (one line
        # each, engine_error: the trainer drops their groups, docs/training.md), and the server samples on
        out = sampler.sample([prompts[0], [5] * 300], num_generations=4, generator=torch.Generator().manual_seed(0))
        assert all(f is not None and f.kind == "engine_error" for f in out.failures[4:])
        assert re.search(r"failed at /grpolab/generate: .*256", out.failures[4].message) and "\n" not in out.failures[4].message
        assert sampler.sample(prompts, num_generations=4).failures is None
    client.call("POST", "/update_weight_version", {"new_version": "other"})  # as a restart or another trainer would
    with pytest.raises(RolloutServerError, match="serves weight version 'other', the trainer sent 1"):
        sampler.sample(prompts, num_generations=4)
    sampler.close()
    assert server.alive()  # a sampler that did not start the server leaves it running


def test_a_trainer_of_another_model_is_refused_and_a_load_that_leaves_layers_out_stops_the_sync(server, model_dir, monkeypatch):
    """The reported case: a trainer of a 1-layer model against this 2-layer server, same vocabulary and width,
    trained three steps on its samples (the server only logged that the weights failed to load). Now the first
    sync refuses it before any weight goes; and a sync that leaves layer 1 out is stopped by the server's
    load report (its weights for layer 1 were kept, as vLLM's reload keeps a layer it is given nothing for)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import grpolab.rollout.vllm.weights as vllm_weights

    tok = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    config.num_hidden_layers = 1
    other = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()

    def sampler_of(policy):
        return ServerSampler(ServerClient(server.url, timeout_s=60), tok, max_completion_length=6,
                             eos_token_ids=[tok.eos_token_id], weights_from=policy)  # fmt: skip

    before = finished_updates(server)
    with pytest.raises(RolloutServerError, match="serves another model than this trainer's: its model has 'model.layers.1."):
        sampler_of(other).sample([tok.encode("1+")], num_generations=2)
    assert finished_updates(server) == before  # nothing was sent

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sent = vllm_weights.policy_weights
    monkeypatch.setattr(vllm_weights, "policy_weights", lambda *a, **kw: ((n, t) for n, t in sent(*a, **kw) if ".layers.1." not in n))
    with pytest.raises(RolloutServerError, match=r"loaded none of this trainer's weights into \d+ of its parameters \(model.layers.1.") as err:
        sampler_of(policy).update_weights(policy)
    assert "\n" not in str(err.value)
    monkeypatch.undo()
    whole = sampler_of(policy)  # the whole model loads, and the server samples on
    assert whole.sample([tok.encode("1+")], num_generations=2).num_sequences == 2
    whole.close()


def test_lora_sends_the_adapter_itself_per_version(server, model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    policy = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    sampler = ServerSampler(
        ServerClient(server.url, timeout_s=60), tok, max_completion_length=6, eos_token_ids=[tok.eos_token_id],
        weights_from=policy, lora=True,
    )  # fmt: skip
    prompts = [tok.encode("1+2="), tok.encode("a")]
    for version in (0, 1):
        with torch.no_grad():  # a new adapter far from zero: its log-probs are not the base model's
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
        if version:
            sampler.update_weights(policy)
        out = sampler.sample(prompts, num_generations=2, generator=torch.Generator().manual_seed(version))
        assert sampler.model_name.endswith(f"-v{version}") and out.weight_versions == [version] * 4
        mask = out.completion_mask
        with torch.no_grad():
            lp, _ = completion_logprobs(policy, out.prompt_ids, out.completion_ids, mask, pad_id=tok.pad_token_id, temperature=1.0)
            with policy.disable_adapter():
                lp_base, _ = completion_logprobs(policy, out.prompt_ids, out.completion_ids, mask, pad_id=tok.pad_token_id, temperature=1.0)
        torch.testing.assert_close(out.logprobs[mask], lp[mask], atol=1e-4, rtol=0)  # the trainer's, new adapter
        assert (out.logprobs[mask] - lp_base[mask]).abs().max() > 1e-2  # not the base model's
    assert sampler.last_sync_bytes == sum(p.numel() * 4 for n, p in policy.named_parameters() if "lora_" in n)
    sampler.close()


def test_lora_run_in_server_mode_keeps_the_engine_on_the_trainer(server, model_dir, addition_jsonl, tmp_path):
    lora = ["model.lora.enabled=true", "model.lora.r=4"]
    rows = read_metrics(train(load_config(None, server_run(model_dir, addition_jsonl(16), tmp_path, "lora", 2, server, *lora))).run_dir)
    assert [r["step"] for r in rows] == [1, 2] and all(r[MISMATCH_KEY] < SYNCED for r in rows)


def test_staleness_0_gives_colocated_samples_and_metrics(server, model_dir, addition_jsonl, tmp_path):
    """At staleness 0 server mode is colocated mode: the server runs each step's batch as the colocated engine
    does (rollout/vllm/batch.py: paused, seeded, added in order, resumed), so the same seeds give the same
    tokens, and so the same rewards and loss; every sample comes from the weights the step trains."""
    data = addition_jsonl(16)
    colocated = read_metrics(train(load_config(None, overrides(model_dir, data, tmp_path, "c", 3))).run_dir)
    served = read_metrics(train(load_config(None, server_run(model_dir, data, tmp_path, "s", 3, server))).run_dir)
    assert [r["step"] for r in served] == [1, 2, 3]
    for c, s in zip(colocated, served, strict=True):
        assert set(c) <= set(s)  # every metric colocated mode logs
        assert s["num_tokens"] == c["num_tokens"] and s["completions/mean_length"] == c["completions/mean_length"]
        for key in ("reward", "reward_std", "loss", "grad_norm", MISMATCH_KEY):  # fp32 on both sides, same samples
            assert s[key] == pytest.approx(c[key], rel=1e-4, abs=1e-6), (s["step"], key)
        assert s[MISMATCH_KEY] < SYNCED
        assert s["rollout/staleness_max"] == 0 and s["rollout/weight_version_max"] == s["step"] - 1
        assert s["sys/weight_sync_bytes"] > 0


def test_staleness_0_resume_is_exact(server, model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    straight = read_metrics(train(load_config(None, server_run(model_dir, data, tmp_path, "a", 3, server))).run_dir)
    train(load_config(None, server_run(model_dir, data, tmp_path, "b", 2, server)))
    resumed = read_metrics(train(load_config(None, server_run(model_dir, data, tmp_path, "b", 3, server)), resume=True).run_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3] and resumed[-1][MISMATCH_KEY] < SYNCED
    for key in ("reward", "loss", "num_tokens"):
        assert resumed[-1][key] == pytest.approx(straight[-1][key], abs=1e-5), key


def test_staleness_1_lags_one_update_and_tis_weights_it(server, model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    rows = read_metrics(
        train(load_config(None, server_run(model_dir, data, tmp_path, "k1", 4, server, "rollout.max_staleness=1"))).run_dir
    )
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 1, 1]
    assert [r["rollout/weight_version_max"] for r in rows] == [0, 0, 1, 2]
    assert rows[0][MISMATCH_KEY] < SYNCED
    for row in rows[1:]:  # sampled one update behind: the engine's log-probs are the old policy's
        assert row[MISMATCH_KEY] > 10 * SYNCED
        assert abs(row[IS_RATIO_KEY] - 1.0) > 1e-4  # the TIS weights come from the engine's log-probs
        assert row["sys/time_trainer_wait_s"] >= 0 and row["sys/time_generator_idle_s"] >= 0


def test_staleness_1_resume_regenerates_in_flight_batches_reproducibly(server, model_dir, addition_jsonl, tmp_path):
    data = addition_jsonl(16)
    results = []
    for name in ("r1", "r2"):
        train(load_config(None, server_run(model_dir, data, tmp_path, name, 2, server, "rollout.max_staleness=1")))
        cfg = load_config(None, server_run(model_dir, data, tmp_path, name, 3, server, "rollout.max_staleness=1"))
        results.append(read_metrics(train(cfg, resume=True).run_dir)[-1])
    a, b = results
    assert a["step"] == b["step"] == 3
    assert a["rollout/staleness_max"] == 0  # the in-flight batch was sampled again from the resumed weights
    for key in ("reward", "loss", "num_tokens"):
        assert a[key] == pytest.approx(b[key], abs=1e-5), key


def test_a_forced_lag_of_1_changes_the_loss_as_the_hand_computed_correction(server, model_dir):
    """Sample from version 0, move the trainer one update on without syncing (a lag of 1), and check the
    loss against ``-(1/N) sum_i (1/|o_i|) sum_t min(pi_1 / pi_engine, 2) A_i`` (GRPO, mu=1: ratio 1; TIS cap 2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.config import config_from_dict
    from grpolab.runtime.step_spec import policy_loss_spec
    from grpolab.training.step import policy_loss
    from grpolab.types import RolloutBatch

    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sampler = ServerSampler(
        ServerClient(server.url, timeout_s=60), tok, max_completion_length=6, eos_token_ids=[tok.eos_token_id],
        weights_from=policy,
    )  # fmt: skip
    out = sampler.sample([tok.encode("1+2="), tok.encode("7")], num_generations=2, generator=torch.Generator().manual_seed(3))
    sampler.close()
    mask = out.completion_mask

    def trainer_lp(model):
        with torch.no_grad():
            lp, _ = completion_logprobs(model, out.prompt_ids, out.completion_ids, mask, pad_id=tok.pad_token_id, temperature=1.0)
        return lp

    torch.testing.assert_close(out.logprobs[mask], trainer_lp(policy)[mask], atol=1e-4, rtol=0)  # engine = pi_0
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    lp1 = trainer_lp(policy)  # pi_1: one update on, never sent to the server
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    cfg = config_from_dict(
        {"model": {"name_or_path": "unused"}, "algo": {"beta": 0.0, "rollout_correction": "tis", "rollout_correction_cap": 2.0}}
    )
    spec = policy_loss_spec(cfg)
    mb = RolloutBatch(
        prompt_ids=out.prompt_ids, completion_ids=out.completion_ids, completion_mask=mask, loss_mask=mask,
        advantages=adv[:, None].expand_as(lp1).clone(), sampler_logprobs=out.logprobs,
    )  # fmt: skip
    loss, stats = policy_loss(lp1, lp1, mb, spec, total_seqs=4.0, total_tokens=float(mask.sum()))
    w = torch.exp(lp1 - out.logprobs).clamp(max=2.0) * mask
    want = -sum(float((w[i] * adv[i]).sum() / mask[i].sum()) for i in range(4)) / 4
    assert cfg.algo.loss_agg == "seq-mean-token-mean"
    assert float(loss) == pytest.approx(want, abs=1e-5)
    unweighted = -sum(float(adv[i] * mask[i].sum() / mask[i].sum()) for i in range(4)) / 4
    assert abs(want - unweighted) > 1e-3  # the lag moved the weights off 1: the check can fail
    assert stats["rollout_weight"] == pytest.approx(float(w.sum()), abs=1e-4)


@pytest.mark.parametrize("k", [0, 1])
def test_dynamic_sampling_in_server_mode(server, model_dir, addition_jsonl, tmp_path, monkeypatch, k):
    """DAPO's rounds in server mode (at k = 1 in the background thread): every round of a step is drawn with
    the step's one weight version, samples_seen counts the extra rounds (not the steps drawn ahead), and
    the groups are scored as they come back from the server, in the scoring thread (at k = 1 beside the
    background sampler, overlapping training)."""
    import threading

    from grpolab.rewards import isolate

    scored_in: list[str] = []

    sizes: list[int] = []

    def recording(*args, **kwargs):
        scored_in.append(threading.current_thread().name)
        sizes.append(len(args[1]))  # the completions of the call: one group, or the groups back together
        return score_batch(*args, **kwargs)

    score_batch = isolate.score_batch  # the scoring of whole groups calls it (rewards/isolate.py)
    monkeypatch.setattr(isolate, "score_batch", recording)
    extra = [
        "reward.functions=[{name: 'toy_rewards:digit_fraction_half_flat'}]", "algo.dynamic_sampling=true",
        "algo.max_sampling_rounds=4", f"rollout.max_staleness={k}",
    ]  # fmt: skip
    cfg = load_config(None, server_run(model_dir, addition_jsonl(16), tmp_path, f"dapo{k}", 3, server, *extra))
    rows = read_metrics(train(cfg).run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    drawn = 0
    for r in rows:
        drawn += r["train/groups_drawn"]
        assert r["sys/samples_seen"] == drawn * 4  # G = 4; every round's groups, no step drawn ahead
        assert r["train/groups_drawn"] == 2 * r["train/sampling_rounds"]
        assert all(math.isfinite(v) for key, v in r.items() if isinstance(v, float) and key != "train/reward_mean_drawn")
        assert r["rollout/staleness_max"] == min(k, r["step"] - 1)  # one version for all the step's rounds
        assert r["rollout/weight_version_min"] == r["rollout/weight_version_max"] == max(r["step"] - 1 - k, 0)
    assert sum(r["train/sampling_rounds"] for r in rows) > 3  # the flat groups cost extra rounds
    rounds = sum(r["train/sampling_rounds"] for r in rows)
    assert sum(sizes) == 2 * 4 * rounds and set(sizes) <= {4, 8}  # every group once; groups back together together
    assert all(name.startswith("grpolab-scoring") for name in scored_in)
    assert all(r["sys/time_scoring_wait_s"] >= 0 for r in rows)


@pytest.fixture(scope="module")
def tool_model_dir(model_dir, tmp_path_factory) -> str:
    """The server's model (same shapes) with a chat template and SFT on calculator traces
    (as tests/integration/test_agent_train.py's, 100 steps): it writes calls, so the episodes reach the tool."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpolab.commands.agent_demo import sft_traces
    from grpolab.envs import ToolLimits, build_environment
    from grpolab.tasks.arithmetic import multiplication_examples
    from grpolab.tasks.tiny import CHAT_TEMPLATE

    path = tmp_path_factory.mktemp("server_tool_chat")
    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    tok.chat_template = CHAT_TEMPLATE
    make_env = build_environment("calculator", {"call_format": "python"}, ToolLimits())
    prompts, episodes, masks = sft_traces(multiplication_examples(size=16, seed=0), tok, make_env, seed=0, tool_fraction=1.0)
    width = max(map(len, episodes))
    ids = torch.tensor([e + [tok.pad_token_id] * (width - len(e)) for e in episodes])
    sampled = torch.tensor([m + [False] * (width - len(m)) for m in masks])
    counted = torch.tensor([[j < len(e) for j in range(width)] for e in episodes])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(100):
        logprobs, _ = completion_logprobs(model, prompts, ids, counted, pad_id=tok.pad_token_id)
        loss = -(logprobs * sampled).sum() / sampled.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("k", [0, 1])
def test_an_episode_with_a_tool_runs_in_server_mode(server, tool_model_dir, tmp_path, k):
    """Multi-turn episodes with the calculator, every turn sampled by the server: the episodes carry the
    weight version they were sampled with, the tool is called, the metrics are finite."""
    extra = [
        "data.source=multiplication", "data.size=16", "data.max_prompt_length=48", "env.name=calculator",
        "env.kwargs={call_format: python}", "env.max_turns=2", "env.max_episode_tokens=96",
        "reward.functions=[{name: env}, {name: 'toy_rewards:digit_fraction'}]", "rollout.max_completion_length=24",
        f"rollout.max_staleness={k}", "optim.lr=1e-4",  # small steps: the SFT's calls survive the first update
    ]  # fmt: skip
    replaced = ("data.path=", "data.max_prompt_length=", "reward.functions=", "rollout.max_completion_length=", "optim.lr=")
    over = [o for o in server_run(tool_model_dir, "unused", tmp_path, f"tool{k}", 2, server) if not o.startswith(replaced)]
    rows = read_metrics(train(load_config(None, [*over, *extra])).run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert max(r["tools/call_frequency"] for r in rows) > 0 and max(r["num_turns/max"] for r in rows) == 2
    assert min(r["rollout/model_token_frac"] for r in rows) < 1  # the tool's tokens are in a batch, masked out of the loss
    for r in rows:
        assert r["rollout/model_token_frac"] > 0
        assert r["rollout/staleness_max"] == min(k, r["step"] - 1)
        assert r["rollout/weight_version_max"] == max(r["step"] - 1 - k, 0)
        assert all(math.isfinite(r[key]) for key in ("loss", "reward", "kl", "grad_norm") if key in r)
    if k == 0:
        assert all(r[MISMATCH_KEY] < SYNCED for r in rows)  # the model's turns: the engine's log-probs are the trainer's


def finished_updates(server) -> int:
    """How many /finish_weight_update calls the server has completed (its Prometheus /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
        text = r.read().decode()
    key = 'vllm:rl_weight_update_operation_duration_seconds_count{operation="finish"}'
    return sum(int(float(line.split()[-1])) for line in text.splitlines() if line.startswith(key))


@pytest.mark.parametrize("k", [0, 1])
def test_torchrun_two_ranks_share_one_server_and_send_once(server, model_dir, addition_jsonl, tmp_path, k):
    """k = 1 with dynamic sampling: each rank's background sampler all-reduces its rounds on a group of its
    own while the trainer's FSDP2 collectives run on the main one (distributed/dist.py, side_group)."""
    from test_torchrun import free_port

    extra = ["rollout.max_staleness=1", "algo.dynamic_sampling=true", "algo.max_sampling_rounds=2"] if k else []
    steps = 3 if k else 2
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "-m", "grpolab", "train",
        *server_run(model_dir, addition_jsonl(16), tmp_path, "ranks", steps, server, *extra), "train.parallel=fsdp",
    ]  # fmt: skip
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    before = finished_updates(server)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "ranks")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:  # both ranks sampled the version rank 0 sent (FSDP2 gathered on both)
        lag = min(k, row["step"] - 1)
        assert row["rollout/weight_version_max"] == row["step"] - 1 - lag and row["rollout/staleness_max"] == lag
        assert row[MISMATCH_KEY] < SYNCED if lag == 0 else row[MISMATCH_KEY] > 10 * SYNCED
    assert finished_updates(server) - before == steps + 1  # v0 and one per update, sent by rank 0 only (not twice)


def test_a_server_gone_mid_run_is_one_error_within_the_timeout_and_serve_leaves_nothing(server, model_dir):
    """The last test of the module: ``grpolab serve`` is stopped (SIGTERM) under a connected sampler."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    timeout = 5.0
    sampler = ServerSampler(
        ServerClient(server.url, timeout_s=timeout), tok, max_completion_length=6,
        eos_token_ids=[tok.eos_token_id], weights_from=policy,
    )  # fmt: skip
    sampler.sample([tok.encode("1+")], num_generations=2)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0  # serve stopped its server's whole group, then exited
    assert group_alive(server.pid) == []
    t0 = time.monotonic()
    with pytest.raises(RolloutServerError, match="cannot be reached") as err:
        sampler.update_weights(policy)
    assert time.monotonic() - t0 < timeout + 10
    assert "\n" not in str(err.value) and server.url in str(err.value)
    sampler.close()


def server_children(trainer_pid: int) -> list[int]:
    """The vLLM API server processes whose parent is ``trainer_pid``."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == trainer_pid and b"vllm.entrypoints.openai.api_server" in cmd:
                out.append(int(proc.name))
    return out


def group_alive(pgid: int) -> list[int]:
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive.append(int(proc.name))
    return alive


def test_cli_run_with_its_own_server_killed_mid_run_is_one_line(model_dir, addition_jsonl, tmp_path):
    # a call timeout no healthy call reaches on a loaded 2-core machine (5 s was reached before the kill), and a
    # stop bound well below it: a killed server stops the run at once (ServerGone), not after a timed-out call
    timeout, stop_bound = 90, 45
    cmd = [
        sys.executable, "-m", "grpolab", "train",
        *overrides(model_dir, addition_jsonl(16), tmp_path, "killed", 200), "rollout.mode=server",
        f"rollout.sync_timeout_s={timeout}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_dir = tmp_path / "killed"
        deadline = time.monotonic() + 300
        while len(read_metrics(run_dir)) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never logged two steps"
            time.sleep(0.2)
        (server_pid,) = server_children(proc.pid)
        assert group_alive(server_pid)  # the API server and its engine core
        queues = {
            line.split()[-1]
            for pid in group_alive(server_pid)
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if "/dev/shm/psm_" in line or "/dev/shm/sem.mp-" in line
        }
        assert queues  # vLLM's shared-memory message queues, which a SIGKILLed server cannot unlink
        os.killpg(server_pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=timeout + 60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("grpolab: error: the vLLM server"), err[-2000:]
    assert took < stop_bound, took
    assert group_alive(server_pid) == []
    assert [q for q in queues if Path(q).exists()] == []  # grpolab removed them
    assert any((run_dir / "checkpoints").iterdir())  # the last checkpoint is kept

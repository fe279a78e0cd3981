"""DAPO dynamic sampling (training/sampling.py), on a scripted sampler: no model needed."""

import torch

from grpolab.data import PromptOrder
from grpolab.rewards import build_reward
from grpolab.rollout.base import Sampler
from grpolab.training.sampling import groups_with_signal, sample_step
from grpolab.training.spec import SamplingSpec
from grpolab.types import Completions, Example

G = 4


class ScriptedSampler(Sampler):
    """Prompt k answers "k" correctly in the first ``k % 3`` of its G samples: prompts with k % 3 == 0 are
    always wrong (no signal), the others mixed. Lengths vary, so rounds must be padded together."""

    def __init__(self):
        self.calls = 0

    def sample(self, prompt_ids, *, num_generations, generator):
        self.calls += 1
        texts, lengths = [], []
        for ids in prompt_ids:
            k = ids[0]
            for j in range(num_generations):
                texts.append(str(k) if j < k % 3 else "x")
                lengths.append(1 + (k + j) % 3 + self.calls)
        n, t = len(texts), max(lengths)
        mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
        return Completions(
            prompt_ids=[list(p) for p in prompt_ids for _ in range(num_generations)],
            completion_ids=torch.randint(0, 9, (n, t), generator=generator),
            completion_mask=mask,
            logprobs=torch.where(mask, -torch.rand(n, t, generator=generator), 0.0),
            texts=texts,
            finish_reasons=["stop"] * n,
            num_generations=num_generations,
        )


EXAMPLES = [Example(prompt=f"q{k}", answer=str(k)) for k in range(30)]
PROMPT_IDS = [[k] for k in range(30)]
REWARDS = [build_reward("exact_match", kwargs={"extract": "none"})]


def _step(data=None, gen=None, **settings):
    spec = SamplingSpec(prompts_per_step=6, num_generations=G, **settings)
    data = data or PromptOrder(len(EXAMPLES), seed=0, shuffle=True)
    gen = gen or torch.Generator().manual_seed(0)
    sampler = ScriptedSampler()
    step = sample_step(
        spec, sampler=sampler, rewards=REWARDS, data=data, examples=EXAMPLES, prompt_ids=PROMPT_IDS, generator=gen
    )
    return step, sampler


def test_groups_with_signal_keeps_mixed_groups_only():
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.3, 0.3]])
    valid = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    assert groups_with_signal(rewards, valid) == [0]
    assert groups_with_signal(torch.tensor([[1.0, 0.0, 0.5]]), torch.tensor([[True, True, True]])) == [0]


def test_dynamic_sampling_fills_the_step_with_groups_that_have_a_signal():
    step, sampler = _step(dynamic_sampling=True)
    assert len(step.rows) == 6 and step.completions.num_sequences == 6 * G  # the step has its prompt count
    assert all(k % 3 for k in step.rows)  # no all-equal group reaches the loss
    assert groups_with_signal(step.rewards, step.valid) == list(range(6))
    assert step.metrics["train/sampling_rounds"] == sampler.calls >= 2
    assert step.metrics["train/groups_drawn"] == 6 * sampler.calls
    assert step.metrics["train/groups_kept"] >= 6
    # k % 3 of the G samples of prompt k are right; drawn = every prompt of every round
    assert 0 < step.metrics["train/reward_mean_drawn"] < float(step.rewards.mean())
    # rows, rewards and completions stay aligned across rounds (texts answer their own prompt)
    for p, k in enumerate(step.rows):
        correct = [step.completions.texts[p * G + j] == str(k) for j in range(G)]
        assert correct == [j < k % 3 for j in range(G)]
        assert step.rewards[p].tolist() == [float(c) for c in correct]
    assert step.completions.completion_mask.sum() == step.completions.lengths.sum()


def test_without_dynamic_sampling_one_round_keeps_everything():
    step, sampler = _step()
    assert sampler.calls == 1 and step.rows == PromptOrder(len(EXAMPLES), seed=0).next(6)  # as before
    assert step.metrics["train/groups_kept"] == step.metrics["train/groups_drawn"] == 6


def test_spent_rounds_train_on_what_was_kept_and_the_draw_is_reproducible():
    step, sampler = _step(dynamic_sampling=True, max_sampling_rounds=1)
    assert sampler.calls == 1 and 0 < len(step.rows) < 6 and all(k % 3 for k in step.rows)
    # same data position and generator state -> the same step (what exact resume relies on)
    data, gen = PromptOrder(len(EXAMPLES), seed=0), torch.Generator().manual_seed(0)
    data.next(6)
    gen_state = gen.get_state()
    a, _ = _step(dynamic_sampling=True, data=data, gen=gen)
    data2, gen2 = PromptOrder(len(EXAMPLES), seed=0), torch.Generator()
    data2.next(6)
    gen2.set_state(gen_state)
    b, _ = _step(dynamic_sampling=True, data=data2, gen=gen2)
    assert a.rows == b.rows and torch.equal(a.completions.completion_ids, b.completions.completion_ids)


def _rank_steps(rank: int, world: int, port: int, out: str) -> None:
    """A rank of a 2-process gloo job (torch.multiprocessing.spawn): dynamic-sampling steps with enough
    rounds and with one round; rank 0 saves what every rank kept."""
    import os

    import torch.distributed as tdist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    from grpolab.distributed import dist

    with dist.session("cpu"):
        results = {}
        for rounds in (8, 1):
            step, sampler = _step(dynamic_sampling=True, max_sampling_rounds=rounds)
            mine = {"rows": step.rows, "calls": sampler.calls, **step.metrics, "n": step.completions.num_sequences}
            every = [None] * world
            tdist.all_gather_object(every, mine)
            results[rounds] = every
        if rank == 0:
            torch.save(results, out)


def test_two_ranks_sample_the_same_rounds_and_train_on_equal_batches(tmp_path):
    """Under torchrun each rank keeps its share of every round's prompts: rounds go on until every rank
    has its 3 groups (the same number of rounds on both), and a step whose rounds ran out trains on as
    many groups on every rank as the rank that kept fewest (DDP / FSDP need equal forwards)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "steps.pt"
    mp.start_processes(_rank_steps, args=(2, port, str(out)), nprocs=2, join=True, start_method="spawn")
    results = torch.load(out, weights_only=False)
    full, one_round = results[8], results[1]
    assert full[0]["calls"] == full[1]["calls"] == full[0]["train/sampling_rounds"] >= 2
    assert [len(r["rows"]) for r in full] == [3, 3] and [r["n"] for r in full] == [3 * G, 3 * G]
    assert all(k % 3 for r in full for k in r["rows"])
    assert full[0]["train/groups_kept"] != full[1]["train/groups_kept"]  # one rank kept more: cut to its share
    assert set(full[0]["rows"]).isdisjoint(full[1]["rows"])  # the ranks' shares of each round differ
    kept = [int(r["train/groups_kept"]) for r in one_round]
    assert one_round[0]["calls"] == one_round[1]["calls"] == 1
    assert kept[0] != kept[1] and [len(r["rows"]) for r in one_round] == [min(kept)] * 2


class StreamingSampler(ScriptedSampler):
    """Hands each prompt's group out as it is "done", as the server sampler does; it generates prompt p + 1's
    group only once prompt p's has been scored (or 5 s passed), so scoring that waits for the whole batch
    shows as a 5 s stall per group, and scoring that overlaps does not."""

    streams_groups = True

    def __init__(self, scored):
        super().__init__()
        self.scored = scored
        self.overlapped = []

    def sample(self, prompt_ids, *, num_generations, generator, on_group):
        out = super().sample(prompt_ids, num_generations=num_generations, generator=generator)
        for p in range(len(prompt_ids)):
            rows = list(range(p * num_generations, (p + 1) * num_generations))
            on_group(p, out.select(rows))
            self.overlapped.append(self.scored[p].wait(timeout=5.0))
        return out


def test_a_streaming_sampler_has_each_group_scored_while_the_next_generates():
    import threading

    from grpolab.rewards.base import WeightedReward

    scored = [threading.Event() for _ in range(6)]
    seen = []

    class Recording:
        name = "exact_match"
        in_process = True  # it records in this process (a bounded reward otherwise runs in a worker process)

        def __call__(self, completions, examples):
            values = REWARDS[0].reward(completions, examples)
            k = int(examples[0].answer)
            seen.append((k, threading.current_thread().name, len(completions)))
            scored[len(seen) - 1].set()
            return values

    rewards = [WeightedReward(reward=Recording())]
    spec = SamplingSpec(prompts_per_step=6, num_generations=G)
    data = PromptOrder(len(EXAMPLES), seed=0, shuffle=True)
    sampler = StreamingSampler(scored)
    step = sample_step(
        spec, sampler=sampler, rewards=rewards, data=data, examples=EXAMPLES, prompt_ids=PROMPT_IDS,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert sampler.overlapped == [True] * 6  # each group scored before the next was generated
    assert [n for _, _, n in seen] == [G] * 6  # a call per group
    assert threading.main_thread().name not in {name for _, name, _ in seen}
    assert [k for k, _, _ in seen] == [int(EXAMPLES[r].answer) for r in step.rows]  # in the step's order
    # the same rewards as the batch scored at once (ScriptedSampler gives prompt k k % 3 right answers)
    want = torch.tensor([[1.0 if j < r % 3 else 0.0 for j in range(G)] for r in step.rows])
    assert torch.equal(step.rewards, want)


def test_groups_that_wait_while_one_is_scored_are_scored_together():
    """The first group's scoring holds until the sampler has handed out the other five: they are then
    scored in one call (a reward that batches gets them together), and the step's rewards are as before."""
    import threading

    from grpolab.rewards.base import WeightedReward
    started, all_out = threading.Event(), threading.Event()
    sizes = []

    class Slow:
        name = "exact_match"
        in_process = True

        def __call__(self, completions, examples):
            if not sizes:
                started.set()
                assert all_out.wait(timeout=10)
            sizes.append(len(completions))
            return REWARDS[0].reward(completions, examples)

    class AllAtOnce(ScriptedSampler):
        streams_groups = True

        def sample(self, prompt_ids, *, num_generations, generator, on_group):
            out = super().sample(prompt_ids, num_generations=num_generations, generator=generator)
            for p in range(len(prompt_ids)):
                on_group(p, out.select(list(range(p * num_generations, (p + 1) * num_generations))))
                if p == 0:
                    assert started.wait(timeout=10)  # the first group is being scored
            all_out.set()
            return out

    spec = SamplingSpec(prompts_per_step=6, num_generations=G)
    step = sample_step(
        spec, sampler=AllAtOnce(), rewards=[WeightedReward(reward=Slow())], data=PromptOrder(len(EXAMPLES), seed=0),
        examples=EXAMPLES, prompt_ids=PROMPT_IDS, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    assert sizes == [G, 5 * G]
    want = torch.tensor([[1.0 if j < r % 3 else 0.0 for j in range(G)] for r in step.rows])
    assert torch.equal(step.rewards, want)


class CountingSampler(ScriptedSampler):
    """The scripted sampler, counting the rounds it only took part in (``Sampler.take_part``)."""

    def __init__(self):
        super().__init__()
        self.parts = 0

    def take_part(self) -> None:
        self.parts += 1


def _sequence_rank(rank: int, world: int, port: int, out: str) -> None:
    """A rank of a 2-process gloo job whose 2 ranks split each sequence (one sequence-parallel group): a
    dynamic-sampling step; rank 0 saves what every rank got."""
    import os

    import torch.distributed as tdist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    from grpolab.distributed import dist, sequence

    with dist.session("cpu"), sequence.sequence_parallel(2):
        spec = SamplingSpec(prompts_per_step=6, num_generations=G, dynamic_sampling=True)
        data, sampler = PromptOrder(len(EXAMPLES), seed=0, shuffle=True), CountingSampler()
        gen = torch.Generator().manual_seed(0)
        step = sample_step(spec, sampler=sampler, rewards=REWARDS, data=data, examples=EXAMPLES, prompt_ids=PROMPT_IDS, generator=gen)
        mine = {"rows": step.rows, "ids": step.completions.completion_ids, "rewards": step.rewards, "metrics": step.metrics,
                "calls": sampler.calls, "parts": sampler.parts, "next": data.next(6), "gen": gen.get_state()}  # fmt: skip
        every = [None] * world
        tdist.all_gather_object(every, mine)
        if rank == 0:
            torch.save(every, out)


def test_a_sequence_parallel_group_samples_once_and_every_rank_trains_on_that_draw(tmp_path):
    """2 ranks with train.sequence_parallel=2 hold the same rows: rank 0 samples and scores every round
    of a dynamic-sampling step, rank 1 never samples and only takes part in the sampler's collectives; both
    end with one process's step (rows, completions, rewards, metrics), and the prompt order moved on alike."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "sequence.pt"
    mp.start_processes(_sequence_rank, args=(2, port, str(out)), nprocs=2, join=True, start_method="spawn")
    first, other = torch.load(out, weights_only=False)
    data = PromptOrder(len(EXAMPLES), seed=0, shuffle=True)
    gen = torch.Generator().manual_seed(0)
    one, sampler = _step(data=data, gen=gen, dynamic_sampling=True)
    after = data.next(6)
    rounds = int(one.metrics["train/sampling_rounds"])
    assert rounds >= 2 and sampler.calls == rounds  # a third of the prompts have no signal: more rounds
    assert (first["calls"], first["parts"]) == (rounds, 0) and (other["calls"], other["parts"]) == (0, rounds)
    for got in (first, other):
        assert got["rows"] == one.rows and len(one.rows) == 6
        assert torch.equal(got["ids"], one.completions.completion_ids) and torch.equal(got["rewards"], one.rewards)
        assert got["metrics"] == first["metrics"] and got["next"] == after  # timings too: the first rank's
    assert {k: v for k, v in first["metrics"].items() if not k.startswith("sys/")} == {
        k: v for k, v in one.metrics.items() if not k.startswith("sys/")
    }
    assert torch.equal(first["gen"], gen.get_state())  # the sampling rank drew as one process did
    assert torch.equal(other["gen"], torch.Generator().manual_seed(0).get_state())  # the other never drew


def test_a_completion_no_reward_scores_is_warned_about_once_in_trls_words(caplog):
    from grpolab.rewards.base import ScoreResult
    from grpolab.training.sampling import _warn_unscored
    from grpolab.types import Failure

    examples = [Example(prompt="1+1=", meta={"row": {"prompt": "1+1=", "id": 7}}), Example(prompt="2+2=")]
    # rows 1 and 3 have no total: row 1 failed (its group is dropped, said elsewhere), row 3 no reward applied
    scores = ScoreResult(total=[1.0, None, 0.0, None], components={"r": [1.0, None, 0.0, None]},
                         failures=[None, Failure("reward_error", "boom"), None, None])  # fmt: skip
    with caplog.at_level("WARNING", logger="grpolab.training.sampling"):
        _warn_unscored(scores, ["a", "b", "c", "d"], examples, group_size=2)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("All reward functions returned None for the following kwargs: ")
    assert "'completion': 'd'" in said[0] and "'prompt': '2+2='" in said[0]  # the second group's second completion
    caplog.clear()
    _warn_unscored(ScoreResult(total=[1.0, 2.0], components={}), ["a", "b"], examples[:1], group_size=2)
    assert not caplog.records

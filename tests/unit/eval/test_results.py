"""ModelEval round-trips through JSON, and a file written before the blind grading existed still loads."""

from __future__ import annotations

import json

from grpolab.eval.results import ModelEval, load_evals, save_evals


def test_the_blind_curves_round_trip_and_old_files_load_with_defaults(tmp_path):
    e = ModelEval("m", "p", 2, 4, 1.0, {1: 0.25, 4: 0.5}, {1: 0.25, 4: 0.5}, per_prompt={"pass": {1: [0.5, 0.0]}},
                  blind_grader="answer_anywhere", blind_pass_at={1: 0.5, 4: 1.0}, blind_maj_at={1: 0.5, 4: 0.5},
                  blind_per_prompt={"pass": {4: [1.0, 1.0]}}, format_error_share=0.25, greedy_format_error_share=0.5)
    [back] = load_evals(save_evals([e], tmp_path / "eval.json"))
    assert back == e and back.blind_pass_at[4] == 1.0 and back.blind_per_prompt["pass"][4] == [1.0, 1.0]
    old = {k: v for k, v in e.to_json().items() if not k.startswith(("blind", "format", "greedy_"))}
    (tmp_path / "old.json").write_text(json.dumps([old]))
    [legacy] = load_evals(tmp_path / "old.json")
    assert legacy.blind_grader is None and legacy.blind_pass_at == {} and legacy.format_error_share is None
    assert legacy.pass_at == e.pass_at

"""Users' reward functions, named in params.yaml as ``rewards.<prompt>: rewards.<module>:<function>``.

Each is ``fn(response, ground_truth) -> {"format_reward": float, "answer_reward": float, "reward": float}``, as the
built-ins of ``reasonrl.grading``; a ``reward`` of 1.0 counts as right. The package lives in the repository, not in
an installed one, so that dvc.yaml's grading stages depend on it (an edit reruns them) and a queued experiment grades
with the copy it records (``reasonrl.rewards``).
"""

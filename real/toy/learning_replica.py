"""How often does the CPU demo's toy reward rise? An offline replica of its learning loop.

``gyre run --config configs/cpu_demo.toml`` learns the emit-character task
(``toy.tasks.EmitCharTask``) with a tiny random model, 8 executions a step,
so its reward curve is noisy and takes a varying number of steps to turn up;
the Ray e2e test asserts that it rose (``analysis.real_run.reward_trend``:
t >= 4, last five steps above the first five). A real run takes minutes and its
sampling is not seeded, so this module replays the same learning loop without
engines, harnesses or timing, many seeds in minutes, to size that check:

    python -m gyre.real.toy.learning_replica --model runs/cpu-demo/engine-model --seeds 0:24

Kept from the real run: the model (the demo's version-0 Qwen2 export), the
task prompt and the scripted harness's conversation (system prompt, ``calls``
calls of ``max_tokens`` at temperature 1, ``Tool output k: ok`` turns, the
answer = the calls' texts joined by spaces), N executions per group and B
groups per step, std-normalised group advantages (``trajectory.groups``), the
the execution-level loss (docs/trajectories.md#execution-level-loss) (``train.loss``) on every generated token against
the behaviour log-probabilities, and Adam with the job's gradient-norm clip of 1.0.
Assumed: each step's groups were sampled by the version ``staleness`` steps
older (default: 0, then 1 and 2 alternating, as the demo's metrics.jsonl
measures at phi = 1, mu = 2); Hugging Face sampling stands in for SGLang's,
and the behaviour log-probabilities are the sampling version's own (exact,
where the real engine's agree to float32 rounding).

Invariant: a pure function of (model, seed, settings); one seed gives the same
curve every time (seeded sampling, one thread).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from gyre.analysis.real_run import reward_trend
from gyre.real.harness.scripted import MAIN_SYSTEM
from gyre.real.toy.tasks import EmitCharTask, char_share
from gyre.real.train.loss import execution_level_loss
from gyre.trajectory.groups import group_advantages


@dataclass(frozen=True)
class Settings:
    steps: int = 30
    lr: float = 1e-2
    max_tokens: int = 16
    calls: int = 2
    N: int = 4
    B: int = 2
    staleness: tuple[int, ...] = (0, 1, 2)  # the first steps, then the last two alternate


@dataclass(frozen=True)
class Replica:
    seed: int
    curve: list[float]  # mean reward of each step's batch
    versions: list[list[int]]  # the sampling version of each step's groups
    # mean over steps: executions the execution-level mask (docs/trajectories.md#execution-level-loss) dropped
    clip_fraction: float
    t: float
    rose: bool  # the e2e check: t >= 4 and the last five steps' mean above the first five's


def staleness_at(settings: Settings, step: int) -> int:
    s = settings.staleness
    if step < len(s):
        return s[step]
    return s[-2 + (step - len(s)) % 2] if len(s) >= 2 else s[-1]


class Loop:
    def __init__(self, model_dir: str, settings: Settings, target: str = "e") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings, self.task = settings, EmitCharTask(target)
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.tok.padding_side = "left"
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")

    def run(self, seed: int) -> Replica:
        st = self.settings
        torch.manual_seed(seed)
        model, sampler = copy.deepcopy(self.base), copy.deepcopy(self.base)
        optimizer = torch.optim.Adam(model.parameters(), lr=st.lr)
        versions = [copy.deepcopy(model.state_dict())]
        curve, used, clipped = [], [], []
        for step in range(st.steps):
            executions, rewards, used_now = [], [], []
            for _ in range(st.B):
                version = max(0, step - staleness_at(st, step))
                sampler.load_state_dict(versions[version])
                group, group_rewards = self._group(sampler)
                advantages = group_advantages(group_rewards)
                executions += [(calls, float(a)) for calls, a in zip(group, advantages)]
                rewards += group_rewards
                used_now.append(version)
            curve.append(statistics.fmean(rewards))
            used.append(used_now)
            clipped.append(self._update(model, optimizer, executions))
            versions.append(copy.deepcopy(model.state_dict()))
        slope, t = reward_trend(curve)
        k = min(5, len(curve))
        return Replica(seed, curve, used, statistics.fmean(clipped), t,
                       t >= 4 and statistics.fmean(curve[-k:]) > statistics.fmean(curve[:k]))

    def _group(self, sampler) -> tuple[list[list[tuple]], list[float]]:
        """N executions of the scripted harness: per execution its calls (prompt ids, output ids, behaviour)."""
        st, tok = self.settings, self.tok
        prompt = self.task.task("replica").prompt
        histories = [[{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": prompt}]
                     for _ in range(st.N)]
        calls: list[list[tuple]] = [[] for _ in range(st.N)]
        texts: list[list[str]] = [[] for _ in range(st.N)]
        for call in range(1, st.calls + 1):
            prompts = [tok.apply_chat_template(h, tokenize=False, add_generation_prompt=True) for h in histories]
            for i, (text, outputs) in enumerate(zip(prompts, self._sample(sampler, prompts))):
                ids = tok(text, add_special_tokens=False).input_ids
                with torch.no_grad():
                    calls[i].append((ids, outputs, _logprobs(sampler, ids, outputs)))
                texts[i].append(tok.decode(outputs, skip_special_tokens=True))
                histories[i] += [{"role": "assistant", "content": texts[i][-1]},
                                 {"role": "user", "content": f"Tool output {call}: ok"}]
        return calls, [char_share(" ".join(t), self.task.target) for t in texts]

    def _sample(self, sampler, prompts: list[str]) -> list[list[int]]:
        enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = sampler.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                   max_new_tokens=self.settings.max_tokens, eos_token_id=self.eos,
                                   pad_token_id=self.eos)
        rows = []
        for row in out[:, enc.input_ids.shape[1]:].tolist():
            rows.append(row[:row.index(self.eos) + 1] if self.eos in row else row)
        return rows

    def _update(self, model, optimizer, executions) -> float:
        logp, behaviour, index = [], [], []
        for e, (calls, _) in enumerate(executions):
            for ids, outputs, old in calls:
                logp.append(_logprobs(model, ids, outputs))
                behaviour.append(old)
                index.append(torch.full((len(outputs),), e))
        logp_all = torch.cat(logp)
        advantages = torch.tensor([a for _, a in executions], dtype=torch.float32)
        loss, stats = execution_level_loss(logp_all, torch.cat(behaviour), torch.ones_like(logp_all, dtype=torch.bool),
                                           torch.cat(index), advantages, num_executions=len(executions))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return stats.clip_fraction


def _logprobs(model, prompt_ids: list[int], outputs: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + outputs])
    logits = model(ids).logits[0, len(prompt_ids) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(outputs)[:, None])[:, 0]


def _seeds(text: str) -> range:
    first, _, end = text.partition(":")
    try:
        seeds = range(int(first), int(end) if end else int(first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not FIRST:END (integers, END excluded)") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} names no seed (END must exceed FIRST)")
    return seeds


def _steps(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        steps = 0
    if steps < 3:
        raise argparse.ArgumentTypeError(f"{text!r}: a trend needs at least 3 steps")
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gyre.real.toy.learning_replica", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a Qwen2 folder: the demo's RUN/engine-model")
    p.add_argument("--seeds", type=_seeds, default=range(0, 8), help="FIRST:END, END excluded (default 0:8)")
    p.add_argument("--steps", type=_steps, default=Settings.steps)
    p.add_argument("--lr", type=float, default=Settings.lr)
    p.add_argument("--max-tokens", type=int, default=Settings.max_tokens)
    p.add_argument("--calls", type=int, default=Settings.calls)
    a = p.parse_args(argv)
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        p.error(f"--model {a.model}: no config.json there (a gyre run leaves one in RUN/engine-model)")
    torch.set_num_threads(1)
    settings = Settings(steps=a.steps, lr=a.lr, max_tokens=a.max_tokens, calls=a.calls)
    loop = Loop(a.model, settings)
    replicas = []
    for seed in a.seeds:
        replicas.append(loop.run(seed))
        print(json.dumps(asdict(replicas[-1])), flush=True)
    ts = sorted(r.t for r in replicas)
    print(f"{sum(r.rose for r in replicas)} of {len(replicas)} rose in {settings.steps} steps; "
          f"lowest t {ts[0]:.1f}, median t {ts[len(ts) // 2]:.1f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

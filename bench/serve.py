"""The OpenAI-compatible endpoint: completion tokens/s of one request at a time against many
at once; and episodes/s of the calculator task played by an agent program through the
endpoint against the built-in environment.

Model: the shipped `jaxrl_llm/assets/calculator_sft` (Llama, 4 layers, hidden 64, vocab 128,
float32; the character tokenizer with a chat template) on one XLA CPU device: the model the
agent demo serves, and one with a chat template, which the chat route needs (bench/sampler.py's
tiny Llama has none). Being tiny, it shows the endpoint's overheads (HTTP, Python, one
dispatch per admission) at their largest next to the model's compute.

1. Endpoint. `serving.Server` over `serving.load_backend(calculator_sft, Layout(slots=64,
   context=224, page_size=32, chunk_steps=8, top_logprobs=0))` on 127.0.0.1 (224 columns:
   the agent player's layout for this task). `--requests` (64) chat requests, each the
   calculator agent's first call (a problem of the `task:calculator` train split as the user
   message, the `calc` tool: a 34-token prompt) with its own seed, temperature 1,
   `max_tokens` 64, sent (a) one at a time through one `openai.AsyncOpenAI` client, (b) all
   at once from 64 clients and (c) from 16 clients (`--concurrency`), each sending its share
   in turn; the clients are built before the clock starts. EOS stays on: the tokens counted
   are the `usage.completion_tokens` the server reports (a request's tokens depend only on its
   seed and prompt, so every mode generates the same ones: checked). (d) The same requests
   straight to the engine (`Engine.submit`, prompts rendered beforehand, no HTTP), all at
   once: the engine's own rate. After a warm-up (the same shapes, one at a time and at once),
   `--rounds` rounds of (a)-(d) back to back. Printed per mode: median wall s, completion
   tokens, tokens/s, requests/s, decode chunks (device calls) and tokens per chunk; each mode
   over sequential (median of per-round ratios); the seconds per one-token request sent one
   at a time through the endpoint and straight to the engine (the round trip, about); and
   what a client costs: one `openai.AsyncOpenAI(...)` construction (an `AgentPlayer` builds
   one) and one `client.copy(base_url=...)` (each agent episode's client, sharing the
   player's HTTP connection pool and SSL context).

2. Episodes. The training plan's sources (`config.sources.run_sources`) of
   configs/grpo_calculator.py (the built-in `CalculatorEnv`, env_workers 1: its default) and
   configs/grpo_calculator_agent.py (`jaxrl_llm.envs.calculator_agent:run` through the
   endpoint), each played by `players.player_for(source, tokenizer, settings)` (settings
   from `config.sampling`: temperature 1, 96 new tokens a turn) with
   `local_model(from_pretrained(calculator_sft))`: `play()` of 64 episodes, 16 problems of the
   train split x G = 4 (the demo's step). The agent player serves the policy from its own
   engine (slots = min(env_workers, 64)) behind one `openai.AsyncOpenAI`, each episode a
   `copy` of it on the episode's URL; an episode's call that continues its previous one
   keeps that call's slot and prefills only its new tokens (`Request.session`,
   `slots.prefill_last`: the "extended" engine calls). Warm-up plays of other problems until
   one compiles nothing; then `--rounds` rounds, each new problems and key, the variants back to
   back: the environment; the agent config as shipped (env_workers 64: all 64 episodes at
   once); and the agent config at env_workers 16 (`--agent-workers`, 0: not; 16 agent
   programs at a time, on a 16-slot engine), the effect of concurrency. Printed: median s
   per play, episodes/s, model turns and tokens per episode, the agent engine's device calls
   (decode chunks, fresh admissions, session extensions), the compilations during timed
   plays; then each agent variant over the environment (median of per-round ratios; the
   issue's target is >= 0.7x).

  .venv/bin/python bench/serve.py                  # both parts, 3 rounds (about 2 minutes)
  .venv/bin/python bench/serve.py --part=endpoint  # or --part=episodes
  .venv/bin/python bench/serve.py --quick          # 16 requests, 4 problems, 1 round

The last line is JSON.

Measured on 2 CPU cores (load average about 2.5), 2026-12-03, at commit 1a1ea2b,
`.venv/bin/python bench/serve.py` (medians of 3 rounds):

  | endpoint mode (64 requests, 3,796 completion tokens) | wall s | tokens/s | chunks |
  |---|---|---|---|
  | sequential (1 client)               | 2.55 | 1,488  | 477 |
  | 64 concurrent clients               | 0.40 | 9,405  | 11  |
  | 16 concurrent clients               | 0.59 | 6,387  | 42  |
  | engine.submit, 64 at once (no HTTP) | 0.23 | 16,421 | 8   |
  64 concurrent / sequential 6.29x (rounds 5.27x, 6.64x, 6.29x), 16 concurrent 4.29x, the
  engine alone 11.0x; a one-token request 5.7 ms through the endpoint, 2.0 ms straight to
  the engine; openai.AsyncOpenAI(...) 18.3 ms (once per player), client.copy 0.32 ms (per
  episode).

  | episodes (64 a play)  | env_workers | s/play | episodes/s | engine calls (last play) | / env (rounds) |
  |---|---|---|---|---|---|
  | environment           | 1  | 0.58 | 110.5 | -                                  | 1 |
  | agent (as shipped)    | 64 | 0.91 | 70.4  | 19 chunks, 64 admitted, 49 extended | 0.51x (0.43, 0.51, 0.72) |
  | agent, env_workers 16 | 16 | 0.87 | 73.3  | 66 chunks, 64 admitted, 49 extended | 0.62x (0.44, 0.62, 0.75) |
  (1.78 model turns and 75.9 model tokens an episode in every row; nothing compiled in
  the timed plays.) Below the 0.7x target: on this tiny model a play is dispatch-bound.
  The environment's path makes about two device calls a play (one `TurnSampler` program per
  turn for all 64 episodes). The agent's makes one admission per episode, one extension
  per continued call and a decode chunk per ended request, each with a host read, plus an
  HTTP round trip per call, all sharing one Python interpreter with the 64 programs.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"environment": "configs/grpo_calculator.py", "agent": "configs/grpo_calculator_agent.py"}


class Compiles:
  """Counts XLA compilations (jax's backend_compile events) while alive."""

  def __init__(self):
    import jax
    self.n, self.seconds = 0, 0.0
    self._listener = self._on
    jax.monitoring.register_event_duration_secs_listener(self._listener)

  def _on(self, event, duration, *a, **k):
    if "backend_compile" in event:
      self.n += 1
      self.seconds += duration


# --- 1. the endpoint ------------------------------------------------------------------------
def _requests(n: int, max_tokens: int) -> list[dict]:
  from jaxrl_llm import tasks
  from jaxrl_llm.envs import calculator_agent
  records = tasks.load_split("calculator", "train")
  return [dict(model="calculator_sft", messages=[{"role": "user", "content": records[i]["prompt"]}],
               tools=[calculator_agent.CALC], temperature=1.0, max_tokens=max_tokens, seed=i)
          for i in range(n)]


def _clients(base_url: str, n: int) -> list:
  import openai
  return [openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
          for _ in range(n)]


async def _send(clients: list, requests: list[dict]) -> list[int]:
  """`requests` from `clients` at once, each client sending its share one at a time (one
  client: sequentially); the completion tokens of each (`usage`)."""
  async def worker(client, mine):
    return [(i, (await client.chat.completions.create(**requests[i])).usage.completion_tokens)
            for i in mine]
  done = await asyncio.gather(*(worker(c, range(k, len(requests), len(clients)))
                                for k, c in enumerate(clients)))
  tokens = [0] * len(requests)
  for part in done:
    for i, n in part:
      tokens[i] = n
  return tokens


async def _make(base_url: str, n: int) -> list:
  return _clients(base_url, n)


def _client_cost(base_url: str, n: int = 8) -> dict:
  """Median seconds of one `openai.AsyncOpenAI(...)` construction (`new`) and of one
  `client.copy(base_url=...)` (`copy`: what an agent episode's client costs)."""
  import openai
  new, copy = [], []
  for k in range(n):
    t = time.perf_counter()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    new.append(time.perf_counter() - t)
    t = time.perf_counter()
    client.copy(base_url=f"{base_url}/episode{k}")
    copy.append(time.perf_counter() - t)
  return dict(new=statistics.median(new), copy=statistics.median(copy))


def _engine_requests(backend, requests: list[dict]) -> list:
  """The requests as the endpoint hands them to the engine (rendered, keyed by seed)."""
  import jax
  import numpy as np
  from jaxrl_llm import envs, serving
  renderer = envs.ChatRenderer(backend.tokenizer, requests[0]["tools"])
  return [serving.Request(renderer.prompt_ids(r["messages"]), r["max_tokens"], r["temperature"],
                          1.0, key=np.asarray(jax.random.fold_in(jax.random.PRNGKey(r["seed"]), 0)))
          for r in requests]


def _direct(backend, requests: list, at_once: bool = True) -> list[int]:
  """Engine requests submitted straight to the engine, all at once or one at a time."""
  if at_once:
    futures = [backend.engine.submit(r) for r in requests]
    return [len(f.result().tokens) for f in futures]
  return [len(backend.engine.submit(r).result().tokens) for r in requests]


def _fixed_cost(backend, send, requests: list[dict]) -> dict:
  """Seconds per request of one-token requests sent one at a time, through the endpoint (one
  client) and straight to the engine: the endpoint's round trip, about."""
  one = [dict(r, max_tokens=1) for r in requests]
  direct = _engine_requests(backend, one)
  out = {}
  for name, fn in (("http", lambda: send(1, one)),
                   ("engine", lambda: _direct(backend, direct, False))):
    t = time.perf_counter()
    fn()
    out[name] = (time.perf_counter() - t) / len(one)
  return out


def endpoint(args) -> dict:
  from jaxrl_llm import assets, serving
  layout = serving.Layout(slots=64, context=args.context, page_size=args.page_size,
                          chunk_steps=args.chunk_steps, top_logprobs=0)
  backend = serving.load_backend(assets.path("calculator_sft"), layout, max_tokens=args.max_tokens)
  server = serving.Server(backend)
  requests = _requests(args.requests, args.max_tokens)
  warm = [dict(r, seed=r["seed"] + 10_000) for r in _requests(8, args.max_tokens)]
  levels = [args.requests] + [c for c in args.concurrency if c < args.requests]
  loop = asyncio.new_event_loop()
  clients = {c: loop.run_until_complete(_make(server.base_url, c))
             for c in {1, len(warm), *levels}}
  send = lambda c, rs: loop.run_until_complete(_send(clients[c][:len(rs)], rs))
  compiles = Compiles()
  try:
    send(1, warm[:2])
    send(len(warm), warm)
    _direct(backend, _engine_requests(backend, warm))
    _fixed_cost(backend, send, warm[:2])
    warm_compiles = compiles.n
    modes = [("sequential (1 client)", lambda: send(1, requests))]
    for c in levels:
      modes.append((f"{c} concurrent clients", lambda c=c: send(c, requests)))
    modes.append((f"engine.submit, {args.requests} at once (no HTTP)",
                  lambda e=_engine_requests(backend, requests): _direct(backend, e)))
    results = {name: [] for name, _ in modes}
    client_s, fixed = [], []
    for _ in range(args.rounds):
      client_s.append(_client_cost(server.base_url))
      fixed.append(_fixed_cost(backend, send, requests[:32]))
      for name, fn in modes:
        chunks = backend.engine.stats["chunks"]
        t = time.perf_counter()
        tokens = fn()
        wall = time.perf_counter() - t
        results[name].append(dict(wall=wall, tokens=tokens,
                                  chunks=backend.engine.stats["chunks"] - chunks))
        print(f"  {name}: {wall:.2f} s, {sum(tokens)} tokens, load {os.getloadavg()[0]:.1f}",
              flush=True)
  finally:
    for cs in clients.values():
      for c in cs:
        loop.run_until_complete(c.close())
    loop.close()
    server.close()
    backend.engine.close()
  reference = results[modes[0][0]][0]["tokens"]
  same = all(r["tokens"] == reference for runs in results.values() for r in runs)
  rows, rates = [], {}
  for name, runs in results.items():
    wall = statistics.median(r["wall"] for r in runs)
    tokens = sum(runs[0]["tokens"])
    chunks = statistics.median(r["chunks"] for r in runs)
    rates[name] = [sum(r["tokens"]) / r["wall"] for r in runs]
    rows.append(f"| {name} | {wall:.2f} | {tokens} | {tokens / wall:,.0f} | "
                f"{args.requests / wall:.1f} | {chunks:.0f} | {tokens / chunks:.1f} |")
  seq = modes[0][0]
  ratio = lambda name: statistics.median(a / b for a, b in zip(rates[name], rates[seq]))
  print(f"\nEndpoint: calculator_sft, Layout(slots=64, context={args.context}, page_size="
        f"{args.page_size}, chunk_steps={args.chunk_steps}); {args.requests} chat requests "
        f"(34-token prompts), temperature 1, max_tokens {args.max_tokens}, EOS on; "
        f"medians of {args.rounds} round(s); {os.cpu_count()} CPUs\n")
  print("| mode | wall s | completion tokens | tokens/s | requests/s | device chunks | "
        "tokens/chunk |")
  print("|---|---|---|---|---|---|---|")
  print("\n".join(rows))
  for name, _ in modes[1:]:
    rounds = ", ".join(f"{a / b:.2f}x" for a, b in zip(rates[name], rates[seq]))
    print(f"{name} / sequential: {ratio(name):.2f}x (median of per-round ratios {rounds})")
  print(f"same tokens in every mode: {same}; compilations: warm-up {warm_compiles}, "
        f"timed {compiles.n - warm_compiles}")
  client = {k: statistics.median(c[k] for c in client_s) for k in ("new", "copy")}
  http, direct = (statistics.median(f[k] for f in fixed) for k in ("http", "engine"))
  print(f"one-token requests one at a time: {http * 1e3:.1f} ms each through the endpoint, "
        f"{direct * 1e3:.1f} ms straight to the engine (round trip {(http - direct) * 1e3:.1f} ms)")
  print(f"a client (the ones above were built before timing): openai.AsyncOpenAI(...) "
        f"{client['new'] * 1e3:.1f} ms (one per agent player), client.copy(base_url=...) "
        f"{client['copy'] * 1e3:.2f} ms (one per agent episode)")
  return dict(tokens_per_s={k: statistics.median(v) for k, v in rates.items()},
              ratio_vs_sequential={name: ratio(name) for name, _ in modes[1:]},
              completion_tokens=sum(reference), same_tokens=same,
              timed_compiles=compiles.n - warm_compiles, client_s=client,
              one_token_request_s=dict(http=http, engine=direct))


# --- 2. episodes ----------------------------------------------------------------------------
def _engine_calls(stats: dict | None) -> str:
  """An agent play's engine device calls: decode chunks, admissions (and extensions)."""
  if stats is None:
    return "-"
  starts = ", ".join(f"{stats[k]} {k}" for k in ("admitted", "extended") if k in stats)
  return f"{stats['chunks']} chunks, {starts}"


def episodes_part(args) -> dict:
  import jax
  from jaxrl_llm import assets, data, models, sampling, tasks
  from jaxrl_llm import config as config_lib
  from jaxrl_llm.config import sources as sources_lib
  from jaxrl_llm.envs import episode as episode_lib
  from jaxrl_llm.training.rollouts import episodes
  from jaxrl_llm.training.rollouts.players import player_for
  path = assets.path("calculator_sft")
  policy = models.from_pretrained(path)
  tokenizer = data.load_tokenizer(path)
  model = episodes.local_model(policy)
  players, workers = {}, {}
  shipped = config_lib.presets.load(os.path.join(REPO, CONFIGS["agent"])).data.env_workers
  builds = [("environment", CONFIGS["environment"], None),
            ("agent (as shipped)", CONFIGS["agent"], None)]
  if args.agent_workers and args.agent_workers != shipped:
    builds.append((f"agent, env_workers={args.agent_workers}", CONFIGS["agent"],
                   args.agent_workers))
  for name, file, env_workers in builds:
    config = config_lib.presets.load(os.path.join(REPO, file))
    if env_workers is not None:
      config.unlock()
      config.data.env_workers = env_workers
    source = sources_lib.run_sources(config)[0]
    settings = sampling.settings.from_config(config.sampling,
                                             sampling.eos_ids(tokenizer, policy.config),
                                             sampling.pad_id(tokenizer))
    G = settings.num_samples
    records = tasks.load_split("calculator", "train", **source.task_options)
    players[name] = player_for(source, tokenizer, settings)
    workers[name] = source.env["env_workers"]
  variants = list(players)
  P = args.problems

  def batch(r):  # round r's problems, each G times
    idx = [i for p in range(r * P, (r + 1) * P) for i in [p] * G]
    return [records[i] for i in idx], idx

  results = {name: [] for name in variants}
  compiles = Compiles()
  try:
    for name, player in players.items():  # until a play compiles nothing
      for w in range(args.warmup):
        before, t = compiles.n, time.perf_counter()
        player.play(model, *batch(1000 + w), jax.random.PRNGKey(1000 + w))
        print(f"  warm-up {name}: {time.perf_counter() - t:.1f} s, "
              f"{compiles.n - before} compilations", flush=True)
        if compiles.n == before:
          break
    warm_compiles = compiles.n
    for r in range(args.rounds):
      for name in variants:
        before = compiles.n
        engine = getattr(players[name], "engine", None)
        stats = dict(engine.stats) if engine is not None else None
        t = time.perf_counter()
        played = players[name].play(model, *batch(r), jax.random.PRNGKey(r))
        wall = time.perf_counter() - t
        model_tokens = [sum(role == episode_lib.MODEL for role in ep.roles) for ep in played]
        results[name].append(dict(wall=wall, turns=statistics.mean(ep.num_turns for ep in played),
                                  model_tokens=statistics.mean(model_tokens),
                                  total_model_tokens=sum(model_tokens),
                                  compiles=compiles.n - before,
                                  engine={k: v - stats[k] for k, v in engine.stats.items()}
                                  if engine is not None else None))
        print(f"  round {r} {name}: {wall:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
  finally:
    for player in players.values():
      player.close()
  B = P * G
  rows, rates = [], {}
  for name in variants:
    runs = results[name]
    wall = statistics.median(r["wall"] for r in runs)
    rates[name] = [B / r["wall"] for r in runs]
    tok_s = statistics.median(r["total_model_tokens"] / r["wall"] for r in runs)
    rows.append(f"| {name} | {workers[name]} | {wall:.2f} | {B / wall:.1f} | "
                f"{statistics.mean(r['turns'] for r in runs):.2f} | "
                f"{statistics.mean(r['model_tokens'] for r in runs):.1f} | {tok_s:,.0f} | "
                f"{_engine_calls(runs[-1]['engine'])} | {sum(r['compiles'] for r in runs)} |")
  ratios = {name: statistics.median(a / e for a, e in zip(rates[name], rates["environment"]))
            for name in variants[1:]}
  print(f"\nEpisodes: calculator_sft, {P} problems x G={G} = {B} episodes per play(), "
        f"temperature 1; medians of {args.rounds} interleaved round(s) after warm-up plays "
        f"({warm_compiles} compilations); {os.cpu_count()} CPUs; "
        f"environment: {CONFIGS['environment']}, agent: {CONFIGS['agent']}\n")
  print("| player | env_workers | s/play | episodes/s | model turns/episode | "
        "model tokens/episode | model tokens/s | engine calls (last play) | compiles (timed) |")
  print("|---|---|---|---|---|---|---|---|---|")
  print("\n".join(rows))
  for name, ratio in ratios.items():
    rounds = ", ".join(f"{a / e:.2f}x" for a, e in zip(rates[name], rates["environment"]))
    print(f"{name} / environment, episodes/s: {ratio:.2f}x (median of per-round ratios "
          f"{rounds}; target >= 0.7x)")
  return dict(episodes_per_s={k: statistics.median(v) for k, v in rates.items()},
              over_environment=ratios, env_workers=workers,
              model_tokens_per_episode={k: statistics.mean(r["model_tokens"] for r in v)
                                        for k, v in results.items()},
              timed_compiles={k: sum(r["compiles"] for r in v) for k, v in results.items()})


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--part", choices=("both", "endpoint", "episodes"), default="both")
  ap.add_argument("--quick", action="store_true",
                  help="16 requests, 4 problems, 1 round, no env_workers variant")
  ap.add_argument("--requests", type=int, default=64)
  ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",") if x],
                  default=[16], help="more concurrent levels besides --requests (comma list)")
  ap.add_argument("--max-tokens", type=int, default=64)
  ap.add_argument("--context", type=int, default=224)
  ap.add_argument("--page-size", type=int, default=32)
  ap.add_argument("--chunk-steps", type=int, default=8)
  ap.add_argument("--problems", type=int, default=16, help="problems per play (x G = 4)")
  ap.add_argument("--agent-workers", type=int, default=16,
                  help="also the agent config with this env_workers (0 or the shipped value: "
                       "not)")
  ap.add_argument("--warmup", type=int, default=4,
                  help="warm-up plays of each player at most (they stop at one that compiles "
                       "nothing)")
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args()
  if args.quick:
    args.requests, args.problems, args.rounds, args.agent_workers = 16, 4, 1, 0
    args.concurrency = [c for c in args.concurrency if c < 16] or [4]
  out = {"cpus": os.cpu_count()}
  if args.part in ("both", "endpoint"):
    out["endpoint"] = endpoint(args)
  if args.part in ("both", "episodes"):
    print()
    out["episodes"] = episodes_part(args)
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
